"""NCHW max / average pooling kernels: separable (rule ``RULE_POOL``: the window's rows reduced
first into one padded row, unit stride, then its columns read from that row) on x86, and on
the stride's phase planes elsewhere (``pool2d_nchw_phased``: every window tap a contiguous run;
its blocks take the padding stage's and the generic reduction schedules).

- plan: ``plan_pool2d`` (which kernel, if any, for a target and stride);
- compute: ``pool2d_nchw_separable`` (and ``pool2d_nchw_phased``); no weight;
- schedule: ``schedule_pool2d_separable`` (it places the row stage, ``RULE_POOL_ROWS``).

Examples
--------
>>> from tilecraft.targets import Target
>>> plan_pool2d(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"), (2, 2))
'separable'
>>> plan_pool2d(Target("llvm -mtriple=aarch64-linux-gnu"), (1, 1)) is None
True
"""
from __future__ import annotations

from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import PrimExpr, min_value
from tilecraft.tensorir.schedule import Schedule

from .geometry import as_int, ceil_div
from .padding import RULE_PAD, image_at, pad_image, schedule_pad
from .registry import SCHEDULE_RULE, KernelFamily
from .schedule_utils import block_lanes, rows_per_output_row

__all__ = ["RULE_POOL", "RULE_POOL_ROWS", "plan_pool2d", "pool2d_nchw_phased",
           "pool2d_nchw_separable", "schedule_pool2d_separable", "FAMILY"]

RULE_POOL = "tilecraft.pool2d_separable"        # the column stage of a separable pooling
RULE_POOL_ROWS = "tilecraft.pool2d_rows"        # its row stage, placed by RULE_POOL


def plan_pool2d(target: Target, strides) -> str | None:
    """Which kernel runs an NCHW max / average pooling with ``strides`` on ``target``:
    ``"separable"`` on x86 (``pool2d_nchw_separable``: the window's rows reduced first, unit
    stride, then its columns from that row, where a strided vector load is a wide load and a
    shuffle; ResNet-50's 3x3 stride-2 max pooling ran in 0.09 ms against 0.26 ms for the
    operator's kernel, which reads every tap as a masked stride-2 vector, and 0.10 ms for
    onnxruntime on Zen 4); elsewhere, with a stride above 1, ``"phased"``
    (``pool2d_nchw_phased``: no strided read at all, since masked and strided loads are
    emulated lane by lane there); None otherwise (the operator's own kernel).

    Examples
    --------
    >>> plan_pool2d(Target("llvm -mtriple=aarch64-linux-gnu"), (2, 2))
    'phased'
    """
    if target.arch == "x86_64":
        return "separable"
    return "phased" if tuple(strides) != (1, 1) else None


def _pool_input(data: te.Tensor, kind: str):
    """``(n, c, h, w, pad value)`` of NCHW ``data`` pooled by ``kind``: ``-inf`` (the dtype's
    lowest) pads a max pooling, 0 an average."""
    n, c, h, w = data.shape
    pad_value = min_value(data.dtype) if kind == "max" else te.const(0, data.dtype)
    return n, c, as_int(h), as_int(w), pad_value


def pool2d_nchw_phased(data: te.Tensor, kind: str, pool_size, strides, padding, out_h: int,
                       out_w: int) -> te.Tensor:
    """Max (``kind="max"``) or average (``"avg"``, divisor ``KH * KW``) pooling of NCHW
    ``data`` with a stride above 1: ``data_phases[n, c, a, b, i, j]`` holds the padded input's
    rows ``s i + a`` and columns ``s j + b`` (the pad value outside the image: ``-inf`` for
    max, 0 for the average), and ``out[n, c, y, x]`` reduces ``data_phases[n, c, ry % s,
    rx % s, y + ry // s, x + rx // s]`` over the window. Blocks ``data_pad`` (when there is
    padding; ``RULE_PAD``), ``data_phases`` (``RULE_PAD``) and ``pool2d``.

    Examples
    --------
    >>> x = te.placeholder((te.var("n"), 8, 11, 11), "float32", "x")
    >>> y = pool2d_nchw_phased(x, "max", (3, 3), (2, 2), (1, 1, 1, 1), 6, 6)
    >>> [str(d) for d in y.shape]
    ['n', '8', '6', '6']
    """
    n, c, h, w, pad_value = _pool_input(data, kind)
    (kh, kw), (sh, sw) = pool_size, strides
    hq = ceil_div((out_h - 1) * sh + kh, sh)
    wq = ceil_div((out_w - 1) * sw + kw, sw)
    # the padding (unit stride, vectorized), then the phase split (strided, no condition)
    padded = pad_image(data, padding, hq * sh, wq * sw, pad_value)
    dp = te.compute((n, c, sh, sw, hq, wq),
                    lambda b, ch, a, bb, i, j: padded[b, ch, i * sh + a, j * sw + bb],
                    "data_phases", attrs={SCHEDULE_RULE: RULE_PAD})
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")

    def tap(b, ch, y, x):
        return dp[b, ch, ry.var % sh, rx.var % sw, y + ry.var // sh, x + rx.var // sw]

    if kind == "max":
        return te.compute((n, c, out_h, out_w),
                          lambda b, ch, y, x: te.max(tap(b, ch, y, x), axis=[ry, rx]), "pool2d")
    total = te.compute((n, c, out_h, out_w),
                       lambda b, ch, y, x: te.sum(tap(b, ch, y, x), axis=[ry, rx]), "pool2d_sum")
    scale = te.const(1.0 / (kh * kw), data.dtype)
    return te.compute((n, c, out_h, out_w), lambda b, ch, y, x: total[b, ch, y, x] * scale,
                      "pool2d")


def pool2d_nchw_separable(data: te.Tensor, kind: str, pool_size, strides, padding, out_h: int,
                          out_w: int) -> te.Tensor:
    """Max (``kind="max"``) or average (``"avg"``, divisor ``KH * KW``) pooling of NCHW
    ``data`` as two passes: ``pool_rows[n, c, y, q]`` reduces the window's ``KH`` input rows
    of padded column ``q`` (every column of the padded row, unit stride), then
    ``pool2d[n, c, y, x]`` reduces ``pool_rows[n, c, y, x * sw + rx]`` over the window's
    ``KW`` columns. A window costs ``KH`` + ``KW`` operations instead of ``KH * KW``, and
    only the second pass reads with the stride, from a row the first pass just wrote. The
    pad value (``-inf`` for max, 0 for the average) is applied in the first pass, so the
    second has no condition. Blocks ``pool_rows`` (``RULE_POOL_ROWS``) and ``pool2d``
    (``RULE_POOL``: the default schedule computes one row of ``pool_rows`` per output row,
    see ``relax.default_schedules``).

    Examples
    --------
    >>> x = te.placeholder((te.var("n"), 8, 11, 11), "float32", "x")
    >>> y = pool2d_nchw_separable(x, "max", (3, 3), (2, 2), (1, 1, 1, 1), 6, 6)
    >>> [str(d) for d in y.shape]
    ['n', '8', '6', '6']
    """
    n, c, _, _, pad_value = _pool_input(data, kind)
    (kh, kw), (sh, sw) = pool_size, strides
    pt, pl = padding[0], padding[1]
    cols = (out_w - 1) * sw + kw          # the padded columns the windows read
    reduce = te.max if kind == "max" else te.sum
    ry = te.reduce_axis((0, kh), "ry")

    def rows(b, ch, y, q):
        return reduce(image_at(data, b, ch, y * sh + ry.var - pt, q - pl, pad_value),
                      axis=[ry])
    pooled_rows = te.compute((n, c, out_h, cols), rows, "pool_rows",
                             attrs={SCHEDULE_RULE: RULE_POOL_ROWS})
    rx = te.reduce_axis((0, kw), "rx")
    if kind == "max":
        def out(b, ch, y, x):
            return te.max(pooled_rows[b, ch, y, x * sw + rx.var], axis=[rx])
    else:
        scale = te.const(1.0 / (kh * kw), data.dtype)

        def out(b, ch, y, x):   # each tap scaled: one block, no separate division pass
            return te.sum(pooled_rows[b, ch, y, x * sw + rx.var] * scale, axis=[rx])
    return te.compute((n, c, out_h, out_w), out, "pool2d", attrs={SCHEDULE_RULE: RULE_POOL})


def schedule_pool2d_separable(sch: Schedule, name: str, target: Target,
                              gemv_rows: PrimExpr | None = None) -> None:
    """The two passes of ``pool2d_nchw_separable``: output rows ``(c, y)`` in parallel; per
    output row the row pass (``RULE_POOL_ROWS``) fills one padded row, then the column pass
    reads it back with the stride. In both, a vector of lanes is the register the window
    reduces into (the reduction loop outside the lanes, the init decomposed above it), so a
    window costs ``KH + KW`` vector operations and each output is stored once."""
    block = sch.get_block(name)
    *spatial, rx = sch.get_loops(block)
    lanes = block_lanes(sch.get(block), target)
    # before the column split: one padded row's region
    producer = rows_per_output_row(sch, block, RULE_POOL_ROWS, spatial[:-1])
    for blk in (block, producer):
        *_, col, red = sch.get_loops(blk)
        c0, c1 = sch.split(col, [None, lanes])
        sch.reorder(c0, red, c1)
        init = sch.decompose_reduction(blk, red)
        sch.vectorize(sch.get_loops(init)[-1])
        sch.vectorize(c1)


FAMILY = KernelFamily(
    name="pool2d_separable", rule=RULE_POOL, plan=plan_pool2d, compute=pool2d_nchw_separable,
    pack=None, schedule=schedule_pool2d_separable,
    stages={RULE_POOL_ROWS: None, RULE_PAD: schedule_pad})
