"""The CPU kernel library: one module per kernel family, each holding the family's plan (its tile
for a given operator and target), its TE compute, its weight packing and its schedule, and
registered in one table keyed by the family's rule name (``KERNELS``).

``relax.transform.AlterLayout`` puts the families' kernels in place of ``conv2d``, ``matmul``,
``linear`` and pooling on CPU targets (asking the plans which kernel and tile),
``relax.transform.ConvertLayout`` and ``relax.tune_layouts`` ask the convolution plans, and
``relax.default_schedules`` schedules each block that carries a rule with the schedule the
table holds for it (``KERNELS.schedule_of``); blocks without one get its generic rules.

Layout::

    relax/backend/cpu/
      registry.py          KernelFamily, KernelRegistry, SCHEDULE_RULE, block_rule
      params.py            cpu_tile_params (lanes, vector registers), num_cores
      geometry.py          ConvGeometry, conv2d_geometry (of a relax call), integer helpers
      padding.py           the padding stages (RULE_PAD) and their schedule
      schedule_utils.py    schedule helpers shared with relax.default_schedules
      conv2d_strategy.py   which convolution family runs a convolution; plans as JSON
      dense.py             dense / GEMV on panels           tilecraft.dense_packed
      dense_int8.py        uint8 x int8 dense, int32 acc    tilecraft.dense_u8i8
      dense_amx.py         its schedule on Intel AMX tiles  (same rule)
      conv2d_int8.py       uint8 x int8 NCHW conv, int32    tilecraft.conv2d_nchw_u8i8
      depthwise_int8.py    uint8 x int8 depthwise NCHW      (conv2d_nchw's flat kernel)
      dense_int4.py        int4 weight-only dense / GEMV    tilecraft.dense_q4
      conv2d_nchw.py       NCHW, flat positions in lanes    tilecraft.conv2d_nchw_flat
      conv2d_nchw_cvec.py  NCHW, channels in lanes          tilecraft.conv2d_nchw_cvec
      conv2d_nhwc.py       NHWC, pixels x channels          tilecraft.conv2d_nhwc_packed
      winograd.py          Winograd F(2x2, 3x3), NHWC       tilecraft.winograd_gemm
      pool2d.py            separable NCHW pooling           tilecraft.pool2d_separable
      depthwise.py         depthwise NCHW over padded rows  tilecraft.depthwise_rows
      depthwise_nhwc.py    depthwise NHWC, channels in lanes  tilecraft.depthwise_nhwc_rows

Adding a kernel family means adding one module and one registration. The depthwise family,
for example: ``depthwise.py`` defines its rule names, a plan (``depthwise_rows_applies(g,
target)``: strided depthwise layers on x86), the TE compute (``depthwise_conv2d_nchw_rows``,
whose main block carries ``{SCHEDULE_RULE: RULE_DW}``), its schedule
(``schedule_depthwise_rows(sch, block, target, gemv_rows=None)``) and its record::

    FAMILY = KernelFamily(
        name="depthwise_rows", rule=RULE_DW, plan=depthwise_rows_applies,
        compute=depthwise_conv2d_nchw_rows, pack=None, schedule=schedule_depthwise_rows,
        stages={RULE_DW_ROWS: None})

and ``KERNELS`` below lists ``depthwise.FAMILY``. ``AlterLayout.conv2d`` then emits the compute
where the plan says so; ``default_schedules`` needs no change.

Examples
--------
>>> KERNELS.family("tilecraft.conv2d_nchw_flat").name
'conv2d_nchw_flat'
>>> sorted(f.name for f in KERNELS.families())[:3]
['conv2d_nchw_cvec', 'conv2d_nchw_flat', 'conv2d_nchw_u8i8']
"""
from . import (conv2d_int8, conv2d_nchw, conv2d_nchw_cvec, conv2d_nhwc, conv2d_strategy, dense,
               dense_amx, dense_int4, dense_int8, depthwise, depthwise_int8, depthwise_nhwc, pool2d,
               winograd)
from .geometry import ConvGeometry, conv2d_geometry
from .params import cpu_tile_params, num_cores
from .registry import SCHEDULE_RULE, KernelFamily, KernelRegistry, block_rule

__all__ = ["KERNELS", "KernelFamily", "KernelRegistry", "SCHEDULE_RULE", "block_rule",
           "ConvGeometry", "conv2d_geometry", "cpu_tile_params", "num_cores",
           # the family modules, and the choice among the convolution families
           "dense", "conv2d_nchw", "conv2d_nchw_cvec", "conv2d_nhwc", "winograd", "pool2d",
           "depthwise", "depthwise_nhwc", "conv2d_strategy", "dense_int8", "dense_amx", "dense_int4",
           "conv2d_int8", "depthwise_int8"]

KERNELS = KernelRegistry([
    dense.FAMILY,
    conv2d_nchw.FAMILY,
    conv2d_nchw_cvec.FAMILY,
    conv2d_nhwc.FAMILY,
    winograd.FAMILY,
    pool2d.FAMILY,
    depthwise.FAMILY,
    depthwise_nhwc.FAMILY,
    dense_int8.FAMILY,
    dense_int4.FAMILY,
    conv2d_int8.FAMILY,
])
