"""Object detection: NonMaxSuppression (a number of results that depends on the data).

Per batch and class, the boxes are ordered by score (``relax.topk`` of every element: ties in
index order, as ONNX's reference), then one serial pass keeps each box whose score passes the
threshold and whose IoU with every box kept so far is at most ``iou_threshold``, up to
``max_output_boxes_per_class``. The number kept is a fresh symbolic dim (``true_positions``'
way: a count, then ``match_cast``), and a second pass writes the ``[batch, class, box]`` rows
in order. The arithmetic of the IoU test follows the reference (same operations, same order),
so boxes at the threshold are decided the same way.
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir.expr import FloatImm, IntImm, Max, Min, Var as TirVar
from tilecraft.tensorir.stmt import (Block, BlockRealize, Buffer, BufferRegion, BufferStore, For,
                                     IfThenElse, Range, seq)

from .... import op as _op
from ....expr import TupleGetItem, const
from ....op.helpers import call_prim, make_prim_func
from ....struct_info import TensorStructInfo
from ..registry import ConversionError, converter
from .common import cast, static_int

_I64 = "int64"


def _full(buf):
    return BufferRegion(buf, [Range(IntImm(0, _I64), d) for d in buf.shape])


def _corners(box, center: bool, f: str):
    """(y_min, y_max, x_min, x_max) of a box (loads of its 4 coordinates)."""
    if center:   # [x_center, y_center, width, height]
        two = FloatImm(2.0, f)
        w, h = box(2) / two, box(3) / two
        return box(1) - h, box(1) + h, box(0) - w, box(0) + w
    return Min(box(0), box(2)), Max(box(0), box(2)), Min(box(1), box(3)), Max(box(1), box(3))


def _suppresses(a, b, iou, center: bool, f: str):
    """Whether boxes ``a`` and ``b`` overlap by more than ``iou`` (ONNX's reference test)."""
    ay0, ay1, ax0, ax1 = _corners(a, center, f)
    by0, by1, bx0, bx1 = _corners(b, center, f)
    ix0, ix1 = Max(ax0, bx0), Min(ax1, bx1)
    iy0, iy1 = Max(ay0, by0), Min(ay1, by1)
    zero = FloatImm(0.0, f)
    inter = (ix1 - ix0) * (iy1 - iy0)
    area_a = (ax1 - ax0) * (ay1 - ay0)
    area_b = (bx1 - bx0) * (by1 - by0)
    union = area_a + area_b - inter
    return (ix1 > ix0) & (iy1 > iy0) & (inter > zero) & (area_a > zero) & (area_b > zero) & \
        (union > zero) & (inter / union > iou)


@converter("NonMaxSuppression", family="detection",
           doc="boxes kept per batch and class by score and IoU (a number of results that "
               "depends on the data)")
def _nms(ctx, node):
    boxes, scores = ctx.input(node, 0), ctx.input(node, 1)
    bs, ss = ctx.shape(boxes), ctx.shape(scores)
    if len(bs) != 3 or len(ss) != 3 or static_int(bs[2]) not in (4, None):
        raise ConversionError(f"NonMaxSuppression: boxes must be [batches, boxes, 4] and scores "
                              f"[batches, classes, boxes], got {bs} and {ss}")
    f = ctx.dtype(boxes)
    center = bool(node.attr("center_point_box", 0))

    def scalar_input(i, dtype: str, default):
        """Optional input ``i`` as a 1-element tensor, or ``default`` when absent or empty."""
        if node.has_input(i):
            t = ctx.input(node, i)
            shape = ctx.shape(t)
            if not (len(shape) == 1 and static_int(shape[0]) == 0):
                return cast(ctx, ctx.emit(_op.reshape(t, (1,))), dtype), True
        return const(np.array([default], dtype=dtype)), False
    max_out, _ = scalar_input(2, _I64, 0)
    iou, _ = scalar_input(3, f, 0.0)
    score_thr, filtered = scalar_input(4, f, 0.0)
    nb, nc, n = ss
    # boxes of each (batch, class) by score, best first
    order = ctx.emit(_op.topk(scores, 0, -1, "both", True, _I64))
    sorted_scores = ctx.emit(TupleGetItem(order, 0))
    sorted_index = ctx.emit(TupleGetItem(order, 1))

    # pass 1: the boxes kept, per (batch, class), and how many
    B = Buffer("boxes", tuple(bs), f)
    SV = Buffer("sorted_scores", tuple(ss), f)
    SI = Buffer("sorted_index", tuple(ss), _I64)
    MX, IOU, ST = Buffer("max_out", (1,), _I64), Buffer("iou", (1,), f), Buffer("thr", (1,), f)
    KEPT = Buffer("kept", tuple(ss), _I64)
    CNT = Buffer("count", (nb, nc), _I64)
    OK = Buffer("ok", (nb, nc), _I64)       # scratch: the candidate survives so far
    b, c, j, s = (TirVar(v, _I64) for v in "bcjs")
    zero, one = IntImm(0, _I64), IntImm(1, _I64)
    cand = SI[b, c, j]

    def box_of(idx):
        return lambda k: B[b, idx, IntImm(k, _I64)]
    # (nested ifs: the kept boxes past the count are not read)
    check = For(s, 0, n, "serial", IfThenElse(s < CNT[b, c], IfThenElse(
        _suppresses(box_of(cand), box_of(KEPT[b, c, s]), IOU[zero], center, f),
        BufferStore(OK, zero, (b, c)))))
    passes = CNT[b, c] < Max(MX[zero], zero)
    if filtered:
        passes = passes & (SV[b, c, j] > ST[zero])
    step = IfThenElse(passes, seq(
        BufferStore(OK, one, (b, c)), check,
        IfThenElse(OK[b, c] == one, seq(BufferStore(KEPT, cand, (b, c, CNT[b, c])),
                                         BufferStore(CNT, CNT[b, c] + 1, (b, c))))))
    body = For(b, 0, nb, "serial", For(c, 0, nc, "serial", seq(
        BufferStore(CNT, zero, (b, c)),
        For(j, 0, n, "serial", BufferStore(KEPT, zero, (b, c, j))),
        For(j, 0, n, "serial", step))))
    block = Block("nms", [], [_full(x) for x in (B, SV, SI, MX, IOU, ST)],
                  [_full(x) for x in (KEPT, CNT, OK)], body)
    func = make_prim_func([B, SV, SI, MX, IOU, ST, KEPT, CNT, OK], BlockRealize([], None, block),
                     "nms")
    res = ctx.emit(call_prim(ctx.bb, func, "nms",
                             [boxes, sorted_scores, sorted_index, max_out, iou, score_thr],
                             [TensorStructInfo(tuple(ss), _I64), TensorStructInfo((nb, nc), _I64),
                              TensorStructInfo((nb, nc), _I64)]), "nms")
    kept, count = ctx.emit(TupleGetItem(res, 0)), ctx.emit(TupleGetItem(res, 1))

    # pass 2: the rows [batch, class, box], batches then classes, best first
    flat = ctx.emit(_op.reshape(count, (-1,)))
    total = ctx.emit(_op.sum(flat, keepdims=True))
    (m,) = ctx.runtime_dims(total, "selected")
    offsets = ctx.emit(_op.reshape(ctx.emit(_op.cumsum(flat, axis=0, exclusive=True)), (nb, nc)))
    K, C2, OFF = Buffer("kept", tuple(ss), _I64), Buffer("count", (nb, nc), _I64), \
        Buffer("offsets", (nb, nc), _I64)
    OUT = Buffer("selected", (m, 3), _I64)
    row = OFF[b, c] + s
    write = For(b, 0, nb, "serial", For(c, 0, nc, "serial", For(s, 0, n, "serial", IfThenElse(
        s < C2[b, c], seq(BufferStore(OUT, b, (row, zero)), BufferStore(OUT, c, (row, one)),
                          BufferStore(OUT, K[b, c, s], (row, IntImm(2, _I64))))))))
    block = Block("nms_rows", [], [_full(x) for x in (K, C2, OFF)], [_full(OUT)], write)
    func = make_prim_func([K, C2, OFF, OUT], BlockRealize([], None, block), "nms_rows")
    return call_prim(ctx.bb, func, "nms_rows", [kept, count, offsets],
                     TensorStructInfo((m, 3), _I64))
