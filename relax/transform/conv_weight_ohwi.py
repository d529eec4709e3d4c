"""``ConvWeightOHWI``: the constant weights of the float16 convolutions the tensor cores take,
stored OHWI at build time, so that the implicit GEMM reads them in 16-byte rows.

Runs on operator calls, before ``LegalizeOps``, for targets with tensor cores
(``Target.tensor_cores``: ``opencl -device=nvidia``). The tensor-core GEMM
(``relax.backend.gpu.tensor_core``) runs an NCHW convolution as an implicit GEMM whose rows
are the output channels and whose reduction runs the input channels fastest, k = (kh, kw, c):
an OIHW weight ``W[o, c, kh, kw]`` is then read a half at a time at a stride of KH x KW
(``a_mode`` ``"gather"``). Stored ``(O, KH, KW, C)`` the same k is contiguous per output
channel: a row of K = KH * KW * C halves, copied in 16-byte pieces of 8 (``a_mode``
``"rows"``). A ``relax.nn.conv2d`` is rewritten where the kernel will take it so: a
**constant** float16 weight in ``OIHW`` (every imported model's, after ``relax.quantize(mod,
"fp16")``), NCHW data and output, one group, a window larger than 1 x 1 (a 1 x 1 weight is
already contiguous) and input channels a multiple of 16 (``ohwi_rows``: each row piece
16-byte aligned, a k-step within one window position). The weight is transposed here in
numpy — no kernel — and the call told ``kernel_layout="OHWI"``. A weight that is a function
parameter is left as it is.

``TILECRAFT_TC_CONV_OHWI=0`` in the environment (read when the pass is made) or
``ConvWeightOHWI(target, enabled=False)`` keeps OIHW (the gathered weight, for the GPU A/B).

Examples
--------
>>> from tilecraft.targets import Target
>>> new_mod = ConvWeightOHWI(Target("opencl -device=nvidia"))(mod)    # doctest: +SKIP
"""
from __future__ import annotations

import os

import numpy as np

from tilecraft.targets import Target
from tilecraft.tensorir.function import IRModule

from ..expr import Call, Constant, Expr
from ..op.base import Op
from ..struct_info import TensorStructInfo
from .base import ExprMutator, Pass

__all__ = ["ConvWeightOHWI", "conv_ohwi_enabled", "ohwi_rows"]


def conv_ohwi_enabled() -> bool:
    """Whether ``TILECRAFT_TC_CONV_OHWI`` leaves the OHWI weights on (unset or not ``0``)."""
    return os.environ.get("TILECRAFT_TC_CONV_OHWI", "1").strip() not in ("0", "false", "off")


def ohwi_rows(channels: int, kh: int, kw: int) -> bool:
    """Whether an OHWI weight of ``channels`` input channels and a ``kh x kw`` window is read
    by the tensor-core GEMM as rows (``match_fp16_gemm``'s ``a_mode`` ``"rows"``): a window
    larger than 1 x 1 and channels a multiple of 16.

    >>> ohwi_rows(64, 3, 3), ohwi_rows(3, 7, 7), ohwi_rows(64, 1, 1)
    (True, False, False)
    """
    return kh * kw > 1 and channels % 16 == 0


class ConvWeightOHWI(Pass):
    """Store the constant weights of the float16 NCHW convolutions the tensor-core GEMM
    takes as OHWI (see the module docstring).

    Parameters
    ----------
    target : Target | str
        The target; without ``tensor_cores`` the module is left as it is.
    enabled : bool | None
        False leaves every convolution as it is; None (the default) reads
        ``TILECRAFT_TC_CONV_OHWI``.

    Examples
    --------
    >>> new_mod = ConvWeightOHWI("opencl -device=nvidia")(mod)    # doctest: +SKIP
    """

    name = "ConvWeightOHWI"

    def __init__(self, target: "Target | str", enabled: bool | None = None):
        self.target = target if isinstance(target, Target) else Target(target)
        self.enabled = conv_ohwi_enabled() if enabled is None else bool(enabled)

    def transform_module(self, mod: IRModule) -> IRModule:
        if self.target.tensor_cores is None or not self.enabled:
            return mod
        return _Rewrite(mod).visit_module()


class _Rewrite(ExprMutator):
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, Op) or call.op.name != "relax.nn.conv2d" or \
                not self.builder.building:
            return call
        return self.conv2d(call) or call

    @staticmethod
    def conv2d(call: Call) -> Expr | None:
        a = call.attr_dict
        data, weight = call.args
        if not isinstance(weight, Constant) or a["groups"] != 1 or \
                a["data_layout"] != "NCHW" or a["out_layout"] != "NCHW" or \
                a["kernel_layout"] != "OIHW":
            return None
        dsi = data.struct_info
        w = np.asarray(weight.data)
        if w.dtype != np.float16 or w.ndim != 4 or not isinstance(dsi, TensorStructInfo) or \
                dsi.dtype != "float16":
            return None
        o, c, kh, kw = w.shape
        if not ohwi_rows(c, kh, kw):
            return None
        ohwi = Constant(np.ascontiguousarray(w.transpose(0, 2, 3, 1)))
        return Call(call.op, [data, ohwi], {**a, "kernel_layout": "OHWI"}, call.sinfo_args)
