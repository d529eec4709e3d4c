"""``FuseExpandDepthwise``: an inverted-residual block's expansion (1x1 convolution, bias,
clip) and the depthwise convolution that reads it as one CPU kernel
(``backend.cpu.depthwise_nhwc.expand_depthwise_nhwc``), so the expanded tensor, the largest
of the block, is never written to memory.

The ONNX and ``torch.export`` imports of MobileNet-V2 write the pair, once ``ConvertLayout``
has made it NHWC, as::

    e = conv2d(x, W1)                        # 1x1, NHWC, no padding, no groups
    e = add(e, b1)                           # a constant bias, (C,) or (1, 1, 1, C)
    e = relu6(e) | clip(e, lo, hi) | minimum(maximum(e, lo), hi)
    y = conv2d(e, W2, groups=C)              # depthwise, padded, NHWC

The pass replaces ``y`` by a ``call_tir`` of the fused kernel on ``x``, the two weights
packed (``conv2d_nhwc.pack_conv2d_nhwc_weight``, kernels ``FoldConstant`` runs) and ``b1``;
the depthwise layer's own epilogue still fuses into it (``FuseOps``). It applies where
``expand_depthwise.expand_depthwise_applies`` says (an expanded image of at least
``FUSE_MIN_IMAGE_BYTES``: MobileNet-V2's 112 x 112 and 56 x 56 blocks), every step of the
chain float32 and used by the next step alone; anything else stays as it is. CPU targets
only (``get_pipeline``: before ``AlterLayout``); the pass ends with ``DeadCodeElimination``.

Examples
--------
>>> new_mod = FuseExpandDepthwise("llvm")(mod)    # doctest: +SKIP
>>> # lv3 = R.call_tir(conv2d_nhwc, (x, lv1, b1, lv2), out_sinfo=R.Tensor((n, 56, 56, 96)))
"""
from __future__ import annotations

import numpy as np

from tilecraft.targets import Target
from tilecraft.tensorir.function import IRModule

from ..analysis import udchain
from ..backend.cpu import conv2d_geometry, conv2d_nhwc, conv2d_strategy, cpu_tile_params
from ..backend.cpu import depthwise_nhwc, expand_depthwise
from ..expr import Call, Constant, Expr, Function, Var
from ..op.base import Op, OpPattern
from .base import ExprMutator, Pass
from .dead_code_elimination import DeadCodeElimination

__all__ = ["FuseExpandDepthwise"]


class FuseExpandDepthwise(Pass):
    """Fuse a 1x1 expansion (bias, clip) into the depthwise convolution reading it, on CPU
    targets (see the module docstring).

    Parameters
    ----------
    target : Target | str | None
        The target (its vector lanes and registers set both layers' tiles); targets other
        than ``llvm`` leave the module as it is.

    Examples
    --------
    >>> new_mod = FuseExpandDepthwise("llvm")(mod)   # doctest: +SKIP
    """

    name = "FuseExpandDepthwise"

    def __init__(self, target: "Target | str | None" = None):
        self.target = target if isinstance(target, Target) else Target(target or "llvm")

    def transform_module(self, mod: IRModule) -> IRModule:
        if self.target.kind != "llvm":
            return mod
        uses: dict[int, int] = {}
        for _, func in mod.functions.items():
            if isinstance(func, Function):
                for var, users in udchain(func).items():
                    uses[id(var)] = len(users)
        return DeadCodeElimination()(_Fuser(mod, self.target, uses).visit_module())


def _op_name(e) -> str | None:
    return e.op.name if isinstance(e, Call) and isinstance(e.op, Op) else None


def _scalar(e) -> float | None:
    if isinstance(e, Constant) and e.data.size == 1:
        return float(e.data.reshape(-1)[0])
    return None


class _Fuser(ExprMutator):
    def __init__(self, mod: IRModule, target: Target, uses: dict[int, int]):
        super().__init__(mod)
        self.target = target
        self.uses = uses
        self.lanes, self.registers = cpu_tile_params(target)

    def _single(self, e) -> Call | None:
        """The value bound to ``e`` when ``e`` is a variable used once, else None."""
        if not isinstance(e, Var) or self.uses.get(id(e), 0) != 1:
            return None
        v = self.builder.lookup_binding(e)
        return v if isinstance(v, Call) else None

    def _activation(self, e) -> tuple[Expr, float | None, float | None] | None:
        """``(input, lo, hi)`` of a clip-like call bound to ``e`` (used once)."""
        call = self._single(e)
        name = _op_name(call)
        if name == "relax.nn.relu6":
            return call.args[0], 0.0, 6.0
        if name == "relax.clip":
            a = call.attr_dict
            lo, hi = a.get("min"), a.get("max")
            if not all(v is None or isinstance(v, (int, float)) for v in (lo, hi)):
                return None
            return call.args[0], None if lo is None else float(lo), \
                None if hi is None else float(hi)
        if name == "relax.minimum" and _scalar(call.args[1]) is not None:
            inner = self._single(call.args[0])
            if _op_name(inner) == "relax.maximum" and _scalar(inner.args[1]) is not None:
                return inner.args[0], _scalar(inner.args[1]), _scalar(call.args[1])
        return None

    def _bias(self, e, channels: int) -> tuple[Call, np.ndarray] | None:
        """``(the convolution, the bias as (C,))`` of ``add(conv, b)`` bound to ``e``."""
        call = self._single(e)
        if _op_name(call) != "relax.add":
            return None
        for conv, b in (call.args, call.args[::-1]):
            if isinstance(b, Constant) and b.data.dtype == np.float32 and \
                    b.data.size == channels and b.data.shape[-1] == channels:
                inner = self._single(conv)
                if _op_name(inner) == "relax.nn.conv2d":
                    return inner, b.data.reshape(channels)
        return None

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if _op_name(call) != "relax.nn.conv2d" or not self.builder.building:
            return call
        return self.fuse(call) or call

    def fuse(self, call: Call) -> Expr | None:
        dw = conv2d_geometry(call)
        a = call.attr_dict
        if dw is None or a["data_layout"] != "NHWC" or not dw.is_depthwise or \
                call.struct_info.dtype != "float32":
            return None
        act = self._activation(call.args[0])
        if act is None:
            return None
        pre, lo, hi = act
        found = self._bias(pre, dw.in_channels)
        if found is None:
            return None
        conv, bias = found
        e = conv2d_geometry(conv)
        if e is None or conv.attr_dict["data_layout"] != "NHWC" or \
                conv.struct_info.dtype != "float32" or \
                not expand_depthwise.expand_depthwise_applies(e, dw):
            return None
        plan1 = expand_depthwise.plan_expand(e, self.lanes, self.registers)
        plan2 = conv2d_strategy.nhwc_kernel_plan(dw, self.lanes, self.registers)
        if not isinstance(plan2, conv2d_nhwc.NhwcPlan) or \
                not depthwise_nhwc.depthwise_nhwc_applies(plan2):
            return None
        w1 = self.builder.emit(self.kernel(
            conv2d_nhwc.pack_conv2d_nhwc_weight, conv.args[1], conv.attr_dict["kernel_layout"],
            plan1.width, name="pack_conv2d_nhwc_weight", pattern=OpPattern.INJECTIVE))
        w2 = self.builder.emit(self.kernel(
            conv2d_nhwc.pack_conv2d_nhwc_weight, call.args[1], a["kernel_layout"], plan2.width,
            name="pack_conv2d_nhwc_weight", pattern=OpPattern.INJECTIVE))
        return self.kernel(depthwise_nhwc.expand_depthwise_nhwc, conv.args[0], w1,
                           Constant(bias), w2, plan1, plan2, lo, hi, "float32",
                           name="conv2d_nhwc_expand", pattern=OpPattern.OUT_EWISE_FUSABLE)

    def kernel(self, te_func, *args, name: str, pattern: int, **kwargs) -> Call:
        """``call_te`` of ``te_func`` with the kernel's ``"op_pattern"`` set."""
        return self.builder.call_te_kernel(te_func, *args, name=name, pattern=pattern, **kwargs)
