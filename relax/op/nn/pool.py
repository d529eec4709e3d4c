"""Pooling: ``max_pool{1,2,3}d``, ``avg_pool{1,2,3}d``, ``adaptive_{avg,max}_pool{1,2,3}d`` and
the ``global_{avg,max}_pool{1,2,3}d`` aliases (adaptive pooling to a 1 x 1 output).

Attributes follow TVM / PyTorch: ``pool_size``, ``strides`` (default 1), ``padding`` (int, one
per spatial dim, or begins-then-ends), ``dilation``, ``ceil_mode`` (PyTorch's rule: the last
window must start inside the data or the begin padding), ``count_include_pad`` for averages
(the divisor counts the padding inside ``[-pad_begin, size + pad_end)``, as PyTorch), ``layout``
``NCHW`` / ``NHWC`` (any permutation of the letters).

Examples
--------
>>> from tilecraft.relax import Var, TensorStructInfo
>>> from tilecraft.relax.op.nn import max_pool2d, adaptive_avg_pool2d
>>> x = Var("x", TensorStructInfo(("n", 64, 112, 112), "float32"))
>>> max_pool2d(x, pool_size=3, strides=2, padding=1).struct_info
Tensor((n, 64, 56, 56), 'float32')
>>> adaptive_avg_pool2d(x, 1).struct_info
Tensor((n, 64, 1, 1), 'float32')
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir import te
from tilecraft.tensorir.arith import Analyzer
from tilecraft.tensorir.expr import IntImm, PrimExpr, floordiv, max_, min_, min_value

from ...expr import Expr, RelaxError
from ...struct_info import TensorStructInfo
from ..base import OpPattern, as_expr, call, register_op
from ..helpers import fmt_dim, out_name
from .conv import (DIM_NAMES, SPATIAL, check_layout, check_positive, int_tuple, pad_stage,
                   pad_tuple, simplify, tensor_shape)

__all__ = [f"{kind}_pool{n}d" for kind in ("max", "avg", "adaptive_avg", "adaptive_max",
                                           "global_avg", "global_max") for n in (1, 2, 3)]


# ---------------------------------------------------------------------------------------------
# max / avg pooling


def _pool_attrs(op: str, n: int, attrs: dict, avg: bool) -> dict:
    a = dict(attrs)
    a["pool_size"] = int_tuple(op, "pool_size", a.get("pool_size", 1), n, 1)
    a["strides"] = int_tuple(op, "strides", a.get("strides", 1), n, 1)
    a["padding"] = pad_tuple(op, a.get("padding", 0), n)
    a["dilation"] = int_tuple(op, "dilation", a.get("dilation", 1), n, 1)
    a["ceil_mode"] = bool(a.get("ceil_mode", False))
    if avg:
        a["count_include_pad"] = bool(a.get("count_include_pad", False))
    a["layout"] = check_layout(op, a.get("layout", "NC" + SPATIAL[n]), n, "NC", "layout")
    a["out_layout"] = check_layout(op, a.get("out_layout") or a["layout"], n, "NC",
                                   "out_layout")
    return a


def _pool_out_dim(H, k, s, d, pb, pe, ceil_mode) -> PrimExpr:
    num = H + (pb + pe - d * (k - 1) - 1)
    if not ceil_mode or s == 1:
        return simplify(floordiv(num, s) + 1)
    # PyTorch / ONNX: round up, but the last window must start inside the data or the begin
    # padding: out <= (H + pb - 1) // s + 1
    up = simplify(floordiv(num + (s - 1), s) + 1)
    last = simplify(floordiv(H + (pb - 1), s) + 1)
    ana = Analyzer()
    if ana.can_prove(up <= last):
        return up
    if ana.can_prove(last <= up):
        return last
    return simplify(min_(up, last))


def _pool_shape(op: str, n: int, shape, a: dict) -> tuple[PrimExpr, ...]:
    sp, lay = SPATIAL[n], a["layout"]
    dims = {"N": shape[lay.index("N")], "C": shape[lay.index("C")]}
    for i, c in enumerate(sp):
        H = shape[lay.index(c)]
        k, s, d = a["pool_size"][i], a["strides"][i], a["dilation"][i]
        pb, pe = a["padding"][i], a["padding"][i + n]
        o = _pool_out_dim(H, k, s, d, pb, pe, a["ceil_mode"])
        dims[c] = check_positive(op, o, DIM_NAMES[c],
                                 f" (input {DIM_NAMES[c]} {fmt_dim(H)} with padding {pb}+{pe} "
                                 f"is smaller than the dilated window {d * (k - 1) + 1})")
    return tuple(dims[c] for c in a["out_layout"])


def _acc_dtype(dtype: str) -> str:
    """Averages of float16 accumulate in float32 (a window sum overflows float16 easily)."""
    return "float32" if dtype == "float16" else dtype


def _window_count(y, k, s, d, pb, lo, hi) -> PrimExpr:
    """How many of the window taps ``y * s - pb + j * d`` (j < k) lie in ``[lo, hi)``."""
    start = y * s - pb
    if d == 1:
        cnt = min_(start + k, hi) - max_(start, lo)
    else:
        jmin = max_(floordiv(lo - start + (d - 1), d), 0)
        jmax = min_(floordiv(hi - 1 - start, d), k - 1)
        cnt = jmax - jmin + 1
    return max_(cnt, 1)  # a window entirely in the padding divides by 1 (its sum is 0)


def _te_pool(data, *, n, kind, pool_size, strides, padding, dilation, ceil_mode, layout,
             out_layout, count_include_pad=False, name="pool"):
    sp = SPATIAL[n]
    a = dict(pool_size=pool_size, strides=strides, padding=padding, dilation=dilation,
             ceil_mode=ceil_mode, layout=layout, out_layout=out_layout)
    out_shape = _pool_shape(name, n, data.shape, a)
    H = [data.shape[layout.index(c)] for c in sp]
    out_sp = [out_shape[out_layout.index(c)] for c in sp]
    # pad to exactly the extent the windows read (ceil mode may read past the end padding)
    extents = [simplify((o - 1) * s + (d * (k - 1) + 1))
               for o, s, d, k in zip(out_sp, strides, dilation, pool_size)]
    pad_value = min_value(data.dtype) if kind == "max" else 0
    P = pad_stage(data, layout, sp, padding[:n], extents, pad_value)
    rk = [te.reduce_axis((0, k), "r" + c.lower()) for c, k in zip(sp, pool_size)]

    def index(idx):
        src = [None] * (n + 2)
        src[layout.index("N")] = idx[out_layout.index("N")]
        src[layout.index("C")] = idx[out_layout.index("C")]
        for i, c in enumerate(sp):
            y = idx[out_layout.index(c)]
            y = y * strides[i] if strides[i] != 1 else y
            r = rk[i].var * dilation[i] if dilation[i] != 1 else rk[i].var
            src[layout.index(c)] = y + r
        return tuple(src)

    tag = out_name(name.split(".")[-1], data)
    if kind == "max":
        return te.compute(out_shape, lambda *idx: te.max(P[index(idx)], axis=rk), tag)
    acc = _acc_dtype(data.dtype)
    S = te.compute(out_shape, lambda *idx: te.sum(P[index(idx)].astype(acc), axis=rk),
                   out_name(tag + "_sum", data))
    constant = not ceil_mode and (count_include_pad or not any(padding))
    if constant:
        div = int(np.prod(pool_size))

    def favg(*idx):
        if constant:
            cnt = te.const(div, acc)
        else:
            cnt = None
            for i, c in enumerate(sp):
                pb, pe = padding[i], padding[i + n]
                lo, hi = (-pb, H[i] + pe) if count_include_pad else (0, H[i])
                ci = _window_count(idx[out_layout.index(c)], pool_size[i], strides[i],
                                   dilation[i], pb, lo, hi)
                cnt = ci if cnt is None else cnt * ci
            cnt = cnt.astype(acc)
        return (S[idx] / cnt).astype(data.dtype)

    return te.compute(out_shape, favg, tag)


def _make_pool(n: int, kind: str):
    op = f"relax.nn.{kind}_pool{n}d"
    avg = kind == "avg"

    def infer(call_):
        a = _pool_attrs(op, n, call_.attr_dict, avg)
        si = tensor_shape(op, call_.args[0], "data", n + 2)
        if si.shape is None:
            return TensorStructInfo(None, si.dtype, n + 2)
        return TensorStructInfo(_pool_shape(op, n, si.shape, a), si.dtype)

    def legalize(bb, call_):
        a = _pool_attrs(op, n, call_.attr_dict, avg)
        return bb.call_te(_te_pool, call_.args[0], n=n, kind=kind, name=op,
                          primfunc_name_hint=op.split(".")[-1], **a)

    register_op(op, infer, legalize, OpPattern.OUT_EWISE_FUSABLE,
                doc=f"{n}-D {kind} pooling.")

    def builder(data, pool_size=1, strides=1, padding=0, dilation=1, ceil_mode: bool = False,
                count_include_pad: bool = False, layout: str = "NC" + SPATIAL[n],
                out_layout: str | None = None) -> Expr:
        attrs = dict(pool_size=pool_size, strides=strides, padding=padding, dilation=dilation,
                     ceil_mode=ceil_mode, layout=layout, out_layout=out_layout)
        if avg:
            attrs["count_include_pad"] = count_include_pad
        elif count_include_pad:
            raise RelaxError(f"{op}: count_include_pad is only for average pooling")
        return call(op, [as_expr(data)], _pool_attrs(op, n, attrs, avg))

    builder.__name__ = builder.__qualname__ = f"{kind}_pool{n}d"
    return builder


max_pool1d = _make_pool(1, "max")
max_pool2d = _make_pool(2, "max")
max_pool3d = _make_pool(3, "max")
avg_pool1d = _make_pool(1, "avg")
avg_pool2d = _make_pool(2, "avg")
avg_pool3d = _make_pool(3, "avg")

max_pool2d.__doc__ = """2-D max pooling.

    Parameters
    ----------
    data : Expr
        ``(N, C, H, W)`` in ``layout`` (``NCHW`` or ``NHWC``).
    pool_size, strides, dilation : int or (int, int)
        Window, step (default 1, as TVM; PyTorch's default stride is the window) and dilation.
    padding : int, (pad_h, pad_w) or (top, left, bottom, right)
        Padded elements never win (they are the dtype's lowest value).
    ceil_mode : bool
        Round the output size up (PyTorch's rule for the last window).
    layout, out_layout : str

    Examples
    --------
    >>> from tilecraft.relax import Var, TensorStructInfo
    >>> x = Var("x", TensorStructInfo(("n", 3, 7, 7), "float32"))
    >>> max_pool2d(x, 2, 2, ceil_mode=True).struct_info
    Tensor((n, 3, 4, 4), 'float32')
    """
avg_pool2d.__doc__ = """2-D average pooling; arguments as ``max_pool2d`` plus ``count_include_pad``
    (divide by the whole window including padding, else only by the data elements in it).

    Examples
    --------
    >>> from tilecraft.relax import Var, TensorStructInfo
    >>> x = Var("x", TensorStructInfo((1, 3, 8, 8), "float32"))
    >>> avg_pool2d(x, 3, 2, padding=1, count_include_pad=True).struct_info
    Tensor((1, 3, 4, 4), 'float32')
    """
for _f in (max_pool1d, max_pool3d, avg_pool1d, avg_pool3d):
    _f.__doc__ = (f"{_f.__name__[-2]}-D {'max' if 'max' in _f.__name__ else 'average'} pooling; "
                  f"see ``{_f.__name__[:-2]}2d``.")


# ---------------------------------------------------------------------------------------------
# adaptive pooling


def _adaptive_attrs(op: str, n: int, attrs: dict) -> dict:
    a = dict(attrs)
    size = a.get("output_size")
    if size is None:
        size = (None,) * n
    elif isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        size = (int(size),) * n
    else:
        size = tuple(size)
        if len(size) == 1 and n > 1:
            size = size * n
    if len(size) != n or not all(s is None or (isinstance(s, (int, np.integer)) and
                                               not isinstance(s, bool) and s >= 1) for s in size):
        raise RelaxError(f"{op}: output_size must be a positive int or {n} of them (None keeps "
                         f"the input size), got {a.get('output_size')!r}")
    a["output_size"] = tuple(None if s is None else int(s) for s in size)
    a["layout"] = check_layout(op, a.get("layout", "NC" + SPATIAL[n]), n, "NC", "layout")
    a["out_layout"] = check_layout(op, a.get("out_layout") or a["layout"], n, "NC",
                                   "out_layout")
    return a


def _adaptive_shape(n: int, shape, a: dict) -> tuple[PrimExpr, ...]:
    lay = a["layout"]
    dims = {"N": shape[lay.index("N")], "C": shape[lay.index("C")]}
    for c, o in zip(SPATIAL[n], a["output_size"]):
        dims[c] = shape[lay.index(c)] if o is None else IntImm(o, "int64")
    return tuple(dims[c] for c in a["out_layout"])


def _te_adaptive(data, *, n, kind, output_size, layout, out_layout, name):
    sp = SPATIAL[n]
    out_shape = _adaptive_shape(n, data.shape, dict(output_size=output_size, layout=layout,
                                                    out_layout=out_layout))
    ana = Analyzer()
    plans = []  # per spatial dim: (H, OH, window extent, "identity" | "even" | "general")
    for c in sp:
        H = data.shape[layout.index(c)]
        OH = out_shape[out_layout.index(c)]
        if ana.can_prove_equal(H, OH):
            plans.append((H, OH, IntImm(1, "int64"), "identity"))
        elif isinstance(H, IntImm) and isinstance(OH, IntImm) and H.value % OH.value == 0:
            plans.append((H, OH, IntImm(H.value // OH.value, "int64"), "even"))
        elif isinstance(H, IntImm) and isinstance(OH, IntImm):
            h, oh = H.value, OH.value
            kmax = max(-(-(i + 1) * h // oh) - (i * h // oh) for i in range(oh))
            plans.append((H, OH, IntImm(kmax, "int64"), "general"))
        else:
            plans.append((H, OH, simplify(floordiv(H + (OH - 1), OH) + 1), "general"))
    rk = [te.reduce_axis((0, k), "r" + c.lower()) for c, (_, _, k, _) in zip(sp, plans)]

    def window(idx):
        """(source indices, guard conditions, window size) of output ``idx``."""
        src = [None] * (n + 2)
        src[layout.index("N")] = idx[out_layout.index("N")]
        src[layout.index("C")] = idx[out_layout.index("C")]
        conds, size = [], None
        for i, c in enumerate(sp):
            H, OH, k, plan = plans[i]
            y, r = idx[out_layout.index(c)], rk[i].var
            if plan == "identity":
                src[layout.index(c)], cnt = y + r, None
            elif plan == "even":
                src[layout.index(c)], cnt = y * k + r, None
            else:
                start = floordiv(y * H, OH)
                end = floordiv((y + 1) * H + (OH - 1), OH)
                src[layout.index(c)] = start + r
                # the second condition is implied by the first; it lets the bounds verifier
                # see the load is in range without reasoning about floordiv
                conds += [r < end - start, start + r < H]
                cnt = end - start
            if cnt is not None:
                size = cnt if size is None else size * cnt
        return tuple(src), conds, size

    tag = out_name(name.split(".")[-1], data)
    if kind == "max":
        def fmax(*idx):
            src, conds, _ = window(idx)
            v = data[src]
            if conds:
                v = te.if_then_else(te.all(*conds), v, min_value(data.dtype))
            return te.max(v, axis=rk)
        return te.compute(out_shape, fmax, tag)

    def fsum(*idx):
        src, conds, _ = window(idx)
        v = data[src].astype(acc)
        if conds:
            v = te.if_then_else(te.all(*conds), v, te.const(0, acc))
        return te.sum(v, axis=rk)

    acc = _acc_dtype(data.dtype)
    S = te.compute(out_shape, fsum, out_name(tag + "_sum", data))

    def favg(*idx):
        _, _, size = window(idx)
        full = 1
        for (_, _, k, plan) in plans:
            if plan == "even":
                full *= k.value
        if size is None:
            cnt = te.const(full, acc)
        else:
            cnt = (size * full if full != 1 else size).astype(acc)
        return (S[idx] / cnt).astype(data.dtype)

    return te.compute(out_shape, favg, tag)


def _make_adaptive(n: int, kind: str):
    op = f"relax.nn.adaptive_{kind}_pool{n}d"

    def infer(call_):
        a = _adaptive_attrs(op, n, call_.attr_dict)
        si = tensor_shape(op, call_.args[0], "data", n + 2)
        if si.shape is None:
            return TensorStructInfo(None, si.dtype, n + 2)
        return TensorStructInfo(_adaptive_shape(n, si.shape, a), si.dtype)

    def legalize(bb, call_):
        a = _adaptive_attrs(op, n, call_.attr_dict)
        return bb.call_te(_te_adaptive, call_.args[0], n=n, kind=kind, name=op,
                          primfunc_name_hint=op.split(".")[-1], **a)

    register_op(op, infer, legalize, OpPattern.OUT_EWISE_FUSABLE,
                doc=f"{n}-D adaptive {kind} pooling.")

    def builder(data, output_size=None, layout: str = "NC" + SPATIAL[n],
                out_layout: str | None = None) -> Expr:
        attrs = _adaptive_attrs(op, n, dict(output_size=output_size, layout=layout,
                                            out_layout=out_layout))
        return call(op, [as_expr(data)], attrs)

    builder.__name__ = builder.__qualname__ = f"adaptive_{kind}_pool{n}d"
    builder.__doc__ = (
        f"{n}-D adaptive {'average' if kind == 'avg' else 'max'} pooling to ``output_size`` "
        f"(an int, {n} ints, None entries keep the input size), as PyTorch: output ``i`` pools "
        f"the input ``[floor(i * H / OH), ceil((i + 1) * H / OH))``.\n\n"
        f"    Examples\n    --------\n"
        f"    >>> from relax import Var, TensorStructInfo\n"
        f"    >>> x = Var(\"x\", TensorStructInfo((\"n\", 8{', 10' * n}), \"float32\"))\n"
        f"    >>> adaptive_{kind}_pool{n}d(x, 3).struct_info\n"
        f"    Tensor((n, 8{', 3' * n}), 'float32')\n")
    return builder


adaptive_avg_pool1d = _make_adaptive(1, "avg")
adaptive_avg_pool2d = _make_adaptive(2, "avg")
adaptive_avg_pool3d = _make_adaptive(3, "avg")
adaptive_max_pool1d = _make_adaptive(1, "max")
adaptive_max_pool2d = _make_adaptive(2, "max")
adaptive_max_pool3d = _make_adaptive(3, "max")


def _make_global(n: int, kind: str, adaptive):
    def builder(data, layout: str = "NC" + SPATIAL[n], out_layout: str | None = None) -> Expr:
        return adaptive(data, 1, layout=layout, out_layout=out_layout)

    builder.__name__ = builder.__qualname__ = f"global_{kind}_pool{n}d"
    builder.__doc__ = (f"Global {'average' if kind == 'avg' else 'max'} pooling (ONNX "
                       f"Global{'Average' if kind == 'avg' else 'Max'}Pool): "
                       f"``adaptive_{kind}_pool{n}d(data, 1)``, keeping the spatial dims as 1.")
    return builder


global_avg_pool1d = _make_global(1, "avg", adaptive_avg_pool1d)
global_avg_pool2d = _make_global(2, "avg", adaptive_avg_pool2d)
global_avg_pool3d = _make_global(3, "avg", adaptive_avg_pool3d)
global_max_pool1d = _make_global(1, "max", adaptive_max_pool1d)
global_max_pool2d = _make_global(2, "max", adaptive_max_pool2d)
global_max_pool3d = _make_global(3, "max", adaptive_max_pool3d)
