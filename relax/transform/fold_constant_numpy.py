"""``FoldConstant``'s direct evaluation: operators on constants computed with numpy, without
legalizing them into a kernel and running it.

The imported networks fold the same few operators on their weights, thousands of times:
inference batch normalization's per-channel scale and shift (``rsqrt``, ``multiply``,
``subtract``, ``add``, ``reshape``), transposes and reshapes of weights. Legalizing each one
into a TensorIR kernel and running it (interpreted or compiled) took ResNet-50's first
``FoldConstant`` 0.68 CPU s; numpy takes a few milliseconds.

Only operators whose numpy result has the same bits as their kernel's are evaluated here:
data movement (``reshape``, ``permute_dims``, ``expand_dims``, ``squeeze``), and
``add``, ``subtract``, ``multiply``, ``divide``, ``negative``, ``sqrt`` and ``rsqrt`` on
float32 / float64 (IEEE operations, correctly rounded in numpy and in the code generator,
which neither contracts ``a * b + c`` into a fused multiply-add nor reassociates;
``rsqrt(x)`` is ``1 / sqrt(x)`` in both). Everything else -- integer arithmetic, float16,
transcendental functions, casts -- takes the kernel path. A result whose shape or dtype is
not the call's ``struct_info`` is not used (the kernel path decides).

Examples
--------
>>> import numpy as np
>>> from tilecraft import relax
>>> c = relax.const(np.full(3, 4.0, "float32"))
>>> evaluate_op(relax.op.rsqrt(c)).data
array([0.5, 0.5, 0.5], dtype=float32)
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from tilecraft.tensorir.expr import IntImm

from ..expr import Call, Constant, ShapeExpr
from ..struct_info import TensorStructInfo

__all__ = ["evaluate_op", "NUMPY_OPS"]

_FLOATS = (np.dtype("float32"), np.dtype("float64"))


def _rsqrt(x: np.ndarray) -> np.ndarray:
    # as the code generator and tensorir.interpret: 1 / sqrt(x), each step rounded
    return np.reciprocal(np.sqrt(x))


_FLOAT_UNARY: dict[str, Callable] = {
    "relax.negative": np.negative,
    "relax.sqrt": np.sqrt,
    "relax.rsqrt": _rsqrt,
}
_FLOAT_BINARY: dict[str, Callable] = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
}


def _float_operands(call: Call, arity: int) -> list[np.ndarray] | None:
    if len(call.args) != arity or not all(isinstance(a, Constant) for a in call.args):
        return None
    arrays = [a.data for a in call.args]
    if any(x.dtype not in _FLOATS or x.dtype != arrays[0].dtype for x in arrays):
        return None
    return arrays


def _unary(fn: Callable) -> Callable[[Call], np.ndarray | None]:
    def run(call: Call):
        xs = _float_operands(call, 1)
        if xs is None:
            return None
        with np.errstate(all="ignore"):    # inf / nan as the kernel computes them
            return fn(xs[0])
    return run


def _binary(fn: Callable) -> Callable[[Call], np.ndarray | None]:
    def run(call: Call):
        xs = _float_operands(call, 2)
        if xs is None:
            return None
        with np.errstate(all="ignore"):
            return fn(xs[0], xs[1])
    return run


def _static_values(shape: ShapeExpr) -> list[int] | None:
    if not all(isinstance(d, IntImm) for d in shape.values):
        return None
    return [int(d.value) for d in shape.values]


def _reshape(call: Call):
    if len(call.args) != 2 or not isinstance(call.args[0], Constant) or \
            not isinstance(call.args[1], ShapeExpr):
        return None
    shape = _static_values(call.args[1])
    return None if shape is None else call.args[0].data.reshape(shape)


def _single_constant(call: Call) -> np.ndarray | None:
    if len(call.args) != 1 or not isinstance(call.args[0], Constant):
        return None
    return call.args[0].data


def _permute_dims(call: Call):
    x = _single_constant(call)
    if x is None:
        return None
    axes = call.attr_dict.get("axes")
    return np.transpose(x, None if axes is None else tuple(int(a) for a in axes))


def _expand_dims(call: Call):
    # the output's rank and static shape decide where the new unit dims go: checked below
    x = _single_constant(call)
    out = call.struct_info
    if x is None or not isinstance(out, TensorStructInfo) or out.static_shape() is None:
        return None
    return x.reshape(out.static_shape()) if x.size == int(np.prod(out.static_shape())) else None


_squeeze = _expand_dims   # both only insert or remove unit dims: a reshape to the output


NUMPY_OPS: dict[str, Callable[[Call], np.ndarray | None]] = {
    **{name: _unary(fn) for name, fn in _FLOAT_UNARY.items()},
    **{name: _binary(fn) for name, fn in _FLOAT_BINARY.items()},
    "relax.reshape": _reshape,
    "relax.permute_dims": _permute_dims,
    "relax.expand_dims": _expand_dims,
    "relax.squeeze": _squeeze,
}


def evaluate_op(call: Call) -> Constant | None:
    """``call`` (an operator on constants) evaluated with numpy, or None where numpy's result
    could differ from the operator's kernel, or the arguments are not all constants.

    Parameters
    ----------
    call : Call
        A call of a Relax operator (``relax.add``, ...), its struct info deduced.

    Returns
    -------
    Constant | None
        The result, of the call's static shape and dtype, or None (fold it with the kernel).

    Examples
    --------
    >>> import numpy as np
    >>> from tilecraft import relax
    >>> a = relax.const(np.ones((2, 3), "float32"))
    >>> evaluate_op(relax.op.add(a, a)).data.tolist()
    [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]
    """
    run = NUMPY_OPS.get(getattr(call.op, "name", None))
    out_si = call.struct_info
    if run is None or not isinstance(out_si, TensorStructInfo):
        return None
    shape = out_si.static_shape()
    if shape is None:
        return None
    try:
        value = run(call)
    except (ValueError, TypeError):   # a shape numpy does not accept: the kernel path reports it
        return None
    if value is None:
        return None
    value = np.asarray(value)
    if value.shape != shape or str(value.dtype) != out_si.dtype:
        return None
    return Constant(value)
