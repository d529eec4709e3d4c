"""``FoldConstant``: evaluate at compile time what only depends on constants.

- ``R.call_tir(f, (c0, c1, ...))`` with constant arguments (and constant ``tir_vars``) runs the
  kernel once: small ones, and data movement or elementwise IEEE arithmetic of any size, with
  numpy on strided views of the inputs (``fold_numpy_kernel``: one loop nest of elementwise
  arithmetic on affine reads, such as the weight packing) or ``tensorir.interpret`` (both the
  compiled kernel's bits), others compiled with ``targets.build``
  for the host; the call becomes a ``Constant`` (a ``Tuple`` of them for several outputs).
- An operator call with constant arguments is evaluated with numpy where that gives the
  kernel's bits (``fold_constant_numpy``: batch normalization's arithmetic, reshapes,
  transposes); else it is legalized on the side and evaluated the same way as a call_tir
  (operators without a legalization, the VM builtins, are left alone).
- ``(a, b)[0]`` and ``t[0]`` where ``t = (a, b)`` fold to ``a``; a variable bound to a constant is
  replaced by the constant where it is used (``DeadCodeElimination`` then drops the binding).

A kernel that fails on the constants (an out-of-bounds index, a failing assert) is not folded:
the program keeps the call and fails where it would have run.

Examples
--------
>>> # lv = R.call_tir(cls.add, (metadata[0], metadata[1]), ...) ; gv = R.add(x, lv)
>>> # after FoldConstant: gv = R.add(x, metadata[2])
"""
from __future__ import annotations

import numpy as np

from tilecraft.errors import TilecraftError
from tilecraft import targets
from tilecraft.tensorir import arith
from tilecraft.tensorir.interpret import interpret
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import (BufferLoad, Call as TirCall, Cast, FloatImm, IntImm, Max,
                                     Min, PrimExpr, Reduce, TIRError, Var as TirVar)
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.functor import post_order_visit, substitute
from tilecraft.tensorir.stmt import Block, BlockRealize, BufferStore, For, SeqStmt

from ..analysis import get_var2val, is_call_tir
from ..expr import (Call, Constant, Expr, Function, PrimValue, ShapeExpr, StringImm, Tuple,
                    TupleGetItem, Var)
from ..op.base import Op
from ..struct_info import TensorStructInfo, TupleStructInfo
from .base import ExprMutator, Pass, RewriteBuilder
from .fold_constant_numpy import evaluate_op
from .fold_numpy_kernel import run_numpy_kernel

__all__ = ["FoldConstant", "run_call_tir"]

_INTERPRET_ELEMENTS = 4096   # kernels touching at most this many elements run in the interpreter
# The other kernels are compiled for the host without LLVM's optimizations: each runs once, on
# constants, and LLVM's -O3 took up to 2 s of code generation for a 2-D weight copy that -O0
# compiles in 30 ms (ResNet-50's graph passes: 4.3 -> 2.3 CPU seconds). The results are the
# same bits: the code generator decides every instruction, and LLVM does not reassociate or
# contract floating-point arithmetic at any level.
_FOLD_TARGET = "llvm -opt-level=0"

# Kernels ``tensorir.interpret`` runs with the compiled kernel's bits, whatever their size: data
# movement (the weight packing of ``AlterLayout``: 54 kernels, 0.6 CPU s compiled and run in a
# warm ResNet-50 build; the interpreter runs them as whole-array numpy indexing in a third of
# that, with nothing to compile or link) and elementwise IEEE arithmetic. The interpreter
# evaluates every node in its own dtype, element by element as the kernel does; what it would
# compute differently stays on the compiled path: reductions (numpy sums pairwise),
# transcendental intrinsics (numpy's exp is not LLVM's), float16 (x86 widens it), casts of
# floats to integers (out of range, numpy and the kernel need not agree), min / max of floats
# (which NaN wins).
_EXACT_INTRINSICS = frozenset({"if_then_else", "sqrt", "rsqrt", "fabs", "floor", "ceil",
                               "trunc", "round"})
_INEXACT_DTYPES = frozenset({"float16", "bfloat16"})


class FoldConstant(Pass):
    """Fold calls whose arguments are all constants into constants.

    Examples
    --------
    >>> new_mod = FoldConstant()(mod)   # doctest: +SKIP
    """

    name = "FoldConstant"

    def transform_module(self, mod: IRModule) -> IRModule:
        _compile_together(mod)
        return _Folder(mod).visit_module()


class _CannotFold(TilecraftError):
    pass


def _bind_dims(dims, shape, env):
    for d, s in zip(dims, shape):
        if isinstance(d, TirVar) and d not in env:
            env[d] = IntImm(int(s), d.dtype)


def _static_dims(dims, env) -> tuple[int, ...]:
    out = []
    for d in dims:
        v = arith.simplify(substitute(d, env)) if env else d
        if not isinstance(v, IntImm):
            raise _CannotFold(f"dimension {d!r} is not known at compile time")
        out.append(v.value)
    return tuple(out)


_BUILD_CACHE: dict[int, tuple] = {}   # id(PrimFunc) -> (PrimFunc, symbol, host module)
_BUILD_CACHE_SIZE = 64


def _compile_together(mod: IRModule) -> None:
    """Compile, in one host module, the kernels of every call that will be folded on the
    compiled path as the module stands: a ``call_tir`` of a PrimFunc whose arguments are all
    constants and that touches more than ``_INTERPRET_ELEMENTS`` elements.

    One module is one link and its kernels compile in parallel, where building them one by one
    as the pass meets them links each (ResNet-50: 21 weight-packing kernels). Calls that only
    become constant while folding (and legalized operators) are still built as they come.
    """
    funcs: dict[str, PrimFunc] = {}
    for func in mod.functions.values():
        if not isinstance(func, Function):
            continue
        for value in get_var2val(func).values():
            if not is_call_tir(value) or len(value.args) != 2:
                continue
            gv, args = value.args
            kernel = mod.functions.get(gv.name_hint)
            if not isinstance(kernel, PrimFunc) or not isinstance(args, Tuple) or \
                    not all(isinstance(a, Constant) for a in args.fields):
                continue
            cached = _BUILD_CACHE.get(id(kernel))
            if cached is not None and cached[0] is kernel:
                continue
            out_si = value.sinfo_args[0]
            outs = list(out_si.fields) if isinstance(out_si, TupleStructInfo) else [out_si]
            shapes = [si.static_shape() if isinstance(si, TensorStructInfo) else None
                      for si in outs]
            if any(shape is None for shape in shapes):
                continue
            total = sum(a.data.size for a in args.fields) + sum(int(np.prod(s)) for s in shapes)
            if total > _INTERPRET_ELEMENTS and not _exact_in_interpreter(kernel):
                funcs[gv.name_hint] = kernel
    if len(funcs) < 2:
        return
    try:
        built = targets.build(IRModule(funcs), _FOLD_TARGET)
    except (TIRError, RuntimeError, ValueError, TilecraftError):
        # a kernel that does not compile: build them one by one as the pass meets them, so
        # that only that call stays unfolded (the per-kernel build raises the same error)
        return
    for name, kernel in funcs.items():
        _BUILD_CACHE[id(kernel)] = (kernel, name, built)
    while len(_BUILD_CACHE) > max(_BUILD_CACHE_SIZE, len(funcs)):
        _BUILD_CACHE.pop(next(iter(_BUILD_CACHE)))


def _one_store_per_element(stmt) -> bool:
    """Whether ``stmt`` is loop nests (static extents), each around one block that stores one
    element per iteration: no reduction, no init, the store's indices distinct iteration
    variables of the block bound to distinct loop variables, so the interpreter vectorizes
    every loop (the iterations write distinct elements)."""
    if isinstance(stmt, SeqStmt):
        return all(_one_store_per_element(s) for s in stmt.seq)
    loops = []
    while isinstance(stmt, For):
        if not isinstance(stmt.extent, IntImm) or not isinstance(stmt.min, IntImm):
            return False
        loops.append(stmt.loop_var)
        stmt = stmt.body
    if not isinstance(stmt, BlockRealize):
        return False
    block = stmt.block
    if block.init is not None or block.alloc_buffers or \
            any(iv.kind != "spatial" for iv in block.iter_vars):
        return False
    values = stmt.iter_values
    if not all(isinstance(v, TirVar) for v in values) or \
            len({id(v) for v in values}) != len(values) or \
            not {id(v) for v in values} <= {id(v) for v in loops}:
        return False
    store = block.body
    if not isinstance(store, BufferStore):
        return False
    own = {id(iv.var) for iv in block.iter_vars}
    return all(isinstance(i, TirVar) and id(i) in own for i in store.indices) and \
        len({id(i) for i in store.indices}) == len(store.indices)


def _exact_in_interpreter(func: PrimFunc) -> bool:
    """Whether ``tensorir.interpret`` computes ``func``'s outputs bit for bit as its compiled
    kernel, vectorized over every loop (see ``_EXACT_INTRINSICS``)."""
    cached = _EXACT_CACHE.get(id(func))
    if cached is not None and cached[0] is func:
        return cached[1]
    body = func.body
    exact = isinstance(body, BlockRealize) and not body.iter_values and \
        not body.block.iter_vars and body.block.init is None and \
        _one_store_per_element(body.block.body) and \
        all(b.dtype not in _INEXACT_DTYPES for b in func.buffers)
    if exact:
        # a read of a buffer the kernel writes (a scan such as out[i] = out[i - 1] + x[i], an
        # intermediate) may keep the interpreter from vectorizing: millions of elements in
        # Python loops. Only the inputs are read.
        written = set()
        post_order_visit(body, lambda n: written.add(id(n.buffer))
                         if isinstance(n, BufferStore) else None)

        def check(n):
            nonlocal exact
            if isinstance(n, Reduce) or \
                    (isinstance(n, BufferLoad) and id(n.buffer) in written) or \
                    (isinstance(n, TirCall) and n.op not in _EXACT_INTRINSICS) or \
                    (isinstance(n, PrimExpr) and n.dtype in _INEXACT_DTYPES) or \
                    (isinstance(n, BufferLoad) and n.buffer.dtype in _INEXACT_DTYPES) or \
                    (isinstance(n, Cast) and dt.is_float(n.value.dtype) and
                     not dt.is_float(n.dtype)) or \
                    (isinstance(n, (Min, Max)) and dt.is_float(n.dtype)):
                exact = False
        post_order_visit(body, check)
    _EXACT_CACHE[id(func)] = (func, exact)
    while len(_EXACT_CACHE) > 4 * _BUILD_CACHE_SIZE:
        _EXACT_CACHE.pop(next(iter(_EXACT_CACHE)))
    return exact


_EXACT_CACHE: dict[int, tuple] = {}   # id(PrimFunc) -> (PrimFunc, _exact_in_interpreter)


def run_call_tir(func: PrimFunc, call: Call, inputs, tir_values=()) -> list[np.ndarray]:
    """Run the kernel of ``call`` (an ``R.call_tir`` of ``func``) on numpy ``inputs``.

    Output shapes come from the call's ``out_sinfo``, with symbolic dims bound from the inputs'
    shapes through the kernel's buffers. Returns the outputs, one array per output.

    Examples
    --------
    >>> # outs = run_call_tir(mod["add"], call, [np.ones(4, "float32"), np.ones(4, "float32")])
    """
    out_si = call.sinfo_args[0]
    outs_si = list(out_si.fields) if isinstance(out_si, TupleStructInfo) else [out_si]
    bufs = func.buffers
    if len(bufs) != len(inputs) + len(outs_si):
        raise _CannotFold(f"the kernel takes {len(bufs)} buffers, the call passes "
                          f"{len(inputs)} inputs and {len(outs_si)} outputs")
    env: dict = {}
    for p, v in zip(func.scalar_params, tir_values):
        env[p] = IntImm(int(v), p.dtype)
    for buf, x in zip(bufs, inputs):
        if len(buf.shape) != x.ndim:
            raise _CannotFold(f"buffer {buf.name} is {len(buf.shape)}-d, the argument {x.ndim}-d")
        _bind_dims(buf.shape, x.shape, env)
    outs = []
    for si, buf in zip(outs_si, bufs[len(inputs):]):
        if not isinstance(si, TensorStructInfo):
            raise _CannotFold(f"output {si!r} is not a tensor")
        try:
            shape = si.static_shape()
            if shape is None:
                raise _CannotFold("symbolic output")
        except _CannotFold:
            shape = _static_dims(buf.shape, env)
        outs.append(np.empty(shape, dtype=np.dtype(buf.dtype) if buf.dtype != "bool" else bool))
    # (np.ascontiguousarray would turn a 0-d constant into a 1-d array)
    arrays = [x if x.flags.c_contiguous else np.array(x, order="C") for x in map(np.asarray,
                                                                                 inputs)]
    scalars = [int(v) for v in tir_values]
    if len(outs) == 1 and not scalars and run_numpy_kernel(func, arrays, outs[0]):
        return outs    # the weight packing: numpy on strided views of the inputs
    total = sum(a.size for a in arrays) + sum(o.size for o in outs)
    if total <= _INTERPRET_ELEMENTS or _exact_in_interpreter(func):
        interpret(func, *arrays, *outs, *scalars)
    else:
        key = id(func)
        cached = _BUILD_CACHE.get(key)
        if cached is None or cached[0] is not func:
            symbol = func.attr_dict.get("global_symbol", "main")
            cached = (func, symbol, targets.build(func, _FOLD_TARGET))
            _BUILD_CACHE[key] = cached
            if len(_BUILD_CACHE) > _BUILD_CACHE_SIZE:
                _BUILD_CACHE.pop(next(iter(_BUILD_CACHE)))
        _, symbol, built = cached
        built[symbol](*arrays, *outs, *scalars)
    return outs


def _const_value(e: Expr):
    """The numpy value of a compile-time constant argument, or raise _CannotFold."""
    if isinstance(e, Constant):
        return e.data
    raise _CannotFold(f"{type(e).__name__} is not a constant")


def _is_const_arg(e: Expr) -> bool:
    if isinstance(e, Constant) or isinstance(e, StringImm):
        return True
    if isinstance(e, ShapeExpr):
        return all(isinstance(d, IntImm) for d in e.values)
    if isinstance(e, PrimValue):
        return isinstance(e.value, (IntImm, FloatImm))
    if isinstance(e, Tuple):
        return all(_is_const_arg(f) for f in e.fields)
    return False


def _to_expr(outs: list[np.ndarray], out_si) -> Expr:
    if isinstance(out_si, TupleStructInfo):
        return Tuple([Constant(o) for o in outs])
    return Constant(outs[0])


class _Folder(ExprMutator):
    def visit_var_(self, v: Var) -> Expr:
        v2 = super().visit_var_(v)
        if isinstance(v2, Var):
            bound = self.builder.lookup_binding(v2)
            if isinstance(bound, Constant):
                return bound
        return v2

    def visit_tuple_getitem_(self, t: TupleGetItem) -> Expr:
        value = self.visit_expr(t.tuple_value)
        tup = value
        if isinstance(value, Var):
            tup = self.builder.lookup_binding(value)
        if isinstance(tup, Tuple):
            field = tup.fields[t.index]
            if self.builder.visible(field):
                return field
        if value is t.tuple_value:
            return t
        return TupleGetItem(value, t.index)

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, Op):
            return call
        try:
            if is_call_tir(call):
                return self._fold_call_tir(call, self.builder)
            if call.op.legalize is not None and all(_is_const_arg(a) for a in call.args) \
                    and any(isinstance(a, Constant) for a in call.args):
                folded = evaluate_op(call)
                return folded if folded is not None else self._fold_op(call)
        except (_CannotFold, TIRError, RuntimeError, IndexError, ValueError, ZeroDivisionError,
                FloatingPointError):
            # not foldable, or the kernel fails on these constants: keep the call, which fails
            # where it runs (if it ever does)
            return call
        return call

    def _fold_call_tir(self, call: Call, builder) -> Expr:
        gv, args = call.args[0], call.args[1]
        if not isinstance(args, Tuple) or not all(isinstance(a, Constant) for a in args.fields):
            raise _CannotFold("non-constant arguments")
        tir_values = []
        if len(call.args) == 3:
            if not _is_const_arg(call.args[2]):
                raise _CannotFold("symbolic tir_vars")
            tir_values = [d.value for d in call.args[2].values]
        func = builder.get_func(gv.name_hint)
        if not isinstance(func, PrimFunc):
            raise _CannotFold(f"{gv.name_hint} is not a PrimFunc")
        outs = run_call_tir(func, call, [a.data for a in args.fields], tir_values)
        return _to_expr(outs, call.sinfo_args[0])

    def _fold_op(self, call: Call) -> Expr:
        """Legalize ``call`` into a scratch module and evaluate what it emits."""
        scratch = RewriteBuilder(IRModule({}))
        scratch.begin_block(True)
        try:
            result = call.op.legalize(scratch, call)
        finally:
            emitted = scratch.end_block()
        values: dict[int, Expr] = {}

        def resolve(e):
            if isinstance(e, Var):
                if id(e) not in values:
                    raise _CannotFold(f"{e.name_hint} is not constant")
                return values[id(e)]
            if isinstance(e, Tuple):
                return Tuple([resolve(f) for f in e.fields])
            if isinstance(e, TupleGetItem):
                t = resolve(e.tuple_value)
                if isinstance(t, Tuple):
                    return t.fields[e.index]
                raise _CannotFold("tuple item of a non-tuple")
            if isinstance(e, Call) and is_call_tir(e):
                args = Tuple([resolve(a) for a in e.args[1].fields])
                new = Call(e.op, [e.args[0], args] + list(e.args[2:]), e.attrs, e.sinfo_args)
                return self._fold_call_tir(new, scratch)
            if isinstance(e, Constant) or _is_const_arg(e):
                return e
            raise _CannotFold(f"{type(e).__name__} in a legalization")

        for b in emitted:
            values[id(b.var)] = resolve(b.value)
        folded = resolve(result)
        if not isinstance(folded, (Constant, Tuple)):
            raise _CannotFold("not a constant")
        return folded
