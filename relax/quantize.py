"""``relax.quantize(mod, mode, calibration=None)``: one entry point to the low-precision modes.

==============  ==========================================================================
mode            what it does
==============  ==========================================================================
``fp16``        matmul, dense and convolution on float16 inputs with float32 accumulation,
                the sensitive ops in float32, float16 weights (``ToMixedPrecision`` and
                ``FoldConstantCasts``)
``int8-dynamic``  dense layers on uint8 activations quantized per row at run time and
                int8 per-channel weights, int32 accumulation (``QuantizeInt8Dynamic``)
``int8``        static: dense layers and convolutions with activation scales calibrated on
                ``calibration`` (``relax.calibrate.collect_ranges``, ``QuantizeInt8Static``)
``int4-g32``    int4 weight-only, groups of 32 along the reduction dim, float32 scales
``int4-g128``   the same with groups of 128 (``QuantizeInt4Weight``)
==============  ==========================================================================

The result is an ordinary Relax module: ``relax.build`` compiles it for any target (CPU
targets get the int8 / int4 kernels of ``relax.backend.cpu``; OpenCL and WebGPU get the int4
GEMV of ``relax.backend.gpu.dense_int4`` for dense layers of up to 16 static or any symbolic
rows (``LowerDenseQ4GEMV``); other cases run the same integer arithmetic through the generic
kernels; ``fp16`` on WebGPU needs ``Target("webgpu -supports-float16=1")``). The passes are
usable on their own.

Examples
--------
>>> qmod = relax.quantize(mod, "fp16")                                 # doctest: +SKIP
>>> qmod = relax.quantize(mod, "int8-dynamic")                         # doctest: +SKIP
>>> qmod = relax.quantize(mod, "int8", calibration=[(x0,), (x1,)])      # doctest: +SKIP
>>> exe = relax.build(qmod, "llvm")                                     # doctest: +SKIP
"""
from __future__ import annotations

from typing import Callable, Iterable

from tilecraft.tensorir.function import IRModule

from .calibrate import collect_ranges
from .transform import (FoldConstantCasts, QuantizeInt4Weight, QuantizeInt8Dynamic,
                        QuantizeInt8Static, ToMixedPrecision)

__all__ = ["quantize", "MODES"]


def _fp16(mod: IRModule, calibration, out_dtype: str = "float32", **options) -> IRModule:
    # the float16 weights are converted now, so the module holds them in half the bytes
    return FoldConstantCasts()(ToMixedPrecision(out_dtype=out_dtype)(mod))


def _int8_dynamic(mod: IRModule, calibration, **options) -> IRModule:
    return QuantizeInt8Dynamic()(mod)


def _int8_static(mod: IRModule, calibration, observer="minmax", **options) -> IRModule:
    if calibration is None:
        raise ValueError("relax.quantize: mode 'int8' (static) needs calibration, an iterable "
                         "of input tuples for main; use 'int8-dynamic' to quantize without")
    return QuantizeInt8Static(collect_ranges(mod, calibration, observer=observer))(mod)


def _int4(group_size: int) -> Callable:
    def run(mod: IRModule, calibration, symmetric: bool = True,
            scale_dtype: str = "float32", **options) -> IRModule:
        return QuantizeInt4Weight(group_size, symmetric=symmetric, scale_dtype=scale_dtype)(mod)
    return run


# mode -> function(mod, calibration, **options) -> IRModule
MODES: dict[str, Callable] = {
    "fp16": _fp16,
    "int8-dynamic": _int8_dynamic,
    "int8": _int8_static,
    "int4-g32": _int4(32),
    "int4-g128": _int4(128),
}


def quantize(mod: IRModule, mode: str, calibration: Iterable | None = None,
             **options) -> IRModule:
    """Quantize ``mod`` in ``mode``.

    Parameters
    ----------
    mod : IRModule
        A float32 Relax module (from a frontend or built by hand).
    mode : str
        One of ``MODES``: ``"fp16"``, ``"int8-dynamic"``, ``"int8"``, ``"int4-g32"``,
        ``"int4-g128"``.
    calibration : iterable of tuples of numpy arrays, optional
        For ``"int8"``: sample inputs of ``main``, one tuple per run.
    **options
        ``out_dtype`` (``"float32"``, the default, or ``"float16"``: the accumulation dtype of
        matmul, dense and convolution) for ``"fp16"``;
        ``observer`` (``"minmax"``, ``"percentile"``, ``"entropy"``) for ``"int8"``;
        ``symmetric`` and ``scale_dtype`` (``"float16"``: q4f16) for the int4 modes.

    Returns
    -------
    IRModule

    Raises
    ------
    ValueError
        An unknown mode (the message lists the modes), ``"int8"`` without calibration.
    CalibrationError
        A calibration sample that does not fit ``main``.

    Examples
    --------
    >>> qmod = quantize(mod, "int4-g128")                                # doctest: +SKIP
    """
    if not isinstance(mod, IRModule):
        raise TypeError(f"relax.quantize: mod must be an IRModule, got {type(mod).__name__}")
    fn = MODES.get(mode) if isinstance(mode, str) else None
    if fn is None:
        raise ValueError(f"relax.quantize: unknown mode {mode!r}; available: "
                         f"{', '.join(MODES)}")
    return fn(mod, calibration, **options)
