"""``DecomposeOpsForInference``: rewrite inference-mode operators that have a cheaper
elementwise form (TVM's pass of the same name).

``relax.nn.batch_norm(x, gamma, beta, mean, var, training=False)`` normalizes with the moving
statistics, which makes it a per-channel scale and shift::

    scale = gamma / sqrt(var + epsilon)          # (C,)
    shift = beta - mean * scale                  # (C,)
    out   = x * reshape(scale) + reshape(shift)  # reshaped to broadcast along the channel axis

and the tuple ``(out, mean, var)`` becomes ``relax.Tuple([out, mean, var])``, so
``bn[0]`` folds to ``out``. As a ``batch_norm`` kernel it was a ``COMM_REDUCE`` call behind a
``TupleGetItem``, which ended every fusion group; as a multiply and an add it is an
elementwise epilogue that ``FuseOps`` fuses into the convolution before it (and, with constant
statistics, ``FoldConstant`` computes ``scale`` and ``shift`` at build time and
``FoldScaleAxis`` folds the scale into the convolution's weights). Training-mode batch norms
(batch statistics) are left as they are.

Examples
--------
>>> # bn = R.nn.batch_norm(x, g, b, m, v, axis=1); y = bn[0]
>>> # becomes  s = g * rsqrt(v + 1e-5); t = b - m * s;  y = x * reshape(s, (C, 1, 1)) + reshape(t, ...)
>>> # new_mod = DecomposeOpsForInference()(mod)
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir.function import IRModule

from ..expr import Call, Expr, Tuple, const
from ..op import add, multiply, reshape, rsqrt, subtract
from ..op.base import Op
from ..struct_info import TensorStructInfo
from .base import ExprMutator, Pass

__all__ = ["DecomposeOpsForInference"]


class DecomposeOpsForInference(Pass):
    """Decompose inference ``batch_norm`` into a per-channel scale and shift.

    Examples
    --------
    >>> new_mod = DecomposeOpsForInference()(mod)   # doctest: +SKIP
    """

    name = "DecomposeOpsForInference"

    def transform_module(self, mod: IRModule) -> IRModule:
        return _Decomposer(mod).visit_module()


class _Decomposer(ExprMutator):
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if isinstance(call.op, Op) and call.op.name == "relax.nn.batch_norm" and \
                self.builder.building:
            return self.batch_norm(call) or call
        return call

    def batch_norm(self, call: Call) -> Expr | None:
        a = call.attr_dict
        if a.get("training"):
            return None
        x, gamma, beta, mean, var = call.args
        si = x.struct_info
        if not isinstance(si, TensorStructInfo) or si.ndim < 1:
            return None
        axis = a["axis"] + si.ndim if a["axis"] < 0 else a["axis"]
        dtype = si.dtype
        emit = self.builder.emit
        inv = emit(rsqrt(emit(add(var, const(np.array(a["epsilon"], dtype))))))
        scale = emit(multiply(gamma, inv)) if a.get("scale", True) else inv
        shifted = emit(multiply(mean, scale))
        shift = emit(subtract(beta, shifted)) if a.get("center", True) else \
            emit(subtract(const(np.array(0, dtype)), shifted))
        # (C,) -> (C, 1, ..., 1): broadcasts along ``axis`` of x
        trailing = si.ndim - 1 - axis
        if trailing:
            c = mean.struct_info.shape[0] if mean.struct_info.shape is not None else -1
            shape = (c,) + (1,) * trailing
            scale = emit(reshape(scale, shape))
            shift = emit(reshape(shift, shape))
        out = emit(add(emit(multiply(x, scale)), shift))
        return Tuple([out, mean, var])
