"""Low-precision operators: ``dense_q4`` (int4 weight-only group-quantized dense).

``dense_q4(x, codes, scale, offset, group_size)``: ``x @ W`` where ``W`` ``(K, N)`` is kept as
4-bit codes ``q`` in ``[0, 15]`` in groups of ``group_size`` rows, each group and column with a
scale and an offset: ``W[k, n] = q[k, n] * scale[k // G, n] + offset[k // G, n]``. The codes
are packed two to a byte along ``K`` (``codes[k // 2, n]``, the even ``k`` in the low nibble).
``relax.quantize(mod, "int4-g32" | "int4-g128")`` produces it; on CPU targets ``AlterLayout``
gives it the panel kernel of ``relax.backend.cpu.dense_int4``, elsewhere it legalizes to the
portable compute (the same arithmetic, the codes unpacked in registers either way).

int8 layers need no operator of their own: they are ``matmul`` of uint8 activations and an
int8 weight with ``out_dtype="int32"`` and elementwise (de)quantization around it.

Examples
--------
>>> from tilecraft.relax import Var, TensorStructInfo, op
>>> x = Var("x", TensorStructInfo(("n", 64), "float32"))
>>> q = Var("q", TensorStructInfo((32, 16), "uint8"))
>>> s = Var("s", TensorStructInfo((2, 16), "float32"))
>>> op.dense_q4(x, q, s, s, 32).struct_info
Tensor((n, 16), 'float32')
"""
from __future__ import annotations

from tilecraft.tensorir.expr import IntImm

from ..backend.cpu.dense_int4 import dense_q4 as _te_dense_q4
from ..expr import Expr, RelaxError
from ..struct_info import TensorStructInfo
from .base import OpPattern, as_expr, call, register_op

__all__ = ["dense_q4"]


def _static(d) -> int | None:
    return d.value if isinstance(d, IntImm) else None


def _infer_dense_q4(call_):
    op = "relax.dense_q4"
    x, codes, scale, offset = call_.args
    sis = [a.struct_info for a in call_.args]
    for name, si in zip(("x", "codes", "scale", "offset"), sis):
        if not isinstance(si, TensorStructInfo):
            raise RelaxError(f"{op}: {name} must be a tensor, got {si!r}", call_)
    sx, sq, ss, so = sis
    if sq.dtype != "uint8":
        raise RelaxError(f"{op}: codes must be uint8 (two 4-bit codes a byte), got {sq.dtype}",
                         call_)
    if ss.dtype not in ("float32", "float16") or so.dtype != ss.dtype:
        raise RelaxError(f"{op}: scale and offset must both be float32 or float16, got "
                         f"{ss.dtype} and {so.dtype}", call_)
    if sx.dtype not in ("float32", "float16"):
        raise RelaxError(f"{op}: x must be float32 or float16, got {sx.dtype}", call_)
    g = int(call_.attr_dict["group_size"])
    if g < 2 or g % 2:
        raise RelaxError(f"{op}: group_size must be even and at least 2, got {g}", call_)
    if sx.shape is None or sq.shape is None:
        return TensorStructInfo(None, "float32", sx.ndim)
    if len(sq.shape) != 2 or ss.shape is None or len(ss.shape) != 2:
        raise RelaxError(f"{op}: codes and scale must be 2-D, got {sq.shape} and {ss.shape}",
                         call_)
    k, k2, n = _static(sx.shape[-1]), _static(sq.shape[0]), sq.shape[1]
    if k is None or k2 is None:
        raise RelaxError(f"{op}: the reduction dim must be static", call_)
    if k2 != (k + 1) // 2:
        raise RelaxError(f"{op}: codes hold {k2} rows of code pairs; x has {k} features "
                         f"(expected {(k + 1) // 2})", call_)
    groups = -(-k // g)
    for name, si in (("scale", ss), ("offset", so)):
        if _static(si.shape[0]) != groups or _static(si.shape[1]) != _static(n):
            raise RelaxError(f"{op}: {name} must be ({groups}, {n}) for {k} features in groups "
                             f"of {g}, got {tuple(si.shape)}", call_)
    return TensorStructInfo(tuple(sx.shape[:-1]) + (n,), "float32")


def _legalize_dense_q4(bb, call_):
    x, codes, scale, offset = call_.args
    return bb.call_te(_te_dense_q4, x, codes, scale, offset,
                      int(call_.attr_dict["group_size"]), primfunc_name_hint="dense_q4")


register_op("relax.dense_q4", _infer_dense_q4, _legalize_dense_q4, OpPattern.OUT_EWISE_FUSABLE,
            doc="x @ W for W held as 4-bit codes in groups with a scale and offset each "
                "(int4 weight-only quantization).")


def dense_q4(x, codes, scale, offset, group_size: int) -> Expr:
    """``x @ W`` with ``W[k, n] = q[k, n] * scale[k // G, n] + offset[k // G, n]``.

    Parameters
    ----------
    x : Expr
        ``(..., K)`` float32 (or float16) activations; ``K`` static.
    codes : Expr
        ``(ceil(K/2), N)`` uint8: ``q[2i, n] | q[2i + 1, n] << 4``.
    scale, offset : Expr
        ``(ceil(K/G), N)``, float32 or float16 (both the same).
    group_size : int
        ``G``, even.

    Returns
    -------
    Expr
        ``(..., N)`` float32.

    Examples
    --------
    >>> from tilecraft.relax import Var, TensorStructInfo, op
    >>> x = Var("x", TensorStructInfo((1, 256), "float32"))
    >>> q = Var("q", TensorStructInfo((128, 32), "uint8"))
    >>> s = Var("s", TensorStructInfo((2, 32), "float16"))
    >>> op.dense_q4(x, q, s, s, 128).struct_info
    Tensor((1, 32), 'float32')
    """
    return call("relax.dense_q4", [as_expr(x), as_expr(codes), as_expr(scale), as_expr(offset)],
                {"group_size": int(group_size)})
