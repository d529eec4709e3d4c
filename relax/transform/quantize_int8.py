"""int8 post-training quantization of dense layers and convolutions.

``QuantizeInt8Dynamic`` (``relax.quantize(mod, "int8-dynamic")``): every ``matmul`` /
``linear`` with a constant float32 2-D weight runs on uint8 activations quantized per row at
run time (the row's min and max, both widened to include 0, give the scale and zero point)
and an int8 weight quantized per output channel (symmetric, ``[-127, 127]``), accumulating in
int32; the result is dequantized in the kernel's epilogue.

``QuantizeInt8Static`` (``relax.quantize(mod, "int8", calibration)``): the same for dense
layers and 2-D convolutions, with each activation's scale and zero point fixed beforehand
from its calibrated range (``relax.transform.calibrate``).

Each quantized layer is, in Relax (so it builds for every target; ``AlterLayout`` gives the
int8 matmul the ``dense_u8i8`` kernel on CPUs, other targets run int32 math)::

    xq  = astype(clip(round(x / sx) + zx, 0, 255), "uint8")    # per row (dynamic) or tensor
    acc = matmul(xq, Wq, out_dtype="int32")                    # conv2d for a convolution
    y   = astype(acc - zx * colsum(Wq), "float32") * (sx * sw) # exact int32 correction

A convolution pads ``xq`` with ``zx`` itself (the quantized 0), so the correction
``zx * sum(Wq[o])`` holds at the borders too.

When ``x`` is a clamp with constant bounds (``clip``, ``relu``, ``minimum(maximum(v, lo),
hi)``: MobileNet's relu6), the static quantization reads ``v`` and moves the bounds past the
rounding into its saturation (``_quantized_bound``): the same bytes, two min / max per
element fewer in the producer's epilogue.

Examples
--------
>>> qmod = QuantizeInt8Dynamic()(mod)                        # doctest: +SKIP
>>> qmod = QuantizeInt8Static(ranges)(mod)                   # doctest: +SKIP
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tilecraft.tensorir.expr import IntImm
from tilecraft.tensorir.function import IRModule

from .. import op as _op
from ..expr import Call, Constant, Expr, Function, RelaxError, SeqExpr, Var, VarBinding, const
from ..op.base import Op
from ..struct_info import TensorStructInfo
from .base import ExprMutator, Pass

__all__ = ["QuantizeInt8Dynamic", "QuantizeInt8Static", "quantize_weight_int8",
           "quantizable_calls", "is_quantizable", "activation_qparams"]

QMAX_W = 127


def quantize_weight_int8(w: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-channel int8: ``(q, scale)`` with ``w ~ q * scale`` along ``axis`` (the
    output channels), ``q`` in ``[-127, 127]``, ``scale = max|w| / 127`` (1 for an all-zero
    channel).

    Examples
    --------
    >>> q, s = quantize_weight_int8(np.array([[1.0, -0.5], [0.5, 2.0]], "float32"), axis=1)
    >>> q.tolist(), s.tolist()
    ([[127, -32], [64, 127]], [0.007874015718698502, 0.015748031437397003])
    """
    w = np.asarray(w, np.float32)
    red = tuple(d for d in range(w.ndim) if d != axis)
    amax = np.max(np.abs(w), axis=red, keepdims=True)
    scale = np.where(amax > 0, amax / QMAX_W, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale), -QMAX_W, QMAX_W).astype(np.int8)
    return q, scale.reshape(-1)


def activation_qparams(lo: float, hi: float) -> tuple[float, int]:
    """uint8 ``(scale, zero_point)`` of the range ``[lo, hi]`` widened to include 0 (so 0 is
    exact, as zero padding needs).

    Examples
    --------
    >>> activation_qparams(-1.0, 3.0)
    (0.01568627543747425, 64)
    """
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise ValueError(f"activation range [{lo}, {hi}] is not finite")
    scale = (hi - lo) / 255.0 if hi > lo else 1.0
    zp = int(np.clip(np.rint(-lo / scale), 0, 255))
    return float(np.float32(scale)), zp


# ---------------------------------------------------------------------------------------------
# which calls are quantized


def _tensor(e: Expr) -> TensorStructInfo | None:
    si = e.struct_info
    return si if isinstance(si, TensorStructInfo) and si.shape is not None else None


def _const_float_weight(e: Expr, ndim: int) -> bool:
    return isinstance(e, Constant) and e.data.dtype == np.float32 and e.data.ndim == ndim


def is_quantizable(call: Call, convolutions: bool) -> bool:
    """Whether ``call`` is a layer the int8 passes quantize: ``matmul(x, W)`` or
    ``linear(x, W[, b])`` with a constant float32 2-D ``W`` and float32 ``x`` of static last
    dim, and with ``convolutions`` a float32 2-D ``conv2d`` with a constant weight."""
    if not isinstance(call, Call) or not isinstance(call.op, Op):
        return False
    name = call.op.name
    x = call.args[0] if call.args else None
    xsi = _tensor(x) if x is not None else None
    if xsi is None or xsi.dtype != "float32" or len(xsi.shape) < 2 or \
            call.struct_info.dtype != "float32":
        return False
    if name in ("relax.matmul", "relax.linear"):
        return _const_float_weight(call.args[1], 2) and isinstance(xsi.shape[-1], IntImm)
    if name == "relax.nn.conv2d" and convolutions:
        return _const_float_weight(call.args[1], 4) and len(xsi.shape) == 4
    return False


def quantizable_calls(func, convolutions: bool) -> list[Call]:
    """The calls of ``func``'s body the int8 passes quantize, in binding order (layers inside
    branches of an ``If`` are left in float)."""
    body = func.body
    if not isinstance(body, SeqExpr):
        return []
    return [b.value for blk in body.blocks for b in blk.bindings
            if isinstance(b, VarBinding) and is_quantizable(b.value, convolutions)]


# ---------------------------------------------------------------------------------------------
# the rewrite


def _scalar(e: Expr) -> float | None:
    """The value of a one-element float32 constant, else None."""
    if isinstance(e, Constant) and e.data.dtype == np.float32 and e.data.size == 1:
        return float(e.data.reshape(()))
    return None


def _quantized_bound(bound: float | None, inv: np.float32, zp: int, default: float) -> float:
    """Where a clamp of the float input at ``bound`` lands after quantization:
    ``clamp(round(clamp(v, lo, hi) * inv) + zp, 0, 255)`` is ``clamp(round(v * inv) + zp, L,
    H)`` with ``L = clamp(round(lo * inv) + zp, 0, 255)`` (``H`` likewise; ``lo <= hi``),
    since the float32 product and the rounding are monotone; None: ``default``."""
    if bound is None:
        return default
    return float(np.clip(np.rint(np.float32(bound) * inv) + np.float32(zp), 0, 255))


def _f32(v) -> Constant:
    return const(np.asarray(v, np.float32))


def _i32(v) -> Constant:
    return const(np.asarray(v, np.int32))


class _Int8Rewriter(ExprMutator):
    def __init__(self, mod: IRModule, ranges: Sequence | None, convolutions: bool):
        super().__init__(mod)
        self.ranges = ranges
        self.convolutions = convolutions
        self.index = 0
        # static ranges are calibrated on "main" (calibrate.collect_ranges)
        funcs = [mod["main"]] if ranges is not None else \
            [f for f in mod.functions.values() if isinstance(f, Function)]
        self.targets = {id(c) for f in funcs for c in quantizable_calls(f, convolutions)}
        # x -> quantize_rows(x): layers reading one input (BERT's q, k and v) share its
        # quantization (where its results are visible) instead of each computing it again
        self._rows: dict[Var, tuple] = {}

    def visit_call_(self, call: Call) -> Expr:
        new = super().visit_call_(call)
        if id(call) not in self.targets or not self.builder.building or \
                not is_quantizable(new, self.convolutions):
            return new
        # static: one range per layer of main, in order (checked by QuantizeInt8Static)
        rng = self.ranges[self.index] if self.ranges is not None else None
        self.index += 1
        if new.op.name == "relax.nn.conv2d":
            return self.conv2d(new, rng)
        return self.dense(new, rng)

    def emit(self, e: Expr) -> Expr:
        return self.builder.emit(e)

    # -- activations --------------------------------------------------------------------------
    def quantize_static(self, x: Expr, rng) -> tuple[Expr, float, int]:
        scale, zp = activation_qparams(*rng)
        inv = np.float32(1.0 / scale)
        v, lo, hi = self.clamped(x)
        q = self.emit(_op.add(self.emit(_op.round(self.emit(_op.multiply(v, _f32(inv))))),
                              _f32(zp)))
        return self.saturate(q, _quantized_bound(lo, inv, zp, 0),
                             _quantized_bound(hi, inv, zp, 255)), scale, zp

    def clamped(self, x: Expr) -> tuple[Expr, float | None, float | None]:
        """``x`` as ``clamp(v, lo, hi)`` with constant bounds (``clip``, ``relu``,
        ``minimum(maximum(v, lo), hi)``, ``maximum(v, lo)``; None: that side open), or
        ``(x, None, None)``. The quantization of ``x`` is then that of ``v`` with the bounds
        moved past the rounding (``_quantized_bound``): exact, and the clamp's two min / max
        per element go from the producer's epilogue (MobileNet-V2's relu6 before every
        quantized layer)."""
        val = self.builder.lookup_binding(x) if isinstance(x, Var) else None
        if not isinstance(val, Call) or not isinstance(val.op, Op) or not val.args:
            return x, None, None
        name, v = val.op.name, val.args[0]
        if name == "relax.clip":
            lo, hi = val.attr_dict.get("min"), val.attr_dict.get("max")
        elif name == "relax.nn.relu":
            lo, hi = 0.0, None
        elif name == "relax.maximum" and _scalar(val.args[1]) is not None:
            lo, hi = _scalar(val.args[1]), None
        elif name == "relax.minimum" and _scalar(val.args[1]) is not None:
            inner, inner_lo, _ = self.clamped(v)
            if inner is v or inner_lo is None:
                return x, None, None
            v, lo, hi = inner, inner_lo, _scalar(val.args[1])
        else:
            return x, None, None
        vsi, xsi = _tensor(v), _tensor(x)
        if vsi is None or xsi is None or vsi.dtype != "float32" or \
                [str(d) for d in vsi.shape] != [str(d) for d in xsi.shape] or \
                (lo is not None and hi is not None and not lo <= hi):
            return x, None, None
        return v, (None if lo is None else float(lo)), (None if hi is None else float(hi))

    def saturate(self, q: Expr, lo: float = 0.0, hi: float = 255.0) -> Expr:
        q = self.emit(_op.minimum(self.emit(_op.maximum(q, _f32(lo))), _f32(hi)))
        return self.emit(_op.astype(q, "uint8"))

    def quantize_rows(self, x: Expr) -> tuple[Expr, Expr, Expr]:
        """Per row: ``(xq, scale (..., 1) float32, zero_point (..., 1) int32)``, once per
        input variable (while its results are visible)."""
        hit = self._rows.get(x) if isinstance(x, Var) else None
        if hit is not None and all(self.builder.visible(v) for v in hit):
            return hit
        out = self._quantize_rows(x)
        if isinstance(x, Var):
            self._rows[x] = out
        return out

    def _quantize_rows(self, x: Expr) -> tuple[Expr, Expr, Expr]:
        e = self.emit
        lo = e(_op.minimum(e(_op.min(x, axis=-1, keepdims=True)), _f32(0)))
        hi = e(_op.maximum(e(_op.max(x, axis=-1, keepdims=True)), _f32(0)))
        rng = e(_op.subtract(hi, lo))
        # an all-zero row: any scale works, 1 avoids 0 / 0
        scale = e(_op.where(e(_op.greater(rng, _f32(0))),
                            e(_op.divide(rng, _f32(255))), _f32(1)))
        zp = e(_op.round(e(_op.divide(e(_op.negative(lo)), scale))))
        # a multiply by the row's reciprocal, as the static quantization does: a division per
        # element (vdivps) was most of the quantizing kernel's time (BERT's 128 x 3072: ~100 us)
        inv = e(_op.divide(_f32(1), scale))
        q = e(_op.add(e(_op.round(e(_op.multiply(x, inv)))), zp))
        return self.saturate(q), scale, e(_op.astype(zp, "int32"))

    # -- dense --------------------------------------------------------------------------------
    def dense(self, call: Call, rng) -> Expr:
        x, w = call.args[0], call.args[1].data
        linear = call.op.name == "relax.linear"
        wk = w.T if linear else w                               # (K, N)
        wq, ws = quantize_weight_int8(wk, axis=1)
        colsum = wq.astype(np.int64).sum(axis=0).astype(np.int32)
        if rng is None:
            xq, xs, zp = self.quantize_rows(x)
        else:
            xq, s, z = self.quantize_static(x, rng)
            xs, zp = _f32(s), _i32(z)
        acc = self.emit(_op.matmul(xq, const(np.ascontiguousarray(wq)), out_dtype="int32"))
        y = self.dequantize(acc, zp, _i32(colsum), xs, _f32(ws))
        if linear and len(call.args) > 2:
            y = self.emit(_op.add(y, call.args[2]))
        return y

    def dequantize(self, acc, zp, wsum, xs, ws) -> Expr:
        e = self.emit
        acc = e(_op.subtract(acc, e(_op.multiply(zp, wsum))))
        return e(_op.multiply(e(_op.astype(acc, "float32")), e(_op.multiply(xs, ws))))

    # -- conv2d -------------------------------------------------------------------------------
    def conv2d(self, call: Call, rng) -> Expr:
        a = call.attr_dict
        x, w = call.args[0], call.args[1].data
        klayout, layout = a["kernel_layout"], a["data_layout"]
        o_axis = klayout.index("O")
        wq, ws = quantize_weight_int8(w, axis=o_axis)
        red = tuple(d for d in range(4) if d != o_axis)
        wsum = wq.astype(np.int64).sum(axis=red).astype(np.int32)
        if rng is None:
            raise RelaxError("QuantizeInt8Dynamic does not quantize convolutions; use "
                             "mode 'int8' with a calibration set", call)
        xq, s, zp = self.quantize_static(x, rng)
        pads = tuple(int(p) for p in a["padding"])
        if any(pads):
            # pad with the quantized 0 so that zp * sum(W) is the border's correction too
            width = [(0, 0)] * 4
            h, wd = layout.index("H"), layout.index("W")
            width[h], width[wd] = (pads[0], pads[2]), (pads[1], pads[3])
            xq = self.emit(_op.pad(xq, width, pad_value=zp))
        acc = self.emit(_op.nn.conv2d(
            xq, const(np.ascontiguousarray(wq)), strides=a["strides"], padding=(0, 0, 0, 0),
            dilation=a["dilation"], groups=a["groups"], data_layout=layout,
            kernel_layout=klayout, out_layout=a["out_layout"], out_dtype="int32"))
        out_layout = a["out_layout"] or layout
        shape = [1, 1, 1, 1]
        shape[out_layout.index("C")] = -1
        return self.dequantize(acc, _i32(zp), _i32(wsum.reshape(shape)), _f32(s),
                               _f32(ws.reshape(shape)))


class QuantizeInt8Dynamic(Pass):
    """Dense layers (``matmul`` / ``linear`` with a constant float32 weight) -> uint8 x int8
    with per-row activation scales computed at run time and per-channel weight scales (see
    the module docstring).

    Examples
    --------
    >>> qmod = QuantizeInt8Dynamic()(mod)                    # doctest: +SKIP
    """

    name = "QuantizeInt8Dynamic"

    def transform_module(self, mod: IRModule) -> IRModule:
        return _Int8Rewriter(mod, None, convolutions=False).visit_module()


class QuantizeInt8Static(Pass):
    """Dense layers and 2-D convolutions -> uint8 x int8 with fixed activation scales.

    Parameters
    ----------
    ranges : sequence of (lo, hi)
        The calibrated range of each quantized layer's input, in the order of
        ``quantizable_calls(main, convolutions=True)`` (``calibrate.collect_ranges`` makes it).

    Examples
    --------
    >>> ranges = collect_ranges(mod, calibration)            # doctest: +SKIP
    >>> qmod = QuantizeInt8Static(ranges)(mod)                # doctest: +SKIP
    """

    name = "QuantizeInt8Static"

    def __init__(self, ranges: Sequence[tuple[float, float]]):
        self.ranges = [(float(lo), float(hi)) for lo, hi in ranges]

    def transform_module(self, mod: IRModule) -> IRModule:
        layers = len(quantizable_calls(mod["main"], convolutions=True))
        if layers != len(self.ranges):
            raise ValueError(f"QuantizeInt8Static: {len(self.ranges)} calibrated ranges for "
                             f"{layers} quantizable layers of main")
        return _Int8Rewriter(mod, self.ranges, convolutions=True).visit_module()
