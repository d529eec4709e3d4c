"""Helpers shared by the converter families (the kernels they emit themselves are in
``emit.py``)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import FloatImm, IntImm, PrimExpr

from .... import op as _op
from ....expr import Expr, const
from ..known import as_int
from ..registry import ConversionError


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise ConversionError(f"{what} {axis} is out of range for a tensor of rank {rank}")
    return axis + rank if axis < 0 else axis


def norm_axes(axes: Sequence[int], rank: int, what: str = "axes") -> list[int]:
    out = [norm_axis(int(a), rank, what) for a in axes]
    if len(set(out)) != len(out):
        raise ConversionError(f"{what} {list(axes)} repeat a dimension")
    return out


def static_int(x) -> int | None:
    if isinstance(x, IntImm):
        return int(x.value)
    if isinstance(x, (int, np.integer)):
        return int(x)
    return None


def scalar(value, dtype: str) -> Expr:
    """A 0-d constant of ``dtype``."""
    return const(np.array(value, dtype=dt.to_numpy(dtype)))


def imm(value, dtype: str) -> PrimExpr:
    if dt.is_float(dtype):
        return FloatImm(float(value), dtype)
    return IntImm(int(value), dtype)


def cast(ctx, x: Expr, dtype: str) -> Expr:
    if ctx.dtype(x) == dtype:
        return x
    return ctx.emit(_op.astype(x, dtype))


def prod(dims):
    out = IntImm(1, "int64")
    for d in dims:
        out = out * d
    return out


def conv_kernel_shape(node, w_shape) -> list[int]:
    """A Conv / ConvTranspose / QLinearConv node's ``kernel_shape`` (else the weight's static
    spatial dims)."""
    ks = node.attr("kernel_shape")
    if ks is None:
        ks = [static_int(d) for d in w_shape[2:]]
        if any(k is None for k in ks):
            raise ConversionError("the kernel shape must be static")
    return list(ks)


def conv_auto_pads(node, in_dims, kernel, strides, dilations, transpose=False):
    """ONNX ``pads`` (begins then ends) for ``auto_pad``; None entries: use ``pads``."""
    mode = node.attr("auto_pad", "NOTSET")
    n = len(kernel)
    if mode in ("NOTSET", ""):
        pads = node.attr("pads")
        return list(pads) if pads is not None else [0] * (2 * n)
    if mode == "VALID":
        return [0] * (2 * n)
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        raise ConversionError(f"auto_pad {mode!r} is not supported")
    begins, ends = [], []
    for d, k, s, dil in zip(in_dims, kernel, strides, dilations):
        eff = (k - 1) * dil + 1
        if transpose:
            total = None
        else:
            dim = static_int(d)
            if dim is None:
                if s != 1:
                    raise ConversionError(f"auto_pad {mode} with stride {s} on a symbolic "
                                          f"spatial dim ({d}) needs padding that depends on the "
                                          f"run-time size; give the dim a static value")
                total = eff - 1
            else:
                out = -(-dim // s)
                total = max((out - 1) * s + eff - dim, 0)
        small, big = total // 2, total - total // 2
        if mode == "SAME_UPPER":
            begins.append(small)
            ends.append(big)
        else:
            begins.append(big)
            ends.append(small)
    return begins + ends


def int_vector(ctx, values) -> Expr:
    """A 1-D int64 tensor of ints / PrimExprs (symbolic dims)."""
    arr = np.empty(len(values), dtype=object)
    arr[:] = [as_int(v) for v in values]
    if all(isinstance(v, int) for v in arr):
        return const(np.array(list(arr), dtype=np.int64))
    return ctx.materialize(arr, "int64")


def runtime_ints(ctx, node, i, what) -> Expr:
    """Input ``i`` as a 1-D int64 tensor (computed at run time; a scalar becomes one entry)."""
    x = ctx.input(node, i)
    if len(ctx.shape(x)) == 0:
        x = ctx.emit(_op.reshape(x, (1,)))
    return cast(ctx, x, "int64")


def static_length(ctx, x: Expr, what: str) -> int:
    """The length of a 1-D tensor, which must be static (it sets a rank or a count)."""
    shape = ctx.shape(x, what)
    n = static_int(shape[0]) if len(shape) == 1 else None
    if n is None:
        raise ConversionError(f"{what} must be a 1-D tensor of static length (it sets the rank "
                              f"or the number of results), got {x.struct_info!r}")
    return n
