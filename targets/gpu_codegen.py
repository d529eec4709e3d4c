"""A C-style code generator for device kernels, shared by the GPU back ends.

The input is one kernel of the device form (``tensorir.transform.split_host_device``, see
``docs/lowering.md``, "Device lowering"). ``CodegenC`` walks it and writes C-like source; a
language is a subclass that fills in a table — type names, how a thread index, a barrier, a
buffer parameter, a shared or local array, a declaration, a loop header, a cast or a ``select``
is written, the math function names — the way tinygrad's renderers express a target over one
shared C-style base. OpenCL C (``targets.opencl_backend.codegen``) is one such table, WGSL
(``targets.webgpu_backend.wgsl``) another.

``CodegenC`` is an ``IRFunctor`` (the walker convention of ``tensorir.functor``): ``visit(node)``
calls ``visit_<ClassName>``; statements emit lines, expressions return their source text.

What the base handles for every language:

* names: every Var and Buffer gets a unique identifier (``i``, ``i_1``, ...);
* integer ``floordiv`` / ``floormod``: ``tensorir.arith.floor_is_trunc`` decides, with an
  ``arith.Analyzer`` that knows the loop and thread ranges, the let values, the conditions
  around and which scalars are shape sizes (``>= 0``): the language's truncating division
  where both operands are provably non-negative, else a helper function that rounds toward
  minus infinity (``tc_floordiv_int``), whose body is ``arith.floor_divmod_general`` printed
  by the generator itself;
* ``if_then_else`` and ``Select`` as ``?:``; a ``Let`` expression is inlined (expressions have
  no side effects);
* ``bool`` buffers are stored as bytes (``uchar``);
* ``vectorized`` loops of a constant extent the language has vectors for, whose body is a store
  at ``base + v`` of loads at ``base' + v`` and loop-invariant values (``arith.ramp_base``),
  become one vector load/compute/store (``vload4`` / ``vstore4`` in OpenCL; an aligned
  ``float4`` pointer access where the offset is a provable multiple of the lanes,
  ``arith.is_aligned``: kernel parameters are whole device allocations and shared arrays are
  declared aligned, ``VECTOR_ALIGN``); a store that is strided (a transposed shared tile) or
  into a ``local`` array (a register fragment) takes the vector value lane by lane
  (``VECTOR_LANE_ACCESS``, at ``arith.lane_index``); other vectorized loops run as unrolled
  scalar loops.

Examples
--------
>>> from tilecraft.targets.opencl_backend.codegen import OpenCLCodegen      # doctest: +SKIP
>>> src = OpenCLCodegen().kernel_source(split.kernels[0])         # doctest: +SKIP
"""
from __future__ import annotations

import math
import re
from typing import Sequence

from tilecraft.tensorir import arith
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import expr as E
from tilecraft.tensorir import stmt as S
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import IRFunctor, post_order_visit, substitute
from tilecraft.tensorir.stmt import Range
from tilecraft.tensorir.transform._common import func_shape_vars, uses_any
from tilecraft.tensorir.transform.device import BARRIER_OP, DeviceKernel


class CodegenError(E.TIRError, ValueError):
    """A kernel the language cannot express (a dtype it lacks, an unknown intrinsic)."""


_C_KEYWORDS = set("""
auto break case char const continue default do double else enum extern float for goto if inline
int long register restrict return short signed sizeof static struct switch typedef union
unsigned void volatile while bool half uchar ushort uint ulong kernel global local private
constant read_only write_only true false min max select vload vstore barrier main
""".split())

# the names a work-group barrier goes by in device code (the device form writes BARRIER_OP)
BARRIER_OPS = {BARRIER_OP, "tir.tvm_storage_sync", "storage_sync", "barrier", "workgroup_barrier",
               "syncthreads"}


class CodegenC(IRFunctor):
    """The shared C-style kernel generator. Subclasses set the class attributes and override
    the spelling hooks (``*_decl``, ``thread_index``, ``barrier_stmt``, ``for_header``, ...)."""

    # -- the language table (subclasses override) ---------------------------------------------
    TYPES = {"bool": "bool", "int8": "char", "int16": "short", "int32": "int", "int64": "long",
             "uint8": "uchar", "uint16": "ushort", "uint32": "uint", "uint64": "ulong",
             "float16": "half", "float32": "float", "float64": "double"}
    # how bool is stored in buffers
    BOOL_STORAGE = "uchar"
    VECTOR_LANES: tuple = (2, 4, 8, 16)
    MATH = {"exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "tanh": "tanh",
            "erf": "erf", "pow": "pow", "fabs": "fabs", "floor": "floor", "ceil": "ceil",
            "round": "rint", "sin": "sin", "cos": "cos", "exp2": "exp2", "log2": "log2",
            "trunc": "trunc"}
    # float min / max (integers use min / max; bools && / ||)
    FLOAT_MIN_MAX = ("fmin", "fmax")
    INDENT = "  "
    # the exception for a kernel the language cannot express
    ERROR = CodegenError

    def __init__(self):
        self.lines: list[str] = []
        self.depth = 0
        self.names: dict = {}
        self.used: set[str] = set()
        self.analyzer = arith.Analyzer()
        self.var_code: dict[E.Var, str] = {}   # the code of each variable in scope
        self.needs: set[str] = set()       # helpers / extensions the kernel uses
        self.dtypes_used: set[str] = set()
        self.kernel_name = ""

    # -- hooks ----------------------------------------------------------------------------------
    def thread_index(self, tag: str) -> str:
        raise NotImplementedError

    def barrier_stmt(self) -> str:
        raise NotImplementedError

    def kernel_signature(self, kernel: DeviceKernel, params: list[str]) -> str:
        raise NotImplementedError

    def buffer_param(self, buf: S.Buffer, name: str, written: bool) -> str:
        raise NotImplementedError

    def scalar_param(self, var: E.Var, name: str) -> str:
        return f"{self.type_name(var.dtype)} {name}"

    def shared_decl(self, buf: S.Buffer, name: str, size: int) -> str:
        raise NotImplementedError

    def local_decl(self, buf: S.Buffer, name: str, size: int) -> str:
        return f"{self.storage_type(buf.dtype)} {name}[{size}];"

    def let_decl(self, name: str, type_name: str, value: str) -> str:
        """The declaration of an immutable local (``LetStmt``)."""
        return f"{type_name} {name} = {value};"

    def for_header(self, name: str, type_name: str, lo: str, hi: str) -> str:
        return f"for ({type_name} {name} = {lo}; {name} < {hi}; ++{name}) {{"

    def unroll_pragma(self, f: S.For) -> str:
        """The line before an ``unrolled`` / ``vectorized`` loop ("": none)."""
        return "#pragma unroll"

    def float_literal(self, value: float, dtype: str) -> str:
        if math.isnan(value):
            return f"(({self.type_name(dtype)})NAN)"
        if math.isinf(value):
            return f"(({self.type_name(dtype)})({'-' if value < 0 else ''}INFINITY))"
        text = repr(float(value))
        if "e" not in text and "." not in text:
            text += ".0"
        if dtype == "float32":
            return text + "f"
        if dtype == "float64":
            return text
        return f"(({self.type_name(dtype)}){text}f)"

    def wrap(self, code: str, dtype: str) -> str:
        """An integer result brought back to the range of ``dtype`` (a language that computes
        narrow integers in 32 bits wraps them here; C's types do it themselves)."""
        return code

    def select(self, cond: str, true_value: str, false_value: str) -> str:
        return f"({cond} ? {true_value} : {false_value})"

    def buffer_index(self, index: E.PrimExpr, buf: S.Buffer) -> str:
        """The code of a (flat) index into ``buf``."""
        return self.visit(index)

    def element_ref(self, buf: S.Buffer, index: str, node) -> str:
        """The lvalue of element ``index`` (code) of ``buf``."""
        return f"{self.name_of(buf)}[{index}]"

    def load_value(self, buf: S.Buffer, ref: str) -> str:
        """The value read through ``ref`` (as ``element_ref`` returns it)."""
        return f"({ref} != 0)" if buf.dtype == "bool" else ref

    def store_value(self, buf: S.Buffer, value: str) -> str:
        """``value`` as stored into an element of ``buf``."""
        return f"({self.BOOL_STORAGE})({value})" if buf.dtype == "bool" else value

    def store_stmt(self, buf: S.Buffer, index: str, value: str, node) -> str:
        """The statement storing ``value`` (code) at element ``index`` (code) of ``buf``."""
        return f"{self.element_ref(buf, index, node)} = {self.store_value(buf, value)};"

    def floor_helper(self, kind: str, dtype: str) -> str:
        """The name of the helper function of ``kind`` ("floordiv" / "floormod") for integers of
        ``dtype``; the kernel then needs its definition (``floor_helper_definition``)."""
        self.needs.add(f"{kind}_{dtype}")
        return f"tc_{kind}_{self.TYPES[dtype]}"

    def floor_helper_definition(self, kind: str, dtype: str) -> str:
        """The definition of ``floor_helper(kind, dtype)``: ``arith.floor_divmod_general``
        printed by this generator."""
        name, t = self.floor_helper(kind, dtype), self.type_name(dtype)
        body = " ".join(self.floor_helper_body(kind, dtype))
        return f"inline {t} {name}({t} a, {t} b) {{ {body} }}"

    def floor_helper_body(self, kind: str, dtype: str) -> list[str]:
        """The statements of the helper's body, for operands ``a`` and ``b``: a declaration per
        ``Let`` of the general form (remainder, quotient), then the ``return``."""
        a, b = E.Var("a", dtype), E.Var("b", dtype)
        self.var_code[a], self.var_code[b] = "a", "b"
        e = arith.floor_divmod_general(E.FloorDiv(a, b) if kind == "floordiv" else
                                       E.FloorMod(a, b))
        lines = []
        while isinstance(e, E.Let):
            lines.append(self.let_decl(e.var.name, self.type_name(dtype), self.visit(e.value)))
            self.var_code[e.var] = e.var.name
            e = e.body
        return lines + [f"return {self.visit(e)};"]

    def vector_load(self, lanes: int, ptr: str, buf: S.Buffer) -> str:
        """A ``lanes``-vector read at ``ptr`` (code: the element's address) of ``buf``."""
        raise NotImplementedError

    def vector_store(self, lanes: int, value: str, ptr: str, buf: S.Buffer) -> str:
        raise NotImplementedError

    def vector_result(self, code: str, dtype: str, lanes: int) -> str:
        """The result of a vector operation of element type ``dtype`` (``wrap`` for vectors)."""
        return code

    def preamble(self) -> list[str]:
        """Lines before the kernels (extensions, helpers)."""
        return []

    # -- names and types ------------------------------------------------------------------------
    def type_name(self, dtype: str, node=None) -> str:
        lanes = dt.lanes(dtype)
        base = dt.element_of(dtype)
        if base not in self.TYPES:
            raise self.error(f"{type(self).__name__}: no type for {dtype}", node)
        self.dtypes_used.add(base)
        name = self.TYPES[base]
        return name if lanes == 1 else f"{name}{lanes}"

    def storage_type(self, dtype: str) -> str:
        return self.BOOL_STORAGE if dtype == "bool" else self.type_name(dtype)

    def name_of(self, node, hint: str | None = None) -> str:
        """The identifier of a Var or Buffer (made from ``hint``, by default the node's name),
        unique in the kernel and the same at every use."""
        key = id(node)
        if key in self.names:
            return self.names[key][0]
        base = self.identifier(node, node.name if hint is None else hint)
        name, k = base, 0
        while name in self.used or self.reserved(name):
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        self.names[key] = (name, node)   # keep the node alive: ids stay unique
        return name

    def identifier(self, node, hint: str) -> str:
        """The identifier ``name_of`` starts from (it appends ``_1``, ``_2``, ... if taken)."""
        base = re.sub(r"[^0-9A-Za-z_]", "_", hint) or "v"
        if base[0].isdigit():
            base = "v_" + base
        if base in _C_KEYWORDS or base.startswith("tc_") or base.startswith("get_"):
            base = base + "_"
        return base

    def reserved(self, name: str) -> bool:
        """Whether ``name`` cannot be an identifier of the language (``name_of`` skips it)."""
        return False

    def emit(self, line: str):
        self.lines.append(self.INDENT * self.depth + line)

    def error(self, message: str, node=None) -> Exception:
        """The exception for ``node``, which the language cannot express."""
        where = f"kernel {self.kernel_name}: " if self.kernel_name else ""
        return self.ERROR(where + message, node)

    def const_size(self, buf: S.Buffer) -> int:
        """The element count of a shared / local array (a constant)."""
        n = 1
        for x in buf.shape:
            c = E.as_int(self.analyzer.simplify(x))
            if c is None:
                raise self.error(f"{buf.scope} buffer {buf.name} has the non-constant size "
                                 f"{tuple(buf.shape)}; a {buf.scope} array needs a constant "
                                 f"size", buf)
            n *= c
        return max(n, 1)

    # -- the kernel -----------------------------------------------------------------------------
    def begin_kernel(self, kernel: DeviceKernel, nonneg_scalars: Sequence[E.Var] = ()) -> None:
        """What the body of ``kernel`` may assume: its thread indices (their code and ranges) and
        the scalar parameters that are sizes (``nonneg_scalars``, ``>= 0``)."""
        self.kernel_name = kernel.name
        for tag, var in kernel.thread_vars.items():
            self.var_code[var] = self.thread_index(tag)
            ext = _axis_extent(kernel, tag)
            if ext is not None:
                self.analyzer.bind(var, Range(E.IntImm(0, var.dtype), E.IntImm(ext, var.dtype)))
            else:
                self.analyzer.update_bound(var, 0, None)
        for v in nonneg_scalars:
            if dt.is_int(v.dtype):
                self.analyzer.update_bound(v, 0, None)

    def kernel_source(self, kernel: DeviceKernel, nonneg_scalars: Sequence[E.Var] = ()) -> str:
        """The source of one kernel function (no preamble).

        ``nonneg_scalars``: the scalar parameters known to be ``>= 0`` (the shape sizes among
        them, ``nonneg_scalars(kernel, host)``), for cheaper integer division.
        """
        func = kernel.func
        self.begin_kernel(kernel, nonneg_scalars)
        written = written_buffers(func.body)
        params = []
        for h, buf in func.buffer_map:
            params.append(self.buffer_param(buf, self.name_of(buf), buf in written))
        for v in func.scalar_params:
            self.var_code[v] = self.name_of(v)
            params.append(self.scalar_param(v, self.var_code[v]))
        self.lines = []
        self.emit(self.kernel_signature(kernel, params) + " {")
        self.depth += 1
        shared, body = kernel_body(kernel)
        for buf in shared:
            self.emit(self.shared_decl(buf, self.name_of(buf), self.const_size(buf)))
        self.visit(body)
        self.depth -= 1
        self.emit("}")
        return "\n".join(self.lines)

    def visit_default(self, node, *args):
        what = "statement" if isinstance(node, S.Stmt) else "expression"
        raise self.error(f"{type(self).__name__}: cannot generate the {what} "
                         f"{type(node).__name__} {node!r}", node)

    # -- statements -----------------------------------------------------------------------------
    def visit_SeqStmt(self, s: S.SeqStmt):
        for c in s.seq:
            self.visit(c)

    def visit_BufferStore(self, s: S.BufferStore):
        buf = s.buffer
        index = self.buffer_index(s.indices[0], buf)
        self.emit(self.store_stmt(buf, index, self.visit(s.value), s))

    def visit_Evaluate(self, s: S.Evaluate):
        v = s.value
        if isinstance(v, E.IntImm):
            return
        if isinstance(v, E.Call) and v.op in BARRIER_OPS:
            self.emit(self.barrier_stmt())
            return
        if isinstance(v, E.Call) and v.op == E.PREFETCH:
            return      # a CPU cache hint: device code has no use for it
        self.emit(self.visit(v) + ";")

    def visit_IfThenElse(self, s: S.IfThenElse):
        self.emit(f"if ({self.visit(s.condition)}) {{")
        self.depth += 1
        with self.analyzer.with_constraint(s.condition):
            self.visit(s.then_case)
        self.depth -= 1
        if s.else_case is not None:
            self.emit("} else {")
            self.depth += 1
            with self.analyzer.with_constraint(E.Not(s.condition)):
                self.visit(s.else_case)
            self.depth -= 1
        self.emit("}")

    def visit_LetStmt(self, s: S.LetStmt):
        name = self.name_of(s.var)
        self.emit(self.let_decl(name, self.type_name(s.var.dtype, s), self.visit(s.value)))
        self.var_code[s.var] = name
        self.assume_let(s.var, s.value)
        self.visit(s.body)

    def assume_let(self, var: E.Var, value: E.PrimExpr):
        """Tell the analyzer ``var == value``: for an integer computed from indices only (a
        value read from memory may change before ``var`` is used: never substituted)."""
        if dt.is_integer(var.dtype) and not _loaded_buffers(value):
            self.analyzer.bind(var, value)

    def visit_Allocate(self, s: S.Allocate):
        buf = s.buffer
        if buf.scope == "shared":
            raise self.error(f"shared buffer {buf.name} must be allocated at the top of the "
                             f"kernel (split_host_device hoists it)", s)
        if buf.scope != "local":
            raise self.error(f"a {buf.scope} buffer ({buf.name}) cannot be allocated inside a "
                             f"kernel", s)
        self.emit(self.local_decl(buf, self.name_of(buf), self.const_size(buf)))
        self.visit(s.body)

    def visit_AssertStmt(self, s: S.AssertStmt):
        raise self.error(f"a run-time check is left in the kernel ({s.message}); "
                         f"split_host_device turns them into error reports", s)

    def visit_For(self, f: S.For):
        if f.kind == "thread_binding":
            raise self.error(f"loop {f.loop_var.name} is still bound to {f.thread_tag}; run "
                             f"split_host_device first", f)
        if f.kind == "vectorized" and self.try_vectorize(f):
            return
        v = f.loop_var
        name = self.name_of(v)
        ty = self.type_name(v.dtype, f)
        self.var_code[v] = name
        lo = self.loop_bound(f.min)
        hi = self.loop_bound(f.extent if _is_zero(f.min) else
                             self.analyzer.simplify(E.Add(f.min, f.extent)))
        if f.kind in ("unrolled", "vectorized") and self.unroll_pragma(f):
            self.emit(self.unroll_pragma(f))
        self.emit(self.for_header(name, ty, lo, hi))
        self.depth += 1
        self.analyzer.bind(v, Range(f.min, f.extent))
        self.visit(f.body)
        self.depth -= 1
        self.emit("}")

    def loop_bound(self, e: E.PrimExpr) -> str:
        return self.visit(e)

    # -- vectorized loops ------------------------------------------------------------------
    # how one lane of a vector value is read (``{v}``: the vector, ``{i}``: the lane); empty:
    # the language has no lane access and strided / register stores stay scalar loops
    VECTOR_LANE_ACCESS = ""
    # the bytes the language aligns its vector types to at most (0: no aligned accesses)
    VECTOR_ALIGN = 0

    def try_vectorize(self, f: S.For) -> bool:
        """Emit ``f`` as vector operations when its body allows; False (nothing emitted) if not."""
        lanes = f.extent.value if isinstance(f.extent, E.IntImm) else None
        if lanes not in self.VECTOR_LANES:
            return False
        body = f.body
        guard = None
        if isinstance(body, S.IfThenElse) and body.else_case is None and \
                not _uses(body.condition, f.loop_var):
            guard, body = body.condition, body.then_case   # a tail test outside the vector
        stores = body.seq if isinstance(body, S.SeqStmt) else (body,)
        if not all(isinstance(s, S.BufferStore) for s in stores):
            return False
        v = f.loop_var
        plans = []
        for st in stores:
            if st.buffer.dtype == "bool" or not self._vectorizable(st.value, v):
                return False
            base = arith.ramp_base(st.indices[0], v)
            if base is None or st.buffer.scope == "local":
                # a strided store (a transposed shared tile) or a register array: the value
                # is computed as one vector, stored lane by lane (a private array indexed by
                # constants stays in registers; a vector store into it would not)
                if not self.VECTOR_LANE_ACCESS or not _loaded_buffers(st.value) or \
                        not _uses(st.value, v):
                    return False
                base = None
            plans.append((st, base))
        # stores must not feed loads of the same buffer inside the loop (order would change)
        stored = {st.buffer for st in stores}
        for st in stores:
            if any(b in stored for b in _loaded_buffers(st.value)):
                return False
        lo = f.min
        if guard is not None:
            self.emit(f"if ({self.visit(guard)}) {{")
            self.depth += 1
        for st, base in plans:
            vec = self._vexpr(st.value, v, lanes, lo)
            name = self.name_of(st.buffer)
            if base is None:
                tmp = self.name_of(object(), "vec")
                vt = self.type_name(dt.with_lanes(st.value.dtype, lanes))
                self.emit(self.let_decl(tmp, vt, vec))
                for lane in range(lanes):
                    at = arith.lane_index(st.indices[0], v, E.Add(lo, E.IntImm(lane, v.dtype)),
                                          self.analyzer)
                    self.emit(self.store_stmt(st.buffer, self.visit(at),
                                              self.VECTOR_LANE_ACCESS.format(v=tmp, i=lane), st))
                continue
            base = arith.simplify(E.Add(base, lo)) if not _is_zero(lo) else base
            ptr = f"{name} + {self.visit(base)}"
            if self._aligned(st.buffer, base, lanes):
                self.emit(self.aligned_vector_store(lanes, vec, ptr, st.buffer))
            else:
                self.emit(self.vector_store(lanes, vec, ptr, st.buffer))
        if guard is not None:
            self.depth -= 1
            self.emit("}")
        return True

    def _aligned(self, buf: S.Buffer, base, lanes: int) -> bool:
        """Whether ``buf + base`` is provably aligned to a ``lanes``-vector: the buffer's start
        is (a kernel parameter: a whole device allocation; a shared array the kernel declares
        aligned) and ``base`` is a multiple of ``lanes``."""
        size = lanes * self.element_bytes(buf)
        if not self.VECTOR_ALIGN or size > self.VECTOR_ALIGN or buf.scope == "local":
            return False
        return arith.is_aligned(base, lanes, self.analyzer)

    def element_bytes(self, buf: S.Buffer) -> int:
        """The size of one element of ``buf`` as the kernel declares it."""
        return max(1, dt.bits(buf.dtype) // 8)

    def aligned_vector_load(self, lanes: int, ptr: str, buf: S.Buffer) -> str:
        return self.vector_load(lanes, ptr, buf)

    def aligned_vector_store(self, lanes: int, value: str, ptr: str, buf: S.Buffer) -> str:
        return self.vector_store(lanes, value, ptr, buf)

    def _vectorizable(self, e, v) -> bool:
        if not _uses(e, v):
            return True
        if isinstance(e, E.BufferLoad):
            return arith.ramp_base(e.indices[0], v) is not None and e.buffer.dtype != "bool" \
                and e.buffer.scope != "local"
        if isinstance(e, (E.Add, E.Sub, E.Mul, E.Div)) and dt.is_float(e.dtype):
            return self._vectorizable(e.a, v) and self._vectorizable(e.b, v)
        if isinstance(e, (E.Min, E.Max)) and dt.is_float(e.dtype):
            return self._vectorizable(e.a, v) and self._vectorizable(e.b, v)
        if isinstance(e, E.Call) and e.op in self.MATH and e.op != "round" or \
                isinstance(e, E.Call) and e.op == "sigmoid":
            return all(self._vectorizable(a, v) for a in e.args)
        return False

    def _vexpr(self, e, v, lanes: int, lo) -> str:
        vt = self.type_name(dt.with_lanes(e.dtype, lanes))
        if not _uses(e, v):
            return f"(({vt})({self.visit(e)}))"          # a broadcast
        if isinstance(e, E.BufferLoad):
            base = arith.ramp_base(e.indices[0], v)
            base = arith.simplify(E.Add(base, lo)) if not _is_zero(lo) else base
            ptr = f"{self.name_of(e.buffer)} + {self.visit(base)}"
            if self._aligned(e.buffer, base, lanes):
                return self.aligned_vector_load(lanes, ptr, e.buffer)
            return self.vector_load(lanes, ptr, e.buffer)
        if isinstance(e, (E.Add, E.Sub, E.Mul, E.Div)):
            op = {E.Add: "+", E.Sub: "-", E.Mul: "*", E.Div: "/"}[type(e)]
            return self.vector_result(
                f"({self._vexpr(e.a, v, lanes, lo)} {op} {self._vexpr(e.b, v, lanes, lo)})",
                e.dtype, lanes)
        if isinstance(e, (E.Min, E.Max)):
            fn = self.FLOAT_MIN_MAX[isinstance(e, E.Max)]
            return f"{fn}({self._vexpr(e.a, v, lanes, lo)}, {self._vexpr(e.b, v, lanes, lo)})"
        if isinstance(e, E.Call) and e.op == "sigmoid":
            x = self._vexpr(e.args[0], v, lanes, lo)
            one = self.float_literal(1.0, e.dtype)
            return self.vector_result(f"(({vt}){one} / (({vt}){one} + exp(-({x}))))", e.dtype,
                                      lanes)
        args = ", ".join(self._vexpr(a, v, lanes, lo) for a in e.args)
        return self.vector_result(f"{self.MATH[e.op]}({args})", e.dtype, lanes)

    # -- expressions ----------------------------------------------------------------------------
    def visit_Var(self, v: E.Var) -> str:
        code = self.var_code.get(v)
        if code is None:
            raise self.error(f"variable {v.name} is not defined in the kernel (it is neither a "
                             f"thread index, a scalar parameter, a loop variable nor a let)", v)
        return code

    def visit_IntImm(self, e: E.IntImm) -> str:
        if e.dtype == "bool":
            return "true" if e.value else "false"
        if e.dtype == "int64":
            return f"{e.value}L" if e.value != -2 ** 63 else "(-9223372036854775807L - 1L)"
        if e.dtype == "int32":
            return str(e.value) if e.value != -2 ** 31 else "(-2147483647 - 1)"
        if e.dtype.startswith("uint"):
            return f"(({self.type_name(e.dtype)}){e.value}u)"
        return f"(({self.type_name(e.dtype)}){e.value})"

    def visit_FloatImm(self, e: E.FloatImm) -> str:
        return self.float_literal(e.value, e.dtype)

    def visit_StringImm(self, e):
        raise self.error(f"a string constant ({e.value!r}) cannot appear in kernel code", e)

    def _binary(self, e, op: str) -> str:
        return self.wrap(f"({self.visit(e.a)} {op} {self.visit(e.b)})", e.dtype)

    def visit_Add(self, e): return self._binary(e, "+")
    def visit_Sub(self, e): return self._binary(e, "-")
    def visit_Mul(self, e): return self._binary(e, "*")
    def visit_LT(self, e): return self._binary(e, "<")
    def visit_LE(self, e): return self._binary(e, "<=")
    def visit_GT(self, e): return self._binary(e, ">")
    def visit_GE(self, e): return self._binary(e, ">=")
    def visit_EQ(self, e): return self._binary(e, "==")
    def visit_NE(self, e): return self._binary(e, "!=")
    def visit_And(self, e): return self._binary(e, "&&")
    def visit_Or(self, e): return self._binary(e, "||")

    def visit_Not(self, e): return f"(!{self.visit(e.a)})"

    def visit_Div(self, e):
        return self._binary(e, "/")   # C's truncating integer division, float division

    def visit_Mod(self, e):
        if dt.is_float(e.dtype):
            return f"fmod({self.visit(e.a)}, {self.visit(e.b)})"
        return self._binary(e, "%")

    def visit_FloorDiv(self, e):
        if dt.is_integer(e.dtype) and arith.floor_is_trunc(e, self.analyzer):
            return self.visit(E.Div(e.a, e.b))
        a, b = self.visit(e.a), self.visit(e.b)
        if dt.is_float(e.dtype):
            return f"floor({a} / {b})"
        return self.wrap(f"{self.floor_helper('floordiv', e.dtype)}({a}, {b})", e.dtype)

    def visit_FloorMod(self, e):
        if dt.is_integer(e.dtype) and arith.floor_is_trunc(e, self.analyzer):
            return self.visit(E.Mod(e.a, e.b))
        a, b = self.visit(e.a), self.visit(e.b)
        if dt.is_float(e.dtype):
            return f"({a} - floor({a} / {b}) * {b})"
        return self.wrap(f"{self.floor_helper('floormod', e.dtype)}({a}, {b})", e.dtype)

    def _min_max(self, e, is_max: bool) -> str:
        a, b = self.visit(e.a), self.visit(e.b)
        if e.dtype == "bool":
            return f"({a} {'||' if is_max else '&&'} {b})"
        fn = self.FLOAT_MIN_MAX[is_max] if dt.is_float(e.dtype) else ("max" if is_max else "min")
        return f"{fn}({a}, {b})"

    def visit_Min(self, e):
        return self._min_max(e, False)

    def visit_Max(self, e):
        return self._min_max(e, True)

    def visit_Select(self, e: E.Select):
        return self.select(self.visit(e.condition), self.visit(e.true_value),
                           self.visit(e.false_value))

    def visit_Cast(self, e: E.Cast):
        src = e.value.dtype
        if e.dtype == "bool":
            return f"({self.visit(e.value)} != 0)"
        if e.dtype == src:
            return self.visit(e.value)
        return f"(({self.type_name(e.dtype)})({self.visit(e.value)}))"

    def visit_BufferLoad(self, e: E.BufferLoad):
        buf = e.buffer
        index = self.buffer_index(e.indices[0], buf)
        return self.load_value(buf, self.element_ref(buf, index, e))

    def visit_Let(self, e: E.Let):
        return self.visit(substitute(e.body, {e.var: e.value}))

    def visit_Call(self, e: E.Call):
        op = e.op
        args = e.args
        if op == "if_then_else":
            return self.select(self.visit(args[0]), self.visit(args[1]), self.visit(args[2]))
        if op in BARRIER_OPS:
            raise self.error("a barrier inside an expression", e)
        if op == "sigmoid":
            x = self.visit(args[0])
            one = self.float_literal(1.0, e.dtype)
            return f"({one} / ({one} + exp(-({x}))))"
        if op == "rsqrt" and "rsqrt" not in self.MATH:
            one = self.float_literal(1.0, e.dtype)
            return f"({one} / sqrt({self.visit(args[0])}))"
        fn = self.MATH.get(op)
        if fn is None:
            raise self.error(f"{type(self).__name__}: unknown intrinsic {op}", e)
        return f"{fn}({', '.join(self.visit(a) for a in args)})"


# ---------------------------------------------------------------------------------------------
# helpers


def kernel_body(kernel: DeviceKernel) -> tuple[list[S.Buffer], S.Stmt]:
    """The shared arrays a kernel declares at its top, and the body below them."""
    shared, body = [], kernel.func.body
    while isinstance(body, S.Allocate) and body.buffer.scope == "shared":
        shared.append(body.buffer)
        body = body.body
    return shared, body


def nonneg_scalars(kernel: DeviceKernel, host: PrimFunc) -> list[E.Var]:
    """The scalar parameters of ``kernel`` launched with a shape size of ``host`` (the entry
    checks that sizes are ``>= 0``); other scalars (a scalar argument, a host loop variable) may
    be negative."""
    sizes = set(func_shape_vars(host))
    return [v for v, h in zip(kernel.scalar_params, kernel.host_scalars)
            if isinstance(h, E.Var) and h in sizes]


def _axis_extent(kernel: DeviceKernel, tag: str) -> int | None:
    axis = "xyz".index(tag[-1])
    if tag.startswith("threadIdx"):
        return kernel.block[axis]
    g = kernel.grid[axis]
    return g.value if isinstance(g, E.IntImm) else None


def _uses(e, v) -> bool:
    return uses_any(e, [v])


def _is_zero(e) -> bool:
    return isinstance(e, E.IntImm) and e.value == 0


def _buffers_of(node, node_type) -> set:
    """The buffers of the ``node_type`` nodes (BufferLoad / BufferStore) inside ``node``."""
    out = set()

    def f(n):
        if isinstance(n, node_type):
            out.add(n.buffer)
    post_order_visit(node, f)
    return out


def _loaded_buffers(e) -> set:
    return _buffers_of(e, E.BufferLoad)


def written_buffers(s) -> set:
    """Buffers stored to in ``s``."""
    return _buffers_of(s, S.BufferStore)


__all__ = ["CodegenC", "CodegenError", "BARRIER_OPS", "kernel_body", "nonneg_scalars",
           "written_buffers"]
