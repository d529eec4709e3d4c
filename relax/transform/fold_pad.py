"""``FoldPad``: fold an explicit ``pad`` into the convolution or pooling that reads it.

Exports of TensorFlow-style models pad explicitly (``Pad`` with the computed "same" widths
before each strided convolution: HF's MobileNet-V2, EfficientNet); the padded copy is one more
pass over the image and the convolution then runs on an unpadded, odd-sized input.
``conv2d(pad(x, widths), W, padding=p)`` becomes ``conv2d(x, W, padding=p + widths)`` when the
pad is constant with value 0, widens only the convolution's spatial dims and crops nothing.
The same for pooling, as far as it keeps the semantics:

- ``max_pool2d``: only a pad value of ``-inf`` (or the dtype's lowest value), which never wins
  a window's max (the pooling's own padding is ignored);
- ``avg_pool2d``: only a zero pad, into a pooling that counts the padding
  (``count_include_pad=True``), or one with no padding of its own (it then counts the folded
  zeros: ``count_include_pad`` becomes True);
- ``ceil_mode`` poolings are left alone (their last window is placed relative to the data).

Reflect and edge pads, nonzero constants into a convolution, and pads with negative widths
(crops) stay as they are. A pad of all-zero widths is its input. The ``pad`` itself stays
where it has other uses (dead otherwise: the pass ends with ``DeadCodeElimination``).

Examples
--------
>>> # lv = R.pad(x, pad_width=[0, 0, 0, 0, 0, 1, 0, 1])
>>> # lv1 = R.nn.conv2d(lv, w, strides=2, groups=32)
>>> # becomes  lv1 = R.nn.conv2d(x, w, strides=2, padding=[0, 0, 1, 1], groups=32)
>>> # new_mod = FoldPad()(mod)
"""
from __future__ import annotations

import math

from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.function import IRModule

from ..expr import Call, Expr, Var
from ..op.base import Op
from .base import ExprMutator, Pass
from .dead_code_elimination import DeadCodeElimination

__all__ = ["FoldPad"]

_CONV = "relax.nn.conv2d"
_MAX_POOL = "relax.nn.max_pool2d"
_AVG_POOL = "relax.nn.avg_pool2d"


class FoldPad(Pass):
    """Fold constant ``pad`` into the padding of the ``conv2d`` / ``max_pool2d`` /
    ``avg_pool2d`` that reads it, where that keeps the result; drop pads of zero widths.

    Examples
    --------
    >>> new_mod = FoldPad()(mod)   # doctest: +SKIP
    """

    name = "FoldPad"

    def transform_module(self, mod: IRModule) -> IRModule:
        # the folded pads are dead now: drop them here, before the layout passes see them
        return DeadCodeElimination()(_PadFolder(mod).visit_module())


def _op_name(e) -> str | None:
    return e.op.name if isinstance(e, Call) and isinstance(e.op, Op) else None


def _pairs(pad: Call) -> list[tuple[int, int]]:
    w = pad.attr_dict["pad_width"]
    return [(int(w[2 * d]), int(w[2 * d + 1])) for d in range(len(w) // 2)]


def _lowest(dtype: str) -> float:
    """The lowest finite value of a float dtype (a max-pool pad at or below it never wins);
    ``-inf`` for a dtype not listed (only a ``-inf`` pad folds then)."""
    return {"float16": -65504.0, "float32": -3.4028234663852886e38,
            "float64": -1.7976931348623157e308}.get(dtype, -math.inf)


def spatial_widths(pad: Call, layout: str) -> tuple[int, ...] | None:
    """The pad's widths as a consumer's ``padding`` (``(top, left, bottom, right)``) in
    ``layout`` (``NCHW``, ``NHWC``, ...), or None when it pads the batch or channels or crops.

    Examples
    --------
    >>> from tilecraft.relax import Var, TensorStructInfo
    >>> from tilecraft.relax.op import pad
    >>> x = Var("x", TensorStructInfo((1, 8, 9, 9), "float32"))
    >>> spatial_widths(pad(x, [0, 0, 0, 0, 0, 1, 0, 1]), "NCHW")
    (0, 0, 1, 1)
    """
    pairs = _pairs(pad)
    if len(pairs) != len(layout) or any(b < 0 or a < 0 for b, a in pairs):
        return None
    if any(pairs[i] != (0, 0) for i, c in enumerate(layout) if c not in "HW"):
        return None
    h, w = pairs[layout.index("H")], pairs[layout.index("W")]
    return (h[0], w[0], h[1], w[1])


def fold_into(consumer: Call, pad: Call) -> Call | None:
    """``consumer`` (conv2d / max_pool2d / avg_pool2d of ``pad``'s result) reading ``pad``'s
    input with the pad added to its own padding, or None when that would change the result."""
    name = _op_name(consumer)
    attrs = consumer.attr_dict
    if pad.attr_dict["pad_mode"] != "constant":
        return None
    value = float(pad.attr_dict["pad_value"])
    layout = attrs["data_layout"] if name == _CONV else attrs["layout"]
    widths = spatial_widths(pad, layout)
    if widths is None:
        return None
    new = dict(attrs)
    if name == _CONV:
        if value != 0.0:
            return None
    elif name == _MAX_POOL:
        dtype = consumer.args[0].struct_info.dtype
        if not dt.is_float(dtype) or not (value == -math.inf or value <= _lowest(dtype)):
            return None
        if attrs["ceil_mode"]:
            return None
    elif name == _AVG_POOL:
        if value != 0.0 or attrs["ceil_mode"]:
            return None
        if not attrs["count_include_pad"] and any(attrs["padding"]):
            return None    # its own padding is not counted, the folded zeros would be
        new["count_include_pad"] = True
    else:
        return None
    new["padding"] = tuple(int(p) + w for p, w in zip(attrs["padding"], widths))
    args = [pad.args[0]] + list(consumer.args[1:])
    return Call(consumer.op, args, new, consumer.sinfo_args)


class _PadFolder(ExprMutator):
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not self.builder.building:
            return call
        name = _op_name(call)
        if name == "relax.pad":
            if all(b == 0 and a == 0 for b, a in _pairs(call)):
                return call.args[0]
            return call
        if name not in (_CONV, _MAX_POOL, _AVG_POOL) or not isinstance(call.args[0], Var):
            return call
        pad = self.builder.lookup_binding(call.args[0])
        if _op_name(pad) != "relax.pad":
            return call
        folded = fold_into(call, pad)
        return call if folded is None else folded
