"""int8 depthwise NCHW convolutions (uint8 data, a constant int8 weight, int32 accumulators):
what ``relax.quantize``'s static mode and QDQ ONNX models make of MobileNet's depthwise layers.

A depthwise layer reduces over the window alone (one input channel per output channel), so
there are no four channels to pack into a ``dot4_u8i8`` word (``conv2d_int8`` needs input
channels per group divisible by 4). The kernel is instead the flat direct NCHW convolution of
``conv2d_nchw`` on the 8-bit operands: the weight packed as ``[O/R, 1, KH, KW, R]``
(``pack_conv2d_nchw_weight``, kept int8: a quarter of the float bytes), the uint8 image
zero-padded into the flat plane (uint8: a quarter of the float copy), and per tap one vector
of ``L`` output positions widened to int32 times the channel's tap broadcast, accumulated in
int32 registers (exact: ``KH * KW * 255 * 128`` fits easily). The plan, tile and schedule are
the float kernel's (``conv2d_nchw.plan_conv2d_nchw`` / ``schedule_conv2d_nchw``), and the
dequantizing epilogue (``(acc - zp * sum(W[o])) * scale``, bias, relu6, the next layer's
quantization: whatever ``FuseOps`` fuses) is computed in the copy to NCHW or the tile's
write-back, as for ``conv2d_int8``.

- plan: ``plan_depthwise_u8i8``;
- packing: ``conv2d_nchw.pack_conv2d_nchw_weight``;
- compute: ``depthwise_conv2d_nchw_u8i8``;
- schedule: ``conv2d_nchw.schedule_conv2d_nchw`` (the block's rule is ``RULE_CONV_NCHW``).

Examples
--------
>>> g = ConvGeometry(32, 112, 112, 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 32)
>>> plan_depthwise_u8i8(g, 16, 32).geometry.groups
32
"""
from __future__ import annotations

from tilecraft.tensorir import te

from .conv2d_nchw import NchwPlan, conv2d_nchw_packed, plan_conv2d_nchw
from .geometry import ConvGeometry

__all__ = ["plan_depthwise_u8i8", "depthwise_conv2d_nchw_u8i8"]


def plan_depthwise_u8i8(g: ConvGeometry, lanes: int, registers: int) -> NchwPlan | None:
    """The flat NCHW plan of the int8 depthwise convolution ``g`` (``lanes`` int32 lanes);
    None unless ``g`` is depthwise.

    Examples
    --------
    >>> g = ConvGeometry(8, 8, 8, 16, (3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    >>> plan_depthwise_u8i8(g, 16, 32) is None
    True
    """
    if not g.is_depthwise:
        return None
    return plan_conv2d_nchw(g, lanes, registers)


def depthwise_conv2d_nchw_u8i8(data: te.Tensor, weight: te.Tensor, plan: NchwPlan
                               ) -> te.Tensor:
    """The int32 depthwise convolution of uint8 NCHW ``data`` with the int8 weight packed as
    ``[O/R, 1, KH, KW, R]`` (``pack_conv2d_nchw_weight``): ``conv2d_nchw_packed`` with int32
    products of the widened bytes.

    Examples
    --------
    >>> g = ConvGeometry(16, 10, 10, 16, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 16)
    >>> p = plan_depthwise_u8i8(g, 16, 32)
    >>> x = te.placeholder((te.var("n"), 16, 10, 10), "uint8", "x")
    >>> w = te.placeholder((16 // p.oc_block, 1, 3, 3, p.oc_block), "int8", "w")
    >>> y = depthwise_conv2d_nchw_u8i8(x, w, p)
    >>> [str(d) for d in y.shape], y.dtype
    (['n', '16', '5', '5'], 'int32')
    """
    if data.dtype != "uint8" or weight.dtype != "int8":
        raise ValueError(f"depthwise_conv2d_nchw_u8i8: expected uint8 data and an int8 weight, "
                         f"got {data.dtype} and {weight.dtype}")
    return conv2d_nchw_packed(data, weight, plan, "int32")
