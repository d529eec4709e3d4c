"""A numpy reference interpreter for TensorIR: the oracle of schedule and codegen tests.

``interpret(func, *arrays, **var_values)`` runs any PrimFunc -- straight from ``te``, scheduled,
or lowered (flattened buffers, ``Allocate``, ``AssertStmt``) -- on numpy arrays and writes the
outputs into them in place, like a compiled kernel would.

How it works
------------
The function is compiled once (per function object and per value of its integer shape
variables) into Python source that is cached. Loops whose iterations provably do not interfere
are *vectorized*: their loop variable becomes a numpy index array (``np.arange`` laid out along
its own axis, so nested vectorized loops broadcast), and the loop body runs once over all
iterations. Everything else runs as plain Python loops over numpy scalars. The dependence test
is conservative: a loop is vectorized only if every buffer written inside it is accessed, in
some dimension, at an index that is the same expression for all accesses and separates the
iterations (checked with a mixed-radix test on affine indices, or numerically over the
iteration box); when in doubt the loop stays serial. Accesses whose indices are provably in
bounds (interval bounds from the enclosing loops' ranges) are emitted as plain numpy indexing;
all others are checked.

A loop whose iterations all update one location with ``+``, ``*``, ``max`` or ``min``
(``C[i, j] = C[i, j] + A[i, k] * B[k, j]`` over ``k``) may instead be evaluated as a numpy
reduction when few outer lanes are vectorized. Integer results are exact; float sums are then
accumulated pairwise in the buffer's dtype, so they differ from sequential order in rounding
only (compare floats with a tolerance). Vectorizing an independent loop never changes results.

Semantics
---------
- Every value has the dtype of its IR node: integers wrap like C fixed-width integers, float32
  arithmetic stays float32. ``FloorDiv``/``FloorMod`` round towards minus infinity, ``Div``/``Mod``
  of integers truncate (C), ``Div`` of floats is true division. Integer division by zero raises
  ``ZeroDivisionError``. Float exceptions give inf/nan silently.
- ``Cast`` follows numpy's ``astype``; ``round`` rounds half to even (``np.rint``, as LLVM's
  ``nearbyint`` which TVM uses); ``erf`` is ``math.erf`` in float64, rounded to the dtype;
  ``sigmoid(x) = 1 / (1 + exp(-x))``; ``rsqrt(x) = 1 / sqrt(x)``.
- ``Select`` evaluates both operands; ``if_then_else`` and the right operand of ``And`` / ``Or``
  are evaluated only where needed (as C's ``?:``, ``&&``, ``||``), so guarded out-of-bounds loads
  are fine.
- A block's ``init`` runs when each of its reduce iteration variables equals its domain minimum.
- Loops of every kind (parallel, vectorized, unrolled, thread-bound) run like serial loops;
  storage scopes are ignored.
- Out-of-bounds accesses raise ``IndexError`` naming the buffer (negative indices never wrap);
  a failing ``AssertStmt`` raises ``RuntimeError`` with its message.
- ``AMX_U8I8`` (the Intel AMX block product, the impl of the ``amx_u8s8s32_*`` tensor
  intrinsics) runs in numpy on the operands' memory: exact, int32 sums wrapping like
  ``tdpbusd``'s; a tile row that would run past its row (an unpadded ragged tile) or the buffer
  raises. Loops around it stay serial.
- Buffers allocated by the function (``alloc_buffers``, ``Allocate``) start filled with NaN
  (floats) or the byte 0xA5 (integers), so that reading before writing shows up in results.
"""
from __future__ import annotations

import itertools
import math
import re
from collections import OrderedDict
from typing import Any

import numpy as np

from . import dtype as dt
from .expr import (AMX_U8I8, Add, And, BufferLoad, Call, Cast, Div, EQ, FloatImm, FloorDiv, FloorMod, GE, GT,
                   IntImm, LE, LT, Let, Max, Min, Mod, Mul, NE, Not, Or, PrimExpr, Select, Sub,
                   TIRError, Var)
from .function import IRModule, PrimFunc
from .functor import IRFunctor, IRMutator, free_vars, post_order_visit
from .stmt import (Allocate, AssertStmt, Block, BlockRealize, Buffer, BufferStore, Evaluate, For,
                   IfThenElse, LetStmt, SeqStmt, Stmt, is_prefetch, is_true)
from .structural import structural_equal, structural_hash

__all__ = ["interpret"]

_CAP = 1 << 20             # elements of one vectorized chunk (the product of vector extents)
_REDUCE_BOX = 2048         # use the vector-reduction form only below this many outer lanes
_NUMERIC_BOX = 1 << 20     # largest iteration box whose injectivity is checked numerically
_MAX_LOOP_NEST = 14        # nested Python for-loops per generated function (CPython allows 20)
_MAX_INDENT = 50           # indentation levels of the generated source (CPython allows 100)
_CACHE_SIZE = 128


# =============================================================================================
# public entry


def interpret(func, *arrays, func_name: str | None = None, **var_values) -> None:
    """Run ``func`` on numpy arrays, writing its outputs into them in place.

    Parameters
    ----------
    func : PrimFunc or IRModule
        Any TensorIR function: unscheduled, scheduled or lowered. For a module, the function
        named ``func_name``, else its only PrimFunc (or ``"main"``).
    *arrays : numpy.ndarray or scalar
        One per parameter, in order: an array (of the buffer's dtype) for each buffer parameter,
        a Python/numpy scalar for each scalar parameter. Trailing scalar parameters may be given
        as keywords instead, or left out when a buffer shape determines them.
    func_name : str, optional
        Which function of an IRModule to run.
    **var_values
        Values of scalar parameters or other variables by name (e.g. ``n=16``).

    Symbolic dimensions are bound from the arrays' shapes; a rank, dimension or dtype mismatch
    raises ``ValueError`` naming the argument. A lowered function whose flattened buffer has a
    different shape than the array but the same number of elements sees the array reshaped; its
    ``"arg_buffers"`` attribute (the original buffers), when present, is used for the checks.
    For a buffer with ``strides`` (in elements), pass a view with those strides (symbolic
    strides bind from it) or contiguous memory that holds the strided layout.

    Examples
    --------
    >>> import numpy as np
    >>> from tilecraft.tensorir import te
    >>> n = te.var("n")
    >>> A = te.placeholder((n,), "float32", "A")
    >>> B = te.compute((n,), lambda i: A[i] * 2.0, "B")
    >>> f = te.create_prim_func([A, B])
    >>> a = np.arange(4, dtype="float32"); b = np.empty(4, "float32")
    >>> interpret(f, a, b)
    >>> b
    array([0., 2., 4., 6.], dtype=float32)
    """
    vectorize = bool(var_values.pop("_vectorize", True))  # internal: False forces the scalar path
    func = _resolve_function(func, func_name)
    call = _bind_arguments(func, arrays, var_values)
    kernel = _get_kernel(func, call, vectorize and not call.aliased)
    with np.errstate(all="ignore"):
        kernel(*call.args)
    for dst, src in call.copy_back:
        dst[...] = src.reshape(dst.shape)


def _resolve_function(func, func_name) -> PrimFunc:
    if isinstance(func, IRModule):
        prims = {k: f for k, f in func.functions.items() if isinstance(f, PrimFunc)}
        if func_name is not None:
            f = func[func_name]
            if not isinstance(f, PrimFunc):
                raise TypeError(f"interpret: {func_name!r} is a {type(f).__name__}, not a PrimFunc")
            return f
        if len(prims) == 1:
            return next(iter(prims.values()))
        if "main" in prims:
            return prims["main"]
        raise ValueError(f"interpret: the module has PrimFuncs {sorted(prims)}; choose one with "
                         f"func_name=")
    if not isinstance(func, PrimFunc):
        raise TypeError(f"interpret: expected a PrimFunc or IRModule, got {type(func).__name__}")
    if func_name is not None:
        raise ValueError("interpret: func_name= is only for an IRModule")
    return func


# =============================================================================================
# argument binding


class _Call:
    """The checked arguments of one call."""

    def __init__(self):
        self.args: list = []           # kernel arguments: buffer arrays, then variable values
        self.ext_vars: list[Var] = []  # the variables passed, in order
        self.key: tuple = ()           # values of the integer variables (specialization key)
        self.copy_back: list = []      # (user array, temporary reshaped copy)
        self.aliased = False


def _to_scalar(value, dtype: str, what: str):
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise TypeError(f"interpret: {what} is a scalar of {dtype}, got an array of shape "
                            f"{value.shape}")
        value = value[()]
    if isinstance(value, PrimExpr):
        raise TypeError(f"interpret: {what} needs a number, got the expression {value!r}")
    if dt.is_bool(dtype):
        return np.bool_(value)
    if dt.is_integer(dtype):
        if isinstance(value, (float, np.floating)) and not float(value).is_integer():
            raise ValueError(f"interpret: {what} is an integer ({dtype}), got {value!r}")
        if not isinstance(value, (int, np.integer, np.bool_, float, np.floating)):
            raise TypeError(f"interpret: {what} is an integer ({dtype}), got "
                            f"{type(value).__name__}")
        try:
            return dt.to_numpy(dtype).type(int(value))
        except OverflowError:
            raise ValueError(f"interpret: {what} = {value} does not fit {dtype}") from None
    if not isinstance(value, (int, float, np.integer, np.floating, np.bool_)):
        raise TypeError(f"interpret: {what} is a {dtype} number, got {type(value).__name__}")
    return dt.to_numpy(dtype).type(value)


def _bind_arguments(func: PrimFunc, arrays, var_values) -> _Call:
    params = func.params
    if len(arrays) > len(params):
        raise TypeError(f"interpret: the function takes {len(params)} argument(s) "
                        f"({', '.join(_param_label(func, p) for p in params)}), got {len(arrays)}")
    positional = dict(zip(params, arrays))
    buffers = func.buffers
    arg_buffers = func.attr_dict.get("arg_buffers")
    if arg_buffers is not None:
        arg_buffers = tuple(arg_buffers)
        if len(arg_buffers) != len(buffers):
            raise TIRError(f"interpret: attr arg_buffers has {len(arg_buffers)} buffers for "
                           f"{len(buffers)} buffer parameters")

    # every variable a caller may have to provide, in a fixed order
    ext: dict[Var, None] = {}
    for p in func.scalar_params:
        ext[p] = None
    shape_holders = list(buffers) + list(arg_buffers or ())
    for b in shape_holders:
        for e in tuple(b.shape) + tuple(b.strides or ()):
            for v in free_vars(e):
                ext.setdefault(v, None)
    for v in free_vars(func.body):
        ext.setdefault(v, None)
    ext_vars = list(ext)

    by_name: dict[str, list[Var]] = {}
    for v in ext_vars:
        by_name.setdefault(v.name, []).append(v)

    env: dict[Var, Any] = {}
    for p in func.scalar_params:
        if p in positional:
            env[p] = _to_scalar(positional[p], p.dtype, f"scalar parameter {p.name}")
    for name, value in var_values.items():
        cands = by_name.get(name)
        if not cands:
            raise ValueError(f"interpret: unknown variable {name!r}; the function's variables are "
                             f"{sorted(by_name)}")
        if len(cands) > 1:
            raise ValueError(f"interpret: {len(cands)} different variables are named {name!r}; "
                             f"pass them positionally")
        v = cands[0]
        if v in env:
            raise ValueError(f"interpret: {name} is given both positionally and as a keyword")
        env[v] = _to_scalar(value, v.dtype, f"variable {name}")

    # the arrays: dtype, then plain-Var dimensions bind, then every dimension is checked
    entries = []
    for i, (pvar, buf) in enumerate(func.buffer_map):
        check = arg_buffers[i] if arg_buffers is not None else buf
        if pvar not in positional:
            raise ValueError(f"interpret: missing the array for buffer argument {check.name}")
        arr = positional[pvar]
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"interpret: argument {check.name} must be a numpy array, got "
                            f"{type(arr).__name__}")
        want = dt.to_numpy(check.dtype)
        if arr.dtype != want:
            raise ValueError(f"interpret: argument {check.name}: expected dtype {check.dtype}, got "
                             f"{arr.dtype}")
        same_rank = arr.ndim == check.ndim
        if not same_rank and (arg_buffers is not None or (check.strides is not None
                                                          and arr.ndim != 1)):
            raise ValueError(f"interpret: argument {check.name}: expected {check.ndim} "
                             f"dimension(s) (shape {_fmt_shape(check.shape)}), got an array of "
                             f"shape {arr.shape}")
        entries.append((buf, check, arr, same_rank))
        if same_rank:
            for d, s in enumerate(check.shape):
                if isinstance(s, Var):
                    _bind_dim(env, s, arr.shape[d], check.name, f"dimension {d}")
            if check.strides is not None:
                for d, s in enumerate(check.strides):
                    if isinstance(s, Var) and s not in env:
                        env[s] = _to_scalar(arr.strides[d] // arr.itemsize, s.dtype, s.name)

    ienv = {v: int(x) for v, x in env.items() if not dt.is_float(v.dtype)}
    call = _Call()
    views = []
    for buf, check, arr, same_rank in entries:
        if same_rank:
            for d, s in enumerate(check.shape):
                want = _eval_dim(s, ienv, check.name, f"dimension {d}")
                if arr.shape[d] != want:
                    what = str(want) if isinstance(s, IntImm) else f"{_fmt_expr(s)} = {want}"
                    raise ValueError(f"interpret: argument {check.name}: dimension {d} must be "
                                     f"{what}, got {arr.shape[d]} (array shape "
                                     f"{arr.shape}, buffer shape {_fmt_shape(check.shape)})")
        view = arr
        if buf is not check or not same_rank:
            shape = tuple(_eval_dim(s, ienv, buf.name, f"dimension {d}")
                          for d, s in enumerate(buf.shape))
            if buf.strides is None:
                if math.prod(shape) != arr.size:
                    raise ValueError(f"interpret: argument {check.name}: an array of shape "
                                     f"{arr.shape} ({arr.size} elements) does not match buffer "
                                     f"shape {_fmt_shape(buf.shape)} = {shape}")
                view = arr.reshape(shape)
                if not np.may_share_memory(view, arr):  # reshape had to copy
                    view = view.copy()
                    call.copy_back.append((arr, view))
            else:
                view = _strided_view(arr, buf, shape, ienv, check.name)
        elif buf.strides is not None:
            view = _strided_view(arr, buf, arr.shape, ienv, check.name)
        views.append(view)

    scalars = set(func.scalar_params)  # (a list's ``in`` would compare Vars with ==)
    for v in ext_vars:
        if v not in env:
            what = "scalar parameter" if v in scalars else "variable"
            raise ValueError(f"interpret: missing the value of {what} {v.name}; pass it "
                             f"{'positionally or ' if v in scalars else ''}as a keyword "
                             f"({v.name}=...)")
    call.ext_vars = ext_vars
    call.args = views + [env[v] for v in ext_vars]
    call.key = tuple(int(env[v]) if not dt.is_float(v.dtype) else None for v in ext_vars)
    for a, b in itertools.combinations(views, 2):
        if np.may_share_memory(a, b):
            call.aliased = True  # in-place calls run on the scalar path: always exact
    return call


def _param_label(func, p):
    for v, b in func.buffer_map:
        if v is p:
            return b.name
    return p.name


def _bind_dim(env, var, value, arg, what):
    value = _to_scalar(value, var.dtype, var.name)
    if var in env:
        if int(env[var]) != int(value):
            raise ValueError(f"interpret: argument {arg}: {what} is {int(value)}, but {var.name} "
                             f"is already {int(env[var])} (from another argument or keyword)")
    else:
        env[var] = value


def _eval_dim(expr, ienv, arg, what) -> int:
    v = _ieval(expr, ienv)
    if v is None:
        missing = [x.name for x in free_vars(expr) if x not in ienv]
        raise ValueError(f"interpret: argument {arg}: cannot determine {what} "
                         f"({_fmt_expr(expr)}): unbound variable(s) {missing}; pass them as "
                         f"keywords")
    return v


def _strided_view(arr, buf, shape, ienv, name):
    strides = tuple(_eval_dim(s, ienv, name, f"stride {d}") for d, s in enumerate(buf.strides))
    if arr.ndim == len(shape) and tuple(arr.shape) == tuple(shape) and \
            all(n <= 1 or a == s * arr.itemsize for n, a, s in zip(shape, arr.strides, strides)):
        return arr  # the array already has the buffer's layout
    if any(s < 0 for s in strides):
        raise ValueError(f"interpret: argument {name}: negative strides {strides} are not "
                         f"supported")
    span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    if not arr.flags.c_contiguous or arr.size < span:
        raise ValueError(f"interpret: argument {name}: buffer shape {tuple(shape)} with element "
                         f"strides {strides} needs a view with those strides or contiguous memory "
                         f"of {span} elements; got an array of shape {arr.shape} and strides "
                         f"{tuple(s // arr.itemsize for s in arr.strides)}")
    flat = arr.reshape(-1)
    return np.lib.stride_tricks.as_strided(flat, tuple(shape),
                                           tuple(s * arr.itemsize for s in strides))


_FMT_OPS = {Add: "+", Sub: "-", Mul: "*", FloorDiv: "//", FloorMod: "%", Div: "/"}


def _fmt_expr(e, top=True) -> str:
    """A short infix form of a shape expression, for messages."""
    if isinstance(e, Var):
        return e.name
    if isinstance(e, (IntImm, FloatImm)):
        return str(e.value)
    if type(e) in _FMT_OPS:
        s = f"{_fmt_expr(e.a, False)} {_FMT_OPS[type(e)]} {_fmt_expr(e.b, False)}"
        return s if top else f"({s})"
    if isinstance(e, (Min, Max)):
        return f"{type(e).__name__.lower()}({_fmt_expr(e.a)}, {_fmt_expr(e.b)})"
    if isinstance(e, Mod):
        return f"truncmod({_fmt_expr(e.a)}, {_fmt_expr(e.b)})"
    return f"<{type(e).__name__}>"


def _fmt_shape(shape) -> str:
    return "(" + ", ".join(_fmt_expr(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


# =============================================================================================
# static evaluation of integer expressions (shapes, extents, index analysis)


def _tdiv(a, b):
    """C division of integers (Python ints or arrays)."""
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return (a - np.fmod(a, b)) // b


def _tmod(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a - b * _tdiv(a, b)
    return np.fmod(a, b)


_STATIC_BIN = {
    Add: lambda a, b: a + b, Sub: lambda a, b: a - b, Mul: lambda a, b: a * b,
    FloorDiv: lambda a, b: a // b, FloorMod: lambda a, b: a % b, Div: _tdiv, Mod: _tmod,
    Min: np.minimum, Max: np.maximum, EQ: lambda a, b: a == b, NE: lambda a, b: a != b,
    LT: lambda a, b: a < b, LE: lambda a, b: a <= b, GT: lambda a, b: a > b,
    GE: lambda a, b: a >= b, And: np.logical_and, Or: np.logical_or,
}
_DIVS = (FloorDiv, FloorMod, Div, Mod)


def _static_eval(e, env):
    """Evaluate an integer/bool expression over Python ints or int64 arrays; None if not
    possible (unknown variable, load, float, division by zero)."""
    t = type(e)
    if t is IntImm:
        return e.value
    if t is Var:
        return env.get(e)
    if t in _STATIC_BIN:
        if dt.is_float(e.a.dtype):
            return None
        a = _static_eval(e.a, env)
        if a is None:
            return None
        b = _static_eval(e.b, env)
        if b is None:
            return None
        if t in _DIVS and np.any(np.asarray(b) == 0):
            return None
        r = _STATIC_BIN[t](a, b)
        return int(r) if isinstance(r, (np.integer, np.bool_)) else r
    if t is Not:
        a = _static_eval(e.a, env)
        return None if a is None else np.logical_not(a)
    if t is Cast:
        if dt.is_float(e.dtype) or dt.is_float(e.value.dtype):
            return None
        return _static_eval(e.value, env)
    if t is Select:
        c = _static_eval(e.condition, env)
        a = _static_eval(e.true_value, env)
        b = _static_eval(e.false_value, env)
        if c is None or a is None or b is None:
            return None
        r = np.where(c, a, b)
        return int(r) if r.ndim == 0 else r
    if t is Let:
        v = _static_eval(e.value, env)
        if v is None:
            return None
        return _static_eval(e.body, {**env, e.var: v})
    return None


def _ieval(e, env) -> int | None:
    r = _static_eval(e, env)
    if r is None or isinstance(r, np.ndarray):
        return None
    return int(r)


def _dtype_range(dtype):
    if dt.is_bool(dtype):
        return 0, 1
    info = np.iinfo(dt.to_numpy(dtype))
    return int(info.min), int(info.max)


def _bound(e, ranges, consts):
    """An interval (lo, hi) holding every value of the integer expression ``e`` when each
    variable lies in ``ranges`` (or equals ``consts``); None if unknown."""
    t = type(e)
    if t is IntImm:
        return e.value, e.value
    if t is Var:
        if e in consts:
            return consts[e], consts[e]
        return ranges.get(e)
    if not dt.is_integer(e.dtype):
        return None
    r = None
    if t in (Add, Sub, Mul, Min, Max):
        a, b = _bound(e.a, ranges, consts), _bound(e.b, ranges, consts)
        if a is None or b is None:
            return None
        if t is Add:
            r = (a[0] + b[0], a[1] + b[1])
        elif t is Sub:
            r = (a[0] - b[1], a[1] - b[0])
        elif t is Mul:
            p = [x * y for x in a for y in b]
            r = (min(p), max(p))
        elif t is Min:
            r = (min(a[0], b[0]), min(a[1], b[1]))
        else:
            r = (max(a[0], b[0]), max(a[1], b[1]))
    elif t in _DIVS:
        c = _ieval(e.b, consts)
        a = _bound(e.a, ranges, consts)
        if a is None or c is None or c <= 0:
            return None
        if t is FloorDiv or (t is Div and a[0] >= 0):
            r = (a[0] // c, a[1] // c)
        elif t is FloorMod or (t is Mod and a[0] >= 0):
            r = (a[0], a[1]) if a[0] >= 0 and a[1] < c and a[0] // c == a[1] // c else (0, c - 1)
        else:
            return None
    elif t is Cast and dt.is_integer(e.value.dtype):
        r = _bound(e.value, ranges, consts)
    elif t is Select or (t is Call and e.op == "if_then_else"):
        x, y = (e.true_value, e.false_value) if t is Select else e.args[1:]
        a, b = _bound(x, ranges, consts), _bound(y, ranges, consts)
        if a is None or b is None:
            return None
        r = (min(a[0], b[0]), max(a[1], b[1]))
    if r is None:
        return None
    lo, hi = _dtype_range(e.dtype)
    return r if lo <= r[0] and r[1] <= hi else None  # may wrap: no proof


# =============================================================================================
# runtime helpers used by the generated code


class _Off:
    """Mask sentinel: no lane is active."""

    def __repr__(self):
        return "_OFF"


_OFF = _Off()


def _arange(lo, ext, dtype):
    """The values of a serial loop variable, as numpy scalars of its dtype."""
    return map(dtype.type, range(int(lo), int(lo + ext)))


def _axshape(nd, k, e):
    return tuple(e if i == k else 1 for i in range(nd))


def _oob(name, shape, index_fn):
    idx = tuple(int(i) for i in index_fn())
    shape = tuple(int(s) for s in shape)
    for d, (i, n) in enumerate(zip(idx, shape)):
        if not 0 <= i < n:
            raise IndexError(f"buffer {name}: index {idx} is out of bounds for shape {shape} "
                             f"(dimension {d}: {i} is not in [0, {n}))")
    raise IndexError(f"buffer {name}: index {idx} is out of bounds for shape {shape}")


def _check(name, ix, n, d):
    if isinstance(ix, np.ndarray):
        if ix.size == 0:
            return
        if ix.min() < 0 or ix.max() >= n:
            bad = int(ix[(ix < 0) | (ix >= n)].flat[0])
            raise IndexError(f"buffer {name}: index {bad} is out of bounds in dimension {d} "
                             f"(size {int(n)})")
    elif not 0 <= ix < n:
        raise IndexError(f"buffer {name}: index {int(ix)} is out of bounds in dimension {d} "
                         f"(size {int(n)})")


def _vld(arr, pre, idx, m, name):
    """Load ``arr[pre + idx]`` over index arrays; only lanes active in mask ``m`` are checked."""
    if m is not None:
        idx = tuple(np.where(m, ix, 0) if isinstance(ix, np.ndarray) else ix for ix in idx)
    npre = len(pre)
    for d, ix in enumerate(idx):
        _check(name, ix, arr.shape[npre + d], d)
    return arr[pre + idx]


def _vst(arr, pre, idx, val, m, name, check=True):
    """Store ``arr[pre + idx] = val`` over index arrays, in the lanes active in mask ``m``
    (``check=False``: the indices are proven in bounds)."""
    npre = len(pre)
    full = pre + idx
    if not any(isinstance(x, np.ndarray) for x in full):
        # one element: every active lane holds the same value (the planner guarantees it)
        for d, ix in enumerate(idx if check else ()):
            _check(name, ix, arr.shape[npre + d], d)
        if isinstance(val, np.ndarray):
            if m is not None:
                val = np.broadcast_to(val, np.broadcast_shapes(val.shape, m.shape))[
                    np.broadcast_to(m, np.broadcast_shapes(val.shape, m.shape))]
            val = val.reshape(-1)[-1]
        arr[full] = val
        return
    if m is None:
        for d, ix in enumerate(idx if check else ()):
            _check(name, ix, arr.shape[npre + d], d)
        try:
            arr[full] = val  # the index arrays cover every lane, so val broadcasts to them
        except ValueError:
            b = np.broadcast_arrays(*full, val)
            arr[tuple(b[:-1])] = b[-1]
        return
    b = np.broadcast_arrays(*full, val, m)
    mb = b[-1]
    sel = [x[mb] for x in b[:-1]]
    for d in range(len(idx) if check else 0):
        _check(name, sel[npre + d], arr.shape[npre + d], d)
    arr[tuple(sel[:-1])] = sel[-1]


def _mand(m, c):
    """The mask of lanes active in ``m`` (None: all) where ``c`` holds; _OFF if none."""
    if not isinstance(c, np.ndarray):
        return m if c else _OFF
    r = c if m is None else (m & c)
    if r.all():
        return m
    return r if r.any() else _OFF


def _vsel(c, t, f):
    if isinstance(c, np.ndarray):
        return np.where(c, t, f)
    return t if c else f


def _sel(c, t, f):
    return t if c else f


def _vite(c, m, tf, ff):
    """if_then_else over lanes: each branch is evaluated only in the lanes that take it."""
    if not isinstance(c, np.ndarray):
        return tf(m) if c else ff(m)
    mt = _mand(m, c)
    mf = _mand(m, ~c)
    if mt is _OFF:
        return ff(mf)
    if mf is _OFF:
        return tf(mt)
    return np.where(c, tf(mt), ff(mf))


def _vand(a, m, bf):
    if not isinstance(a, np.ndarray):
        return bf(m) if a else a
    mb = _mand(m, a)
    return a if mb is _OFF else a & bf(mb)


def _vor(a, m, bf):
    if not isinstance(a, np.ndarray):
        return a if a else bf(m)
    mb = _mand(m, ~a)
    return a if mb is _OFF else a | bf(mb)


def _vassert(c, m, msg):
    if isinstance(c, np.ndarray):
        bad = ~c if m is None else (m & ~c)
        if bad.any():
            raise RuntimeError(msg)
    elif not c:
        raise RuntimeError(msg)


def _nonzero(b, m):
    if isinstance(b, np.ndarray):
        z = b == 0
        if z.any():
            if m is None or (z & m).any():
                raise ZeroDivisionError("integer division by zero")
            b = np.where(z, 1, b)  # lanes that are masked off
        return b
    if b == 0:
        raise ZeroDivisionError("integer division by zero")
    return b


def _floordiv(a, b, m):
    return a // _nonzero(b, m)


def _floormod(a, b, m):
    return a % _nonzero(b, m)


def _truncdiv(a, b, m):
    b = _nonzero(b, m)
    return (a - np.fmod(a, b)) // b


def _truncmod(a, b, m):
    return np.fmod(a, _nonzero(b, m))


def _truncdiv_c(a, c):
    return (a - np.fmod(a, c)) // c


def _rsqrt(x):
    return np.reciprocal(np.sqrt(x))


def _sigmoid(x):
    one = x.dtype.type(1)
    return one / (one + np.exp(-x))


_erf_object = np.frompyfunc(math.erf, 1, 1)


def _erf(x):
    # numpy has no erf: math.erf is correctly rounded in float64, then round to the dtype
    if isinstance(x, np.ndarray):
        return _erf_object(x.astype(np.float64)).astype(x.dtype)
    return x.dtype.type(math.erf(float(x)))


def _dot4_u8i8(a, b):
    """The packed 8-bit dot product: the four bytes of ``a`` (unsigned) times those of ``b``
    (signed), summed exactly in int32 (``targets.llvm.dot4``)."""
    a, b = np.asarray(a, np.int32), np.asarray(b, np.int32)
    total = np.zeros(np.broadcast_shapes(a.shape, b.shape), np.int32)
    for k in range(4):
        ua = (a >> (8 * k)) & 255
        sb = (((b >> (8 * k)) & 255) ^ 128) - 128
        total = total + ua * sb
    return total if total.shape else np.int32(total)


def _amx_operand(arr, first, nxt, rows: int, width: int, name: str):
    """The flat view of the C-contiguous ``arr``, the offset of the element at index tuple
    ``first`` and the row stride (the offset of ``nxt`` less it) of an AMX operand tile of
    ``rows`` x ``width`` elements; each tile row must lie within one row of the layout and the
    whole tile within the buffer."""
    if not arr.flags.c_contiguous:
        raise TIRError(f"interpret: the AMX operand {name} is not a contiguous buffer")
    steps = [st // arr.itemsize for st in arr.strides]
    off = sum(int(i) * st for i, st in zip(first, steps))
    ld = sum(int(i) * st for i, st in zip(nxt, steps)) - off
    if rows > 1 and (ld < width or off % ld + width > ld):
        raise TIRError(f"interpret: an AMX tile row of {width} elements of {name} at offset "
                       f"{off} does not lie within one row of stride {ld}: the tile overruns "
                       f"its rows (pad the buffer to whole tiles)")
    end = off + ld * (rows - 1) + width
    if off < 0 or end > arr.size:
        raise IndexError(f"interpret: the AMX tile of {name} ({rows} x {width} elements from "
                         f"offset {off}, row stride {ld}) lies outside the buffer of {arr.size} "
                         f"elements")
    return arr.reshape(-1), off, ld


def _amx_u8i8(c, ci, a, ai, b, bi, cn, an, bn, rows, ksteps, col_tiles, names):
    """The Intel AMX int8 block product ``AMX_U8I8`` (``tensorir.expr``): ``C`` (``rows`` x
    ``16 col_tiles`` int32) += the uint8 bytes of ``A``'s words (``rows`` x ``16 ksteps``) times
    the int8 bytes of ``B``'s words (``16 ksteps`` x ``16 col_tiles``, VNNI layout), exact, the
    int32 sums wrapping as ``tdpbusd``'s do. ``ci``/``cn`` ... index the first element and the
    next row's first element of each operand."""
    rows, ksteps, col_tiles = int(rows), int(ksteps), int(col_tiles)
    if not 1 <= rows <= 32:
        raise TIRError(f"interpret: an AMX block product of {rows} rows (1..32 are possible)")
    n, kw = 16 * col_tiles, 16 * ksteps
    tiles = []
    for arr, first, nxt, r, w, name in ((a, ai, an, rows, kw, names[1]),
                                        (b, bi, bn, kw, n, names[2])):
        flat, off, ld = _amx_operand(arr, first, nxt, r, w, name)
        idx = off + ld * np.arange(r)[:, None] + np.arange(w)
        tiles.append(flat[idx].astype(np.int64))
    words_a, words_b = tiles
    ua = np.stack([(words_a >> (8 * p)) & 255 for p in range(4)], -1)           # rows, kw, 4
    sb = np.stack([(((words_b >> (8 * p)) & 255) ^ 128) - 128 for p in range(4)], -1)
    prod = ua.reshape(rows, kw * 4) @ sb.transpose(0, 2, 1).reshape(kw * 4, n)
    flat, off, ld = _amx_operand(c, ci, cn, rows, n, names[0])
    idx = off + ld * np.arange(rows)[:, None] + np.arange(n)
    flat[idx] = (flat[idx].astype(np.int64) + prod).astype(np.int32)


def _nibble_f32(w, s):
    """The float32 of bits ``s .. s+3`` of the int32 ``w`` (``targets.llvm.codegen``)."""
    out = ((np.asarray(w, np.int32) >> np.asarray(s, np.int32)) & 15).astype(np.float32)
    return out if out.shape else np.float32(out)


_INTRINSICS = {
    "dot4_u8i8": "_dot4_u8i8", "nibble_f32": "_nibble_f32",
    "exp": "np.exp", "log": "np.log", "sqrt": "np.sqrt", "rsqrt": "_rsqrt", "tanh": "np.tanh",
    "sigmoid": "_sigmoid", "erf": "_erf", "pow": "np.power", "fabs": "np.abs",
    "floor": "np.floor", "ceil": "np.ceil", "round": "np.rint", "sin": "np.sin", "cos": "np.cos",
    "exp2": "np.exp2", "log2": "np.log2", "trunc": "np.trunc",
}

_REDUCE_UFUNCS = {"add": np.add, "multiply": np.multiply, "maximum": np.maximum,
                  "minimum": np.minimum}
_REDUCE_OPS = {Add: "add", Mul: "multiply", Max: "maximum", Min: "minimum"}


def _identity(op, dtype):
    if op == "add":
        return dtype.type(0)
    if op == "multiply":
        return dtype.type(1)
    if dtype.kind == "f":
        return dtype.type(-np.inf if op == "maximum" else np.inf)
    if dtype.kind == "b":
        return np.bool_(op == "minimum")
    info = np.iinfo(dtype)
    return dtype.type(info.min if op == "maximum" else info.max)


def _rreduce(arr, pre, idx, op, f, m, axis, ic, iv, pos, name):
    """Apply all iterations of ``arr[idx] = arr[idx] <op> f`` along ``axis`` at once.

    ``ic`` is the init condition per iteration (None: no init), ``iv`` the init value; the
    result is the one of running the iterations in order: the last iteration whose init runs
    restarts the accumulation from ``iv``.
    """
    uf = _REDUCE_UFUNCS[op]
    dtype = arr.dtype
    shapes = [np.shape(f), pos.shape]
    if m is not None:
        shapes.append(m.shape)
    if ic is not None:
        shapes.append(np.shape(ic))
    full = np.broadcast_shapes(*shapes)
    act = np.ones(full, bool) if m is None else np.broadcast_to(m, full)
    has_init = None
    if ic is not None:
        icb = np.broadcast_to(ic, full) & act
        last = np.where(icb, pos, -1).max(axis=axis, keepdims=True)
        act = act & (pos >= last)
        has_init = last >= 0
    vals = np.where(act, f, _identity(op, dtype))
    acc = uf.reduce(vals, axis=axis, keepdims=True, dtype=dtype)
    any_act = act.any(axis=axis, keepdims=True)
    if not any_act.any():
        return
    mm = None if any_act.all() else any_act
    old = _vld(arr, pre, idx, mm, name)
    start = old if has_init is None else np.where(has_init, iv, old)
    _vst(arr, pre, idx, uf(start, acc).astype(dtype, copy=False), mm, name)


def _poison(a):
    if a.dtype.kind == "f":
        a.fill(np.nan)
    elif a.dtype.kind == "b":
        a.fill(True)
    elif a.size:
        a.view(np.uint8).fill(0xA5)
    return a


def _alloc(shape, dtype, strides, prefix, name):
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"buffer {name}: negative allocation shape {shape}")
    prefix = tuple(int(p) for p in prefix)
    if strides is None:
        return _poison(np.empty(prefix + shape, dtype))
    strides = tuple(int(s) for s in strides)
    if any(s < 0 for s in strides):
        raise ValueError(f"buffer {name}: negative strides {strides}")
    span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    base = _poison(np.empty(prefix + (span,), dtype))
    return np.lib.stride_tricks.as_strided(
        base, prefix + shape, base.strides[:-1] + tuple(s * base.itemsize for s in strides))


def _alias_view(arr, shape, name, param):
    shape = tuple(int(s) for s in shape)
    if math.prod(shape) != arr.size:
        raise ValueError(f"buffer {name} (an alias of parameter {param}) has shape {shape}, "
                         f"which does not hold the {arr.size} elements of {param}")
    v = arr.reshape(shape)
    if not np.may_share_memory(v, arr):
        raise ValueError(f"buffer {name} cannot be a view of parameter {param}")
    return v


_RUNTIME = {
    "np": np, "_OFF": _OFF, "_arange": _arange, "_axshape": _axshape, "_oob": _oob,
    "_vld": _vld, "_vst": _vst, "_mand": _mand, "_vsel": _vsel, "_sel": _sel, "_vite": _vite,
    "_vand": _vand, "_vor": _vor, "_vassert": _vassert, "_floordiv": _floordiv,
    "_floormod": _floormod, "_truncdiv": _truncdiv, "_truncmod": _truncmod,
    "_truncdiv_c": _truncdiv_c, "_rsqrt": _rsqrt, "_sigmoid": _sigmoid, "_erf": _erf,
    "_dot4_u8i8": _dot4_u8i8,
    "_amx_u8i8": _amx_u8i8,
    "_nibble_f32": _nibble_f32,
    "_rreduce": _rreduce, "_alloc": _alloc, "_alias_view": _alias_view, "_CAP": _CAP,
}


# =============================================================================================
# dependence analysis


class _Normalizer(IRMutator):
    """Substitute iteration/let variables by their (normalized) definitions and inline ``Let``,
    so that index expressions are in terms of loop variables."""

    def __init__(self, defs):
        super().__init__()
        self.defs = defs

    def visit_Var(self, v):
        return self.defs.get(v, v)

    def visit_Let(self, e):
        value = self.visit(e.value)
        saved = dict(self.defs)
        self.defs = {**self.defs, e.var: value}
        try:
            return self.visit(e.body)
        finally:
            self.defs = saved


def _normalize(e, defs):
    if not defs:
        return e
    return _Normalizer(defs).visit(e)


def _has_load(e, buffer=None) -> bool:
    found = []

    def f(n):
        if isinstance(n, BufferLoad) and (buffer is None or n.buffer is buffer):
            found.append(n)
    post_order_visit(e, f)
    return bool(found)


class _K:
    """A dict key comparing expressions structurally (Vars by identity)."""

    __slots__ = ("e", "h")

    def __init__(self, e):
        self.e = e
        self.h = id(e) if isinstance(e, Var) else structural_hash(e)

    def __hash__(self):
        return self.h

    def __eq__(self, other):
        if self.e is other.e:
            return True
        if isinstance(self.e, Var) or isinstance(other.e, Var):
            return False
        return structural_equal(self.e, other.e)


def _linear(e, consts):
    """``e`` as ``const + sum(coef * term)``: (int, {_K(term): int})."""
    c = _ieval(e, consts)
    if c is not None:
        return c, {}
    t = type(e)
    if t is Add or t is Sub:
        c1, t1 = _linear(e.a, consts)
        c2, t2 = _linear(e.b, consts)
        sign = 1 if t is Add else -1
        terms = dict(t1)
        for k, v in t2.items():
            terms[k] = terms.get(k, 0) + sign * v
        return c1 + sign * c2, {k: v for k, v in terms.items() if v}
    if t is Mul:
        ca, cb = _ieval(e.a, consts), _ieval(e.b, consts)
        if ca is not None or cb is not None:
            scale, other = (ca, e.b) if ca is not None else (cb, e.a)
            c0, t0 = _linear(other, consts)
            return c0 * scale, {k: v * scale for k, v in t0.items() if v * scale}
    if t is Cast and dt.is_integer(e.dtype) and dt.is_integer(e.value.dtype):
        return _linear(e.value, consts)
    return 0, {_K(e): 1}


class _Dec:
    __slots__ = ("h", "r", "lo", "hi")

    def __init__(self, h, r, lo, hi):
        self.h, self.r, self.lo, self.hi = h, r, lo, hi


def _decompose(e, vset, inner, consts):
    """Split an index into a part that depends on the vectorized loop vars (``h``), an
    invariant symbolic part (``r``) and a bounded offset ``[lo, hi]`` (constants and inner loop
    variables); None when that is not possible."""
    if not dt.is_integer(e.dtype):
        return None
    const, terms = _linear(e, consts)
    h, r = {}, {}
    lo = hi = const
    for k, c in terms.items():
        x = k.e
        if isinstance(x, Var):
            if x in vset:
                h[k] = c
            elif x in inner:
                rng = inner[x]
                if rng is None:
                    return None
                a, b = c * rng[0], c * (rng[0] + max(rng[1], 1) - 1)
                lo += min(a, b)
                hi += max(a, b)
            else:
                r[k] = c
            continue
        if _has_load(x):
            return None
        fv = set(free_vars(x))
        if any(v in inner for v in fv):
            return None
        if any(v in vset for v in fv):
            if not all(v in vset or v in consts for v in fv):
                return None
            h[k] = c   # an opaque function of the vector variables (e.g. fused // 64)
        else:
            r[k] = c
    return _Dec(h, r, lo, hi)


def _radix_ok(items, acc):
    """Mixed-radix test: coefficients (|c|, extent) separate every pair of distinct points by
    more than ``acc``."""
    for a, ext in sorted(items):
        if a <= acc:
            return False
        acc += a * (ext - 1)
    return True


def _injective(dims, vinfo, consts) -> bool:
    """Do the separating dimensions ``dims`` [(h, width)] distinguish every two iterations of
    the vector loops ``vinfo`` [(var, lo, ext)]?"""
    ext_of = {v: ext for v, _, ext in vinfo}
    need = {v for v, _, ext in vinfo if ext > 1}
    if not need:
        return True
    covered = set()
    for h, width in dims:
        if not all(isinstance(k.e, Var) for k in h):
            continue
        items = [(abs(c), ext_of[k.e]) for k, c in h.items() if ext_of[k.e] > 1]
        if items and _radix_ok(items, width):
            covered |= {k.e for k in h if ext_of[k.e] > 1}
    if need <= covered:
        return True
    # numeric check over the whole iteration box, for non-affine maps such as fused loops
    exact = [h for h, width in dims if width == 0]
    box = math.prod(ext for _, _, ext in vinfo)
    if not exact or box > _NUMERIC_BOX:
        return False
    used = set()
    for h in exact:
        for key in h:
            used.update(free_vars(key.e) if not isinstance(key.e, Var) else [key.e])
    if not need <= used:
        return False  # a loop variable no index depends on: iterations collide
    env = dict(consts)
    nd = len(vinfo)
    for k, (v, lo, ext) in enumerate(vinfo):
        if lo is None:
            if any(v in set(free_vars(key.e)) for h in exact for key in h):
                return False
            continue
        env[v] = np.arange(lo, lo + ext, dtype=np.int64).reshape(_axshape(nd, k, ext))
    full = tuple(ext for _, _, ext in vinfo)
    cols = []
    for h in exact:
        val = 0
        for key, c in h.items():
            x = _static_eval(key.e, env)
            if x is None:
                return False
            val = val + c * np.asarray(x, dtype=np.int64)
        cols.append(np.broadcast_to(val, full).ravel())
    code = np.zeros(box, dtype=np.int64)
    radix = 1
    for col in cols:
        col = col - col.min()
        width = int(col.max()) + 1
        if radix * width >= 1 << 62:
            rows = np.unique(np.stack(cols, axis=1), axis=0)
            return rows.shape[0] == box
        code += col * radix
        radix *= width
    return np.unique(code).size == box


class _BodyInfo:
    def __init__(self):
        self.accesses: list = []   # (buffer, normalized indices, is_write)
        self.inner: dict = {}      # inner loop var -> (lo, ext) or None
        self.private: set = set()  # buffers allocated inside
        self.bounds: list = []     # loop bounds and allocation shapes (normalized)
        self.opaque = False        # an intrinsic writes memory no store shows (AMX tiles)


def _is_amx(s) -> bool:
    return isinstance(s, Evaluate) and isinstance(s.value, Call) and s.value.op == AMX_U8I8


def _collect(stmt, defs, consts) -> _BodyInfo:
    info = _BodyInfo()

    def loads(e, defs):
        e = _normalize(e, defs)

        def f(n):
            if isinstance(n, BufferLoad):
                info.accesses.append((n.buffer, n.indices, False))
        post_order_visit(e, f)

    def alloc(buf, defs):
        info.private.add(buf)
        for s in tuple(buf.shape) + tuple(buf.strides or ()):
            info.bounds.append(_normalize(s, defs))

    def visit(s, defs):
        if isinstance(s, SeqStmt):
            for x in s.seq:
                visit(x, defs)
        elif isinstance(s, BufferStore):
            loads(s.value, defs)
            for i in s.indices:
                loads(i, defs)
            info.accesses.append((s.buffer, tuple(_normalize(i, defs) for i in s.indices), True))
        elif isinstance(s, For):
            lo, ext = _normalize(s.min, defs), _normalize(s.extent, defs)
            loads(lo, defs)
            loads(ext, defs)
            info.bounds += [lo, ext]
            clo, cext = _ieval(lo, consts), _ieval(ext, consts)
            info.inner[s.loop_var] = None if clo is None or cext is None else (clo, cext)
            visit(s.body, defs)
        elif isinstance(s, IfThenElse):
            loads(s.condition, defs)
            visit(s.then_case, defs)
            if s.else_case is not None:
                visit(s.else_case, defs)
        elif isinstance(s, LetStmt):
            loads(s.value, defs)
            visit(s.body, {**defs, s.var: _normalize(s.value, defs)})
        elif isinstance(s, AssertStmt):
            loads(s.condition, defs)
            visit(s.body, defs)
        elif isinstance(s, Evaluate):
            if _is_amx(s):
                info.opaque = True      # writes a tile no store shows: the loops stay serial
            if not is_prefetch(s):      # a hint: it reads nothing
                loads(s.value, defs)
        elif isinstance(s, Allocate):
            alloc(s.buffer, defs)
            visit(s.body, defs)
        elif isinstance(s, BlockRealize):
            loads(s.predicate, defs)
            inner_defs = dict(defs)
            for iv, v in zip(s.block.iter_vars, s.iter_values):
                loads(v, defs)
                inner_defs[iv.var] = _normalize(v, defs)
            for iv in s.block.iter_vars:
                loads(iv.dom.min, inner_defs)
            for b in s.block.alloc_buffers:
                alloc(b, inner_defs)
            if s.block.init is not None:
                visit(s.block.init, inner_defs)
            visit(s.block.body, inner_defs)
        elif isinstance(s, Block):
            visit(BlockRealize([], None, s), defs)
        elif s is not None:
            raise TIRError(f"interpret: cannot evaluate a {type(s).__name__} statement", s)

    visit(stmt, defs)
    return info


def _separable(accs, vinfo, inner, consts) -> bool:
    """No two distinct iterations of the vector loops touch one element through ``accs``."""
    vset = {v for v, _, _ in vinfo}
    dims = []
    for d in range(len(accs[0])):
        decs = [_decompose(a[d], vset, inner, consts) for a in accs]
        if any(x is None for x in decs):
            continue
        first = decs[0]
        if not first.h or not all(x.h == first.h and x.r == first.r for x in decs[1:]):
            continue
        width = max(x.hi for x in decs) - min(x.lo for x in decs)
        dims.append((first.h, width))
    return _injective(dims, vinfo, consts)


def _non_overlapping(buf, consts) -> bool:
    shape = [_ieval(s, consts) for s in buf.shape]
    strides = [_ieval(s, consts) for s in buf.strides]
    if any(x is None for x in shape + strides):
        return False
    items = [(s, n) for s, n in zip(strides, shape) if n > 1]
    return all(s > 0 for s, _ in items) and _radix_ok(items, 0)


class _ReducePattern:
    def __init__(self, realize, store, op, value, init):
        self.realize, self.store, self.op, self.value, self.init = realize, store, op, value, init


# =============================================================================================
# code generation


class _BufInfo:
    __slots__ = ("arr", "dims", "npre", "pre")

    def __init__(self, arr, dims, npre=0, pre="()"):
        self.arr, self.dims, self.npre, self.pre = arr, dims, npre, pre


class _Axis:
    __slots__ = ("var", "lo", "ext", "e", "ax", "box")

    def __init__(self, var, lo, ext, e, ax, box):
        self.var, self.lo, self.ext, self.e, self.ax, self.box = var, lo, ext, e, ax, box


_CMP = {EQ: "==", NE: "!=", LT: "<", LE: "<=", GT: ">", GE: ">="}
_ARITH = {Add: "+", Sub: "-", Mul: "*"}


def _may_fault(e) -> bool:
    found = []

    def f(n):
        if isinstance(n, BufferLoad):
            found.append(n)
        elif isinstance(n, _DIVS) and dt.is_integer(n.dtype):
            c = n.b.value if isinstance(n.b, IntImm) else 0
            if c == 0:
                found.append(n)
    post_order_visit(e, f)
    return bool(found)


def _ident(name: str) -> str:
    s = re.sub(r"\W", "_", name)
    return s[:24] if s and not s[0].isdigit() else "x" + s[:24]


class _Compiler(IRFunctor):
    def __init__(self, func: PrimFunc, ext_vars, consts, vectorize: bool):
        self.func = func
        self.consts = consts
        self.vectorize = vectorize
        self.ns = dict(_RUNTIME)
        self.lines: list[str] = []
        self.ind = 1
        self.uid = itertools.count()
        self.names: dict = {}
        self.bufs: dict = {}
        self.defs: dict = {}
        self.axes: list[_Axis] = []
        self.region = None        # [name of the region's axis count, max axis count]
        self.loop_nest = 0
        self.created: set[str] = set()   # every local name of the generated code
        self.helpers: list[str] = []     # top-level functions for deeply nested blocks
        self.lazy = 0             # > 0 inside lambdas / lazily evaluated branches
        self.edepth = 0
        self.consts_cache: dict = {}
        self.ext_vars = ext_vars
        self.ranges: dict = {}    # loop var -> (lo, hi) of the loops around the code emitted

    # ---- emission utilities
    def emit(self, line: str):
        self.lines.append("    " * self.ind + line)

    def tmp(self, base="_t") -> str:
        name = f"{base}{next(self.uid)}"
        self.created.add(name)
        return name

    def const(self, value, dtype) -> str:
        key = (dtype, repr(value))
        name = self.consts_cache.get(key)
        if name is None:
            name = f"_k{len(self.consts_cache)}"
            self.consts_cache[key] = name
            self.ns[name] = np.bool_(value) if dt.is_bool(dtype) else \
                dt.to_numpy(dtype).type(value)
        return name

    def dtype_name(self, dtype) -> str:
        name = "_dt_" + dt.element_of(dtype)
        self.ns[name] = dt.to_numpy(dt.element_of(dtype))
        return name

    def bind_var(self, v: Var) -> str:
        name = f"{_ident(v.name)}_{next(self.uid)}"
        self.created.add(name)
        self.names[v] = name
        return name

    def var(self, v: Var) -> str:
        name = self.names.get(v)
        if name is None:
            raise TIRError(f"interpret: variable {v.name} is used outside its scope (it is not a "
                           f"parameter, loop, block or let variable here)", v)
        return name

    def buf(self, b: Buffer) -> _BufInfo:
        info = self.bufs.get(b)
        if info is None:
            raise TIRError(f"interpret: buffer {b.name} is used outside its scope: it is neither "
                           f"a parameter of the function nor allocated (alloc_buffers of an "
                           f"enclosing block, or Allocate) around this use", b)
        return info

    def block(self, fn):
        """Emit the statements ``fn`` emits as an indented block."""
        self.ind += 1
        if self.loop_nest >= _MAX_LOOP_NEST or self.ind >= _MAX_INDENT:
            # CPython limits statically nested blocks and indentation: the block becomes a
            # top-level function that gets the names it reads as arguments (a block's
            # statements never define names used after it)
            fn_name = self.tmp("_body")
            before = set(self.created)
            saved = (self.lines, self.ind, self.loop_nest)
            self.lines, self.ind, self.loop_nest = [], 1, 0
            self._block_lines(fn)
            body = self.lines
            self.lines, self.ind, self.loop_nest = saved
            text = re.sub(r"'[^'\\]*'|\"[^\"\\]*\"", "", "\n".join(body))
            params = ", ".join(sorted(set(re.findall(r"[A-Za-z_]\w*", text)) & before))
            self.helpers.append("\n".join([f"def {fn_name}({params}):"] + body))
            self.emit(f"{fn_name}({params})")
        else:
            self._block_lines(fn)
        self.ind -= 1

    def _block_lines(self, fn):
        n = len(self.lines)
        fn()
        if len(self.lines) == n:
            self.emit("pass")

    def norm(self, e):
        return _normalize(e, self.defs)

    # ---- buffers
    def declare_buffer(self, b: Buffer, arr_expr: str | None = None):
        """Emit an allocation (or a view ``arr_expr``) of ``b``; returns the shadowed info."""
        arr = self.tmp(f"b_{_ident(b.name)}_")
        if arr_expr is None:
            shape = ", ".join(self.expr(s, "None") for s in b.shape)
            strides = "None" if b.strides is None else \
                "(" + "".join(self.expr(s, "None") + ", " for s in b.strides) + ")"
            prefix = "(" + "".join(f"{a.e}, " for a in self.axes) + ")"
            arr_expr = (f"_alloc(({shape}{',' if len(b.shape) == 1 else ''}), "
                        f"{self.dtype_name(b.dtype)}, {strides}, {prefix}, {b.name!r})")
        self.emit(f"{arr} = {arr_expr}")
        return self.register_buffer(b, arr, private=arr_expr.startswith("_alloc"))

    def register_buffer(self, b: Buffer, arr: str, private: bool):
        # a buffer allocated inside vectorized loops gets one private copy per lane: its array
        # has the lanes' axes in front, indexed by the axes' index arrays
        axes = self.axes if private else []
        npre = len(axes)
        pre = "(" + "".join(f"{a.ax}, " for a in axes) + ")"
        dims = []
        for d in range(len(b.shape)):
            dn = f"{arr}_n{d}"
            self.created.add(dn)
            self.emit(f"{dn} = {arr}.shape[{npre + d}]")
            dims.append(dn)
        old = self.bufs.get(b)
        self.bufs[b] = _BufInfo(arr, dims, npre, pre)
        return old

    # ---- the function
    def compile(self):
        func = self.func
        params, param_arrays = [], []
        for b in func.buffers:
            arr = self.tmp(f"b_{_ident(b.name)}_")
            params.append(arr)
            param_arrays.append((b, arr))
        for v in self.ext_vars:
            params.append(self.bind_var(v))
        header = f"def _kernel({', '.join(params)}):"
        for b, arr in param_arrays:
            self.register_buffer(b, arr, private=False)
        self.declare_aliases()
        self.visit(func.body, "None")
        main = "\n".join([header] + (self.lines or ["    pass"]))
        source = "\n\n".join(self.helpers + [main]) + "\n"
        symbol = func.attr_dict.get("global_symbol", "main")
        code = compile(source, f"<tensorir.interpret:{symbol}>", "exec")
        exec(code, self.ns)
        kernel = self.ns["_kernel"]
        kernel.source = source
        return kernel

    def declare_aliases(self):
        """Buffers used in the body but declared nowhere: a lowered function may use a
        flattened (or unflattened) twin of a parameter buffer under the same name."""
        declared = set(self.func.buffers)
        used: dict = {}

        def f(n):
            if isinstance(n, Block):
                declared.update(n.alloc_buffers)
            elif isinstance(n, Allocate):
                declared.add(n.buffer)
            elif isinstance(n, (BufferLoad, BufferStore)):
                used.setdefault(n.buffer, None)
        post_order_visit(self.func.body, f)
        for b in used:
            if b in declared:
                continue
            twins = [p for p in self.func.buffers if p.name == b.name]
            if len(twins) != 1 or b.strides is not None:
                continue  # reported at the use
            p = twins[0]
            # two Buffer objects over one memory defeat the dependence test: stay scalar
            self.vectorize = False
            shape = ", ".join(self.expr(s, "None") for s in b.shape)
            self.declare_buffer(b, f"_alias_view({self.bufs[p].arr}, ({shape}"
                                   f"{',' if len(b.shape) == 1 else ''}), {b.name!r}, {p.name!r})")

    # ---- the walker (tensorir.functor's convention): visit(node, mask) -> visit_<ClassName>;
    # a statement emits lines, an expression returns its Python source
    def visit_default(self, node, m):
        what = "statement" if isinstance(node, Stmt) else "expression"
        raise TIRError(f"interpret: cannot evaluate a {type(node).__name__} {what}", node)

    # ---- statements

    def visit_SeqStmt(self, s, m):
        for x in s.seq:
            self.visit(x, m)

    def visit_Evaluate(self, s, m):
        if is_prefetch(s):
            self.emit("pass")       # a cache hint: nothing to compute
            return
        if _is_amx(s):
            self.amx_block(s.value, m)
            return
        self.emit(self.expr(s.value, m))

    def amx_block(self, call: Call, m):
        """``AMX_U8I8``: the block product on the operands' arrays (``_amx_u8i8``); never
        inside a vectorized loop (``_collect`` marks the loops around it opaque)."""
        if self.axes:
            raise TIRError("interpret: an AMX block product inside a vectorized loop", call)
        parts, names = [], []
        for ld in call.args[:6]:
            info = self.buf(ld.buffer)
            if info.npre:
                raise TIRError(f"interpret: the AMX operand {ld.buffer.name} is allocated "
                               f"inside a vectorized loop", call)
            idx = "".join(self.expr(i, m) + ", " for i in ld.indices)
            parts.append(f"{info.arr}, ({idx})" if len(parts) < 3 else f"({idx})")
            names.append(ld.buffer.name)
        rest = ", ".join(self.expr(x, m) for x in call.args[6:])
        self.emit(f"_amx_u8i8({', '.join(parts)}, {rest}, {tuple(names[:3])!r})")

    def in_bounds(self, buf: Buffer, indices) -> bool:
        """Are the indices provably inside ``buf`` (given the ranges of the loops around)?"""
        for i, n in zip(indices, buf.shape):
            size = _ieval(n, self.consts)
            b = _bound(self.norm(i), self.ranges, self.consts)
            if size is None or b is None or b[0] < 0 or b[1] >= size:
                return False
        return True

    def lane_index(self, indices, info) -> bool:
        """Does some index (or the private prefix) vary over the vector lanes?"""
        if info.npre:
            return True
        vset = {a.var for a in self.axes}
        return any(v in vset for i in indices for v in free_vars(self.norm(i)))

    def visit_BufferStore(self, s, m):
        info = self.buf(s.buffer)
        idx = [self.expr(i, m) for i in s.indices]
        val = self.expr(s.value, m)
        name = s.buffer.name
        safe = self.in_bounds(s.buffer, s.indices)
        if self.axes:
            if safe and m == "None" and self.lane_index(s.indices, info):
                self.emit(f"{info.arr}[{self.subscript(info, idx)}] = {val}")
                return
            self.emit(f"_vst({info.arr}, {info.pre}, ({''.join(i + ', ' for i in idx)}), {val}, "
                      f"{m}, {name!r}{'' if not safe else ', False'})")
            return
        if safe or not idx:
            self.emit(f"{info.arr}[{self.subscript(info, idx)}] = {val}")
            return
        temps = [self.tmp() for _ in idx]
        for t, i in zip(temps, idx):
            self.emit(f"{t} = {i}")
        conds = " and ".join(f"0 <= {t} < {n}" for t, n in zip(temps, info.dims))
        self.emit(f"if not ({conds}): _oob({name!r}, ({', '.join(info.dims)},), "
                  f"lambda: ({', '.join(temps)},))")
        self.emit(f"{info.arr}[{', '.join(temps)},] = {val}")

    def visit_IfThenElse(self, s, m):
        c = self.expr(s.condition, m)
        if not self.axes:
            self.emit(f"if {c}:")
            self.block(lambda: self.visit(s.then_case, m))
            if s.else_case is not None:
                self.emit("else:")
                self.block(lambda: self.visit(s.else_case, m))
            return
        cn = self.tmp("_c")
        self.emit(f"{cn} = {c}")
        self.masked(f"_mand({m}, {cn})", lambda mt: self.visit(s.then_case, mt))
        if s.else_case is not None:
            self.masked(f"_mand({m}, ~{cn})", lambda mf: self.visit(s.else_case, mf))

    def masked(self, mask_src: str, body):
        mn = self.tmp("_m")
        self.emit(f"{mn} = {mask_src}")
        self.emit(f"if {mn} is not _OFF:")
        self.block(lambda: body(mn))

    def visit_LetStmt(self, s, m):
        val = self.expr(s.value, m)
        old_name = self.names.get(s.var)
        old_def = self.defs.get(s.var)
        name = self.bind_var(s.var)
        self.emit(f"{name} = {val}")
        self.defs[s.var] = self.norm(s.value)
        self.visit(s.body, m)
        self.restore(s.var, old_name, old_def)

    def restore(self, var, old_name, old_def):
        if old_name is None:
            self.names.pop(var, None)
        else:
            self.names[var] = old_name
        if old_def is None:
            self.defs.pop(var, None)
        else:
            self.defs[var] = old_def

    def visit_AssertStmt(self, s, m):
        c = self.expr(s.condition, m)
        if self.axes:
            self.emit(f"_vassert({c}, {m}, {s.message!r})")
        else:
            self.emit(f"if not ({c}): raise RuntimeError({s.message!r})")
        self.visit(s.body, m)

    def visit_Allocate(self, s, m):
        old = self.declare_buffer(s.buffer)
        self.visit(s.body, m)
        self.undeclare(s.buffer, old)

    def undeclare(self, b, old):
        if old is None:
            self.bufs.pop(b, None)
        else:
            self.bufs[b] = old

    def visit_Block(self, s, m):
        self.s_BlockRealize(BlockRealize([], None, s), m)

    def visit_BlockRealize(self, s, m):
        blk = s.block
        saved = []
        normed = [self.norm(v) for v in s.iter_values]
        for iv, val in zip(blk.iter_vars, s.iter_values):
            src = self.expr(val, m)
            if val.dtype != iv.var.dtype:
                src = f"({src}).astype({self.dtype_name(iv.var.dtype)})"
            saved.append((iv.var, self.names.get(iv.var), self.defs.get(iv.var)))
            name = self.bind_var(iv.var)
            self.emit(f"{name} = {src}")
        for iv, val in zip(blk.iter_vars, normed):
            self.defs[iv.var] = val

        def inner(m2):
            olds = [(b, self.declare_buffer(b)) for b in blk.alloc_buffers]
            if blk.init is not None:
                conds = [f"({self.var(iv.var)} == {self.expr(iv.dom.min, m2)})"
                         for iv in blk.iter_vars if iv.kind == "reduce"]
                if not conds:
                    self.visit(blk.init, m2)
                elif not self.axes:
                    self.emit(f"if {' and '.join(conds)}:")
                    self.block(lambda: self.visit(blk.init, m2))
                else:
                    self.masked(f"_mand({m2}, {' & '.join(conds)})",
                                lambda mi: self.visit(blk.init, mi))
            self.visit(blk.body, m2)
            for b, old in reversed(olds):
                self.undeclare(b, old)

        if is_true(s.predicate):
            inner(m)
        elif not self.axes:
            self.emit(f"if {self.expr(s.predicate, m)}:")
            self.block(lambda: inner(m))
        else:
            self.masked(f"_mand({m}, {self.expr(s.predicate, m)})", inner)
        for var, old_name, old_def in reversed(saved):
            self.restore(var, old_name, old_def)

    def visit_For(self, s, m):
        decision = self.plan(s)
        old_name = self.names.get(s.loop_var)
        old_range = self.ranges.pop(s.loop_var, None)
        lo_b = _bound(self.norm(s.min), self.ranges, self.consts)
        ext_b = _bound(self.norm(s.extent), self.ranges, self.consts)
        if lo_b is not None and ext_b is not None:
            self.ranges[s.loop_var] = (lo_b[0], lo_b[1] + max(ext_b[1], 1) - 1)
        lo = self.expr(s.min, m)
        ext = self.expr(s.extent, m)
        if decision is None:
            name = self.bind_var(s.loop_var)
            self.emit(f"for {name} in _arange({lo}, {ext}, {self.dtype_name(s.loop_var.dtype)}):")
            self.loop_nest += 1
            self.block(lambda: self.visit(s.body, m))
            self.loop_nest -= 1
        else:
            self.vector_loop(s, m, lo, ext, decision)
        self.restore(s.loop_var, old_name, self.defs.get(s.loop_var))
        self.ranges.pop(s.loop_var, None)
        if old_range is not None:
            self.ranges[s.loop_var] = old_range

    def vector_loop(self, s, m, lo, ext, decision):
        """The loop as chunks of at most _CAP lanes; inside a chunk its variable is an index
        array along axis ``k``."""
        kind, clo, cext = decision[:3]
        top = not self.axes
        if top:
            self.region = [self.tmp("_ND"), 0]
        k = len(self.axes)
        box_prev = self.axes[-1].box if self.axes else "1"
        lo_n, ext_n, ch, c = self.tmp("_lo"), self.tmp("_n"), self.tmp("_ch"), self.tmp("_c")
        self.emit(f"{lo_n} = {lo}")
        self.emit(f"{ext_n} = int({ext})")
        self.emit(f"{ch} = max(1, _CAP // {box_prev})")
        self.emit(f"for {c} in range(0, {ext_n}, {ch}):")
        nd = self.region[0]
        self.region[1] = max(self.region[1], k + 1)

        def chunk():
            e, ax, box = self.tmp("_e"), self.tmp("_ax"), self.tmp("_box")
            self.emit(f"{e} = min({ch}, {ext_n} - {c})")
            self.emit(f"{ax} = np.arange({e}).reshape(_axshape({nd}, {k}, {e}))")
            name = self.bind_var(s.loop_var)
            self.emit(f"{name} = ({ax} + ({lo_n} + {c})).astype("
                      f"{self.dtype_name(s.loop_var.dtype)}, copy=False)")
            self.emit(f"{box} = {box_prev} * {e}")
            self.axes.append(_Axis(s.loop_var, clo, cext, e, ax, box))
            if kind == "vector":
                self.visit(s.body, m)
            else:
                self.reduce_body(decision[3], m, k, ax)
            self.axes.pop()

        self.loop_nest += 1
        self.block(chunk)
        self.loop_nest -= 1
        if top:
            self.ns[self.region[0]] = self.region[1]
            self.region = None

    def reduce_body(self, pat: _ReducePattern, m, k, ax):
        br = pat.realize
        saved = []
        if br is not None:
            normed = [self.norm(v) for v in br.iter_values]
            for iv, val, nv in zip(br.block.iter_vars, br.iter_values, normed):
                src = self.expr(val, m)
                if val.dtype != iv.var.dtype:
                    src = f"({src}).astype({self.dtype_name(iv.var.dtype)})"
                saved.append((iv.var, self.names.get(iv.var), self.defs.get(iv.var)))
                self.emit(f"{self.bind_var(iv.var)} = {src}")
                self.defs[iv.var] = nv

        def body(mp):
            store = pat.store
            info = self.buf(store.buffer)
            ic = iv = "None"
            if pat.init is not None:
                conds = [f"({self.var(v.var)} == {self.expr(v.dom.min, mp)})"
                         for v in br.block.iter_vars if v.kind == "reduce"]
                ic = " & ".join(conds) if conds else "np.True_"
                iv = self.expr(pat.init.value, mp)
            f = self.expr(pat.value, mp)
            idx = "".join(self.expr(i, mp) + ", " for i in store.indices)
            self.emit(f"_rreduce({info.arr}, {info.pre}, ({idx}), {pat.op!r}, {f}, {mp}, {k}, "
                      f"{ic}, {iv}, {ax}, {store.buffer.name!r})")

        if br is None or is_true(br.predicate):
            body(m)
        else:
            self.masked(f"_mand({m}, {self.expr(br.predicate, m)})", body)
        for var, old_name, old_def in reversed(saved):
            self.restore(var, old_name, old_def)

    # ---- planning: which loops run as numpy vectors
    def plan(self, loop: For):
        if not self.vectorize:
            return None
        lo = _ieval(self.norm(loop.min), self.consts)
        ext = _ieval(self.norm(loop.extent), self.consts)
        if ext is not None and ext <= 1:
            return None
        vinfo = [(a.var, a.lo, a.ext) for a in self.axes]
        box = math.prod(a.ext for a in self.axes) if self.axes else 1
        if ext is not None:
            info = _collect(loop.body, dict(self.defs), self.consts)
            if self.independent(info, vinfo + [(loop.loop_var, lo, ext)]):
                return ("vector", lo, ext)
        if box < _REDUCE_BOX:
            pat = self.reduce_pattern(loop)
            if pat is not None:
                return ("reduce", lo, ext if ext is not None else 1, pat)
        return None

    def independent(self, info: _BodyInfo, vinfo) -> bool:
        if info.opaque:
            return False
        vset = {v for v, _, _ in vinfo}
        for b in info.bounds:
            if _has_load(b) or any(v in vset for v in free_vars(b)):
                return False
        written = {}
        for buf, _, w in info.accesses:
            if w and buf not in info.private:
                written[buf] = None
        for buf in written:
            if buf.strides is not None and not _non_overlapping(buf, self.consts):
                return False
            accs = [idx for b, idx, _ in info.accesses if b is buf]
            # a buffer allocated inside outer vector loops has one copy per lane of those
            # loops: only the lanes of the loops inside its allocation can collide
            npre = self.bufs[buf].npre if buf in self.bufs else 0
            if not _separable(accs, vinfo[npre:], info.inner, self.consts):
                return False
        return True

    def reduce_pattern(self, loop: For):
        body, k = loop.body, loop.loop_var
        realize, init = None, None
        defs = dict(self.defs)
        if isinstance(body, BlockRealize):
            realize, blk = body, body.block
            if blk.alloc_buffers or not isinstance(blk.body, BufferStore):
                return None
            if blk.init is not None and not isinstance(blk.init, BufferStore):
                return None
            store, init = blk.body, blk.init
            for iv, val in zip(blk.iter_vars, body.iter_values):
                if _has_load(val):
                    return None
                defs[iv.var] = _normalize(val, self.defs)
        elif isinstance(body, BufferStore):
            store = body
        else:
            return None
        op = _REDUCE_OPS.get(type(store.value))
        if op is None:
            return None
        B = store.buffer
        idx = [_normalize(i, defs) for i in store.indices]
        if any(_has_load(i) or k in set(free_vars(i)) for i in idx):
            return None

        def is_self(x):
            return isinstance(x, BufferLoad) and x.buffer is B and all(
                structural_equal(_normalize(a, defs), b) for a, b in zip(x.indices, idx))

        if is_self(store.value.a):
            f = store.value.b
        elif is_self(store.value.b):
            f = store.value.a
        else:
            return None
        if _has_load(f, B):
            return None
        if realize is not None and _has_load(realize.predicate, B):
            return None
        if init is not None:
            if init.buffer is not B or _has_load(init.value, B):
                return None
            if not all(structural_equal(_normalize(a, defs), b)
                       for a, b in zip(init.indices, idx)):
                return None
            if k in set(free_vars(_normalize(init.value, defs))):
                return None
        return _ReducePattern(realize, store, op, f, init)

    # ---- expressions
    def expr(self, e, m: str) -> str:
        self.edepth += 1
        depth = self.edepth
        try:
            src = self.visit(e, m)
        finally:
            self.edepth -= 1
        if depth > 1 and depth % 16 == 0 and not self.lazy \
                and not isinstance(e, (Var, IntImm, FloatImm)):
            # keep generated expressions shallow (CPython limits nesting): hoist eager parts
            t = self.tmp("_h")
            self.emit(f"{t} = {src}")
            return t
        return src

    def lazy_lambda(self, e) -> str:
        mn = self.tmp("_m")
        self.lazy += 1
        try:
            return f"(lambda {mn}: {self.expr(e, mn)})"
        finally:
            self.lazy -= 1

    # ---- expressions
    def visit_Var(self, e, m):
        return self.var(e)

    def visit_IntImm(self, e, m):
        return self.const(e.value, e.dtype)

    visit_FloatImm = visit_IntImm

    def visit_StringImm(self, e, m):
        return repr(e.value)

    def _binary(self, e, m):
        op = _ARITH.get(type(e)) or _CMP[type(e)]
        return f"({self.expr(e.a, m)} {op} {self.expr(e.b, m)})"

    visit_Add = visit_Sub = visit_Mul = _binary
    visit_EQ = visit_NE = visit_LT = visit_LE = visit_GT = visit_GE = _binary

    def visit_FloorDiv(self, e, m):
        return self.division(e, m)

    visit_FloorMod = visit_Div = visit_Mod = visit_FloorDiv

    def visit_Min(self, e, m):
        fn = "np.minimum" if type(e) is Min else "np.maximum"
        return f"{fn}({self.expr(e.a, m)}, {self.expr(e.b, m)})"

    visit_Max = visit_Min

    def visit_And(self, e, m):
        t = type(e)
        a = self.expr(e.a, m)
        if not self.axes:
            self.lazy += 1
            try:
                b = self.expr(e.b, m)
            finally:
                self.lazy -= 1
            return f"({a} {'and' if t is And else 'or'} {b})"
        if _may_fault(e.b):
            return f"{'_vand' if t is And else '_vor'}({a}, {m}, {self.lazy_lambda(e.b)})"
        return f"({a} {'&' if t is And else '|'} {self.expr(e.b, m)})"

    visit_Or = visit_And

    def visit_Not(self, e, m):
        return f"(~{self.expr(e.a, m)})"

    def visit_Select(self, e, m):
        fn = "_vsel" if self.axes else "_sel"
        return (f"{fn}({self.expr(e.condition, m)}, {self.expr(e.true_value, m)}, "
                f"{self.expr(e.false_value, m)})")

    def visit_Cast(self, e, m):
        return f"({self.expr(e.value, m)}).astype({self.dtype_name(e.dtype)})"

    def visit_Call(self, e, m):
        return self.call(e, m)

    def visit_BufferLoad(self, e, m):
        return self.load(e, m)

    def visit_Let(self, e, m):
        val = self.expr(e.value, m)
        old_name = self.names.get(e.var)
        name = self.bind_var(e.var)
        self.lazy += 1  # the body reads a walrus-bound name: never hoist out of it
        try:
            body = self.expr(e.body, m)
        finally:
            self.lazy -= 1
        self.restore(e.var, old_name, self.defs.get(e.var))
        return f"(({name} := {val}), {body})[1]"

    def visit_Reduce(self, e, m):
        raise TIRError("interpret: a Reduce node can only appear inside te.compute; make a "
                       "PrimFunc with te.create_prim_func first", e)

    def division(self, e, m):
        t = type(e)
        a, b = self.expr(e.a, m), self.expr(e.b, m)
        if dt.is_float(e.dtype):
            fn = {Div: None, Mod: "np.fmod", FloorDiv: "np.floor_divide", FloorMod: "np.mod"}[t]
            return f"({a} / {b})" if fn is None else f"{fn}({a}, {b})"
        c = e.b.value if isinstance(e.b, IntImm) else 0
        if c > 0:
            if t is FloorDiv:
                return f"({a} // {b})"
            if t is FloorMod:
                return f"({a} % {b})"
            if t is Mod:
                return f"np.fmod({a}, {b})"
            return f"_truncdiv_c({a}, {b})"
        fn = {Div: "_truncdiv", Mod: "_truncmod", FloorDiv: "_floordiv",
              FloorMod: "_floormod"}[t]
        return f"{fn}({a}, {b}, {m})"

    def call(self, e: Call, m):
        if e.op == "if_then_else":
            c = self.expr(e.args[0], m)
            if not self.axes:
                self.lazy += 1
                try:
                    tv, fv = self.expr(e.args[1], m), self.expr(e.args[2], m)
                finally:
                    self.lazy -= 1
                return f"({tv} if {c} else {fv})"
            return f"_vite({c}, {m}, {self.lazy_lambda(e.args[1])}, {self.lazy_lambda(e.args[2])})"
        fn = _INTRINSICS.get(e.op)
        if fn is None:
            raise TIRError(f"interpret: unknown intrinsic {e.op!r}; known: "
                           f"{sorted(_INTRINSICS) + ['if_then_else']}", e)
        args = ", ".join(self.expr(a, m) for a in e.args)
        src = f"{fn}({args})"
        if e.args and e.dtype != e.args[0].dtype:
            src = f"({src}).astype({self.dtype_name(e.dtype)})"
        return src

    def subscript(self, info, idx) -> str:
        parts = [a.ax for a in self.axes[:info.npre]] + idx
        return ", ".join(parts) + "," if parts else "()"

    def load(self, e: BufferLoad, m):
        info = self.buf(e.buffer)
        idx = [self.expr(i, m) for i in e.indices]
        name = e.buffer.name
        if self.in_bounds(e.buffer, e.indices):
            return f"{info.arr}[{self.subscript(info, idx)}]"
        if self.axes:
            args = "".join(i + ", " for i in idx)
            return f"_vld({info.arr}, {info.pre}, ({args}), {m}, {name!r})"
        if not idx:
            return f"{info.arr}[()]"
        temps = [self.tmp() for _ in idx]
        conds = " and ".join(f"(0 <= ({t} := {i}) < {n})" for t, i, n in zip(temps, idx, info.dims))
        return (f"({info.arr}[{', '.join(temps)},] if {conds} else _oob({name!r}, "
                f"({', '.join(info.dims)},), lambda: ({', '.join(idx)},)))")


# =============================================================================================
# kernel cache

_KERNELS: "OrderedDict[tuple, tuple]" = OrderedDict()


def _get_kernel(func: PrimFunc, call: _Call, vectorize: bool):
    key = (id(func), call.key, vectorize)
    hit = _KERNELS.get(key)
    if hit is not None and hit[0] is func:
        _KERNELS.move_to_end(key)
        return hit[1]
    consts = {v: k for v, k in zip(call.ext_vars, call.key) if k is not None}
    with np.errstate(all="ignore"):  # constants such as float16(1e5) overflow as they should
        kernel = _Compiler(func, call.ext_vars, consts, vectorize).compile()
    _KERNELS[key] = (func, kernel)  # holding func keeps its id from being reused
    while len(_KERNELS) > _CACHE_SIZE:
        _KERNELS.popitem(last=False)
    return kernel


def _kernel_source(func, *arrays, func_name=None, **var_values) -> str:
    """The generated Python source for a call (debugging aid)."""
    vectorize = bool(var_values.pop("_vectorize", True))
    func = _resolve_function(func, func_name)
    call = _bind_arguments(func, arrays, var_values)
    return _get_kernel(func, call, vectorize and not call.aliased).source
