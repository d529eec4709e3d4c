"""Import-time evaluation: nodes whose inputs are all known when the model is read are computed
right away, in numpy, instead of becoming kernels.

Known values are numpy arrays. Integer vectors that hold symbolic dims (``Shape`` of a tensor of
shape ``(batch, seq_len, 768)``) are object arrays of Python ints and int64 ``tensorir``
expressions, so that the shape arithmetic exporters write (``Shape -> Gather -> Unsqueeze ->
Concat -> Reshape``) gives ``Reshape`` the exact symbolic shape ``(batch, seq_len, 12, 64)``.

``fold(ctx, node)`` returns the node's outputs as ``Known`` values, or None when the node is not
one of the simple operators evaluated here, an input is not known, or (for symbolic values) a
comparison cannot be decided; the node is then converted into Relax operators as usual.
"""
from __future__ import annotations

import functools
import operator

import numpy as np

from tilecraft.errors import TilecraftError
from tilecraft.tensorir import arith
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import IntImm, Max, Min, Not, PrimExpr, Var as TirVar, truncdiv
from tilecraft.tensorir.functor import post_order_visit

from .registry import ConversionError, ONNX_DTYPES
from .values import Known

# numeric constants folded here may be as large as this; a ConstantOfShape / Expand / Tile /
# Range making more elements becomes a kernel instead (it would bloat the module)
MAX_FOLDED_ELEMENTS = 1 << 16
# ConstantOfShape of a static shape is a weight tensor in some exporters' "light" models: fold
# it up to this size (elements)
MAX_CONSTANT_OF_SHAPE = 1 << 26
# symbolic integer vectors (shapes and their arithmetic) stay small
MAX_SYMBOLIC_ELEMENTS = 256


class _NotFoldable(TilecraftError):
    pass


def as_int(x):
    """A Python int from an int-like, an int64 PrimExpr otherwise."""
    if isinstance(x, (bool, np.bool_)):
        return int(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, IntImm):
        return int(x.value)
    if isinstance(x, PrimExpr):
        return x
    if isinstance(x, (float, np.floating)) and float(x).is_integer():
        return int(x)
    raise ConversionError(f"expected an integer, got {x!r}")


def as_array(x) -> np.ndarray:
    """An ndarray of ``x`` (a single PrimExpr becomes a 0-d object array, not a sequence)."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, PrimExpr):
        out = np.empty((), dtype=object)
        out[()] = x
        return out
    return np.asarray(x)


def is_symbolic(arr) -> bool:
    return isinstance(arr, np.ndarray) and arr.dtype == object


def _analyzer(values) -> arith.Analyzer:
    ana = arith.Analyzer()
    seen = set()

    def visit(n):
        if isinstance(n, TirVar) and id(n) not in seen:
            seen.add(id(n))
            ana.update_bound(n, 0, None)   # symbolic dims are non-negative
    for v in values:
        if isinstance(v, PrimExpr):
            post_order_visit(v, visit)
    return ana


def _simplify_all(arr: np.ndarray) -> np.ndarray:
    """Simplify symbolic elements; a fully static result becomes an int64 array."""
    flat = list(arr.reshape(-1))
    ana = _analyzer(flat)
    out = []
    for x in flat:
        if isinstance(x, PrimExpr):
            x = ana.simplify(x)
            if isinstance(x, IntImm):
                x = int(x.value)
        elif isinstance(x, (np.integer, np.bool_)):
            x = int(x)
        out.append(x)
    res = np.empty(len(out), dtype=object)
    res[:] = out
    res = res.reshape(arr.shape)
    if all(not isinstance(x, PrimExpr) for x in out):
        return np.array(out, dtype=np.int64).reshape(arr.shape)
    return res


def _decide(cond: PrimExpr, values) -> bool:
    """A comparison of symbolic ints, when the analyzer can decide it."""
    ana = _analyzer(values)
    if ana.can_prove(cond):
        return True
    if ana.can_prove(Not(cond)):
        return False
    raise _NotFoldable


def _obj(arr: np.ndarray) -> np.ndarray:
    if arr.dtype == object:
        return arr
    out = np.empty(arr.shape, dtype=object)
    out.reshape(-1)[:] = [int(x) for x in arr.reshape(-1)]
    return out


def _np_dtype(dtype: str) -> np.dtype:
    return np.dtype(dt.to_numpy(dtype))


# ---------------------------------------------------------------------------------------------
# folding rules: fn(node, arrays, dtypes) -> list of (array, dtype) or raises _NotFoldable

_RULES = {}


def _rule(*op_types, symbolic: bool = False):
    """``symbolic``: the rule also takes object arrays (symbolic ints)."""
    def wrap(fn):
        for t in op_types:
            _RULES[t] = (fn, symbolic)
        return fn
    return wrap


def _ints(arr, what="value") -> list:
    if arr is None:
        return None
    vals = [as_int(x) for x in np.asarray(arr).reshape(-1)]
    if any(isinstance(v, PrimExpr) for v in vals):
        raise _NotFoldable
    return vals


@_rule("Identity", symbolic=True)
def _identity(node, a, d):
    return [(a[0], d[0])]


@_rule("Cast", symbolic=True)
def _cast(node, a, d):
    to = node.attr("to")
    if to not in ONNX_DTYPES:
        raise _NotFoldable
    return _cast_to(a[0], ONNX_DTYPES[to])


@_rule("CastLike", symbolic=True)
def _cast_like(node, a, d):
    # torch.onnx.export(dynamo=True) writes its constants as CastLike(constant, size)
    if d[1] not in dt.SCALAR_TYPES:
        raise _NotFoldable
    return _cast_to(a[0], d[1])


def _cast_to(x, target: str):
    if is_symbolic(x):
        if not dt.is_integer(target):
            raise _NotFoldable
        return [(x, target)]
    if x.dtype.kind == "f" and (dt.is_integer(target)):
        if not np.all(np.isfinite(x)):
            raise _NotFoldable
        info = np.iinfo(_np_dtype(target))
        if x.size and (x.min() < info.min or x.max() > info.max):
            raise _NotFoldable
    if x.dtype.kind in "iu" and dt.is_integer(target):
        info = np.iinfo(_np_dtype(target))
        if x.size and (int(x.min()) < info.min or int(x.max()) > info.max):
            raise _NotFoldable   # wrapping: leave it to the kernel
    return [(x.astype(_np_dtype(target)), target)]


@_rule("Reshape", symbolic=True)
def _reshape(node, a, d):
    x = a[0]
    if node.version < 5:
        shape = list(node.attr("shape"))
    else:
        shape = _ints(a[1])
    allowzero = node.attr("allowzero", 0)
    out = []
    for k, s in enumerate(shape):
        if s == 0 and not allowzero:
            s = x.shape[k]
        out.append(s)
    return [(x.reshape(out), d[0])]


def _axes_of(node, a, i, attr="axes"):
    if node.has_input(i) and a[i] is not None:
        return _ints(a[i])
    return node.attr(attr)


@_rule("Unsqueeze", symbolic=True)
def _unsqueeze(node, a, d):
    x = a[0]
    axes = _axes_of(node, a, 1) if node.version >= 13 else node.attr("axes")
    rank = x.ndim + len(axes)
    axes = sorted(ax + rank if ax < 0 else ax for ax in axes)
    for ax in axes:
        x = np.expand_dims(x, ax)
    return [(x, d[0])]


@_rule("Squeeze", symbolic=True)
def _squeeze(node, a, d):
    x = a[0]
    axes = _axes_of(node, a, 1) if node.version >= 13 else node.attr("axes")
    if axes is None:
        axes = [k for k, s in enumerate(x.shape) if s == 1]
    axes = tuple(ax + x.ndim if ax < 0 else ax for ax in axes)
    return [(np.squeeze(x, axis=axes), d[0])]


@_rule("Flatten", symbolic=True)
def _flatten(node, a, d):
    x = a[0]
    axis = node.attr("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    lead = int(np.prod(x.shape[:axis], dtype=np.int64))
    return [(x.reshape(lead, -1) if x.size else x.reshape(lead, int(np.prod(x.shape[axis:]))),
             d[0])]


@_rule("Transpose", symbolic=True)
def _transpose(node, a, d):
    perm = node.attr("perm")
    return [(np.transpose(a[0], perm), d[0])]


@_rule("Concat", symbolic=True)
def _concat(node, a, d):
    arrs = [x for x in a if x is not None]
    axis = node.attr("axis", 0)
    if any(is_symbolic(x) for x in arrs):
        arrs = [_obj(x) for x in arrs]
        return [(_simplify_all(np.concatenate(arrs, axis=axis)), d[0])]
    return [(np.concatenate(arrs, axis=axis), d[0])]


@_rule("Gather", symbolic=True)
def _gather(node, a, d):
    x, idx = a[0], a[1]
    idx = np.asarray(_ints(idx)).reshape(np.shape(idx)).astype(np.int64)
    axis = node.attr("axis", 0)
    n = x.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise ConversionError(f"Gather: index out of range for a dimension of {n}")
    return [(as_array(np.take(x, np.where(idx < 0, idx + n, idx), axis=axis)), d[0])]


@_rule("Slice", symbolic=True)
def _slice(node, a, d):
    x = a[0]
    if node.version < 10:
        starts, ends = node.attr("starts"), node.attr("ends")
        axes, steps = node.attr("axes"), None
    else:
        starts, ends = _ints(a[1]), _ints(a[2])
        axes = _ints(a[3]) if len(a) > 3 and a[3] is not None else None
        steps = _ints(a[4]) if len(a) > 4 and a[4] is not None else None
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    sl = [slice(None)] * x.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ConversionError("Slice: a step of 0")
        sl[ax + x.ndim if ax < 0 else ax] = slice(s, e, st)
    return [(x[tuple(sl)], d[0])]


@_rule("Shape", symbolic=True)
def _shape_of_known(node, a, d):
    x = a[0]
    dims = np.array(x.shape, dtype=np.int64)
    start = node.attr("start", 0)
    end = node.attr("end", None)
    return [(dims[start:end], "int64")]


@_rule("Size", symbolic=True)
def _size(node, a, d):
    return [(np.array(a[0].size, dtype=np.int64), "int64")]


@_rule("Expand")
def _expand(node, a, d):
    shape = _ints(a[1])
    out = np.broadcast_shapes(a[0].shape, tuple(shape))
    if int(np.prod(out, dtype=np.int64)) > MAX_FOLDED_ELEMENTS:
        raise _NotFoldable
    return [(np.broadcast_to(a[0], out).copy(), d[0])]


@_rule("Tile")
def _tile(node, a, d):
    reps = _ints(a[1])
    if a[0].size * int(np.prod(reps, dtype=np.int64)) > MAX_FOLDED_ELEMENTS:
        raise _NotFoldable
    return [(np.tile(a[0], reps), d[0])]


@_rule("ConstantOfShape")
def _constant_of_shape(node, a, d):
    shape = _ints(a[0])
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else value.reshape(-1)
    if int(np.prod(shape, dtype=np.int64)) > MAX_CONSTANT_OF_SHAPE:
        raise _NotFoldable
    return [(np.full(shape, value[0], dtype=value.dtype), str(value.dtype))]


@_rule("Range")
def _range(node, a, d):
    start, limit, delta = (np.asarray(x).reshape(()) for x in a[:3])
    if delta == 0:
        raise ConversionError("Range: delta is 0")
    n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    if n > MAX_FOLDED_ELEMENTS:
        raise _NotFoldable
    out = (start + np.arange(n, dtype=start.dtype) * delta).astype(start.dtype)
    return [(out, d[0])]


def _binary(np_fn, sym_fn=None, int_only_sym=True):
    def fn(node, a, d):
        x, y = a[0], a[1]
        if is_symbolic(x) or is_symbolic(y):
            if sym_fn is None:
                raise _NotFoldable
            xs, ys = np.broadcast_arrays(_obj(np.asarray(x)), _obj(np.asarray(y)))
            flat = [sym_fn(p, q) for p, q in zip(xs.reshape(-1), ys.reshape(-1))]
            out = np.empty(len(flat), dtype=object)
            out[:] = flat
            return [(_simplify_all(out.reshape(xs.shape)), d[0])]
        return [(np.asarray(np_fn(x, y)).astype(x.dtype), d[0])]
    return fn


def _int_div(x, y):
    if x.dtype.kind in "iu":
        if np.any(y == 0):
            raise _NotFoldable
        q = np.abs(x) // np.abs(y)
        return np.where((x < 0) != (y < 0), -q, q)
    return x / y


def _sym_div(p, q):
    if isinstance(q, int) and q == 0:
        raise _NotFoldable
    if isinstance(p, int) and isinstance(q, int):
        r = abs(p) // abs(q)
        return -r if (p < 0) != (q < 0) else r
    ana = _analyzer([p, q])
    if ana.can_prove(IntImm(0, "int64") <= p) and ana.can_prove(IntImm(0, "int64") < q):
        return p // q   # floor division of non-negatives: what the simplifier reasons about
    return truncdiv(p, q)


def _sym_mod(p, q):
    if isinstance(p, int) and isinstance(q, int):
        if q == 0:
            raise _NotFoldable
        return p % q
    return p % q   # floormod: ONNX Mod with fmod=0 takes the sign of the divisor, as floormod


_rule("Add", symbolic=True)(_binary(np.add, lambda p, q: p + q))
_rule("Sub", symbolic=True)(_binary(np.subtract, lambda p, q: p - q))
_rule("Mul", symbolic=True)(_binary(np.multiply, lambda p, q: p * q))
_rule("Div", symbolic=True)(_binary(_int_div, _sym_div))


@_rule("Mod", symbolic=True)
def _mod(node, a, d):
    if node.attr("fmod", 0):
        if is_symbolic(a[0]) or is_symbolic(a[1]):
            raise _NotFoldable
        return [(np.fmod(a[0], a[1]).astype(a[0].dtype), d[0])]
    if a[0].dtype.kind == "f":
        raise _NotFoldable
    return _binary(lambda x, y: np.mod(x, y) if not np.any(y == 0) else _raise(),
                   _sym_mod)(node, a, d)


def _raise():
    raise _NotFoldable


def _compare(np_fn, make):
    def fn(node, a, d):
        x, y = a[0], a[1]
        if is_symbolic(x) or is_symbolic(y):
            xs, ys = np.broadcast_arrays(_obj(np.asarray(x)), _obj(np.asarray(y)))
            out = []
            for p, q in zip(xs.reshape(-1), ys.reshape(-1)):
                if isinstance(p, int) and isinstance(q, int):
                    out.append(bool(np_fn(p, q)))
                else:
                    out.append(_decide(make(_as_expr(p), _as_expr(q)), [p, q]))
            return [(np.array(out, dtype=bool).reshape(xs.shape), "bool")]
        return [(np.asarray(np_fn(x, y)), "bool")]
    return fn


def _as_expr(x) -> PrimExpr:
    return x if isinstance(x, PrimExpr) else IntImm(int(x), "int64")


_rule("Equal", symbolic=True)(_compare(np.equal, lambda p, q: p == q))
_rule("Less", symbolic=True)(_compare(np.less, lambda p, q: p < q))
_rule("Greater", symbolic=True)(_compare(np.greater, lambda p, q: p > q))
_rule("LessOrEqual", symbolic=True)(_compare(np.less_equal, lambda p, q: p <= q))
_rule("GreaterOrEqual", symbolic=True)(_compare(np.greater_equal, lambda p, q: p >= q))


@_rule("Not")
def _not(node, a, d):
    return [(np.logical_not(a[0]), "bool")]


@_rule("And")
def _and(node, a, d):
    return [(np.logical_and(a[0], a[1]), "bool")]


@_rule("Or")
def _or(node, a, d):
    return [(np.logical_or(a[0], a[1]), "bool")]


@_rule("Where", symbolic=True)
def _where(node, a, d):
    c, x, y = a
    if is_symbolic(c):
        raise _NotFoldable
    if is_symbolic(x) or is_symbolic(y):
        c2, xs, ys = np.broadcast_arrays(c, _obj(np.asarray(x)), _obj(np.asarray(y)))
        return [(_simplify_all(np.where(c2, xs, ys)), d[1])]
    return [(np.where(c, x, y).astype(x.dtype), d[1])]


@_rule("Neg", symbolic=True)
def _neg(node, a, d):
    x = a[0]
    if is_symbolic(x):
        return [(_simplify_all(-x), d[0])]
    return [(np.negative(x), d[0])]


@_rule("Abs", symbolic=True)
def _abs(node, a, d):
    x = a[0]
    if is_symbolic(x):
        out = []
        for p in x.reshape(-1):
            if isinstance(p, int):
                out.append(abs(p))
            elif _decide(p >= 0, [p]):
                out.append(p)
            else:
                out.append(-p)
        arr = np.empty(len(out), dtype=object)
        arr[:] = out
        return [(_simplify_all(arr.reshape(x.shape)), d[0])]
    return [(np.abs(x), d[0])]


def _variadic(np_fn, sym_fn):
    def fn(node, a, d):
        xs = [x for x in a if x is not None]
        if any(is_symbolic(x) for x in xs):
            arrs = np.broadcast_arrays(*[_obj(np.asarray(x)) for x in xs])
            flat = []
            for items in zip(*[t.reshape(-1) for t in arrs]):
                flat.append(functools.reduce(sym_fn, [_as_expr(v) for v in items]))
            out = np.empty(len(flat), dtype=object)
            out[:] = flat
            return [(_simplify_all(out.reshape(arrs[0].shape)), d[0])]
        return [(functools.reduce(np_fn, xs).astype(xs[0].dtype), d[0])]
    return fn


_rule("Max", symbolic=True)(_variadic(np.maximum, lambda p, q: Max(p, q)))
_rule("Min", symbolic=True)(_variadic(np.minimum, lambda p, q: Min(p, q)))
_rule("Sum", symbolic=True)(_variadic(np.add, operator.add))


def _reduce(np_fn, sym_ok):
    def fn(node, a, d):
        x = a[0]
        if node.version >= 18 or (node.op_type == "ReduceSum" and node.version >= 13):
            axes = _ints(a[1]) if len(a) > 1 and a[1] is not None else None
        else:
            axes = node.attr("axes")
        keep = bool(node.attr("keepdims", 1))
        if not axes:
            if node.attr("noop_with_empty_axes", 0) and axes is not None or \
                    (node.attr("noop_with_empty_axes", 0) and axes is None):
                return [(x, d[0])]
            axes = list(range(x.ndim))
        axes = tuple(ax + x.ndim if ax < 0 else ax for ax in axes)
        if is_symbolic(x):
            if not sym_ok:
                raise _NotFoldable
            return [(_simplify_all(as_array(np_fn(x, axis=axes, keepdims=keep))), d[0])]
        return [(np.asarray(np_fn(x, axis=axes, keepdims=keep)).astype(x.dtype), d[0])]
    return fn


_rule("ReduceProd", symbolic=True)(_reduce(np.prod, True))
_rule("ReduceSum", symbolic=True)(_reduce(np.sum, True))
_rule("ReduceMax")(_reduce(np.max, False))
_rule("ReduceMin")(_reduce(np.min, False))


def _unary_float(np_fn):
    def fn(node, a, d):
        if a[0].dtype.kind != "f":
            raise _NotFoldable
        return [(np_fn(a[0]).astype(a[0].dtype), d[0])]
    return fn


_rule("Floor")(_unary_float(np.floor))
_rule("Ceil")(_unary_float(np.ceil))
_rule("Sqrt")(_unary_float(np.sqrt))
_rule("Reciprocal")(_unary_float(np.reciprocal))


# ---------------------------------------------------------------------------------------------


def fold(ctx, node):
    """The outputs of ``node`` computed at import time, or None (see the module docstring)."""
    rule = _RULES.get(node.op_type)
    if rule is None:
        return _fold_by_reference(ctx, node)
    fn, symbolic_ok = rule
    arrays, dtypes = [], []
    for i in range(len(node.inputs)):
        v = ctx.value(node, i)
        if v is None:
            arrays.append(None)
            dtypes.append(None)
            continue
        if v.known is None:
            return None
        if is_symbolic(v.known):
            if not symbolic_ok or v.known.size > MAX_SYMBOLIC_ELEMENTS:
                return None
        elif v.known.size > MAX_FOLDED_ELEMENTS and node.op_type not in ("Shape", "Size"):
            return None
        arrays.append(v.known)
        dtypes.append(v.dtype)
    if not any(a is not None for a in arrays):
        return None
    try:
        results = fn(node, arrays, dtypes)
    except _NotFoldable:
        return None
    except (ValueError, IndexError, TypeError) as err:
        raise ConversionError(f"{node.describe()}: {err}") from None
    out = []
    for arr, dtype in results:
        arr = as_array(arr)
        if arr.dtype == object and arr.size and all(
                not isinstance(v, PrimExpr) for v in arr.reshape(-1)):
            arr = np.array([int(v) for v in arr.reshape(-1)], dtype=np.int64).reshape(arr.shape)
        if arr.dtype != object and dtype is not None and dtype in dt.SCALAR_TYPES and \
                arr.dtype != _np_dtype(dtype):
            arr = arr.astype(_np_dtype(dtype))
        out.append(Known(np.require(arr, requirements="C") if arr.dtype != object else arr, dtype))
    return out


# operators never evaluated by the reference implementation at import time: random, with
# subgraphs (their converters inline them), or producing values the frontend keeps symbolic
_NO_REFERENCE = {"If", "Loop", "Scan", "RandomNormal", "RandomNormalLike", "RandomUniform",
                 "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout", "Constant",
                 "ConstantOfShape", "Shape", "Size", "Identity", "SequenceMap"}


def _fold_by_reference(ctx, node):
    """A node whose inputs are all small numeric constants, evaluated with ONNX's reference
    implementation (the specification's own code), so that values such as a trip count
    computed from constants are known."""
    if node.op_type in _NO_REFERENCE or any(a.type in (7, 10) for a in node.proto.attribute):
        return None
    arrays = []
    for i in range(len(node.inputs)):
        v = ctx.value(node, i)
        if v is None:
            arrays.append(None)
            continue
        if v.known is None or v.known.dtype == object or v.logical is not None or \
                v.known.size > MAX_FOLDED_ELEMENTS:
            return None
        arrays.append(v.known)
    if not any(a is not None for a in arrays):
        return None
    try:
        import onnx
        from onnx import helper
        from onnx.reference import ReferenceEvaluator
        names = [f"i{k}" if a is not None else "" for k, a in enumerate(arrays)]
        n = onnx.NodeProto()
        n.CopyFrom(node.proto)
        del n.input[:]
        n.input.extend(names)
        del n.output[:]
        outs = [f"o{k}" if o else "" for k, o in enumerate(node.outputs)]
        n.output.extend(outs)
        n.name = "fold"
        g = helper.make_graph([n], "fold",
                              [helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(
                                  a.dtype), a.shape) for nm, a in zip(names, arrays) if nm],
                              [helper.make_tensor_value_info(o, 0, None) for o in outs if o])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", node.opset)])
        model.ir_version = onnx.IR_VERSION
        with np.errstate(all="ignore"):
            results = ReferenceEvaluator(model).run(
                None, {nm: a for nm, a in zip(names, arrays) if nm})
    except Exception:
        return None
    out = []
    for r in results:
        r = np.asarray(r)
        try:
            dt.from_numpy(r.dtype)
        except Exception:
            return None
        out.append(Known(np.require(r, requirements="C")))
    # outputs not asked for stay None
    full, it = [], iter(out)
    for o in node.outputs:
        full.append(next(it) if o else None)
    return full
