"""A C-style code generator for device kernels, shared by the GPU back ends.

The input is one kernel of the device form (``tensorir.transform.split_host_device``, see
``docs/lowering.md``, "Device lowering"). ``CodegenC`` walks it and writes C-like source; a
language is a subclass that fills in a small table — type names, how a thread index, a
barrier, a buffer parameter, a shared or local array is written, the math function names —
the way tinygrad's renderers express a target over one shared C-style base. OpenCL C
(``targets.opencl_backend.codegen``) is one such table.

What the base handles for every language:

* names: every Var and Buffer gets a unique C identifier (``i``, ``i_1``, ...);
* integer ``floordiv`` / ``floormod``: C's ``/`` and ``%`` where an ``arith.Analyzer`` that
  knows the loop and thread ranges proves both operands non-negative, else a helper that
  rounds toward minus infinity (``tc_floordiv_i32``);
* ``if_then_else`` and ``Select`` as ``?:``; a ``Let`` expression is inlined (expressions have
  no side effects);
* ``bool`` buffers are stored as bytes (``uchar``);
* ``vectorized`` loops of a constant extent the language has vectors for, whose body is a store
  at ``base + v`` of loads at ``base' + v`` and loop-invariant values, become one vector
  load/compute/store (``vload4`` / ``vstore4`` in OpenCL; an aligned ``float4`` pointer access
  where the offset is a provable multiple of the lanes: kernel parameters are whole device
  allocations and shared arrays are declared aligned, ``VECTOR_ALIGN``); a store that is
  strided (a transposed shared tile) or into a ``local`` array (a register fragment) takes the
  vector value lane by lane (``VECTOR_LANE_ACCESS``); other vectorized loops run as unrolled
  scalar loops.

Examples
--------
>>> from tilecraft.targets.opencl_backend.codegen import OpenCLCodegen      # doctest: +SKIP
>>> src = OpenCLCodegen().kernel_source(split.kernels[0])         # doctest: +SKIP
"""
from __future__ import annotations

import math
import re
from typing import Iterable

from tilecraft.tensorir import arith
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import expr as E
from tilecraft.tensorir import stmt as S
from tilecraft.tensorir.stmt import Range
from tilecraft.tensorir.transform.device import BARRIER_OP, DeviceKernel


class CodegenError(E.TIRError, ValueError):
    """A kernel the language cannot express (a dtype it lacks, an unknown intrinsic)."""


_C_KEYWORDS = set("""
auto break case char const continue default do double else enum extern float for goto if inline
int long register restrict return short signed sizeof static struct switch typedef union
unsigned void volatile while bool half uchar ushort uint ulong kernel global local private
constant read_only write_only true false min max select vload vstore barrier main
""".split())

_BINARY = {E.Add: "+", E.Sub: "-", E.Mul: "*", E.LT: "<", E.LE: "<=", E.GT: ">", E.GE: ">=",
           E.EQ: "==", E.NE: "!=", E.And: "&&", E.Or: "||"}


class CodegenC:
    """The shared C-style kernel generator. Subclasses set the class attributes and override
    the ``*_decl`` / ``thread_index`` / ``barrier_stmt`` hooks."""

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
    INDENT = "  "

    def __init__(self):
        self.lines: list[str] = []
        self.depth = 0
        self.names: dict = {}
        self.used: set[str] = set()
        self.analyzer = arith.Analyzer()
        self.needs: set[str] = set()       # helpers / extensions the kernel uses
        self.dtypes_used: set[str] = set()

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

    def vector_load(self, lanes: int, ptr: str) -> str:
        raise NotImplementedError

    def vector_store(self, lanes: int, value: str, ptr: str) -> str:
        raise NotImplementedError

    def preamble(self) -> list[str]:
        """Lines before the kernels (extensions, helpers)."""
        return []

    # -- names and types ------------------------------------------------------------------------
    def type_name(self, dtype: str) -> str:
        lanes = dt.lanes(dtype)
        base = dt.element_of(dtype)
        if base not in self.TYPES:
            raise CodegenError(f"{type(self).__name__}: no type for {dtype}")
        self.dtypes_used.add(base)
        name = self.TYPES[base]
        return name if lanes == 1 else f"{name}{lanes}"

    def storage_type(self, dtype: str) -> str:
        return self.BOOL_STORAGE if dtype == "bool" else self.type_name(dtype)

    def name_of(self, node, hint: str) -> str:
        key = id(node)
        if key in self.names:
            return self.names[key][0]
        base = re.sub(r"[^0-9A-Za-z_]", "_", hint) or "v"
        if base[0].isdigit():
            base = "v_" + base
        if base in _C_KEYWORDS or base.startswith("tc_") or base.startswith("get_"):
            base = base + "_"
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        self.names[key] = (name, node)   # keep the node alive: ids stay unique
        return name

    def emit(self, line: str):
        self.lines.append(self.INDENT * self.depth + line)

    # -- the kernel -----------------------------------------------------------------------------
    def kernel_source(self, kernel: DeviceKernel) -> str:
        """The source of one kernel function (no preamble)."""
        func = kernel.func
        self.thread_exprs = {}
        for tag, var in kernel.thread_vars.items():
            self.thread_exprs[var] = self.thread_index(tag)
            ext = self._axis_extent(kernel, tag)
            if ext is not None:
                self.analyzer.bind(var, Range(E.IntImm(0, var.dtype), E.IntImm(ext, var.dtype)))
            else:
                self.analyzer.update_bound(var, 0, None)
        written = _written_buffers(func.body)
        params = []
        for h, buf in func.buffer_map:
            params.append(self.buffer_param(buf, self.name_of(buf, buf.name), buf in written))
        for v in func.scalar_params:
            params.append(self.scalar_param(v, self.name_of(v, v.name)))
            self.analyzer.update_bound(v, 0, None)   # host scalars are sizes: >= 0
        self.lines = []
        self.emit(self.kernel_signature(kernel, params) + " {")
        self.depth += 1
        body = func.body
        while isinstance(body, S.Allocate) and body.buffer.scope == "shared":
            buf = body.buffer
            self.emit(self.shared_decl(buf, self.name_of(buf, buf.name), _const_size(buf)))
            body = body.body
        self.stmt(body)
        self.depth -= 1
        self.emit("}")
        return "\n".join(self.lines)

    @staticmethod
    def _axis_extent(kernel: DeviceKernel, tag: str) -> int | None:
        axis = "xyz".index(tag[-1])
        if tag.startswith("threadIdx"):
            return kernel.block[axis]
        g = kernel.grid[axis]
        return g.value if isinstance(g, E.IntImm) else None

    # -- statements -----------------------------------------------------------------------------
    def stmt(self, s):
        if s is None:
            return
        method = getattr(self, "stmt_" + type(s).__name__, None)
        if method is None:
            raise CodegenError(f"{type(self).__name__}: cannot generate {type(s).__name__} in a "
                               f"kernel", s)
        method(s)

    def stmt_SeqStmt(self, s: S.SeqStmt):
        for c in s.seq:
            self.stmt(c)

    def stmt_BufferStore(self, s: S.BufferStore):
        buf = s.buffer
        value = self.expr(s.value)
        if buf.dtype == "bool":
            value = f"({self.BOOL_STORAGE})({value})"
        self.emit(f"{self.name_of(buf, buf.name)}[{self.expr(s.indices[0])}] = {value};")

    def stmt_Evaluate(self, s: S.Evaluate):
        v = s.value
        if isinstance(v, E.IntImm):
            return
        if isinstance(v, E.Call) and v.op == BARRIER_OP:
            self.emit(self.barrier_stmt())
            return
        self.emit(self.expr(v) + ";")

    def stmt_IfThenElse(self, s: S.IfThenElse):
        self.emit(f"if ({self.expr(s.condition)}) {{")
        self.depth += 1
        with self.analyzer.with_constraint(s.condition):
            self.stmt(s.then_case)
        self.depth -= 1
        if s.else_case is not None:
            self.emit("} else {")
            self.depth += 1
            with self.analyzer.with_constraint(E.Not(s.condition)):
                self.stmt(s.else_case)
            self.depth -= 1
        self.emit("}")

    def stmt_LetStmt(self, s: S.LetStmt):
        name = self.name_of(s.var, s.var.name)
        self.emit(f"{self.type_name(s.var.dtype)} {name} = {self.expr(s.value)};")
        if dt.is_integer(s.var.dtype):
            b = self.analyzer.const_int_bound(s.value)
            if b.min_value >= 0:
                self.analyzer.update_bound(s.var, 0, None)
        self.stmt(s.body)

    def stmt_Allocate(self, s: S.Allocate):
        buf = s.buffer
        if buf.scope == "shared":
            raise CodegenError(f"shared buffer {buf.name} must be allocated at the top of the "
                               f"kernel (split_host_device hoists it)", s)
        if buf.scope == "global":
            raise CodegenError(f"global buffer {buf.name} cannot be allocated inside a kernel", s)
        self.emit(self.local_decl(buf, self.name_of(buf, buf.name), _const_size(buf)))
        self.stmt(s.body)

    def stmt_AssertStmt(self, s: S.AssertStmt):
        raise CodegenError(f"a run-time check is left in the kernel ({s.message}); "
                           f"split_host_device turns them into error reports", s)

    def stmt_For(self, f: S.For):
        if f.kind == "vectorized" and self._try_vectorize(f):
            return
        v = self.name_of(f.loop_var, f.loop_var.name)
        ty = self.type_name(f.loop_var.dtype)
        lo = self.expr(f.min)
        hi = self.expr(E.Add(f.min, f.extent)) if not (isinstance(f.min, E.IntImm) and
                                                       f.min.value == 0) else self.expr(f.extent)
        if f.kind in ("unrolled", "vectorized"):
            self.emit(self.unroll_pragma(f))
        if f.kind == "thread_binding":
            raise CodegenError(f"loop {f.loop_var.name} is still bound to {f.thread_tag}; run "
                               f"split_host_device first", f)
        self.emit(f"for ({ty} {v} = {lo}; {v} < {hi}; ++{v}) {{")
        self.depth += 1
        self.analyzer.bind(f.loop_var, Range(f.min, f.extent))
        self.stmt(f.body)
        self.depth -= 1
        self.emit("}")

    def unroll_pragma(self, f: S.For) -> str:
        return "#pragma unroll"

    # -- vectorized loops ------------------------------------------------------------------
    def _try_vectorize(self, f: S.For) -> bool:
        lanes = f.extent.value if isinstance(f.extent, E.IntImm) else None
        if lanes not in self.VECTOR_LANES:
            return False
        body = f.body
        guard = None
        if isinstance(body, S.IfThenElse) and body.else_case is None and \
                not E_uses(body.condition, f.loop_var):
            guard, body = body.condition, body.then_case   # a tail test outside the vector
        stores = body.seq if isinstance(body, S.SeqStmt) else (body,)
        if not all(isinstance(s, S.BufferStore) for s in stores):
            return False
        v = f.loop_var
        plans = []
        for st in stores:
            if st.buffer.dtype == "bool" or not self._vectorizable(st.value, v):
                return False
            base = _unit_offset(st.indices[0], v)
            if base is None or st.buffer.scope == "local":
                # a strided store (a transposed shared tile) or a register array: the value
                # is computed as one vector, stored lane by lane (a private array indexed by
                # constants stays in registers; a vector store into it would not)
                if not self.VECTOR_LANE_ACCESS or not _loaded_buffers(st.value) or \
                        not E_uses(st.value, v):
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
            self.emit(f"if ({self.expr(guard)}) {{")
            self.depth += 1
        for st, base in plans:
            vec = self._vexpr(st.value, v, lanes, lo)
            name = self.name_of(st.buffer, st.buffer.name)
            if base is None:
                tmp = self.name_of(object(), "vec")
                vt = self.type_name(dt.with_lanes(st.value.dtype, lanes))
                self.emit(f"{vt} {tmp} = {vec};")
                for lane in range(lanes):
                    at = arith.simplify(_subst(st.indices[0], v, E.Add(lo, E.IntImm(
                        lane, v.dtype))))
                    self.emit(f"{name}[{self.expr(at)}] = "
                              f"{self.VECTOR_LANE_ACCESS.format(v=tmp, i=lane)};")
                continue
            base = arith.simplify(E.Add(base, lo)) if not _is_zero(lo) else base
            ptr = f"{name} + {self.expr(base)}"
            if self._aligned(st.buffer, base, lanes):
                self.emit(self.aligned_vector_store(lanes, vec, ptr, st.buffer))
            else:
                self.emit(self.vector_store(lanes, vec, ptr))
        if guard is not None:
            self.depth -= 1
            self.emit("}")
        return True

    # how one lane of a vector value is read (``{v}``: the vector, ``{i}``: the lane); empty:
    # the language has no lane access and strided / register stores stay scalar loops
    VECTOR_LANE_ACCESS = ""
    # the bytes the language aligns its vector types to at most (0: no aligned accesses)
    VECTOR_ALIGN = 0

    def _aligned(self, buf: S.Buffer, base, lanes: int) -> bool:
        """Whether ``buf + base`` is provably aligned to a ``lanes``-vector: the buffer's start
        is (a kernel parameter: a whole device allocation; a shared array the kernel declares
        aligned) and ``base`` is a multiple of ``lanes``."""
        size = lanes * max(1, dt.bits(buf.dtype) // 8)
        if not self.VECTOR_ALIGN or size > self.VECTOR_ALIGN or buf.scope == "local":
            return False
        return self.analyzer.can_prove(E.EQ(E.FloorMod(base, E.IntImm(lanes, base.dtype)),
                                            E.IntImm(0, base.dtype)))

    def aligned_vector_load(self, lanes: int, ptr: str, buf: S.Buffer) -> str:
        return self.vector_load(lanes, ptr)

    def aligned_vector_store(self, lanes: int, value: str, ptr: str, buf: S.Buffer) -> str:
        return self.vector_store(lanes, value, ptr)

    def _vectorizable(self, e, v) -> bool:
        if not E_uses(e, v):
            return True
        if isinstance(e, E.BufferLoad):
            return _unit_offset(e.indices[0], v) is not None and e.buffer.dtype != "bool" \
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
        if not E_uses(e, v):
            return f"(({vt})({self.expr(e)}))"
        if isinstance(e, E.BufferLoad):
            base = _unit_offset(e.indices[0], v)
            base = arith.simplify(E.Add(base, lo)) if not _is_zero(lo) else base
            ptr = f"{self.name_of(e.buffer, e.buffer.name)} + {self.expr(base)}"
            if self._aligned(e.buffer, base, lanes):
                return self.aligned_vector_load(lanes, ptr, e.buffer)
            return self.vector_load(lanes, ptr)
        if isinstance(e, (E.Add, E.Sub, E.Mul, E.Div)):
            op = {E.Add: "+", E.Sub: "-", E.Mul: "*", E.Div: "/"}[type(e)]
            return f"({self._vexpr(e.a, v, lanes, lo)} {op} {self._vexpr(e.b, v, lanes, lo)})"
        if isinstance(e, (E.Min, E.Max)):
            fn = "fmin" if isinstance(e, E.Min) else "fmax"
            return f"{fn}({self._vexpr(e.a, v, lanes, lo)}, {self._vexpr(e.b, v, lanes, lo)})"
        if isinstance(e, E.Call) and e.op == "sigmoid":
            x = self._vexpr(e.args[0], v, lanes, lo)
            one = self.float_literal(1.0, e.dtype)
            return f"(({vt}){one} / (({vt}){one} + exp(-({x}))))"
        args = ", ".join(self._vexpr(a, v, lanes, lo) for a in e.args)
        return f"{self.MATH[e.op]}({args})"

    # -- expressions ----------------------------------------------------------------------------
    def expr(self, e) -> str:
        method = getattr(self, "expr_" + type(e).__name__, None)
        if method is None:
            raise CodegenError(f"{type(self).__name__}: cannot generate the expression "
                               f"{type(e).__name__} {e!r}", e)
        return method(e)

    def expr_Var(self, v: E.Var) -> str:
        t = getattr(self, "thread_exprs", {}).get(v)
        if t is not None:
            return t
        return self.name_of(v, v.name)

    def expr_IntImm(self, e: E.IntImm) -> str:
        if e.dtype == "bool":
            return "true" if e.value else "false"
        if e.dtype == "int64":
            return f"{e.value}L" if e.value != -2 ** 63 else "(-9223372036854775807L - 1L)"
        if e.dtype == "int32":
            return str(e.value) if e.value != -2 ** 31 else "(-2147483647 - 1)"
        if e.dtype.startswith("uint"):
            return f"(({self.type_name(e.dtype)}){e.value}u)"
        return f"(({self.type_name(e.dtype)}){e.value})"

    def expr_FloatImm(self, e: E.FloatImm) -> str:
        return self.float_literal(e.value, e.dtype)

    def expr_StringImm(self, e):
        raise CodegenError("a string constant cannot appear in kernel code", e)

    def _binary(self, e, op: str) -> str:
        return f"({self.expr(e.a)} {op} {self.expr(e.b)})"

    def expr_Add(self, e): return self._binary(e, "+")
    def expr_Sub(self, e): return self._binary(e, "-")
    def expr_Mul(self, e): return self._binary(e, "*")
    def expr_LT(self, e): return self._binary(e, "<")
    def expr_LE(self, e): return self._binary(e, "<=")
    def expr_GT(self, e): return self._binary(e, ">")
    def expr_GE(self, e): return self._binary(e, ">=")
    def expr_EQ(self, e): return self._binary(e, "==")
    def expr_NE(self, e): return self._binary(e, "!=")
    def expr_And(self, e): return self._binary(e, "&&")
    def expr_Or(self, e): return self._binary(e, "||")

    def expr_Not(self, e): return f"(!{self.expr(e.a)})"

    def expr_Div(self, e):
        return self._binary(e, "/")   # C's truncating integer division, float division

    def expr_Mod(self, e):
        if dt.is_float(e.dtype):
            return f"fmod({self.expr(e.a)}, {self.expr(e.b)})"
        return self._binary(e, "%")

    def _nonneg(self, e) -> bool:
        try:
            return self.analyzer.const_int_bound(e).min_value >= 0
        except Exception:
            return False

    def expr_FloorDiv(self, e):
        if dt.is_float(e.dtype):
            return f"floor({self.expr(e.a)} / {self.expr(e.b)})"
        if self._nonneg(e.a) and self._nonneg(e.b):
            return self._binary(e, "/")
        self.needs.add(f"floordiv_{e.dtype}")
        return f"tc_floordiv_{self.TYPES[e.dtype]}({self.expr(e.a)}, {self.expr(e.b)})"

    def expr_FloorMod(self, e):
        if dt.is_float(e.dtype):
            a, b = self.expr(e.a), self.expr(e.b)
            return f"({a} - floor({a} / {b}) * {b})"
        if self._nonneg(e.a) and self._nonneg(e.b):
            return self._binary(e, "%")
        self.needs.add(f"floormod_{e.dtype}")
        return f"tc_floormod_{self.TYPES[e.dtype]}({self.expr(e.a)}, {self.expr(e.b)})"

    def expr_Min(self, e):
        fn = "fmin" if dt.is_float(e.dtype) else "min"
        return f"{fn}({self.expr(e.a)}, {self.expr(e.b)})"

    def expr_Max(self, e):
        fn = "fmax" if dt.is_float(e.dtype) else "max"
        return f"{fn}({self.expr(e.a)}, {self.expr(e.b)})"

    def expr_Select(self, e: E.Select):
        return f"({self.expr(e.condition)} ? {self.expr(e.true_value)} : " \
               f"{self.expr(e.false_value)})"

    def expr_Cast(self, e: E.Cast):
        src = e.value.dtype
        if e.dtype == "bool":
            return f"({self.expr(e.value)} != 0)"
        if e.dtype == src:
            return self.expr(e.value)
        return f"(({self.type_name(e.dtype)})({self.expr(e.value)}))"

    def expr_BufferLoad(self, e: E.BufferLoad):
        buf = e.buffer
        text = f"{self.name_of(buf, buf.name)}[{self.expr(e.indices[0])}]"
        if buf.dtype == "bool":
            return f"({text} != 0)"
        return text

    def expr_Let(self, e: E.Let):
        from tilecraft.tensorir.functor import substitute
        return self.expr(substitute(e.body, {e.var: e.value}))

    def expr_Call(self, e: E.Call):
        op = e.op
        args = e.args
        if op == "if_then_else":
            return f"({self.expr(args[0])} ? {self.expr(args[1])} : {self.expr(args[2])})"
        if op == "sigmoid":
            x = self.expr(args[0])
            one = self.float_literal(1.0, e.dtype)
            return f"({one} / ({one} + exp(-({x}))))"
        if op == "rsqrt" and "rsqrt" not in self.MATH:
            one = self.float_literal(1.0, e.dtype)
            return f"({one} / sqrt({self.expr(args[0])}))"
        fn = self.MATH.get(op)
        if fn is None:
            raise CodegenError(f"{type(self).__name__}: unknown intrinsic {op}", e)
        return f"{fn}({', '.join(self.expr(a) for a in args)})"


# ---------------------------------------------------------------------------------------------
# helpers


def E_uses(e, v) -> bool:
    from tilecraft.tensorir.transform._common import uses_any
    return uses_any(e, [v])


def _is_zero(e) -> bool:
    return isinstance(e, E.IntImm) and e.value == 0


def _subst(e, v, value):
    from tilecraft.tensorir.functor import substitute
    return substitute(e, {v: value})


def _unit_offset(index, v):
    """``index == base + v`` with ``base`` free of ``v``: ``base``; else None."""
    from tilecraft.tensorir.transform._common import linear_coeff
    r = linear_coeff(index, v)
    if r is None or r[0] != 1:
        return None
    return r[1]


def _buffers_of(node, node_type) -> set:
    """The buffers of the ``node_type`` nodes (BufferLoad / BufferStore) inside ``node``."""
    out = set()
    from tilecraft.tensorir.functor import post_order_visit

    def f(n):
        if isinstance(n, node_type):
            out.add(n.buffer)
    post_order_visit(node, f)
    return out


def _loaded_buffers(e) -> set:
    return _buffers_of(e, E.BufferLoad)


def _written_buffers(s) -> set:
    return _buffers_of(s, S.BufferStore)


def written_buffers(s) -> set:
    """Buffers stored to in ``s``."""
    return _written_buffers(s)


def _const_size(buf: S.Buffer) -> int:
    n = 1
    for x in buf.shape:
        x = arith.simplify(x)
        if not isinstance(x, E.IntImm):
            raise CodegenError(f"{buf.scope} buffer {buf.name} has the non-constant size "
                               f"{tuple(buf.shape)}", buf)
        n *= x.value
    return max(n, 1)


def floordiv_helpers(types: Iterable[str]) -> list[str]:
    """C definitions of ``tc_floordiv_<t>`` / ``tc_floormod_<t>`` for integer C types."""
    out = []
    for t in sorted(set(types)):
        out.append(f"inline {t} tc_floordiv_{t}({t} a, {t} b) {{ {t} q = a / b; "
                   f"return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }}")
        out.append(f"inline {t} tc_floormod_{t}({t} a, {t} b) {{ {t} r = a % b; "
                   f"return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }}")
    return out


__all__ = ["CodegenC", "CodegenError", "floordiv_helpers", "written_buffers"]
