"""``GPUWinograd``: NCHW 3x3 stride-1 convolutions as Winograd F(2x2, 3x3) on GPU targets.

Runs on operator calls, before ``LegalizeOps``, for ``opencl`` and ``webgpu`` targets. A
``relax.nn.conv2d`` that ``relax.backend.gpu.winograd.winograd_applies`` takes (float32 data,
weight and output, NCHW data and output, static channels and image size, 3x3, stride 1, no
dilation, one group, at least 64 input and output channels, an output of 7 x 7 to 14 x 14)
becomes two kernel calls:

    u = call_tir(pack_winograd_weight, (weight,))        # [16, O, C]
    y = call_tir(conv2d_nchw_winograd, (data, u))        # input transform, 16 GEMMs, output

The convolution kernel carries ``"op_pattern"`` ``OUT_EWISE_FUSABLE``, so ``FuseOps`` still
fuses its bias, residual add and activation, which the default GPU schedule inlines into the
output transform. A constant weight (every imported model's) is transformed here, in numpy
(``winograd.winograd_weight_numpy``): ``u`` is a constant and no kernel is built for it.

On a target with tensor cores (``opencl -device=nvidia``) float16 convolutions are left to
the tensor-core GEMM (implicit GEMMs) unless ``TILECRAFT_GPU_WINOGRAD_TC=1``.
``TILECRAFT_GPU_WINOGRAD=0`` in the environment (read when the pass is made) or
``GPUWinograd(target, enabled=False)`` keeps the direct implicit-GEMM convolution (for
comparing the two; their float32 results round differently).

Examples
--------
>>> from tilecraft.targets import Target
>>> new_mod = GPUWinograd(Target("opencl"))(mod)    # doctest: +SKIP
"""
from __future__ import annotations

import os

import numpy as np

from tilecraft.targets import Target
from tilecraft.tensorir.function import IRModule

from ..backend.cpu.geometry import conv2d_geometry
from ..backend.gpu import winograd
from ..expr import Call, Constant, Expr
from ..op.base import Op, OpPattern
from .base import ExprMutator, Pass

__all__ = ["GPUWinograd", "winograd_enabled", "winograd_on_tensor_cores"]

GPU_KINDS = ("opencl", "webgpu")


def winograd_on_tensor_cores() -> bool:
    """Whether ``TILECRAFT_GPU_WINOGRAD_TC=1`` asks for float16 Winograd also on a target with
    tensor cores (default: off there, the tensor-core GEMM taking float16 3x3 convolutions as
    implicit GEMMs)."""
    return os.environ.get("TILECRAFT_GPU_WINOGRAD_TC", "0").strip() in ("1", "true", "on")


def winograd_enabled() -> bool:
    """Whether ``TILECRAFT_GPU_WINOGRAD`` leaves the GPU Winograd path on (unset or not
    ``0``)."""
    return os.environ.get("TILECRAFT_GPU_WINOGRAD", "1").strip() not in ("0", "false", "off")


_WINOGRAD_DTYPES = ("float32", "float16")

class GPUWinograd(Pass):
    """Rewrite the NCHW 3x3 stride-1 convolutions Winograd pays for into the GPU Winograd
    kernels (see the module docstring).

    Parameters
    ----------
    target : Target | str
        The target; other than ``opencl`` / ``webgpu`` the module is left as it is.
    enabled : bool | None
        False leaves every convolution as it is; None (the default) reads
        ``TILECRAFT_GPU_WINOGRAD``.
    min_channels : int | None
        The fewest input and output channels rewritten (None: ``winograd.MIN_CHANNELS``;
        tests use fewer to keep PoCL's compile times short).

    Examples
    --------
    >>> new_mod = GPUWinograd("webgpu")(mod)    # doctest: +SKIP
    """

    name = "GPUWinograd"

    def __init__(self, target: "Target | str", enabled: bool | None = None,
                 min_channels: int | None = None):
        self.target = target if isinstance(target, Target) else Target(target)
        self.enabled = winograd_enabled() if enabled is None else bool(enabled)
        self.min_channels = winograd.MIN_CHANNELS if min_channels is None else int(min_channels)
        if self.min_channels < 1:
            raise ValueError(f"GPUWinograd: min_channels must be positive, got {min_channels}")

    def transform_module(self, mod: IRModule) -> IRModule:
        if self.target.kind not in GPU_KINDS or not self.enabled:
            return mod
        # float16 convolutions only where no tensor core takes them (the tensor-core GEMM runs
        # a float16 3x3 convolution as an implicit GEMM; Winograd's batched GEMMs are SIMT)
        half = self.target.tensor_cores is None or winograd_on_tensor_cores()
        return _Rewrite(mod, self.min_channels, half).visit_module()


class _Rewrite(ExprMutator):
    def __init__(self, mod: IRModule, min_channels: int, half: bool = True):
        super().__init__(mod)
        self.min_channels = min_channels
        self.half = half

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, Op) or call.op.name != "relax.nn.conv2d" or \
                not self.builder.building:
            return call
        return self.conv2d(call) or call

    def kernel(self, te_func, *args, name: str, pattern: int, **kwargs) -> Call:
        """``call_te`` of ``te_func`` with the kernel's ``"op_pattern"`` set."""
        return self.builder.call_te_kernel(te_func, *args, name=name, pattern=pattern, **kwargs)

    def conv2d(self, call: Call) -> Expr | None:
        a = call.attr_dict
        if a["data_layout"] != "NCHW" or a["out_layout"] != "NCHW":
            return None
        # float32, or a float16 model's (ToMixedPrecision): float16 weights, float32 or float16
        # data (FoldCastIntoGEMM), a float32 or float16 result
        dtypes = tuple(e.struct_info.dtype for e in (call.args[0], call.args[1], call))
        if dtypes[1] not in _WINOGRAD_DTYPES or not set(dtypes) <= set(_WINOGRAD_DTYPES) or \
                (dtypes[1] == "float32" and dtypes != ("float32",) * 3) or \
                (dtypes[1] == "float16" and not self.half):
            return None
        g = conv2d_geometry(call, dtypes=dtypes)
        if g is None:
            return None
        if not winograd.winograd_applies(g, self.min_channels):
            return None
        data, weight = call.args
        if isinstance(weight, Constant):      # every imported model's: no kernel to build
            packed = Constant(winograd.winograd_weight_numpy(np.asarray(weight.data),
                                                             a["kernel_layout"]))
        else:
            packed = self.builder.emit(self.kernel(
                winograd.pack_winograd_weight, weight, a["kernel_layout"],
                name="pack_winograd_weight", pattern=OpPattern.INJECTIVE))
        return self.kernel(winograd.conv2d_nchw_winograd, data, packed, g, dtypes[2],
                           name="conv2d_nchw_winograd", pattern=OpPattern.OUT_EWISE_FUSABLE)
