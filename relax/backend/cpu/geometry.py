"""The static description of a 2-D convolution (``ConvGeometry``) that the convolution families
plan their tiles from, read off a ``relax.nn.conv2d`` call (``conv2d_geometry``), and the
integer helpers the kernels size their buffers with.

Examples
--------
>>> g = ConvGeometry(in_channels=64, height=56, width=56, out_channels=64, kernel=(3, 3),
...                  strides=(2, 2), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1)
>>> (g.out_h, g.out_w, g.padded)
(28, 28, (58, 58))
"""
from __future__ import annotations

from dataclasses import dataclass

from tilecraft.tensorir.expr import IntImm

from ...expr import Call, Expr
from ...struct_info import TensorStructInfo

__all__ = ["ConvGeometry", "conv2d_geometry", "CPU_KERNEL_DTYPES", "static_shape", "static_ints", "as_int", "ceil_div",
           "divisors", "group_of"]


def ceil_div(a: int, b: int) -> int:
    """``a / b`` rounded up (``ceil_div(7, 2) == 4``)."""
    return -(-a // b)


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending (``divisors(6) == [1, 2, 3, 6]``)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def as_int(d) -> int:
    """The value of a static dimension (an ``int`` or ``IntImm``); ``ValueError`` for a
    symbolic one."""
    if isinstance(d, IntImm):
        return d.value
    if isinstance(d, int):
        return d
    raise ValueError(f"expected a static dimension, got {d!r}")


@dataclass(frozen=True)
class ConvGeometry:
    """The static attributes of one 2-D convolution (the batch may stay symbolic).

    ``padding`` is ``(top, left, bottom, right)``; ``kernel``, ``strides`` and ``dilation`` are
    ``(h, w)`` pairs.
    """

    in_channels: int
    height: int
    width: int
    out_channels: int
    kernel: tuple
    strides: tuple
    padding: tuple
    dilation: tuple
    groups: int

    @property
    def in_per_group(self) -> int:
        return self.in_channels // self.groups

    @property
    def out_per_group(self) -> int:
        return self.out_channels // self.groups

    @property
    def padded(self) -> tuple[int, int]:
        pt, pl, pb, pr = self.padding
        return self.height + pt + pb, self.width + pl + pr

    @property
    def out_h(self) -> int:
        return (self.padded[0] - self.dilation[0] * (self.kernel[0] - 1) - 1) // \
            self.strides[0] + 1

    @property
    def out_w(self) -> int:
        return (self.padded[1] - self.dilation[1] * (self.kernel[1] - 1) - 1) // \
            self.strides[1] + 1

    @property
    def is_depthwise(self) -> bool:
        return self.in_per_group == 1 and self.out_per_group == 1

    def macs(self) -> int:
        """Multiply-adds per image."""
        return (self.out_channels * self.out_h * self.out_w * self.in_per_group *
                self.kernel[0] * self.kernel[1])


def static_shape(e: Expr):
    """The shape of the tensor ``e`` (a tuple of ``tensorir`` expressions), or None when its
    struct info has none."""
    si = e.struct_info
    if not isinstance(si, TensorStructInfo) or si.shape is None:
        return None
    return si.shape


def static_ints(dims) -> list[int] | None:
    """``dims`` as ints when each is a constant, else None."""
    out = []
    for d in dims:
        if not isinstance(d, IntImm):
            return None
        out.append(d.value)
    return out


# (operand dtype, result dtype) of the convolutions and dense layers the CPU kernels run: float32,
# and float16 operands (half the bytes of weights and activations) accumulating in float32 or
# float16 (the kernels cast each product's operands to the result's dtype)
CPU_KERNEL_DTYPES = {("float32", "float32"), ("float16", "float32"), ("float16", "float16")}


def conv2d_geometry(call: Call, dtypes: tuple[str, str, str] | None = None,
                    mixed: bool = False) -> ConvGeometry | None:
    """The ``ConvGeometry`` of a ``relax.nn.conv2d`` call the CPU convolution families can run:
    data, weight and output of ``dtypes`` (``("uint8", "int8", "int32")`` for the int8
    family), or by default float32 (or float16 operands with a float32 or float16 result,
    ``CPU_KERNEL_DTYPES``), NCHW or NHWC data with the output in the same layout, static
    channels, image size and weight; None otherwise (and for what the operator's own checks
    report). With ``mixed``, also NCHW data with an NHWC output (the head convolution of
    ``ConvertLayout``'s NHWC chains).

    Examples
    --------
    >>> conv2d_geometry(call).kernel   # doctest: +SKIP
    (3, 3)
    """
    a = call.attr_dict
    data, weight = call.args
    layout, klayout = a["data_layout"], a["kernel_layout"]
    head = mixed and (layout, a["out_layout"]) == ("NCHW", "NHWC")
    if layout not in ("NCHW", "NHWC") or (a["out_layout"] != layout and not head):
        return None
    dsi, wsi = data.struct_info, weight.struct_info
    out_si = call.struct_info
    if not all(isinstance(s, TensorStructInfo) for s in (dsi, wsi, out_si)):
        return None
    if dtypes is None:
        if dsi.dtype != wsi.dtype or (dsi.dtype, out_si.dtype) not in CPU_KERNEL_DTYPES:
            return None
    elif (dsi.dtype, wsi.dtype, out_si.dtype) != tuple(dtypes):
        return None
    dshape, wshape = static_shape(data), static_shape(weight)
    if dshape is None or wshape is None or len(dshape) != 4 or len(wshape) != 4:
        return None
    dims = static_ints([dshape[layout.index(c)] for c in "CHW"])
    wdims = static_ints(wshape)
    if dims is None or wdims is None:
        return None
    c, h, w = dims
    kd = {ch: wdims[klayout.index(ch)] for ch in "OIHW"}
    g = ConvGeometry(in_channels=c, height=h, width=w, out_channels=kd["O"],
                     kernel=(kd["H"], kd["W"]), strides=tuple(a["strides"]),
                     padding=tuple(a["padding"]), dilation=tuple(a["dilation"]),
                     groups=a["groups"])
    if g.in_per_group != kd["I"] or g.out_h < 1 or g.out_w < 1:
        return None
    return g


def group_of(o, width: int, out_per_group: int):
    """The group of output channel ``o`` in a kernel whose tile holds ``width`` channels of
    one group: ``o // width * width // out_per_group``, which is constant over the tile's
    vector of channels (``o // out_per_group`` is the same value, but varies with ``o``'s
    lanes as far as the code generator can tell, so each lane's input was gathered: AlexNet's
    grouped 5x5 layer ran at 7.6 GFLOP/s)."""
    if out_per_group % width:
        return o // out_per_group
    return o // width * width // out_per_group
