"""The int8 dense kernel (``dense_int8``, rule ``RULE_DENSE_U8I8``) on Intel AMX tiles.

Chosen by ``dense_int8``'s schedule where the target has ``amx-int8`` (``Target.amx_int8``:
the host when its CPU has it, ``-mattr=+amx-int8``; ``-mattr=-amx-int8`` turns it off) and
the panel width is a multiple of 16 (every AVX-512 panel). The operands keep the VNNI kernel's
layouts, padded along K to whole 64-byte tiles (``amx_words``; ``AlterOpImpl`` packs them so):
the activations' rows of words are A tiles (16 rows x 64 bytes), and each 16-word step of a
weight panel ``[K/4, NR]`` is a B tile per 16 columns (16 rows of K-quads x 64 bytes).

The schedule (ordinary primitives, one trace that replays): panels outermost (parallel), then
blocks of ``ROWS`` = 32 rows; per block, the ``32 x NR`` int32 accumulators on the stack
(``cache_write``) are zeroed (the reduction's init, ``decompose_reduction``), the block's
product is tensorized with the intrinsic ``amx_u8s8s32_32x{NR}x{K}``
(``tensorir.schedule.intrinsics.amx_funcs``): one ``AMX_U8I8`` call (``targets.llvm.amx``)
adds the whole reduction to them — per pair of 16-column tiles, 2 x 2 C tiles in the tile
registers across all of K, stored once — and the write-back computes the fused epilogue
(dequantize, bias, GELU, residual) from them, vectorized. The last block of a symbolic or
ragged row count is a partial tile of the intrinsic (it passes its row count, 1..32); a ragged
last panel of columns is computed whole into accumulators padded to whole panels
(``transform_layout``). ``tensorir.interpret`` runs the scheduled kernel (the AMX call in
numpy), and the tuner searches such kernels (``metaschedule``'s ``MultiLevelTilingAMX``).
The symbolic small version of a layer (``gemv_rows``) and fewer than ``AMX_MIN_ROWS``
constant rows keep the VNNI kernels.

Examples
--------
>>> amx_words(768), amx_words(70)
(192, 32)
"""
from __future__ import annotations

from tilecraft.targets import Target
from tilecraft.tensorir.expr import AMX_U8I8, Call
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.schedule.index_map import IndexMap
from tilecraft.tensorir.schedule.intrinsics import amx_name

from .geometry import ceil_div
from .params import num_cores
from .schedule_utils import ann_int, finish_tile_block, fuse_epilogue, loop_extent, tile_tail

__all__ = ["ROWS", "AMX_MIN_ROWS", "amx_applies", "amx_words", "schedule_dense_amx", "uses_amx"]

ROWS = 32          # rows of a block: two 16-row tiles
AMX_MIN_ROWS = 16  # fewer constant rows keep the VNNI kernel (a symbolic count takes AMX)


def amx_applies(target: Target, width: int) -> bool:
    """Whether ``dense_int8``'s kernel with panels of ``width`` columns runs on AMX tiles.

    Examples
    --------
    >>> amx_applies(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids"), 64)
    True
    >>> amx_applies(Target("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell"), 64)
    False
    """
    return target.amx_int8 and width % 16 == 0


def amx_words(k: int) -> int:
    """The words (4 bytes each) of a ``k``-long reduction padded to whole 64-byte tiles."""
    return 16 * ceil_div(ceil_div(k, 4), 16)


def uses_amx(func) -> bool:
    """Whether the scheduled ``func`` calls the AMX block kernel (a block tensorized with
    ``amx_u8s8s32_*``).

    Examples
    --------
    >>> uses_amx(te.create_prim_func([te.placeholder((4,), "float32", "x")]))   # doctest: +SKIP
    False
    """
    found = []
    post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, Call) and
                     n.op == AMX_U8I8 else None)
    return bool(found)


def schedule_dense_amx(sch: Schedule, name: str, target: Target) -> None:
    """Schedule the ``dense_u8i8`` block ``name`` on AMX tiles (see the module docstring)."""
    block = sch.get_block(name)
    width = ann_int(sch.get(block), "width")
    *lead, i, j, k = sch.get_loops(block)
    k_words = loop_extent(sch.get(k))
    n = loop_extent(sch.get(j))
    if k_words is None or k_words % 16 or width % 16 or n is None:
        raise ValueError(f"{name}: the AMX kernel needs K in whole 16-word tiles and panels "
                         f"of whole 16 columns (K words {k_words}, panel {width}, N {n})")
    jo, ji = sch.split(j, [None, width])
    io, ii = sch.split(i, [None, ROWS])
    sch.reorder(jo, *lead, io, ii, ji, k)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, io)
    fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(block, ii)
    outer = len(sch.get_loops(init)) - 2
    finish_tile_block(sch, init, outer)
    # the write-back's rows stay a loop: the accumulators are in memory (not registers) here,
    # and 32 unrolled rows of a GELU epilogue made a 200 KB kernel that ran from beyond L1i
    sch.vectorize(tile_tail(sch, acc, outer)[-1])
    panels = loop_extent(sch.get(jo)) or 1
    if panels >= 2 * num_cores(target) or (loop_extent(sch.get(io)) or 2) < 2:
        sch.parallel(jo)
    else:
        sch.parallel(io)
    if n % width:
        # the tile product computes the last panel's columns whole: its accumulators get a
        # scratch padded to whole panels (the padding is written, never read)
        ndim = len(lead) + 2
        sch.transform_layout(block, 0, IndexMap.from_func(
            lambda *idx: (*idx[:-1], idx[-1] // width, idx[-1] % width), ndim=ndim))
    # the block's ROWS x width x K product is one call of the AMX block kernel (a ragged last
    # block of rows passes its row count: the intrinsic's partial tile)
    sch.tensorize(ii, amx_name(ROWS, width, 4 * k_words))
