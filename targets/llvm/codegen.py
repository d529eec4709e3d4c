"""Lowered TensorIR -> LLVM IR text, through ``llvmir`` (the text-emitting builder with
llvmlite.ir's API).

Input: PrimFuncs in the form ``tensorir.transform.lower`` produces (no blocks, flat 1-D buffers,
attrs ``arg_buffers`` / ``shape_vars``). Each PrimFunc becomes

* ``<symbol>.compute``: the loop nest, taking flat data pointers (``noalias``) and the values of
  the shape variables and scalar parameters; it returns 0 or an error code;
* ``<symbol>``: the exported entry of ``docs/abi.md``, which checks the packed arguments against
  the function's constraints (``entry.EntryEmitter``) and calls the compute function.

Loop kinds:

* ``serial``: a plain loop.
* ``unrolled``: copied ``extent`` times when the extent is a small constant, else a loop with
  ``llvm.loop.unroll.full``.
* ``vectorized``: the body is evaluated once on vectors of L lanes (the loop variable is
  ``<base, base+1, ..., base+L-1>``): contiguous accesses become vector loads/stores, loads
  with a constant stride of 2 to 4 one wide masked load and a shuffle (``_strided_load``),
  other strided loads from a stack buffer (a register tile) one load per lane
  (``_lane_loads``: shuffles once LLVM promotes the tile), other lane-varying accesses
  gathers/scatters, lane-varying conditions masks. A constant
  extent up to 64 is one vector step; longer or symbolic extents loop over L-lane steps with
  a masked tail.
  Bodies that cannot be vectorized (inner loops, allocations, asserts, stores to a lane-invariant
  address) fall back to a scalar loop carrying ``llvm.loop.vectorize.enable``.
* ``parallel``: the body is outlined into ``i32 fn(i32 task, i32 num_tasks, ptr closure)`` and
  run by the thread pool of ``threadpool``: each task runs its own contiguous region of the
  iterations, in a few chunks, then helps with the chunks other tasks have not claimed yet
  (``_claim_chunks``); parallel loops nested in it run serially.

Lowering has moved ``local`` buffers into the loops that use them (``CompactBufferAllocation``,
``CompactLocalAllocations``), so accumulator tiles become registers. Loads and stores carry one
alias scope per buffer, and reduction updates ``acc + a * b`` become fused multiply-adds.
* ``thread_binding``: rejected (GPU only).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from . import llvmir as ir
import numpy as np

from tilecraft.tensorir import arith
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import (GE, GT, LE, LT, Add, And, BufferLoad, Call, Cast, CmpOp, Div,
                                     FloatImm, FloorDiv, FloorMod, IntImm, Let, Mod, Mul, Not,
                                     NIBBLE_F32, PrimExpr, Reduce, Select, StringImm, TIRError,
                                     Var)
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import IRFunctor, free_vars, post_order_visit
from tilecraft.tensorir.stmt import (Allocate, AssertStmt, Block, BlockRealize, Buffer,
                                     BufferStore, Evaluate, For, IfThenElse, LetStmt, Range,
                                     SeqStmt, Stmt, is_prefetch, ANN_NONTEMPORAL_STORE)
from tilecraft.tensorir.structural import structural_equal

from ..runtime import abi
from . import amx, dot4, intrinsics
from .entry import EntryEmitter, expr_str, fmt_escape as _fmt_escape
from .fp16 import Float16
from .softops import SoftOps
from .irutil import (F16, F32, F64, I1, I8, I32, I64, PTR, ModuleBuilder, const, element_type, gep,
                     is_vector, lane_ids, lanes_of, set_loop_metadata, splat, vec_type)

NONTEMPORAL_ALIGN = 64       # bytes: a non-temporal vector store writes whole aligned lines
STACK_ALLOCA_LIMIT = 4096     # bytes: larger or symbolic intermediates use posix_memalign
# A "local"-scope intermediate (a kernel's private workspace, as a schedule's set_scope makes
# it) of at least WORKSPACE_CACHE_MIN bytes (glibc's default mmap threshold) and at most
# WORKSPACE_CACHE_MAX keeps its memory from call to call (see _cached_workspace): glibc
# maps such a block afresh on each call, or trims it from the heap on free, and the kernel then
# pays a page fault per 4 KB it touches (Winograd's 3.2 MB transformed input of ResNet-18's
# 56 x 56 layers: ~1500 faults, 3.0 ms a call against 1.4 ms with the memory kept)
WORKSPACE_CACHE_MIN = 128 << 10
WORKSPACE_CACHE_MAX = 64 << 20
MAX_VECTOR_LANES = 64         # a constant vectorized extent up to this is one vector step
MAX_UNROLL = 64               # unrolled loops longer than this get unroll metadata instead
ALLOC_ALIGN = 64
STRIDED_LOAD_STRIDES = (2, 3, 4)   # vector loads of these constant strides: wide load + shuffle
PARALLEL_LAUNCH = "tilecraft_rt_parallel_launch"
MAX_TASKS = 256               # the thread pool runs at most this many tasks (255 workers + caller)
# iterations of a parallel loop's innermost statements (a vector lane counts as one) that one
# task must have before another is launched: below it a launch (waking workers, claiming chunks,
# joining) costs more than the work it shares. Known extents decide it at compile time,
# symbolic ones with a few integer operations before the launch (see _task_limit)
PARALLEL_GRAIN = 32768
CHUNKS_PER_TASK = 4           # a parallel loop is claimed in n * 4 chunks (see _claim_chunks)
FMA_METADATA = "tilecraft.fma"    # tags a multiply and add to fuse (see _accumulate)
RUNTIME_NUM_CORES = "tilecraft_rt_num_cores"


@dataclass
class CodegenOptions:
    """What the code generator needs to know about the target."""

    triple: str
    data_layout: str
    pointer_bits: int
    native_f16: bool           # float16 <-> float32 conversions are instructions
    vector_width: int          # bits of a vector register
    num_cores: int | None      # baked-in default thread count (None: all cores at run time)
    target_str: str
    hw_div: dict = field(default_factory=lambda: {32: True, 64: True})  # see softops
    # float16 arithmetic is native (AArch64 +fullfp16): float16 values are ``half`` registers
    # and each operation rounds in hardware; else they compute as float32, rounded after each
    # operation (see ``fp16``)
    fp16_arith: bool = False
    dot_isa: str | None = None  # the packed 8-bit dot product's instructions (see dot4)
    amx_int8: bool = False      # Intel AMX int8 tiles (see amx)


@dataclass
class _VecCtx:
    """The vectorized loop being emitted: its variable, lane count, active-lane mask."""

    var: Var
    lanes: int
    mask: object = None                       # <lanes x i1> or None (all lanes)
    lets: dict = field(default_factory=dict)  # let var -> its lane-varying value expression
    # the loop's ANN_NONTEMPORAL_STORE value: the bytes from which a stored buffer is written
    # non-temporally (its whole size, tested at run time where it is symbolic); 0: never
    nontemporal: int = 0
    # every lane's loop value lies in the loop's range (not a masked tail step past its end):
    # a mask then only comes from a condition (``_stack_lanes_in_bounds``)
    in_range: bool = True


class _FnCtx:
    """Per-LLVM-function state: builder, variables, buffers, live heap allocations."""

    def __init__(self, fn: ir.Function, func_name: str):
        self.fn = fn
        self.func_name = func_name
        # allocas go to their own first block (so loops do not grow the stack); code starts
        # in the next one, and finish() links the two
        self.entry = fn.append_basic_block("entry")
        self.start = fn.append_basic_block("start")
        self.builder = ir.IRBuilder(self.start)
        self._alloca_builder = ir.IRBuilder(self.entry)
        self.env: dict[Var, object] = {}
        self.buffers: dict[Buffer, object] = {}
        # cleanups for an error return: each emits the code that frees (or gives back) one
        # live heap buffer
        self.heap: list = []
        # what is known of the integers in scope (loop ranges, let values, sizes >= 0), for
        # arith.is_nonneg and arith.lower_floor_divmod
        self.analyzer = arith.Analyzer()
        self.parallel_depth = 0
        self.nontemporal = False        # a non-temporal store was emitted (fenced at the end)
        self.vec: _VecCtx | None = None

    def alloca(self, ty, name: str = "", align: int | None = None):
        """An alloca in the entry block, so loops do not grow the stack."""
        slot = self._alloca_builder.alloca(ty, name=name)
        slot.type = PTR  # opaque, so GEPs into it need no typed-pointer bookkeeping
        if align:
            slot.align = align
        return slot

    def finish(self):
        self._alloca_builder.branch(self.start)


@dataclass(eq=False)
class BufferParam:
    index: int
    var: Var
    name: str
    flat: Buffer
    orig: Buffer


@dataclass(eq=False)
class ScalarParam:
    index: int
    var: Var
    name: str
    dtype: str


class CodeGenLLVM(EntryEmitter, IRFunctor):
    """Generate one LLVM module from lowered PrimFuncs.

    Examples
    --------
    >>> cg = CodeGenLLVM(options)                 # doctest: +SKIP
    >>> cg.add_function("main", lowered_func)     # doctest: +SKIP
    >>> text = cg.finish()                        # doctest: +SKIP
    """

    def __init__(self, options: CodegenOptions):
        self._dispatch: dict[type, object] = {}   # node class -> its visit method (see visit)
        self.opt = options
        self.mb = ModuleBuilder("tilecraft", options.triple, options.data_layout,
                                options.pointer_bits)
        self.module = self.mb.module
        intrinsics.configure(self.mb, triple=options.triple, vector_width=options.vector_width)
        self.f16 = Float16(options.native_f16 or options.fp16_arith)
        self.f16_arith = options.fp16_arith
        self.soft = SoftOps(self.mb, options.hw_div, options.pointer_bits)
        self.functions_meta: list[dict] = []
        self.ctx: _FnCtx | None = None
        self._outlined = 0
        self._uses_parallel = False
        self._amx_functions = False       # whether the function being added uses AMX tiles
        self._workspace_sites = 0      # allocation sites that keep their memory (_cached_workspace)
        self._scopes: dict[Buffer, tuple] = {}   # buffer -> (its scope list, all other scopes)
        self._fma_tags = 0
        self._init_globals()

    def visit(self, node, *args):
        """``IRFunctor.visit`` with the method found once per node class (a ResNet-50 kernel
        module visits about 10^5 nodes; the name lookup was a tenth of code generation)."""
        fn = self._dispatch.get(type(node))
        if fn is None:
            fn = getattr(self, "visit_" + type(node).__name__, None) or self.visit_default
            self._dispatch[type(node)] = fn
        return fn(node, *args)

    # ------------------------------------------------------------------------------------------
    # module-level pieces

    def _init_globals(self):
        mb = self.mb
        err_ty = ir.ArrayType(I8, abi.ERROR_BUFFER_BYTES)
        self.error_buffer = mb.global_var("tilecraft_error_buffer", err_ty, linkage="internal")
        self.error_claimed = mb.global_var("tilecraft_error_claimed", I32, ir.Constant(I32, 0),
                                           linkage="internal")
        self.num_threads = mb.global_var(abi.NUM_THREADS_SYMBOL, I32,
                                         ir.Constant(I32, int(self.opt.num_cores or 0)))
        mb.global_var(abi.ABI_VERSION_SYMBOL, I32, ir.Constant(I32, abi.ABI_VERSION),
                      constant=True)
        getter = ir.Function(self.module, ir.FunctionType(PTR, []), abi.LAST_ERROR_SYMBOL)
        getter.attributes.add("nounwind")
        ir.IRBuilder(getter.append_basic_block("entry")).ret(self.error_buffer)
        self.snprintf = mb.declare("snprintf", I32, [PTR, mb.intptr, PTR], var_arg=True)
        self.memalign = mb.declare("posix_memalign", I32, [PTR, mb.intptr, mb.intptr])
        self.free = mb.declare("free", ir.VoidType(), [PTR])

    def _make_ctx(self, fn: ir.Function, func_name: str) -> _FnCtx:
        return _FnCtx(fn, func_name)

    @property
    def uses_parallel(self) -> bool:
        """Whether the module calls the thread-pool runtime (it must be linked or registered)."""
        return self._uses_parallel

    def finish(self, entry: str | None = None) -> str:
        """Add the metadata symbol (``self.meta``) and return the module's LLVM IR text."""
        names = [f["name"] for f in self.functions_meta]
        if entry not in names:
            entry = "main" if "main" in names else (names[0] if names else None)
        self.meta = {"abi_version": abi.ABI_VERSION, "target": self.opt.target_str,
                     "triple": self.opt.triple, "num_cores": self.opt.num_cores,
                     "entry": entry, "functions": self.functions_meta}
        data = bytearray(json.dumps(self.meta, sort_keys=True).encode("utf-8")) + b"\0"
        ty = ir.ArrayType(I8, len(data))
        self.mb.global_var(abi.METADATA_SYMBOL, ty, ir.Constant(ty, data), constant=True)
        return str(self.module)

    # ------------------------------------------------------------------------------------------
    # types

    def rtype(self, dtype: str, lanes: int = 1):
        """The register type of a scalar dtype (bool i1; float16 half where the target
        computes in half, else float)."""
        code, bits, _ = dt.parse(dtype)
        if dt.lanes(dtype) != 1:
            raise TIRError(f"vector dtype {dtype} in lowered TIR; vectorize with a 'vectorized' "
                           f"loop instead")
        if code == "bool":
            t = I1
        elif code in ("int", "uint"):
            t = ir.IntType(bits)
        elif code == "float":
            t = F64 if bits == 64 else (F16 if bits == 16 and self.f16_arith else F32)
        else:
            raise TIRError(f"dtype {dtype} has no register type")
        return vec_type(t, lanes)

    def mtype(self, dtype: str):
        """The in-memory type of a scalar dtype (bool as i8, float16 as half or i16)."""
        code, bits, _ = dt.parse(dtype)
        if code == "bool":
            return I8
        if code == "float" and bits == 16:
            return self.f16.mem
        return self.rtype(dtype)

    @staticmethod
    def itemsize(dtype: str) -> int:
        return dt.itemsize(dtype)

    # ------------------------------------------------------------------------------------------
    # helpers on the current function

    @property
    def b(self) -> ir.IRBuilder:
        return self.ctx.builder

    def _new_block(self, name: str) -> ir.Block:
        return self.ctx.fn.append_basic_block(name)

    def _k(self, like, value):
        """A constant with the (scalar or vector) type of ``like``."""
        return const(like.type, value)

    def _match(self, a, b_):
        """Broadcast the scalar operand when the other is a vector."""
        la, lb = lanes_of(a), lanes_of(b_)
        if la == lb:
            return a, b_
        n = max(la, lb)
        return splat(self.b, a, n), splat(self.b, b_, n)

    def _scalar(self, v, what: str):
        if is_vector(v):
            raise TIRError(f"{what} varies across the lanes of a vectorized loop")
        return v

    def _round16(self, v, dtype: str):
        """A float16 result computed in float32 rounded to float16 (native half: as it is)."""
        return self.f16.round(self.b, v) if dtype == "float16" and not self.f16_arith else v

    def _to_i64(self, v, dtype: str):
        """An index value as i64 (sign- or zero-extended)."""
        ty = element_type(v.type)
        if ty == I64:
            return v
        target = vec_type(I64, lanes_of(v))
        if ty.width > 64:
            return self.b.trunc(v, target)
        return self.b.zext(v, target) if dt.is_uint(dtype) or dtype == "bool" else \
            self.b.sext(v, target)

    def _to_intptr(self, v64):
        if self.mb.pointer_bits == 64:
            return v64
        return self.b.trunc(v64, self.mb.intptr)

    # -- errors ---------------------------------------------------------------------------------
    def _write_error(self, fmt: str, args: list):
        """Write the message unless another thread already did (first failure wins)."""
        b = self.b
        res = b.cmpxchg(self.error_claimed, I32(0), I32(1), "seq_cst", "seq_cst")
        won = b.extract_value(res, 1)
        write_bb, done_bb = self._new_block("err.write"), self._new_block("err.written")
        b.cbranch(won, write_bb, done_bb)
        b.position_at_end(write_bb)
        b.call(self.snprintf, [self.error_buffer, self.mb.intptr(abi.ERROR_BUFFER_BYTES),
                               self.mb.cstring(fmt)] + list(args))
        b.branch(done_bb)
        b.position_at_end(done_bb)

    def _return_error(self, code):
        """Free live heap buffers and return ``code`` (an i32 value or int)."""
        for cleanup in reversed(self.ctx.heap):
            cleanup()
        self.b.ret(code if isinstance(code, ir.Value) else I32(code))

    def _check(self, ok, fmt: str, args: list = (), code: int = -1):
        """Continue when ``ok`` (i1) holds; otherwise report ``fmt % args`` and return."""
        ok_bb, bad_bb = self._new_block("check.ok"), self._new_block("check.fail")
        br = self.b.cbranch(ok, ok_bb, bad_bb)
        br.set_weights([1 << 20, 1])
        self.b.position_at_end(bad_bb)
        self._write_error(fmt, list(args))
        self._return_error(code)
        self.b.position_at_end(ok_bb)

    # ------------------------------------------------------------------------------------------
    # functions

    def add_function(self, name: str, func: PrimFunc) -> dict:
        """Compile one lowered PrimFunc; returns its metadata entry."""
        if not isinstance(func, PrimFunc):
            raise TIRError(f"function {name}: expected a PrimFunc, got {type(func).__name__}", func)
        _reject_unlowered(name, func)
        symbol = abi.entry_symbol(name)
        if any(f["symbol"] == symbol for f in self.functions_meta):
            raise TIRError(f"two functions map to the C symbol {symbol}; rename {name!r}")
        bparams, sparams = _classify_params(name, func)
        bound = self._plan_binding(name, func, bparams, sparams)
        compute = self._emit_compute(name, symbol, func, bparams, bound)
        self.emit_entry(name, symbol, func, bparams, sparams, bound, compute)
        meta = _function_metadata(name, symbol, func, bparams, sparams)
        if self._amx_functions:
            meta["uses_amx"] = True
            self._amx_functions = False
        self.functions_meta.append(meta)
        return meta

    def _plan_binding(self, name, func, bparams, sparams) -> list[Var]:
        """The variables the entry computes and passes on: scalar params, then shape vars."""
        bound: list[Var] = [p.var for p in sparams]
        known = set(bound)  # Vars hash by identity; a list's `in` would build EQ nodes
        for p in bparams:
            for d in p.orig.shape:
                if isinstance(d, Var) and d not in known:
                    bound.append(d)
                    known.add(d)
        for p in bparams:
            for i, d in enumerate(p.orig.shape):
                for v in free_vars(d):
                    if v not in known:
                        raise TIRError(f"{name}: dimension {i} of argument {p.name} is "
                                       f"{expr_str(d)}, but {v.name} is neither a parameter nor "
                                       f"a dimension of its own in any argument, so a caller "
                                       f"cannot bind it", d)
        return bound

    def _emit_compute(self, name, symbol, func, bparams, bound) -> ir.Function:
        arg_types = [PTR] * len(bparams) + [self.rtype(v.dtype) for v in bound]
        fn = ir.Function(self.module, ir.FunctionType(I32, arg_types), f"{symbol}.compute")
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        for i, p in enumerate(bparams):
            fn.args[i].add_attribute("noalias")
            fn.args[i].name = p.name
        self.ctx = _FnCtx(fn, name)
        for p, arg in zip(bparams, fn.args):
            self.ctx.buffers[p.flat] = arg
        body = func.body   # local tiles are compacted by lowering (CompactLocalAllocations)
        allocated: dict[Buffer, None] = {}
        post_order_visit(body, lambda n: allocated.setdefault(n.buffer)
                         if isinstance(n, Allocate) else None)
        self._alias_scopes(symbol, [p.flat for p in bparams] + list(allocated))
        shape_vars = {d for p in bparams for d in p.orig.shape if isinstance(d, Var)}
        for v, arg in zip(bound, fn.args[len(bparams):]):
            arg.name = v.name
            self.ctx.env[v] = arg
            if v in shape_vars:
                # the entry checked every dimension is >= 0
                self.ctx.analyzer.update_bound(v, 0, None)
        self.visit(body)
        if not self.b.block.is_terminated:
            self._fence_nontemporal()
            self.b.ret(I32(0))
        self.ctx.finish()
        self.ctx = None
        return fn

    def _fence_nontemporal(self) -> None:
        """A full fence before the function returns, where it stored non-temporally: those
        stores are weakly ordered (x86), and the thread pool signals a task's end with
        ordinary release / acquire atomics, which order only ordinary stores; the fence
        (``mfence``) makes them visible to the thread that reads the output next."""
        if self.ctx.nontemporal:
            self.b.fence("seq_cst")

    def _alias_scopes(self, symbol: str, buffers: list[Buffer]) -> None:
        """One LLVM alias scope per buffer of the function (scoped-noalias metadata).

        Distinct buffers never overlap (arguments by the ABI, intermediates by allocation), and
        saying so lets LLVM keep loaded values in registers across stores to other buffers and
        hoist loads out of loops -- also in outlined parallel bodies and for heap
        intermediates, where the pointers come from a closure or from ``posix_memalign`` and
        carry no ``noalias`` attribute.
        """
        m = self.module
        self._scopes = {}
        if len(buffers) < 2:
            return
        domain = m.add_metadata([ir.MetaDataString(m, f"tilecraft.{symbol}")])
        scopes = [m.add_metadata([ir.MetaDataString(m, f"tilecraft.{symbol}.{k}.{b.name}"),
                                  domain]) for k, b in enumerate(buffers)]
        for k, b in enumerate(buffers):
            others = [sc for j, sc in enumerate(scopes) if j != k]
            self._scopes[b] = (m.add_metadata([scopes[k]]), m.add_metadata(others))

    def _tag(self, instr, buf: Buffer):
        """Attach ``buf``'s alias scope to a load, store or masked memory intrinsic."""
        md = self._scopes.get(buf)
        if md is not None:
            instr.set_metadata("alias.scope", md[0])
            instr.set_metadata("noalias", md[1])
        return instr

    # ------------------------------------------------------------------------------------------
    # statements

    def visit_default(self, node):
        if isinstance(node, Stmt):
            raise TIRError(f"the LLVM back end cannot compile {type(node).__name__} statements "
                           f"(is the function lowered?)", node)
        raise TIRError(f"the LLVM back end cannot compile {type(node).__name__} expressions",
                       node)

    def visit_SeqStmt(self, s: SeqStmt):
        for x in s.seq:
            self.visit(x)

    def visit_Evaluate(self, s: Evaluate):
        if isinstance(s.value, (IntImm, FloatImm)):
            return
        if is_prefetch(s):
            self._prefetch(s.value.args[0])
            return
        if isinstance(s.value, Call) and s.value.op == amx.AMX_U8I8:
            self._amx_block(s.value)
            return
        self.visit(s.value)

    def _element_ptr(self, at: BufferLoad):
        """The address of the element ``at`` names (a scalar index)."""
        ptr = self._buffer_ptr(at.buffer, at)
        index = self._to_i64(self._scalar(self.visit(at.indices[0]), "an index"),
                             at.indices[0].dtype)
        return self.b.gep(ptr, [index], source_etype=self.mtype(at.buffer.dtype))

    def _amx_block(self, call: Call):
        """``AMX_U8I8`` (``tensorir.expr``): a call of the AMX block function
        (``targets.llvm.amx``); the function's metadata says it uses AMX, so the module asks
        the OS for the tile state when it is loaded."""
        if not self.opt.amx_int8:
            raise TIRError(f"{amx.AMX_U8I8} needs a target with +amx-int8 (this one: "
                           f"{self.opt.target_str})", call)
        c, a, w = (self._element_ptr(x) for x in call.args[:3])
        # each operand's row stride: the distance from its first element to its next row's,
        # in the flattened layout (a constant once the scratch buffers are compacted)
        strides = []
        for first, nxt in zip(call.args[:3], call.args[3:6]):
            if first.buffer is not nxt.buffer:
                raise TIRError(f"{amx.AMX_U8I8}: an operand's next row must be in its own "
                               f"buffer ({first.buffer.name} / {nxt.buffer.name})", call)
            d = self.ctx.analyzer.simplify(nxt.indices[0] - first.indices[0])
            strides.append(d.value if isinstance(d, IntImm) else
                           self._to_i64(self._scalar(self.visit(d), "an AMX row stride"),
                                        d.dtype))
        rows = self._scalar(self.visit(call.args[6]), "the AMX row count")
        consts = []
        for x in call.args[7:]:
            if not isinstance(x, IntImm):
                raise TIRError(f"{amx.AMX_U8I8}: the K steps and the column tiles must be "
                               f"constants, got {x!r}", call)
            consts.append(x.value)
        lda, ldb, ldc = strides[1], strides[2], strides[0]
        amx.emit_block(self.mb, self.b, c, a, w, rows, lda, ldb, ldc, *consts)
        self._amx_functions = True

    def _prefetch(self, at: BufferLoad):
        """``llvm.prefetch(ptr, rw=0 read, locality=3 keep in all levels, cache=1 data)`` of
        the element ``at`` names (in a vectorized loop, its first lane's: one line a step)."""
        ptr = self._buffer_ptr(at.buffer, at)
        index = self._to_i64(self.visit(at.indices[0]), at.indices[0].dtype)
        if is_vector(index):
            index = self.b.extract_element(index, I32(0))
        addr = self.b.gep(ptr, [index], source_etype=self.mtype(at.buffer.dtype))
        fn = self.mb.intrinsic("prefetch", ir.VoidType(), [PTR, I32, I32, I32], [PTR])
        self.b.call(fn, [addr, I32(0), I32(3), I32(1)])

    def visit_LetStmt(self, s: LetStmt):
        v = self.visit(s.value)
        self._bind(s.var, v, s.value, lambda: self.visit(s.body))

    def _bind(self, var: Var, v, value_expr, body):
        ctx = self.ctx
        old = ctx.env.get(var)
        ctx.env[var] = v
        if ctx.vec is not None and is_vector(v):
            ctx.vec.lets[var] = value_expr
        if value_expr is not None and dt.is_integer(var.dtype) and \
                not _used_buffers(value_expr):
            # an integer computed from indices only (a value read from memory may change)
            ctx.analyzer.bind(var, value_expr)
        try:
            return body()
        finally:
            if old is None:
                ctx.env.pop(var, None)
            else:
                ctx.env[var] = old

    def visit_AssertStmt(self, s: AssertStmt):
        cond = self._scalar(self.visit(s.condition), "an assert condition")
        msg = _fmt_escape(f"{self.ctx.func_name}: {s.message}")
        self._check(cond, msg)
        self.visit(s.body)

    def visit_IfThenElse(self, s: IfThenElse):
        vec = self.ctx.vec
        if vec is not None and vec.mask is None and s.else_case is None:
            full = self._all_lanes(s.condition)
            if full is not None:
                # a tail predicate (`i_0 * 16 + i_1 < n`): one scalar test at the extreme lane
                # runs whole vectors without masks; only a partial step builds the mask
                full_bb, part_bb, end_bb = (self._new_block("vif.full"),
                                            self._new_block("vif.part"),
                                            self._new_block("vif.end"))
                self.b.cbranch(full, full_bb, part_bb)
                self.b.position_at_end(full_bb)
                self.visit(s.then_case)
                self.b.branch(end_bb)
                self.b.position_at_end(part_bb)
                vec.mask = self.visit(s.condition)
                try:
                    self.visit(s.then_case)
                finally:
                    vec.mask = None
                self.b.branch(end_bb)
                self.b.position_at_end(end_bb)
                return
        cond = self.visit(s.condition)
        if is_vector(cond):
            # lane-varying condition: run both sides under complementary masks
            old = vec.mask
            vec.mask = cond if old is None else self.b.and_(old, cond)
            self.visit(s.then_case)
            if s.else_case is not None:
                neg = self.b.not_(cond)
                vec.mask = neg if old is None else self.b.and_(old, neg)
                self.visit(s.else_case)
            vec.mask = old
            return
        then_bb = self._new_block("if.then")
        end_bb = self._new_block("if.end")
        else_bb = self._new_block("if.else") if s.else_case is not None else end_bb
        self.b.cbranch(cond, then_bb, else_bb)
        self.b.position_at_end(then_bb)
        self.visit(s.then_case)
        self.b.branch(end_bb)
        if s.else_case is not None:
            self.b.position_at_end(else_bb)
            self.visit(s.else_case)
            self.b.branch(end_bb)
        self.b.position_at_end(end_bb)

    def _all_lanes(self, cond):
        """A scalar i1 saying that every lane of the vectorized loop satisfies ``cond``, for an
        integer comparison whose sides are affine in the lane (or an ``And`` of such and
        lane-invariant terms); None for any other condition. An affine difference is monotonic
        over the lanes, so the comparison at the first or the last lane decides."""
        vec = self.ctx.vec
        if isinstance(cond, And):
            parts = [self._all_lanes(x) if self._stride(x) != 0 else x for x in (cond.a, cond.b)]
            if any(p is None for p in parts) or all(isinstance(p, PrimExpr) for p in parts):
                return None
            vals = [self._scalar_at(p, 0) if isinstance(p, PrimExpr) else p for p in parts]
            return self.b.and_(vals[0], vals[1])
        if not isinstance(cond, (LT, LE, GT, GE)) or not dt.is_integer(cond.a.dtype):
            return None
        sa, sb = self._stride(cond.a), self._stride(cond.b)
        if sa is None or sb is None or sa == sb or \
                any(v in vec.lets and v is not vec.var for v in free_vars(cond)):
            return None  # (a let-bound lane value would need its own scalar binding)
        # a < b (a <= b) must hold where a - b is largest; a > b (a >= b) where it is smallest
        largest = (sa > sb) == isinstance(cond, (LT, LE))
        return self._scalar_at(cond, vec.lanes - 1 if largest else 0)

    def _scalar_at(self, e, lane: int):
        """``e`` evaluated as a scalar at one lane of the vectorized loop."""
        ctx = self.ctx
        vec, ramp = ctx.vec, ctx.env[ctx.vec.var]
        ctx.vec = None
        ctx.env[vec.var] = self.b.extract_element(ramp, I32(lane))
        try:
            return self.visit(e)
        finally:
            ctx.env[vec.var] = ramp
            ctx.vec = vec

    def _buffer_bytes(self, buf: Buffer):
        """The size of the flat buffer ``buf`` in bytes: an ``int`` where its extent is
        static, else an i64 value computed from the shape variables in scope."""
        extent = arith.simplify(buf.shape[0])
        if isinstance(extent, IntImm):
            return extent.value * self.itemsize(buf.dtype)
        vec, self.ctx.vec = self.ctx.vec, None      # a scalar, whatever loop it sits in
        try:
            n = self._to_i64(self.visit(extent), extent.dtype)
        finally:
            self.ctx.vec = vec
        return self.b.mul(n, I64(self.itemsize(buf.dtype)))

    def _nontemporal_store(self, mem, addr, buf: Buffer, min_bytes: int) -> None:
        """Store the vector ``mem`` at ``addr`` non-temporally (``!nontemporal``: x86
        ``movntps``, which writes the lines without reading them in and leaves them out of the
        caches) when ``addr`` is aligned to ``NONTEMPORAL_ALIGN`` bytes, as those instructions
        need, and ``buf`` holds at least ``min_bytes``; else as a plain store. The tests are a
        branch at run time (a caller's array may be aligned to its elements only; a buffer
        of a symbolic shape is as large as this call's), predicted perfectly in a kernel
        whose vectors all share the alignment of the buffer. A buffer of a static size under
        ``min_bytes`` gets plain stores only. The function fences before it returns
        (``_fence_nontemporal``)."""
        b = self.b
        size = self._buffer_bytes(buf)
        if isinstance(size, int) and size < min_bytes:
            self._tag(b.store(mem, addr, align=self.itemsize(buf.dtype)), buf)
            return
        aligned = b.icmp_unsigned("==", b.and_(b.ptrtoint(addr, I64), I64(NONTEMPORAL_ALIGN - 1)),
                                  I64(0))
        if not isinstance(size, int):
            aligned = b.and_(aligned, b.icmp_signed(">=", size, I64(min_bytes)))
        nt_bb, plain_bb, done_bb = (self._new_block("store.nt"), self._new_block("store.plain"),
                                    self._new_block("store.done"))
        b.cbranch(aligned, nt_bb, plain_bb)
        b.position_at_end(nt_bb)
        st = self._tag(b.store(mem, addr, align=NONTEMPORAL_ALIGN), buf)
        st.set_metadata("nontemporal", self.module.add_metadata([I32(1)]))
        self.ctx.nontemporal = True
        b.branch(done_bb)
        b.position_at_end(plain_bb)
        self._tag(b.store(mem, addr, align=self.itemsize(buf.dtype)), buf)
        b.branch(done_bb)
        b.position_at_end(done_bb)

    def visit_BufferStore(self, s: BufferStore):
        buf = s.buffer
        ptr = self._buffer_ptr(buf, s)
        index_e = s.indices[0]
        value = self._accumulate(s)
        if value is None:
            value = self.visit(s.value)
        vec = self.ctx.vec
        if vec is None:
            index = self._to_i64(self.visit(index_e), index_e.dtype)
            addr = self.b.gep(ptr, [index], source_etype=self.mtype(buf.dtype))
            self._tag(self.b.store(self._to_mem(value, buf.dtype), addr,
                                   align=self.itemsize(buf.dtype)), buf)
            return
        stride = self._stride(index_e)
        if stride == 0:  # excluded by _can_vectorize; kept as a guard
            raise TIRError(f"store to {buf.name} at a lane-invariant index in a vectorized loop",
                           s)
        n = vec.lanes
        index = splat(self.b, self._to_i64(self.visit(index_e), index_e.dtype), n)
        mem = self._to_mem(splat(self.b, value, n), buf.dtype)
        align = I32(self.itemsize(buf.dtype))
        if stride == 1:
            base = self.b.extract_element(index, I32(0))
            addr = self.b.gep(ptr, [base], source_etype=self.mtype(buf.dtype))
            if vec.mask is None and vec.nontemporal and \
                    (n * self.itemsize(buf.dtype)) % NONTEMPORAL_ALIGN == 0:
                self._nontemporal_store(mem, addr, buf, vec.nontemporal)
            elif vec.mask is None:
                self._tag(self.b.store(mem, addr, align=self.itemsize(buf.dtype)), buf)
            elif self._stack_lanes_in_bounds(ptr, buf, index_e):
                # a blend (load, select, store) rather than a masked store: LLVM promotes a
                # stack buffer accessed only by whole loads and stores to registers (rfactor's
                # partial results over a symbolic row, their last vector masked)
                old = self._tag(self.b.load(addr, typ=mem.type, align=self.itemsize(buf.dtype)),
                                buf)
                self._tag(self.b.store(self.b.select(vec.mask, mem, old), addr,
                                       align=self.itemsize(buf.dtype)), buf)
            else:
                fn = self.mb.intrinsic("masked.store", ir.VoidType(),
                                       [mem.type, PTR, I32, vec_type(I1, n)], [mem.type, PTR])
                self._tag(self.b.call(fn, [mem, addr, align, vec.mask]), buf)
            return
        ptrs = self._vector_gep(ptr, index, self.mtype(buf.dtype))
        mask = vec.mask if vec.mask is not None else const(vec_type(I1, n), 1)
        fn = self.mb.intrinsic("masked.scatter", ir.VoidType(),
                               [mem.type, ptrs.type, I32, vec_type(I1, n)], [mem.type, ptrs.type])
        self._tag(self.b.call(fn, [mem, ptrs, align, mask]), buf)

    def _stack_lanes_in_bounds(self, ptr, buf: Buffer, index_e) -> bool:
        """Whether every lane of the contiguous vector access ``buf[index_e]`` lies inside
        ``buf``, a stack buffer of constant size (``ptr`` an alloca), masked lanes included:
        true where the lanes' loop values all lie in the loop's range (the mask comes from a
        condition, ``_VecCtx.in_range``) and ``index_e`` is provably within the buffer there.
        A masked access may then read and write whole vectors: no other thread sees a stack
        buffer, and the masked-off lanes are written back unchanged."""
        vec = self.ctx.vec
        if not (vec.in_range and isinstance(ptr, ir.AllocaInstr) and len(buf.shape) == 1
                and isinstance(buf.shape[0], IntImm)):
            return False
        bound = self.ctx.analyzer.const_int_bound(index_e)
        return bound.min_value >= 0 and bound.max_value < buf.shape[0].value

    def _accumulate(self, s: BufferStore):
        """``X[i] = X[i] + a * b`` (a reduction's update, float32/64) as a multiply and an
        add tagged for fusion into one FMA.

        A fused multiply-add is what makes a GEMM or convolution inner loop run at the FMA
        units' rate (and it rounds once, as BLAS does). Only accumulations into the stored
        element are fused: elementwise expressions keep numpy's separately rounded multiply and
        add. The pair is emitted as ``%m = fmul x, y`` and ``%r = fadd acc, %m``, both tagged
        with one ``!tilecraft.fma`` node of their own; for a target with FMA instructions the
        compiler (``compiler.fuse_tagged_fma``) turns the pair into ``llvm.fma(x, y, acc)``
        before optimizing. Returns None when ``s`` is not such an update.
        """
        v = s.value
        fusable = ("float32", "float64", "float16") if self.f16_arith else ("float32", "float64")
        if not isinstance(v, Add) or s.buffer.dtype not in fusable:
            return None
        for acc, prod in ((v.a, v.b), (v.b, v.a)):
            if isinstance(acc, BufferLoad) and acc.buffer is s.buffer and \
                    isinstance(prod, Mul) and prod.dtype == v.dtype and \
                    len(acc.indices) == len(s.indices) and \
                    all(x is y or structural_equal(x, y) for x, y in zip(acc.indices, s.indices)):
                ops = [self.visit(acc), self.visit(prod.a), self.visit(prod.b)]
                n = max(lanes_of(v) for v in ops)
                a, x, y = (splat(self.b, v, n) for v in ops)  # all defined before the fmul
                m = self.b.fmul(x, y)
                r = self.b.fadd(a, m)
                self._fma_tags += 1
                tag = self.module.add_metadata([ir.MetaDataString(self.module,
                                                                  f"fma{self._fma_tags}")])
                m.set_metadata(FMA_METADATA, tag)
                r.set_metadata(FMA_METADATA, tag)
                return r
        return None

    def _vector_gep(self, ptr, index_vec, elem_ty):
        g = self.b.gep(ptr, [index_vec], source_etype=elem_ty)
        g.type = ir.VectorType(PTR, lanes_of(index_vec))  # llvmlite types it as a scalar ptr
        return g

    def _buffer_ptr(self, buf: Buffer, node):
        ptr = self.ctx.buffers.get(buf)
        if ptr is None:
            raise TIRError(f"{self.ctx.func_name}: buffer {buf.name} is used but is neither a "
                           f"parameter nor allocated here", node)
        if buf.ndim != 1:
            raise TIRError(f"buffer {buf.name} has {buf.ndim} dimensions; lowered code accesses "
                           f"flat 1-D buffers (run tensorir.transform.lower)", node)
        return ptr

    def visit_Allocate(self, s: Allocate):
        buf = s.buffer
        if buf.ndim != 1:
            raise TIRError(f"Allocate of {buf.name}: the buffer has {buf.ndim} dimensions; "
                           f"lowered code allocates flat buffers", s)
        memty = self.mtype(buf.dtype)
        size = buf.shape[0]
        nbytes_const = size.value * self.itemsize(buf.dtype) if isinstance(size, IntImm) else None
        if nbytes_const is not None and nbytes_const <= STACK_ALLOCA_LIMIT:
            slot = self.ctx.alloca(ir.ArrayType(memty, max(size.value, 1)), name=buf.name,
                                   align=max(ALLOC_ALIGN, buf.align))
            self.ctx.buffers[buf] = slot
            try:
                self.visit(s.body)
            finally:
                del self.ctx.buffers[buf]
            return
        count = self._to_i64(self._scalar(self.visit(size), "an allocation size"), size.dtype)
        nbytes = self.b.mul(count, I64(self.itemsize(buf.dtype)))
        nbytes = self.b.select(self.b.icmp_signed("<", nbytes, I64(1)), I64(1), nbytes)
        align = max(ALLOC_ALIGN, buf.align)
        cacheable = nbytes_const is None or \
            WORKSPACE_CACHE_MIN <= nbytes_const <= WORKSPACE_CACHE_MAX
        if buf.scope == "local" and cacheable:
            data, release = self._cached_workspace(buf, nbytes, align)
        else:
            data = self._memalign(buf, nbytes, align)

            def release():
                self.b.call(self.free, [data])
        self.ctx.heap.append(release)
        self.ctx.buffers[buf] = data
        try:
            self.visit(s.body)
        finally:
            del self.ctx.buffers[buf]
            self.ctx.heap.pop()
        release()

    def _memalign(self, buf: Buffer, nbytes, align: int):
        """``posix_memalign`` of ``nbytes`` (i64) for ``buf``; an error return when it fails."""
        slot = self.ctx.alloca(PTR, name=buf.name + ".slot")
        rc = self.b.call(self.memalign, [slot, self.mb.intptr(align), self._to_intptr(nbytes)])
        self._check(self.b.icmp_signed("==", rc, I32(0)),
                    f"{self.ctx.func_name}: out of memory allocating %lld bytes for buffer "
                    f"{_fmt_escape(buf.name)}", [nbytes])
        return self.b.load(slot, typ=PTR)

    def _cached_workspace(self, buf: Buffer, nbytes, align: int):
        """``buf``'s memory from a block this allocation site keeps between calls, and the
        function that emits its release: ``(pointer, release)``.

        The site owns three internal globals: the block, its size and a busy flag. A call
        claims the flag (compare-and-swap), grows the block when it is too small (free, then
        ``posix_memalign``) and gives the flag back at the end; a call that finds the flag
        taken (the same kernel running on another thread at once) or needs more than
        ``WORKSPACE_CACHE_MAX`` bytes allocates and frees its own block, as before. The block
        lives as long as the module: at most one per site, the largest size seen. This is
        TVM's workspace pool in its simplest form; its reason is the page faults of freshly
        mapped memory (``WORKSPACE_CACHE_MIN``). Only "local"-scope buffers take it (the
        schedule's word that the buffer is the kernel's private workspace: Winograd's ``V`` and
        ``M``), so a library does not keep every large intermediate it has."""
        b, mb = self.b, self.mb
        site = f"tilecraft_ws.{self.ctx.func_name}.{buf.name}.{self._workspace_sites}"
        self._workspace_sites += 1
        block_g = mb.global_var(site + ".ptr", PTR, linkage="internal")
        size_g = mb.global_var(site + ".size", I64, I64(0), linkage="internal")
        busy_g = mb.global_var(site + ".busy", I32, I32(0), linkage="internal")
        try_bb, own_bb, grow_bb = (self._new_block(f"{buf.name}.ws.{n}")
                                   for n in ("try", "own", "grow"))
        kept_bb, fresh_bb, join_bb = (self._new_block(f"{buf.name}.ws.{n}")
                                      for n in ("kept", "fresh", "join"))
        b.cbranch(b.icmp_unsigned("<=", nbytes, I64(WORKSPACE_CACHE_MAX)), try_bb, fresh_bb)
        b.position_at_end(try_bb)
        won = b.extract_value(b.cmpxchg(busy_g, I32(0), I32(1), "acquire", "monotonic"), 1)
        b.cbranch(won, own_bb, fresh_bb)
        b.position_at_end(own_bb)
        big_enough = b.icmp_unsigned(">=", b.load(size_g, typ=I64), nbytes)
        b.cbranch(big_enough, kept_bb, grow_bb)
        b.position_at_end(grow_bb)
        b.call(self.free, [b.load(block_g, typ=PTR)])
        b.store(ir.Constant(PTR, None), block_g)
        b.store(I64(0), size_g)

        def give_back():
            self.b.store_atomic(I32(0), busy_g, "release", 4)
        self.ctx.heap.append(give_back)
        grown = self._memalign(buf, nbytes, align)
        self.ctx.heap.pop()
        self.b.store(grown, block_g)
        self.b.store(nbytes, size_g)
        self.b.branch(kept_bb)
        b = self.b
        b.position_at_end(kept_bb)
        kept = b.load(block_g, typ=PTR)
        b.branch(join_bb)
        b.position_at_end(fresh_bb)
        fresh = self._memalign(buf, nbytes, align)
        fresh_end = self.b.block
        self.b.branch(join_bb)
        b = self.b
        b.position_at_end(join_bb)
        data = b.phi(PTR, name=buf.name)
        data.add_incoming(kept, kept_bb)
        data.add_incoming(fresh, fresh_end)
        owned = b.phi(I1, name=buf.name + ".owned")
        owned.add_incoming(ir.Constant(I1, 1), kept_bb)
        owned.add_incoming(ir.Constant(I1, 0), fresh_end)

        def release():
            # free(NULL) is a no-op, and subtracting 0 leaves another call's claim alone:
            # no branch, so the error paths can emit it anywhere
            bb = self.b
            bb.call(self.free, [bb.select(owned, ir.Constant(PTR, None), data)])
            bb.atomic_rmw("sub", busy_g, bb.zext(owned, I32), "release")
        return data, release

    # -- loops ----------------------------------------------------------------------------------
    def visit_For(self, s: For):
        if s.kind == "thread_binding":
            raise TIRError(f"{self.ctx.func_name}: loop {s.loop_var.name} is bound to "
                           f"{s.thread_tag}; thread bindings are for GPU targets (opencl, webgpu),"
                           f" not the CPU target {self.opt.target_str!r}", s)
        if self.ctx.vec is not None:  # _can_vectorize keeps loops out of vector bodies
            raise TIRError(f"loop {s.loop_var.name} inside a vectorized loop", s)
        if s.kind == "vectorized":
            self._vector_loop(s)
        elif s.kind == "parallel" and self.ctx.parallel_depth == 0:
            self._parallel_loop(s)
        elif s.kind == "unrolled":
            self._unrolled_loop(s)
        else:
            self._serial_loop(s)

    def _bind_loop_range(self, s: For):
        self.ctx.analyzer.bind(s.loop_var, Range(s.min, s.extent))

    def _serial_loop(self, s: For, metadata: list | None = None, lo=None, hi=None):
        var = s.loop_var
        b = self.b
        if lo is None:
            lo = self._scalar(self.visit(s.min), "a loop bound")
            ext = self._scalar(self.visit(s.extent), "a loop extent")
            hi = b.add(lo, ext)
        pre = b.block
        header = self._new_block(f"for.{var.name}")
        body_bb = self._new_block(f"for.{var.name}.body")
        exit_bb = self._new_block(f"for.{var.name}.end")
        b.branch(header)
        b.position_at_end(header)
        phi = b.phi(lo.type, name=var.name)
        phi.add_incoming(lo, pre)
        cmp = b.icmp_unsigned if dt.is_uint(var.dtype) else b.icmp_signed
        b.cbranch(cmp("<", phi, hi), body_bb, exit_bb)
        b.position_at_end(body_bb)
        self._bind_loop_range(s)
        self._bind(var, phi, None, lambda: self.visit(s.body))
        nxt = b.add(phi, ir.Constant(lo.type, 1))
        phi.add_incoming(nxt, b.block)
        back = b.branch(header)
        if metadata:
            set_loop_metadata(self.module, back, metadata)
        b.position_at_end(exit_bb)

    def _unrolled_loop(self, s: For):
        ext = s.extent.value if isinstance(s.extent, IntImm) else None
        if ext is None or ext > MAX_UNROLL:
            self._serial_loop(s, [["llvm.loop.unroll.full"]])
            return
        lo = self._scalar(self.visit(s.min), "a loop bound")
        self._bind_loop_range(s)
        for k in range(ext):
            value = self.b.add(lo, ir.Constant(lo.type, k)) if k else lo
            self._bind(s.loop_var, value, None, lambda: self.visit(s.body))

    # -- vectorized loops -----------------------------------------------------------------------
    def _vector_loop(self, s: For):
        ext = s.extent.value if isinstance(s.extent, IntImm) else None
        if ext is not None and ext <= 1:
            self._serial_loop(s)
            return
        if not self._can_vectorize(s):
            self._serial_loop(s, [["llvm.loop.vectorize.enable", True]])
            return
        b = self.b
        var = s.loop_var
        lo = self._scalar(self.visit(s.min), "a loop bound")
        ity = lo.type
        self._bind_loop_range(s)
        if ext is not None and ext <= MAX_VECTOR_LANES:
            self._vector_step(s, lo, ext, None)
            return
        lanes = self._natural_lanes(s)
        extent = self._scalar(self.visit(s.extent), "a loop extent")
        steps = self._div(extent, ir.Constant(ity, lanes), True, False)
        # the full L-lane steps
        step_var = Var(var.name + ".step", var.dtype)
        start, stop = ir.Constant(ity, 0), steps
        pre = b.block
        header, body_bb, exit_bb = (self._new_block(f"vfor.{var.name}"),
                                    self._new_block(f"vfor.{var.name}.body"),
                                    self._new_block(f"vfor.{var.name}.end"))
        b.branch(header)
        b.position_at_end(header)
        phi = b.phi(ity, name=step_var.name)
        phi.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", phi, stop), body_bb, exit_bb)
        b.position_at_end(body_bb)
        base = b.add(lo, b.mul(phi, ir.Constant(ity, lanes)))
        self._vector_step(s, base, lanes, None)
        nxt = b.add(phi, ir.Constant(ity, 1))
        phi.add_incoming(nxt, b.block)
        b.branch(header)
        b.position_at_end(exit_bb)
        # the tail: one masked step over the remaining lanes
        done = b.mul(steps, ir.Constant(ity, lanes))
        rem = b.sub(extent, done)
        if ext is not None and ext % lanes == 0:
            return
        tail_bb, end_bb = self._new_block(f"vfor.{var.name}.tail"), \
            self._new_block(f"vfor.{var.name}.done")
        b.cbranch(b.icmp_signed(">", rem, ir.Constant(ity, 0)), tail_bb, end_bb)
        b.position_at_end(tail_bb)
        mask = b.icmp_signed("<", lane_ids(ity, lanes), splat(b, rem, lanes))
        self._vector_step(s, b.add(lo, done), lanes, mask)
        b.branch(end_bb)
        b.position_at_end(end_bb)

    def _vector_step(self, s: For, base, lanes: int, mask):
        """Emit the body once for lanes base .. base+lanes-1."""
        ctx = self.ctx
        ramp = self.b.add(splat(self.b, base, lanes), lane_ids(base.type, lanes))
        ctx.vec = _VecCtx(s.loop_var, lanes, mask,
                          nontemporal=int(s.annotation_dict.get(ANN_NONTEMPORAL_STORE) or 0),
                          in_range=mask is None)
        try:
            self._bind(s.loop_var, ramp, None, lambda: self.visit(s.body))
        finally:
            ctx.vec = None

    def _natural_lanes(self, s: For) -> int:
        bits = [8 if b.dtype == "bool" else dt.bits(b.dtype) for b in _stored_buffers(s.body)]
        narrow = min(bits) if bits else 32
        lanes = max(4, min(MAX_VECTOR_LANES, self.opt.vector_width // narrow))
        return 1 << (lanes.bit_length() - 1)

    def _can_vectorize(self, s: For) -> bool:
        probe = _VecCtx(s.loop_var, 2)
        saved = self.ctx.vec
        self.ctx.vec = probe
        try:
            return self._vectorizable(s.body)
        finally:
            self.ctx.vec = saved

    def _vectorizable(self, s) -> bool:
        if isinstance(s, SeqStmt):
            return all(self._vectorizable(x) for x in s.seq)
        if isinstance(s, BufferStore):
            return self._stride(s.indices[0]) != 0
        if isinstance(s, LetStmt):
            if self._stride(s.value) != 0:
                self.ctx.vec.lets[s.var] = s.value
            return self._vectorizable(s.body)
        if isinstance(s, IfThenElse):
            return self._vectorizable(s.then_case) and (s.else_case is None or
                                                        self._vectorizable(s.else_case))
        if isinstance(s, Evaluate):
            return True
        return False  # For, Allocate, AssertStmt: keep the scalar loop

    def _stride(self, e) -> int | None:
        """How ``e`` changes from one lane to the next: 0 (invariant), a constant, or None."""
        return arith.lane_stride(e, self.ctx.vec.var, self.ctx.vec.lets)

    # -- parallel loops -------------------------------------------------------------------------
    def _parallel_loop(self, s: For):
        self._uses_parallel = True
        ctx = self.ctx
        b = self.b
        lo = self._scalar(self.visit(s.min), "a loop bound")
        ext = self._scalar(self.visit(s.extent), "a loop extent")
        # everything the body reads from this function travels in a closure struct
        cap_vars = [v for v in free_vars(s) if v in ctx.env and v is not s.loop_var]
        cap_bufs = [buf for buf in _used_buffers(s) if buf in ctx.buffers]
        # one claim counter per task (see _outline), zeroed below once the task count is known
        counters = ctx.alloca(ir.ArrayType(I32, MAX_TASKS), name="par.claimed", align=64)
        values = [ctx.env[v] for v in cap_vars] + [ctx.buffers[x] for x in cap_bufs] + \
            [lo, ext, counters]
        closure_ty = ir.LiteralStructType([v.type for v in values])
        closure = ctx.alloca(closure_ty, name="closure", align=8)
        for i, v in enumerate(values):
            b.store(v, gep(b, closure, [I32(0), I32(i)], closure_ty))
        task_fn = self._outline(s, cap_vars, cap_bufs, closure_ty, lo.type)
        # how many tasks: min(threads, extent); one task runs inline without the pool
        nt = b.load(self.num_threads, typ=I32)
        rt_cores = self.mb.declare(RUNTIME_NUM_CORES, I32, [])
        nt_bb, have_bb = self._new_block("par.nthreads"), self._new_block("par.have")
        pre = b.block
        b.cbranch(b.icmp_signed(">", nt, I32(0)), have_bb, nt_bb)
        b.position_at_end(nt_bb)
        cores = b.call(rt_cores, [])
        b.branch(have_bb)
        b.position_at_end(have_bb)
        threads = b.phi(I32)
        threads.add_incoming(nt, pre)
        threads.add_incoming(cores, nt_bb)
        ext64 = self._to_i64(ext, s.extent.dtype)
        threads64 = b.zext(threads, I64)
        tasks64 = b.select(b.icmp_signed("<", ext64, threads64), ext64, threads64)
        limit = self._task_limit(s, ext64)
        if limit is not None:
            tasks64 = b.select(b.icmp_signed("<", limit, tasks64), limit, tasks64)
        tasks64 = b.select(b.icmp_signed(">", tasks64, I64(MAX_TASKS)), I64(MAX_TASKS), tasks64)
        tasks = b.trunc(tasks64, I32)
        memset = self.mb.intrinsic("memset", ir.VoidType(), [PTR, I8, I64, I1], [PTR, I64])
        b.call(memset, [counters, I8(0), b.mul(tasks64, I64(4)), I1(0)])
        run_bb, pool_bb, one_bb, done_bb = (self._new_block("par.run"), self._new_block("par.pool"),
                                            self._new_block("par.inline"),
                                            self._new_block("par.done"))
        b.cbranch(b.icmp_signed(">", tasks, I32(0)), run_bb, done_bb)
        b.position_at_end(run_bb)
        b.cbranch(b.icmp_signed(">", tasks, I32(1)), pool_bb, one_bb)
        b.position_at_end(pool_bb)
        launch = self.mb.declare(PARALLEL_LAUNCH, I32, [PTR, PTR, I32])
        rc_pool = b.call(launch, [task_fn, closure, tasks])
        b.branch(done_bb)
        b.position_at_end(one_bb)
        rc_one = b.call(task_fn, [I32(0), I32(1), closure])
        b.branch(done_bb)
        b.position_at_end(done_bb)
        rc = b.phi(I32)
        rc.add_incoming(I32(0), have_bb)
        rc.add_incoming(rc_pool, pool_bb)
        rc.add_incoming(rc_one, one_bb)
        ok_bb, bad_bb = self._new_block("par.ok"), self._new_block("par.fail")
        b.cbranch(b.icmp_signed("==", rc, I32(0)), ok_bb, bad_bb)
        b.position_at_end(bad_bb)
        self._return_error(rc)  # the failing task already wrote the message
        b.position_at_end(ok_bb)

    def _task_limit(self, s: For, ext64):
        """``max(1, work // PARALLEL_GRAIN)`` as an i64 for the parallel loop ``s`` (``ext64``
        its extent), ``work`` the iterations of its innermost statements; None where the work
        is not known before the loop (an inner extent that depends on the loop's own variables
        or reads memory): then the loop is not limited."""
        inner = self._work(s.body, s)
        if inner is None:
            return None
        b = self.b
        if isinstance(inner, int):
            if isinstance(ext64, ir.Constant):
                return I64(max(1, ext64.constant * inner // PARALLEL_GRAIN))
            work = b.mul(ext64, I64(inner)) if inner != 1 else ext64
        else:
            work = b.mul(ext64, inner)
        tasks = b.sdiv(work, I64(PARALLEL_GRAIN))
        return b.select(b.icmp_signed("<", tasks, I64(1)), I64(1), tasks)

    def _work(self, stmt: Stmt, par: For):
        """Iterations of ``stmt``'s innermost statements: an int when every extent is a
        constant, an i64 value when some are symbolic (computed here, before the parallel loop
        ``par``), None when an extent is not known before ``par`` runs."""
        b = self.b

        def mul(x, y):
            if isinstance(x, int) and isinstance(y, int):
                return x * y
            if isinstance(x, int):
                x, y = y, x
            return x if y == 1 else b.mul(x, I64(y) if isinstance(y, int) else y)

        def add(x, y):
            if isinstance(x, int) and isinstance(y, int):
                return x + y
            return b.add(I64(x) if isinstance(x, int) else x, I64(y) if isinstance(y, int) else y)

        def extent(e: PrimExpr):
            if isinstance(e, IntImm):
                return int(e.value)
            env = self.ctx.env
            if any(v not in env or v is par.loop_var for v in free_vars(e)):
                return None
            found = []
            post_order_visit(e, lambda n: found.append(n) if isinstance(n, (BufferLoad, Call))
                             else None)
            if found:
                return None
            return self._to_i64(self.visit(e), e.dtype)

        def rec(n):
            if isinstance(n, For):
                ext, body = extent(n.extent), rec(n.body)
                return None if ext is None or body is None else mul(ext, body)
            if isinstance(n, SeqStmt):
                total = 0
                for x in n.seq:
                    w = rec(x)
                    if w is None:
                        return None
                    total = add(total, w)
                return total
            if isinstance(n, IfThenElse):
                # both branches: an upper bound of the work
                w = rec(n.then_case)
                e = rec(n.else_case) if n.else_case is not None else 0
                return None if w is None or e is None else add(w, e)
            if isinstance(n, (LetStmt, AssertStmt, Allocate)):
                return rec(n.body)
            if isinstance(n, (BufferStore, Evaluate)):
                return 1
            return None
        return rec(stmt)

    def _outline(self, s: For, cap_vars, cap_bufs, closure_ty, ity) -> ir.Function:
        outer = self.ctx
        self._outlined += 1
        fn = ir.Function(self.module, ir.FunctionType(I32, [I32, I32, PTR]),
                         f"{outer.fn.name}.par{self._outlined}")
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        task, ntasks, closure = fn.args
        task.name, ntasks.name, closure.name = "task", "num_tasks", "closure"
        ctx = _FnCtx(fn, outer.func_name)
        ctx.parallel_depth = outer.parallel_depth + 1
        ctx.analyzer = outer.analyzer   # the facts around the parallel loop hold inside
        self.ctx = ctx
        b = self.b
        fields = list(closure_ty.elements)

        def load_field(i):
            return b.load(gep(b, closure, [I32(0), I32(i)], closure_ty), typ=fields[i])

        k = 0
        for v in cap_vars:
            ctx.env[v] = load_field(k)
            k += 1
        for x in cap_bufs:
            ctx.buffers[x] = load_field(k)
            k += 1
        lo, ext, counters = load_field(k), load_field(k + 1), load_field(k + 2)
        self._claim_chunks(s, task, ntasks, lo, ext, counters, ity)
        self._fence_nontemporal()
        b.ret(I32(0))
        ctx.finish()
        self.ctx = outer
        return fn

    def _claim_chunks(self, s: For, task, ntasks, lo, ext, counters, ity):
        """The body of task ``t`` of ``n``: its own ``CHUNKS_PER_TASK`` contiguous chunks of the
        iteration space in order, then whatever chunks of the other tasks are still unclaimed.

        Each task's region (``K`` chunks, chunk ``j`` covering ``[j * extent / (n * K),
        (j + 1) * extent / (n * K))``) is what a balanced static split would give it, so on an idle
        machine every task runs exactly its own region, with the same cache locality from call to
        call. A chunk is claimed with an atomic increment of its region's counter; a task that
        finishes early takes the others' remaining chunks, so a core slowed down by another
        process delays the loop by at most about one chunk, not by its whole share.
        """
        b = self.b
        fn = self.ctx.fn
        K = CHUNKS_PER_TASK
        n = b.sext(ntasks, ity) if ity.width > 32 else ntasks
        total = b.mul(n, ir.Constant(ity, K))
        victim_bb, claim_bb, run_bb, next_bb, done_bb = (
            fn.append_basic_block("steal.victim"), fn.append_basic_block("steal.claim"),
            fn.append_basic_block("steal.run"), fn.append_basic_block("steal.next"),
            fn.append_basic_block("steal.done"))
        entry = b.block
        b.branch(victim_bb)
        # for s in 0 .. n-1: region u = (t + s) mod n
        b.position_at_end(victim_bb)
        step = b.phi(I32, name="steal.s")
        step.add_incoming(I32(0), entry)
        b.cbranch(b.icmp_signed("<", step, ntasks), claim_bb, done_bb)
        b.position_at_end(claim_bb)
        u = b.add(task, step)
        u = b.select(b.icmp_signed(">=", u, ntasks), b.sub(u, ntasks), u)
        counter = b.gep(counters, [b.zext(u, I64)], source_etype=I32)
        c = b.atomic_rmw("add", counter, I32(1), "monotonic")
        b.cbranch(b.icmp_signed("<", c, I32(K)), run_bb, next_bb)
        b.position_at_end(run_bb)
        u_i = b.sext(u, ity) if ity.width > 32 else u
        c_i = b.sext(c, ity) if ity.width > 32 else c
        # chunk j covers [j * extent / (n K), (j + 1) * extent / (n K)): sizes differ by at most
        # one iteration, so the tasks' regions are balanced (34 iterations: 17 + 17, not 20 + 14)
        # (in 64 bits: j * extent overflows a 32-bit loop variable's type)
        wide = I64 if ity.width < 64 else ity
        j = b.add(b.mul(u_i, ir.Constant(ity, K)), c_i)
        j, ext_w, total_w = (b.sext(v, wide) if ity.width < 64 else v for v in (j, ext, total))
        begin = self._div(b.mul(j, ext_w), total_w, True, False)
        end = self._div(b.mul(b.add(j, ir.Constant(wide, 1)), ext_w), total_w, True, False)
        if ity.width < 64:
            begin, end = b.trunc(begin, ity), b.trunc(end, ity)
        self._serial_loop(s, None, lo=b.add(lo, begin), hi=b.add(lo, end))
        b.branch(claim_bb)
        b.position_at_end(next_bb)
        step.add_incoming(b.add(step, I32(1)), next_bb)
        b.branch(victim_bb)
        b.position_at_end(done_bb)

    # ------------------------------------------------------------------------------------------
    # expressions

    def visit_Var(self, e: Var):
        v = self.ctx.env.get(e)
        if v is None:
            raise TIRError(f"{self.ctx.func_name}: variable {e.name} is used but not defined",
                           e)
        return v

    def visit_IntImm(self, e: IntImm):
        bits = dt.bits(e.dtype)
        value = e.value
        if bits > 1 and value >= 1 << (bits - 1):
            value -= 1 << bits  # LLVM prints integer constants signed
        return self.rtype(e.dtype)(value)

    def visit_FloatImm(self, e: FloatImm):
        value = e.value
        if e.dtype == "float16":
            value = float(np.float16(value))  # the constant as float16 holds it
        return ir.Constant(self.rtype(e.dtype), value)

    def visit_StringImm(self, e: StringImm):
        raise TIRError(f"string constant {e.value!r} used as a value", e)

    def visit_Reduce(self, e: Reduce):
        raise TIRError("Reduce is a te node; lower the function before compiling it", e)

    def _operands(self, e):
        return self._match(self.visit(e.a), self.visit(e.b))

    def _arith(self, e, fop: str, iop: str):
        a, b_ = self._operands(e)
        if dt.is_float(e.a.dtype):
            return self._round16(getattr(self.b, fop)(a, b_), e.dtype)
        return getattr(self.b, iop)(a, b_)

    def visit_Add(self, e):
        if isinstance(e.b, Call) and e.b.op == dot4.DOT4_U8I8:
            # acc + dot4(a, b): one accumulating instruction (vpdpbusd, sdot)
            acc, x, y = self.visit(e.a), self.visit(e.b.args[0]), self.visit(e.b.args[1])
            return dot4.emit_dot4(self.mb, self.b, self.opt.dot_isa, acc, x, y)
        return self._arith(e, "fadd", "add")

    def visit_Sub(self, e):
        return self._arith(e, "fsub", "sub")

    def visit_Mul(self, e):
        return self._arith(e, "fmul", "mul")

    def visit_Div(self, e: Div):
        if dt.is_float(e.a.dtype):
            return self._arith(e, "fdiv", "")
        return self._int_divmod("div", e)

    def visit_Mod(self, e: Mod):
        if dt.is_float(e.a.dtype):
            return self._arith(e, "frem", "")
        return self._int_divmod("mod", e)

    def visit_FloorDiv(self, e: FloorDiv):
        if dt.is_float(e.a.dtype):
            a, b_ = self._operands(e)
            q = intrinsics.emit_math(self.mb, self.b, "floor", [self.b.fdiv(a, b_)])
            return self._round16(q, e.dtype)
        return self.visit(arith.lower_floor_divmod(e, self.ctx.analyzer))

    def visit_FloorMod(self, e: FloorMod):
        if dt.is_float(e.a.dtype):
            a, b_ = self._operands(e)
            b = self.b
            r = b.frem(a, b_)
            zero = self._k(r, 0.0)
            fix = b.and_(b.fcmp_unordered("!=", r, zero),
                         b.xor(b.fcmp_ordered("<", r, zero), b.fcmp_ordered("<", b_, zero)))
            return self._round16(b.select(fix, b.fadd(r, b_), r), e.dtype)
        return self.visit(arith.lower_floor_divmod(e, self.ctx.analyzer))

    def _div(self, a, d, signed: bool, rem: bool):
        """Truncating division or remainder: an instruction, or softops where the target would
        otherwise call a compiler-runtime helper."""
        if self.soft.division_is_soft(element_type(a.type).width, d):
            return self.soft.divrem(self.b, a, d, signed, rem)
        b = self.b
        if signed:
            return b.srem(a, d) if rem else b.sdiv(a, d)
        return b.urem(a, d) if rem else b.udiv(a, d)

    def _int_divmod(self, kind: str, e):
        """Integer ``Div`` (kind "div") or ``Mod`` ("mod"), truncating; x / 0 and x % 0 give 0
        (as numpy) instead of a trap. (Floor division is lowered to these by
        ``arith.lower_floor_divmod``.)"""
        a, d = self._operands(e)
        b = self.b
        signed = dt.is_int(e.a.dtype)
        dconst = e.b.value if isinstance(e.b, IntImm) else None
        want_rem = kind == "mod"
        if not signed:
            if dconst:
                return self._div(a, d, False, want_rem)
            zero = b.icmp_unsigned("==", d, self._k(d, 0))
            res = self._div(a, b.select(zero, self._k(d, 1), d), False, want_rem)
            return b.select(zero, self._k(res, 0), res)
        if dconst is not None and dconst > 0:
            if arith.is_nonneg(e.a, self.ctx.analyzer):  # both >= 0: the unsigned division
                return self._div(a, d, False, want_rem)
            return self._div(a, d, True, want_rem)
        if dconst is not None and dconst < -1:
            return self._div(a, d, True, want_rem)
        zero = b.icmp_signed("==", d, self._k(d, 0))
        minus1 = b.icmp_signed("==", d, self._k(d, -1))
        safe = b.select(b.or_(zero, minus1), self._k(d, 1), d)
        res = self._div(a, safe, True, want_rem)
        # x / -1 is -x (INT_MIN / -1 wraps rather than trapping), x % -1 is 0
        by_minus1 = b.neg(a) if kind == "div" else self._k(a, 0)
        res = b.select(minus1, by_minus1, res)
        return b.select(zero, self._k(res, 0), res)

    def _minmax(self, e, is_max: bool):
        a, b_ = self._operands(e)
        b = self.b
        d = e.a.dtype
        if dt.is_float(d):
            op = ">" if is_max else "<"
            for c, x, imm in ((b_, a, e.b), (a, b_, e.a)):
                if isinstance(imm, FloatImm) and not math.isnan(imm.value):
                    # a constant that is not NaN (relu's 0, a clip bound): ``c op x ? c : x``
                    # keeps a NaN ``x`` and is one max / min instruction (x86 ``maxps(c, x)``
                    # returns its second operand when either is NaN), against three for the
                    # general form below (a compare, a NaN test and a blend)
                    return b.select(b.fcmp_ordered(op, c, x), c, x)
            pick = b.fcmp_ordered(op, a, b_)
            r = b.select(pick, a, b_)
            return b.select(b.fcmp_unordered("uno", a, a), a, r)  # NaN propagates, as in numpy
        cmp = b.icmp_unsigned if (dt.is_uint(d) or d == "bool") else b.icmp_signed
        return b.select(cmp(">" if is_max else "<", a, b_), a, b_)

    def visit_Min(self, e):
        return self._minmax(e, False)

    def visit_Max(self, e):
        return self._minmax(e, True)

    def _cmp(self, e: CmpOp, op: str):
        a, b_ = self._operands(e)
        d = e.a.dtype
        if dt.is_float(d):
            if op == "!=":
                return self.b.fcmp_unordered("!=", a, b_)
            return self.b.fcmp_ordered(op, a, b_)
        if dt.is_uint(d) or d == "bool":
            return self.b.icmp_unsigned(op, a, b_)
        return self.b.icmp_signed(op, a, b_)

    def visit_EQ(self, e):
        return self._cmp(e, "==")

    def visit_NE(self, e):
        return self._cmp(e, "!=")

    def visit_LT(self, e):
        return self._cmp(e, "<")

    def visit_LE(self, e):
        return self._cmp(e, "<=")

    def visit_GT(self, e):
        return self._cmp(e, ">")

    def visit_GE(self, e):
        return self._cmp(e, ">=")

    def visit_And(self, e):
        a, b_ = self._operands(e)
        return self.b.and_(a, b_)

    def visit_Or(self, e):
        a, b_ = self._operands(e)
        return self.b.or_(a, b_)

    def visit_Not(self, e: Not):
        return self.b.not_(self.visit(e.a))

    def visit_Select(self, e: Select):
        c = self.visit(e.condition)
        t, f = self._match(self.visit(e.true_value), self.visit(e.false_value))
        if is_vector(c) and not is_vector(t):
            t, f = splat(self.b, t, lanes_of(c)), splat(self.b, f, lanes_of(c))
        return self.b.select(c, t, f)

    def visit_Let(self, e: Let):
        v = self.visit(e.value)
        return self._bind(e.var, v, e.value, lambda: self.visit(e.body))

    def visit_Cast(self, e: Cast):
        return self._cast(self.visit(e.value), e.value.dtype, e.dtype)

    def _cast(self, v, src: str, dst: str):
        if src == dst:
            return v
        b = self.b
        n = lanes_of(v)
        s_code, s_bits, _ = dt.parse(src)
        d_code, d_bits, _ = dt.parse(dst)
        target = self.rtype(dst, n)
        if d_code == "bool":
            if s_code == "float":
                return b.fcmp_unordered("!=", v, self._k(v, 0.0))
            return b.icmp_unsigned("!=", v, self._k(v, 0))
        if s_code == "bool":
            return b.uitofp(v, target) if d_code == "float" else b.zext(v, target)
        if s_code in ("int", "uint") and d_code in ("int", "uint"):
            if d_bits < s_bits:
                return b.trunc(v, target)
            if d_bits > s_bits:
                return b.sext(v, target) if s_code == "int" else b.zext(v, target)
            return v
        if d_code == "float" and s_code in ("int", "uint"):
            if s_bits == 64 and self.soft.soft_int64_float:
                r = self.soft.int64_to_float(b, v, s_code == "int", target)
            else:
                r = b.sitofp(v, target) if s_code == "int" else b.uitofp(v, target)
            return self._round16(r, dst)
        if s_code == "float" and d_code in ("int", "uint"):
            if d_bits == 64 and self.soft.soft_int64_float:
                return self.soft.float_to_int64(b, v, d_code == "int", target)
            return b.fptosi(v, target) if d_code == "int" else b.fptoui(v, target)
        # float -> float (float16 computes as float32 unless the target computes in half)
        width = {F16: 16, F32: 32, F64: 64}
        have, want = width[element_type(v.type)], width[element_type(target)]
        if have == want:
            r = v
        elif want > have:
            r = b.fpext(v, target)
        else:
            r = b.fptrunc(v, target)
        return self._round16(r, dst)

    def visit_Call(self, e: Call):
        if e.op == "if_then_else":
            return self._if_then_else(e)
        if e.op == dot4.DOT4_U8I8:
            x, y = self.visit(e.args[0]), self.visit(e.args[1])
            return dot4.emit_dot4(self.mb, self.b, self.opt.dot_isa, I32(0), x, y)
        if e.op == NIBBLE_F32:
            w, s = self._match(self.visit(e.args[0]), self.visit(e.args[1]))
            return intrinsics.emit_nibble_f32(self.mb, self.b, w, s)
        if e.op not in intrinsics.LLVM_INTRINSIC and e.op not in intrinsics.LIBM and \
                e.op not in ("sigmoid", "rsqrt"):
            raise TIRError(f"the LLVM back end does not know the intrinsic {e.op!r}", e)
        args = [self.visit(a) for a in e.args]
        if len(args) == 2:
            args = list(self._match(*args))
        src = e.args[0].dtype
        if src == "float16" and self.f16_arith:
            # the math routines compute in float32: widen, compute, round once
            args = [self._cast(a, "float16", "float32") for a in args]
            out = intrinsics.emit_math(self.mb, self.b, e.op, args)
            return self._cast(out, "float32", e.dtype)
        out = intrinsics.emit_math(self.mb, self.b, e.op, args)
        if src == "float16" and e.op not in intrinsics.EXACT_F16:
            out = self.f16.round(self.b, out)
        return self._cast(out, src, e.dtype) if e.dtype != src else out

    def _if_then_else(self, e: Call):
        cond_e, t_e, f_e = e.args
        c = self.visit(cond_e)
        b = self.b
        vec = self.ctx.vec
        if is_vector(c):
            # both sides run, each under its mask, so guarded loads stay in bounds
            old = vec.mask
            vec.mask = c if old is None else b.and_(old, c)
            t = self.visit(t_e)
            neg = b.not_(c)
            vec.mask = neg if old is None else b.and_(old, neg)
            f = self.visit(f_e)
            vec.mask = old
            t, f = splat(b, t, lanes_of(c)), splat(b, f, lanes_of(c))
            return b.select(c, t, f)
        then_bb, else_bb, end_bb = (self._new_block("ite.then"), self._new_block("ite.else"),
                                    self._new_block("ite.end"))
        b.cbranch(c, then_bb, else_bb)
        b.position_at_end(then_bb)
        t = self.visit(t_e)
        t_end = b.block
        b.position_at_end(else_bb)
        f = self.visit(f_e)
        f_end = b.block
        n = max(lanes_of(t), lanes_of(f))
        b.position_at_end(t_end)
        t = splat(b, t, n)
        b.branch(end_bb)
        b.position_at_end(f_end)
        f = splat(b, f, n)
        b.branch(end_bb)
        b.position_at_end(end_bb)
        phi = b.phi(t.type)
        phi.add_incoming(t, t_end)
        phi.add_incoming(f, f_end)
        return phi

    def visit_BufferLoad(self, e: BufferLoad):
        buf = e.buffer
        ptr = self._buffer_ptr(buf, e)
        index_e = e.indices[0]
        memty = self.mtype(buf.dtype)
        align = self.itemsize(buf.dtype)
        vec = self.ctx.vec
        b = self.b
        if vec is None or self._stride(index_e) == 0:
            index = self._to_i64(self._scalar(self.visit(index_e), "an index"), index_e.dtype)
            if vec is not None and vec.mask is not None:
                return self._guarded_scalar_load(ptr, index, buf)
            addr = b.gep(ptr, [index], source_etype=memty)
            return self._from_mem(self._tag(b.load(addr, typ=memty, align=align), buf),
                                  buf.dtype)
        n = vec.lanes
        stride = self._stride(index_e)
        index = splat(b, self._to_i64(self.visit(index_e), index_e.dtype), n)
        vty = vec_type(memty, n)
        if stride == 1:
            base = b.extract_element(index, I32(0))
            addr = b.gep(ptr, [base], source_etype=memty)
            if vec.mask is None:
                return self._from_mem(self._tag(b.load(addr, typ=vty, align=align), buf),
                                      buf.dtype)
            if self._stack_lanes_in_bounds(ptr, buf, index_e):
                # a whole load and a select, for the reason the store gives
                raw = self._tag(b.load(addr, typ=vty, align=align), buf)
                return self._from_mem(b.select(vec.mask, raw, const(vty, 0)), buf.dtype)
            fn = self.mb.intrinsic("masked.load", vty, [PTR, I32, vec_type(I1, n), vty],
                                   [vty, PTR])
            raw = self._tag(b.call(fn, [addr, I32(align), vec.mask, const(vty, 0)]), buf)
            return self._from_mem(raw, buf.dtype)
        if stride in STRIDED_LOAD_STRIDES:
            return self._strided_load(ptr, index, stride, buf)
        if vec.mask is None and isinstance(ptr, ir.AllocaInstr):
            return self._lane_loads(ptr, index, buf)
        ptrs = self._vector_gep(ptr, index, memty)
        mask = vec.mask if vec.mask is not None else const(vec_type(I1, n), 1)
        fn = self.mb.intrinsic("masked.gather", vty, [ptrs.type, I32, vec_type(I1, n), vty],
                               [vty, ptrs.type])
        raw = self._tag(b.call(fn, [ptrs, I32(align), mask, const(vty, 0)]), buf)
        return self._from_mem(raw, buf.dtype)

    def _strided_load(self, ptr, index, stride: int, buf: Buffer):
        """Lanes ``index[0] + k * stride`` (a small constant stride: a pooling window, a strided
        slice) as one masked load of ``lanes * stride`` contiguous elements, only every
        ``stride``-th enabled (so nothing outside the accessed elements is read), then a
        shuffle that keeps those lanes. A gather of the same lanes measured 50-70x slower
        than a scalar loop on Zen 4; the masked load and the shuffle are a few instructions."""
        b = self.b
        vec = self.ctx.vec
        n = vec.lanes
        memty = self.mtype(buf.dtype)
        wide = n * stride
        wty = vec_type(memty, wide)
        if vec.mask is None:
            mask = ir.Constant(vec_type(I1, wide), [ir.Constant(I1, int(i % stride == 0))
                                                    for i in range(wide)])
        else:
            # lane i of the wide load is element i // stride's lane when i % stride == 0; the
            # other lanes take lane 0 of an all-false vector
            off = const(vec_type(I1, n), 0)
            pick = [i // stride if i % stride == 0 else n for i in range(wide)]
            mask = b.shuffle_vector(vec.mask, off, ir.Constant(vec_type(I32, wide), pick))
        base = b.extract_element(index, I32(0))
        addr = b.gep(ptr, [base], source_etype=memty)
        fn = self.mb.intrinsic("masked.load", wty, [PTR, I32, vec_type(I1, wide), wty],
                               [wty, PTR])
        raw = self._tag(b.call(fn, [addr, I32(self.itemsize(buf.dtype)), mask,
                                    const(wty, 0)]), buf)
        keep = ir.Constant(vec_type(I32, n), [k * stride for k in range(n)])
        lanes = b.shuffle_vector(raw, ir.Constant(wty, ir.Undefined), keep)
        return self._from_mem(lanes, buf.dtype)

    def _lane_loads(self, ptr, index, buf: Buffer):
        """The lanes of a load from a stack buffer (a register tile) one scalar load each,
        put together with ``insertelement``. Once LLVM has promoted the tile to registers
        these are lane extracts and shuffles (a tile read across its vectors, the transpose of
        a channel-vector convolution's accumulators); a gather would keep the tile in memory
        (every accumulator spilled to the stack to be gathered back) and is slow on Zen 4."""
        b = self.b
        n = lanes_of(index)
        memty = self.mtype(buf.dtype)
        out = ir.Constant(vec_type(memty, n), ir.Undefined)
        for k in range(n):
            addr = b.gep(ptr, [b.extract_element(index, I32(k))], source_etype=memty)
            lane = self._tag(b.load(addr, typ=memty, align=self.itemsize(buf.dtype)), buf)
            out = b.insert_element(out, lane, I32(k))
        return self._from_mem(out, buf.dtype)

    def _guarded_scalar_load(self, ptr, index, buf: Buffer):
        """A lane-invariant load under a mask: done only if some lane is active."""
        dtype = buf.dtype
        b = self.b
        vec = self.ctx.vec
        memty = self.mtype(dtype)
        any_fn = self.mb.intrinsic("vector.reduce.or", I1, [vec.mask.type], [vec.mask.type])
        active = b.call(any_fn, [vec.mask])
        pre = b.block
        load_bb, end_bb = self._new_block("gload"), self._new_block("gload.end")
        b.cbranch(active, load_bb, end_bb)
        b.position_at_end(load_bb)
        v = self._tag(b.load(b.gep(ptr, [index], source_etype=memty), typ=memty,
                             align=self.itemsize(dtype)), buf)
        b.branch(end_bb)
        b.position_at_end(end_bb)
        phi = b.phi(memty)
        phi.add_incoming(v, load_bb)
        phi.add_incoming(ir.Constant(memty, 0), pre)
        return self._from_mem(phi, dtype)

    def _to_mem(self, v, dtype: str):
        if dtype == "bool":
            return self.b.zext(v, vec_type(I8, lanes_of(v)))
        if dtype == "float16" and not self.f16_arith:
            return self.f16.float_to_mem(self.b, v)
        return v

    def _from_mem(self, v, dtype: str):
        if dtype == "bool":
            return self.b.icmp_unsigned("!=", v, self._k(v, 0))
        if dtype == "float16" and not self.f16_arith:
            return self.f16.load_to_float(self.b, v)
        return v

# ----------------------------------------------------------------------------------------------
# function analysis


def _reject_unlowered(name: str, func: PrimFunc):
    def visit(n):
        if isinstance(n, (Block, BlockRealize)):
            raise TIRError(f"{name}: the function still has blocks; compile the output of "
                           f"tensorir.transform.lower", n)
    post_order_visit(func.body, visit)


def _classify_params(name: str, func: PrimFunc):
    attrs = func.attr_dict
    handles = [p for p in func.params if p.dtype == dt.HANDLE]
    originals = attrs.get("arg_buffers")
    if originals is None:
        originals = [func.buffer_of(h) for h in handles]
    originals = list(originals)
    if len(originals) != len(handles):
        raise TIRError(f"{name}: attr arg_buffers lists {len(originals)} buffers for "
                       f"{len(handles)} buffer parameters", func)
    bparams, sparams = [], []
    k = 0
    for i, p in enumerate(func.params):
        if p.dtype == dt.HANDLE:
            flat = func.buffer_of(p)
            orig = originals[k]
            k += 1
            if flat.ndim != 1:
                raise TIRError(f"{name}: buffer parameter {flat.name} is not flat; compile the "
                               f"output of tensorir.transform.lower", flat)
            if orig.dtype != flat.dtype:
                raise TIRError(f"{name}: argument {orig.name} is {orig.dtype} but its flat buffer "
                               f"is {flat.dtype}", flat)
            abi.dl_dtype(orig.dtype)
            bparams.append(BufferParam(i, p, orig.name, flat, orig))
        else:
            if dt.lanes(p.dtype) != 1:
                raise TIRError(f"{name}: scalar parameter {p.name} has vector dtype {p.dtype}", p)
            sparams.append(ScalarParam(i, p, p.name, p.dtype))
    return bparams, sparams


def _stored_buffers(s) -> list[Buffer]:
    out: dict[int, Buffer] = {}

    def visit(n):
        if isinstance(n, BufferStore):
            out[id(n.buffer)] = n.buffer
    post_order_visit(s, visit)
    return list(out.values())


def _used_buffers(s) -> list[Buffer]:
    """Buffers ``s`` reads or writes that it does not allocate itself, in first-use order."""
    used: dict[int, Buffer] = {}
    allocated: set[int] = set()

    def visit(n):
        if isinstance(n, (BufferLoad, BufferStore)):
            used.setdefault(id(n.buffer), n.buffer)
        elif isinstance(n, Allocate):
            allocated.add(id(n.buffer))
    post_order_visit(s, visit)
    return [b for k, b in used.items() if k not in allocated]


def _function_metadata(name, symbol, func, bparams, sparams) -> dict:
    written = {id(b) for b in _stored_buffers(func.body)}
    params: list[dict | None] = [None] * len(func.params)
    for p in bparams:
        shape = [d.value if isinstance(d, IntImm) else expr_str(d) for d in p.orig.shape]
        params[p.index] = {"name": p.name, "kind": "buffer", "dtype": p.orig.dtype,
                           "shape": shape, "symbolic": [not isinstance(d, IntImm)
                                                        for d in p.orig.shape],
                           "written": id(p.flat) in written}
    for p in sparams:
        params[p.index] = {"name": p.name, "kind": "scalar", "dtype": p.dtype}
    shape_vars = []
    for p in bparams:
        for d in p.orig.shape:
            for v in free_vars(d):
                if v.name not in shape_vars:
                    shape_vars.append(v.name)
    return {"name": name, "symbol": symbol, "params": params, "shape_vars": shape_vars}
