"""Tensor expressions: describe a computation, then ``create_prim_func`` makes TensorIR of it.

Examples
--------
>>> from tilecraft.tensorir import te
>>> n = te.var("n")
>>> A = te.placeholder((n, 64), "float32", "A")
>>> W = te.placeholder((64, 32), "float32", "W")
>>> k = te.reduce_axis((0, 64), "k")
>>> C = te.compute((n, 32), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
>>> func = te.create_prim_func([A, W, C])
"""
from __future__ import annotations

import builtins
import inspect
import weakref
from typing import Callable, Sequence

from . import dtype as dt
from .expr import (BufferLoad, Call, IntImm, PrimExpr, Reduce, Select, TIRError, Var, call, combine,
                   const as _const, convert, identity_of, max_, min_, var as _var)
from .function import PrimFunc
from .stmt import (Block, BlockRealize, Buffer, BufferStore, For, IterVar, Range, is_true, seq)
from .functor import post_order_visit, substitute
from .schedule.regions import with_regions

__all__ = ["var", "const", "placeholder", "compute", "reduce_axis", "sum", "max", "min", "prod",
           "if_then_else", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "pow", "abs",
           "floor", "ceil", "round", "sin", "cos", "maximum", "minimum", "all", "any",
           "create_prim_func", "Tensor"]

var = _var


def const(value, dtype: str | None = None) -> PrimExpr:
    """A constant: ``te.const(1.0, "float16")``."""
    return _const(value, dtype)


# id(buffer) -> Tensor that owns it, while that Tensor is alive; lets compute() find producers.
_OWNER: "weakref.WeakValueDictionary[int, Tensor]" = weakref.WeakValueDictionary()


class Tensor:
    """The result of ``placeholder`` or ``compute``: index it as ``A[i, j]`` inside a compute."""

    def __init__(self, buffer: Buffer, op: str, axis=(), body=None, inputs=(), attrs=None):
        self.buffer = buffer
        self.op = op                  # "placeholder" or "compute"
        self.axis = tuple(axis)       # spatial IterVars (compute only)
        self.body = body              # PrimExpr or Reduce over axis vars (compute only)
        self.inputs = tuple(inputs)   # producer Tensors read by body
        self.attrs = dict(attrs or {})
        _OWNER[id(buffer)] = self

    @property
    def name(self) -> str:
        return self.buffer.name

    @property
    def shape(self) -> tuple:
        return self.buffer.shape

    @property
    def dtype(self) -> str:
        return self.buffer.dtype

    @property
    def ndim(self) -> int:
        return self.buffer.ndim

    @property
    def reduce_axis(self) -> tuple:
        return self.body.axis if isinstance(self.body, Reduce) else ()

    def __getitem__(self, indices) -> BufferLoad:
        if not isinstance(indices, tuple):
            indices = (indices,)
        indices = tuple(i.var if isinstance(i, IterVar) else i for i in indices)
        try:
            return BufferLoad(self.buffer, indices)
        except TIRError as err:
            raise TIRError(f"indexing tensor {self.name}: {err}", self.buffer) from None

    def __repr__(self):
        dims = ", ".join(str(s) for s in self.shape)
        return f"Tensor({self.name}, ({dims}), {self.dtype}, {self.op})"


def placeholder(shape: Sequence, dtype: str = "float32", name: str = "placeholder") -> Tensor:
    """An input tensor: ``te.placeholder((n, 3), "float32", "A")``; dims may be ``te.var``."""
    if isinstance(shape, (int, PrimExpr)):
        shape = (shape,)
    return Tensor(Buffer(name, shape, dtype), "placeholder")


def reduce_axis(dom, name: str = "rv") -> IterVar:
    """A reduction axis over ``dom = (begin, end)`` (or a Range): ``k = te.reduce_axis((0, K))``."""
    if isinstance(dom, Range):
        rng = dom
    else:
        lo, hi = dom
        lo, hi = convert(lo), convert(hi)
        if isinstance(lo, IntImm) and lo.value == 0:
            rng = Range(lo, hi)
        elif isinstance(lo, IntImm) and isinstance(hi, IntImm):
            rng = Range(lo, IntImm(hi.value - lo.value, hi.dtype))
        else:
            rng = Range(lo, hi - lo)
    return IterVar(Var(name, rng.extent.dtype), rng, "reduce")


def _axis_names(fcompute, ndim):
    try:
        params = list(inspect.signature(fcompute).parameters.values())
        if len(params) == ndim and builtins.all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                                       for p in params):
            return [p.name for p in params]
    except (TypeError, ValueError):
        pass
    return [f"i{d}" for d in range(ndim)]


def compute(shape: Sequence, fcompute: Callable, name: str = "compute", tag: str = "",
            attrs: dict | None = None) -> Tensor:
    """A tensor whose element at ``indices`` is ``fcompute(*indices)``.

    The body may be a reduction (``te.sum(..., axis=k)``) at its top level only.

    Examples
    --------
    >>> A = placeholder((8,), "float32", "A")
    >>> B = compute((8,), lambda i: exp(A[i]), "B")
    """
    if isinstance(shape, (int, PrimExpr)):
        shape = (shape,)
    shape = tuple(convert(s) for s in shape)
    names = _axis_names(fcompute, len(shape))
    axis = tuple(IterVar(Var(nm, s.dtype), Range(IntImm(0, s.dtype), s), "spatial")
                 for nm, s in zip(names, shape))
    body = fcompute(*[iv.var for iv in axis])
    if isinstance(body, Tensor):
        raise TIRError(f"compute {name}: the function returned the tensor {body.name}; "
                       f"return an element such as {body.name}[i]")
    if isinstance(body, (list, tuple)):
        raise TIRError(f"compute {name}: multiple outputs are not supported; make one compute each")
    body = convert(body)
    _check_no_nested_reduce(body, name)
    inputs = []
    seen = set()

    def collect(node):
        if isinstance(node, BufferLoad) and id(node.buffer) not in seen:
            seen.add(id(node.buffer))
            owner = _OWNER.get(id(node.buffer))
            if owner is None:
                raise TIRError(f"compute {name}: buffer {node.buffer.name} has no producing tensor",
                               node)
            inputs.append(owner)

    post_order_visit(body, collect)
    buf = Buffer(name, shape, body.dtype)
    t = Tensor(buf, "compute", axis, body, inputs, dict(attrs or {}, tag=tag) if tag else attrs)
    return t


def _check_no_nested_reduce(body, name):
    if isinstance(body, Reduce):
        inner = [body.source, body.condition] + ([body.init] if body.init is not None else [])
    else:
        inner = [body]
    for e in inner:
        def visit(n):
            if isinstance(n, Reduce):
                raise TIRError(f"compute {name}: a reduction may only be the whole body of a "
                               f"compute, not part of an expression", n)
        post_order_visit(e, visit)


# ---------------------------------------------------------------------------------------------
# reductions


def _axes(axis):
    if isinstance(axis, IterVar):
        axis = [axis]
    axis = list(axis)
    for a in axis:
        if not isinstance(a, IterVar) or a.kind != "reduce":
            raise TIRError(f"reduction axis {a!r} must come from te.reduce_axis")
    return axis


def _reducer(combiner):
    def reduce(expr, axis, where=None, init=None) -> Reduce:
        return Reduce(combiner, convert(expr), _axes(axis), where, init)
    reduce.__name__ = combiner
    reduce.__doc__ = (f"``{combiner}`` of ``expr`` over the reduce ``axis`` (optionally only "
                      f"where ``where`` holds, starting from ``init``).")
    return reduce


sum = _reducer("sum")
prod = _reducer("prod")
_max_reduce = _reducer("max")
_min_reduce = _reducer("min")


def _is_axis_arg(x) -> bool:
    return isinstance(x, IterVar) or (isinstance(x, (list, tuple)) and len(x) > 0
                                      and builtins.all(isinstance(a, IterVar) for a in x))


def max(expr, axis=None, where=None, init=None):
    """``te.max(expr, axis=k)`` reduces; ``te.max(a, b)`` is the elementwise maximum."""
    if axis is not None and not _is_axis_arg(axis):
        return maximum(expr, axis)
    if axis is None:
        raise TIRError("te.max needs an axis (reduction) or a second operand (elementwise)")
    return _max_reduce(expr, axis, where, init)


def min(expr, axis=None, where=None, init=None):
    """``te.min(expr, axis=k)`` reduces; ``te.min(a, b)`` is the elementwise minimum."""
    if axis is not None and not _is_axis_arg(axis):
        return minimum(expr, axis)
    if axis is None:
        raise TIRError("te.min needs an axis (reduction) or a second operand (elementwise)")
    return _min_reduce(expr, axis, where, init)


def maximum(a, b) -> PrimExpr:
    return max_(a, b)


def minimum(a, b) -> PrimExpr:
    return min_(a, b)


# ---------------------------------------------------------------------------------------------
# math


def _unary(op):
    def f(x) -> PrimExpr:
        x = convert(x)
        return Call(x.dtype, op, [x])
    f.__name__ = op
    f.__doc__ = f"Elementwise ``{op}`` of a float expression."
    return f


exp = _unary("exp")
log = _unary("log")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
tanh = _unary("tanh")
sigmoid = _unary("sigmoid")
erf = _unary("erf")
floor = _unary("floor")
ceil = _unary("ceil")
round = _unary("round")
sin = _unary("sin")
cos = _unary("cos")


def pow(x, y) -> PrimExpr:
    """``x ** y`` for float expressions."""
    x = convert(x, y if isinstance(y, PrimExpr) else None)
    y = convert(y, x)
    return Call(x.dtype, "pow", [x, y])


def abs(x) -> PrimExpr:
    """Absolute value (floats through ``fabs``, integers through a select)."""
    x = convert(x)
    if dt.is_float(x.dtype):
        return Call(x.dtype, "fabs", [x])
    if dt.is_uint(x.dtype) or dt.is_bool(x.dtype):
        return x
    return Select(x < 0, -x, x)


def if_then_else(cond, t, f) -> PrimExpr:
    """``t if cond else f``, evaluating only the chosen side (safe for guarded loads)."""
    cond = convert(cond)
    t = convert(t, f if isinstance(f, PrimExpr) else None)
    f = convert(f, t)
    return call("if_then_else", cond, t, f)


def all(*conds) -> PrimExpr:
    """Logical and of conditions."""
    if not conds:
        return convert(True)
    out = convert(conds[0])
    for c in conds[1:]:
        out = out & convert(c)
    return out


def any(*conds) -> PrimExpr:
    """Logical or of conditions."""
    if not conds:
        return convert(False)
    out = convert(conds[0])
    for c in conds[1:]:
        out = out | convert(c)
    return out


# ---------------------------------------------------------------------------------------------
# te -> TensorIR


def _toposort(outputs: Sequence[Tensor]) -> list[Tensor]:
    order: list[Tensor] = []
    state: dict[int, int] = {}

    def visit(t: Tensor):
        s = state.get(id(t))
        if s == 2:
            return
        if s == 1:  # pragma: no cover - compute() cannot build cycles
            raise TIRError(f"cycle through tensor {t.name}")
        state[id(t)] = 1
        for i in t.inputs:
            visit(i)
        state[id(t)] = 2
        order.append(t)

    for t in outputs:
        visit(t)
    return order


def _make_block(t: Tensor) -> For | BlockRealize:
    body = t.body
    reduce_axes = list(body.axis) if isinstance(body, Reduce) else []
    vmap = {}
    iter_vars = []
    loop_vars = []
    for iv in list(t.axis) + reduce_axes:
        bv = Var("v" + iv.var.name, iv.var.dtype)
        vmap[iv.var] = bv
        iter_vars.append(IterVar(bv, iv.dom, iv.kind))
        loop_vars.append(Var(iv.var.name, iv.var.dtype))
    spatial_idx = [vmap[iv.var] for iv in t.axis]
    init = None
    if isinstance(body, Reduce):
        src = substitute(body.source, vmap)
        cond = substitute(body.condition, vmap)
        ident = identity_of(body.combiner, body.dtype)
        if not is_true(cond):
            src = Select(cond, src, ident)
        start = ident if body.init is None else substitute(body.init, vmap)
        init = BufferStore(t.buffer, start, spatial_idx)
        stmt = BufferStore(t.buffer, combine(body.combiner, t.buffer[tuple(spatial_idx)], src),
                           spatial_idx)
    else:
        value = substitute(body, vmap)
        stmt = BufferStore(t.buffer, value, spatial_idx)
    block = with_regions(Block(t.name, iter_vars, [], [], stmt, init=init,
                               annotations=t.attrs or None))
    nest = BlockRealize(loop_vars, None, block)
    for lv, iv in reversed(list(zip(loop_vars, iter_vars))):
        nest = For(lv, iv.dom.min, iv.dom.extent, "serial", nest)
    return nest


def create_prim_func(args: Sequence, name: str = "main") -> PrimFunc:
    """Make a PrimFunc computing the given tensors; ``args`` lists the parameters in order:
    placeholders, outputs, and optionally scalar ``te.var``s not bound by any buffer shape.

    Every placeholder the outputs read must be an argument; computes that are not arguments
    become intermediate buffers of the root block.

    Examples
    --------
    >>> A = placeholder((4, 4), "float32", "A")
    >>> B = compute((4, 4), lambda i, j: A[i, j] + 1.0, "B")
    >>> f = create_prim_func([A, B])
    >>> len(f.params)
    2
    """
    tensors = [a for a in args if isinstance(a, Tensor)]
    for a in args:
        if not isinstance(a, (Tensor, Var)):
            raise TIRError(f"create_prim_func: argument {a!r} is neither a te Tensor nor a Var")
    arg_ids = {id(t) for t in tensors}
    order = _toposort([t for t in tensors if t.op == "compute"])
    for t in order:
        if t.op == "placeholder" and id(t) not in arg_ids:
            raise TIRError(f"create_prim_func: placeholder {t.name} is read but is not an argument",
                           t.buffer)
    stmts = [_make_block(t) for t in order if t.op == "compute"]
    intermediates = [t.buffer for t in order if t.op == "compute" and id(t) not in arg_ids]
    body = seq(*stmts) if stmts else None
    if body is None:
        raise TIRError("create_prim_func: nothing to compute (no compute tensor among the "
                       "arguments)")
    root = Block("root", [], [], [], body, alloc_buffers=intermediates)
    params, buffer_map = [], {}
    for a in args:
        if isinstance(a, Tensor):
            h = Var(a.name + "_handle", "handle")
            params.append(h)
            buffer_map[h] = a.buffer
        else:
            params.append(a)
    names = [b.name for b in buffer_map.values()]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise TIRError(f"create_prim_func: two arguments are named {sorted(dup)}; names must be "
                       f"unique")
    return PrimFunc(params, BlockRealize([], None, root), buffer_map,
                    attrs={"global_symbol": name})
