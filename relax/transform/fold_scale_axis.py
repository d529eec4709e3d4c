"""``FoldScaleAxis``: fold a constant per-channel scale after a convolution or dense layer into
its constant weights (the backward half of TVM's ``FoldScaleAxis``; onnxruntime's Conv +
BatchNormalization fusion).

``multiply(conv2d(x, W), s)`` becomes ``conv2d(x, W * s)`` when ``W`` and ``s`` are constants,
``s`` varies only along the output's channel axis, and the convolution's result has no other
use; ``multiply(add(conv2d(x, W), b), s)`` becomes ``add(conv2d(x, W * s), b * s)``. The same
for ``matmul(x, W)`` and ``linear(x, W, b)`` with a scale along the last axis. The new weights
are computed here, at build time, in float64 and stored in the weight's dtype.

After ``DecomposeOpsForInference`` and ``FoldConstant``, an inference batch norm after a
convolution is ``add(multiply(conv, scale), shift)``: this pass leaves
``add(conv2d(x, W * scale), shift)``, a convolution with a bias.

Examples
--------
>>> # lv = R.nn.conv2d(x, metadata[0]); lv1 = R.multiply(lv, metadata[1])
>>> # becomes  lv1 = R.nn.conv2d(x, metadata[2])       (metadata[2] = metadata[0] * scale)
>>> # new_mod = FoldScaleAxis()(mod)
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir.function import IRModule

from ..analysis import free_vars
from ..expr import Call, Constant, Expr, Function, SeqExpr, Var, const
from ..op import add
from ..op.base import Op
from ..struct_info import TensorStructInfo
from .base import ExprMutator, Pass

__all__ = ["FoldScaleAxis"]

_FOLDABLE = ("relax.nn.conv2d", "relax.matmul", "relax.linear")


class FoldScaleAxis(Pass):
    """Fold constant per-channel scales into the constant weights of conv2d / matmul / linear.

    Examples
    --------
    >>> new_mod = FoldScaleAxis()(mod)   # doctest: +SKIP
    """

    name = "FoldScaleAxis"

    def transform_module(self, mod: IRModule) -> IRModule:
        return _ScaleFolder(mod).visit_module()


def _use_counts(func: Function) -> dict[int, int]:
    counts: dict[int, int] = {}
    body = func.body
    if not isinstance(body, SeqExpr):
        return counts
    for blk in body.blocks:
        for b in blk.bindings:
            for v in free_vars(b.value):
                counts[id(v)] = counts.get(id(v), 0) + 1
    for v in free_vars(body.body):
        counts[id(v)] = counts.get(id(v), 0) + 1
    return counts


def _op_name(e) -> str | None:
    return e.op.name if isinstance(e, Call) and isinstance(e.op, Op) else None


def _channel_vector(scale: np.ndarray, out_ndim: int, axis: int, channels: int):
    """``scale`` as a vector over the ``channels`` of ``axis`` when it broadcasts to an
    ``out_ndim``-D output varying only along that axis (numpy broadcasting), else None."""
    if scale.ndim > out_ndim:
        return None
    shape = (1,) * (out_ndim - scale.ndim) + scale.shape
    for k, d in enumerate(shape):
        if k != axis and d != 1:
            return None
        if k == axis and d not in (1, channels):
            return None
    vec = scale.reshape(shape)
    vec = vec.reshape(-1) if shape[axis] == channels else np.full(channels, vec.reshape(-1)[0])
    return vec.astype(np.float64)


class _ScaleFolder(ExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.uses: dict[int, int] = {}

    def visit_function_root(self, name, func):
        self.uses = _use_counts(func)
        return super().visit_function_root(name, func)

    def used_once(self, v) -> bool:
        return isinstance(v, Var) and self.uses.get(id(v), 0) == 1

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if _op_name(call) != "relax.multiply" or not self.builder.building:
            return call
        a, b = call.args
        for prod, scale in ((a, b), (b, a)):
            if isinstance(scale, Constant) and self.used_once(prod):
                new = self.fold(prod, scale.data)
                if new is not None:
                    return new
        return call

    def fold(self, prod: Var, scale: np.ndarray) -> Expr | None:
        value = self.builder.lookup_binding(prod)
        bias = None
        if _op_name(value) == "relax.add":
            x, y = value.args
            for c, bv in ((x, y), (y, x)):
                if isinstance(bv, Constant) and self.used_once(c) and \
                        _op_name(self.builder.lookup_binding(c)) in _FOLDABLE:
                    bias, value = bv, self.builder.lookup_binding(c)
                    break
            else:
                return None
        if _op_name(value) not in _FOLDABLE or not isinstance(value.args[1], Constant):
            return None
        if not isinstance(value.struct_info, TensorStructInfo) or value.struct_info.ndim < 1:
            return None
        new = self.scaled(value, scale)   # None unless the scale varies along channels only
        if new is None:
            return None
        if bias is None:
            return new
        conv_var = self.builder.emit(new)
        scaled_bias = (bias.data.astype(np.float64) * scale.astype(np.float64))
        return add(conv_var, const(scaled_bias.astype(bias.data.dtype)))

    def scaled(self, call: Call, scale: np.ndarray) -> Call | None:
        """``call`` (conv2d / matmul / linear) with its weight multiplied by ``scale`` along
        the output channels, or None when ``scale`` does not vary along them only."""
        name = call.op.name
        w = call.args[1].data
        ndim = call.struct_info.ndim
        if name == "relax.nn.conv2d":
            a = call.attr_dict
            axis = a["out_layout"].index("C")
            o_axis = a["kernel_layout"].index("O")
        elif name == "relax.matmul":
            if w.ndim != 2:
                return None
            axis, o_axis = ndim - 1, 1
        else:
            if w.ndim != 2 or len(call.args) > 2:
                return None   # linear with a bias: the bias would need scaling too
            axis, o_axis = ndim - 1, 0
        vec = _channel_vector(scale, ndim, axis, w.shape[o_axis])
        if vec is None:
            return None
        shape = [1] * w.ndim
        shape[o_axis] = w.shape[o_axis]
        new_w = (w.astype(np.float64) * vec.reshape(shape)).astype(w.dtype)
        args = list(call.args)
        args[1] = const(new_w)
        return Call(call.op, args, call.attrs, call.sinfo_args)
