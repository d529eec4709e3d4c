"""int4 weight-only group quantization of dense layers (the ``q4f32`` / ``q4f16`` family).

``QuantizeInt4Weight(group_size)`` replaces every ``matmul(x, W)`` / ``linear(x, W[, b])``
with a constant float32 2-D weight by ``relax.dense_q4``: ``W`` ``(K, N)`` becomes 4-bit codes
in groups of ``group_size`` consecutive rows (along the reduction dim), each group of each
column with its own scale and offset (``w ~ q * scale + offset``), stored as ``scale_dtype``
(float32, or float16 for ``q4f16``). Activations stay float; the kernel dequantizes the codes
in registers (``relax.backend.cpu.dense_int4``).

- symmetric (default): ``scale = max|w| / 7``, ``q = clip(round(w / scale), -8, 7) + 8``,
  ``offset = -8 * scale``;
- with zero points (``symmetric=False``): the group's ``[min, max]`` (widened to 0) in 15
  steps, ``z = round(-min / scale)``, ``q = clip(round(w / scale) + z, 0, 15)``,
  ``offset = -z * scale``.

A reduction dim that is not a multiple of the group size ends in a shorter last group.

Examples
--------
>>> codes, scale, offset = quantize_weight_int4(np.ones((64, 8), "float32"), 32)
>>> codes.shape, scale.shape
((32, 8), (2, 8))
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir.function import IRModule

from .. import op as _op
from ..expr import Call, Constant, Expr, const
from ..op.base import Op
from ..struct_info import TensorStructInfo
from .base import ExprMutator, Pass

__all__ = ["QuantizeInt4Weight", "quantize_weight_int4", "dequantize_int4", "pack_nibbles"]


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """Codes ``(K, N)`` in ``[0, 15]`` as bytes ``(ceil(K/2), N)``: row ``2i`` in the low
    nibble, row ``2i + 1`` in the high one (0 past ``K``).

    Examples
    --------
    >>> pack_nibbles(np.array([[1], [2], [3]])).tolist()
    [[33], [3]]
    """
    q = np.asarray(q, np.uint8)
    if q.shape[0] % 2:
        q = np.concatenate([q, np.zeros((1,) + q.shape[1:], np.uint8)])
    return (q[0::2] | (q[1::2] << 4)).astype(np.uint8)


def quantize_weight_int4(w: np.ndarray, group_size: int, symmetric: bool = True,
                         scale_dtype: str = "float32"):
    """``(codes, scale, offset)`` of ``w`` ``(K, N)``: codes ``(ceil(K/2), N)`` uint8 (two 4-bit
    codes a byte), scale and offset ``(ceil(K/G), N)`` of ``scale_dtype``.

    Examples
    --------
    >>> w = np.linspace(-1, 1, 64, dtype="float32").reshape(32, 2)
    >>> codes, s, o = quantize_weight_int4(w, 32)
    >>> float(np.abs(dequantize_int4(codes, s, o, 32, 32) - w).max()) < float(s.max()) / 2 + 1e-6
    True
    """
    if group_size < 2 or group_size % 2:
        raise ValueError(f"quantize_weight_int4: group_size must be even and at least 2, got "
                         f"{group_size}")
    if scale_dtype not in ("float32", "float16"):
        raise ValueError(f"quantize_weight_int4: scale_dtype must be float32 or float16, got "
                         f"{scale_dtype!r}")
    w = np.asarray(w, np.float32)
    k, n = w.shape
    groups = -(-k // group_size)
    padded = np.zeros((groups * group_size, n), np.float32)
    padded[:k] = w
    g = padded.reshape(groups, group_size, n)
    if symmetric:
        amax = np.abs(g).max(axis=1)
        scale = np.where(amax > 0, amax / 7.0, 1.0).astype(scale_dtype).astype(np.float32)
        q = np.clip(np.rint(g / scale[:, None]), -8, 7) + 8
        offset = (-8.0 * scale).astype(scale_dtype)
    else:
        lo = np.minimum(g.min(axis=1), 0.0)
        hi = np.maximum(g.max(axis=1), 0.0)
        scale = np.where(hi > lo, (hi - lo) / 15.0, 1.0).astype(scale_dtype).astype(np.float32)
        z = np.clip(np.rint(-lo / scale), 0, 15)
        q = np.clip(np.rint(g / scale[:, None]) + z[:, None], 0, 15)
        offset = (-z * scale).astype(scale_dtype)
    codes = pack_nibbles(q.reshape(groups * group_size, n)[:k].astype(np.uint8))
    return codes, scale.astype(scale_dtype), offset


def dequantize_int4(codes: np.ndarray, scale: np.ndarray, offset: np.ndarray, k: int,
                    group_size: int) -> np.ndarray:
    """The float32 weight ``(K, N)`` that ``codes``, ``scale`` and ``offset`` stand for (the
    numpy reference of ``relax.dense_q4``).

    Examples
    --------
    >>> dequantize_int4(np.array([[0x21]], np.uint8), np.ones((1, 1)), np.zeros((1, 1)), 2, 32)
    array([[1.],
           [2.]], dtype=float32)
    """
    q = np.empty((codes.shape[0] * 2, codes.shape[1]), np.float32)
    q[0::2] = codes & 15
    q[1::2] = codes >> 4
    q = q[:k]
    g_idx = np.arange(k) // group_size
    s, o = scale.astype(np.float32)[g_idx], offset.astype(np.float32)[g_idx]
    return q * s + o


class _Int4Rewriter(ExprMutator):
    def __init__(self, mod, group_size, symmetric, scale_dtype):
        super().__init__(mod)
        self.group_size, self.symmetric, self.scale_dtype = group_size, symmetric, scale_dtype

    def visit_call_(self, call: Call) -> Expr:
        new = super().visit_call_(call)
        if not self.builder.building or not isinstance(new.op, Op) or \
                new.op.name not in ("relax.matmul", "relax.linear"):
            return new
        x, w = new.args[0], new.args[1]
        xsi = x.struct_info
        if not isinstance(w, Constant) or w.data.dtype != np.float32 or w.data.ndim != 2 or \
                not isinstance(xsi, TensorStructInfo) or xsi.dtype != "float32" or \
                xsi.shape is None or len(xsi.shape) < 1 or new.struct_info.dtype != "float32":
            return new
        linear = new.op.name == "relax.linear"
        wk = w.data.T if linear else w.data
        codes, scale, offset = quantize_weight_int4(wk, self.group_size, self.symmetric,
                                                    self.scale_dtype)
        y = self.builder.emit(_op.dense_q4(x, const(codes), const(scale), const(offset),
                                           self.group_size))
        if linear and len(new.args) > 2:
            y = self.builder.emit(_op.add(y, new.args[2]))
        return y


class QuantizeInt4Weight(Pass):
    """Dense layers with constant float32 weights -> ``relax.dense_q4`` (int4 weight-only
    groups; see the module docstring).

    Parameters
    ----------
    group_size : int
        Rows of ``W`` (along the reduction dim) per group: 32 or 128 (any even size works).
    symmetric : bool
        Symmetric codes (default) or codes with a zero point per group.
    scale_dtype : str
        ``"float32"`` or ``"float16"`` scales and offsets.

    Examples
    --------
    >>> qmod = QuantizeInt4Weight(128)(mod)                  # doctest: +SKIP
    """

    name = "QuantizeInt4Weight"

    def __init__(self, group_size: int = 128, symmetric: bool = True,
                 scale_dtype: str = "float32"):
        if isinstance(group_size, bool) or not isinstance(group_size, int) or \
                group_size < 2 or group_size % 2:
            raise ValueError(f"QuantizeInt4Weight: group_size must be an even int >= 2, got "
                             f"{group_size!r}")
        if scale_dtype not in ("float32", "float16"):
            raise ValueError(f"QuantizeInt4Weight: scale_dtype must be 'float32' or "
                             f"'float16', got {scale_dtype!r}")
        self.group_size, self.symmetric, self.scale_dtype = group_size, bool(symmetric), \
            scale_dtype

    def transform_module(self, mod: IRModule) -> IRModule:
        return _Int4Rewriter(mod, self.group_size, self.symmetric,
                             self.scale_dtype).visit_module()
