"""Dense layers on packed weights (rule ``RULE_DENSE``): ``matmul(x, W)`` / ``linear`` with ``W``
packed into panels ``[ceil(N/NR), K, NR]`` (the ``[n // 16, k, 16]`` packing of the GEMM recipe,
``docs/gemm-tutorial.md``), zero-padded to whole panels; an ``MR x NR`` register tile, or a
``1 x NR`` row-vector tile for few rows.

- plan: ``dense_panel_width``;
- weight packing: ``pack_dense_weight``;
- compute: ``dense_packed``;
- schedule: ``schedule_dense``.

Examples
--------
>>> dense_panel_width(768, 16, 32), dense_panel_width(10, 16, 32)
(64, 16)
"""
from __future__ import annotations

from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import PrimExpr
from tilecraft.tensorir.schedule import Schedule

from .geometry import as_int, ceil_div
from .params import num_cores
from .registry import SCHEDULE_RULE, KernelFamily
from .schedule_utils import (MIN_PARALLEL_WORK, MR, SYMBOLIC_EXTENT, ann_int,
                             finish_tile_block, fuse_epilogue, loop_extent, loop_nodes, loop_work)

__all__ = ["RULE_DENSE", "dense_panel_width", "pack_dense_weight", "dense_packed",
           "schedule_dense", "FAMILY"]

RULE_DENSE = "tilecraft.dense_packed"


def dense_panel_width(n: int, lanes: int, registers: int) -> int:
    """The panel width ``NR`` for ``N`` output columns: 4 vectors with 32 vector registers (the
    6 x 64 tile of the GEMM recipe), 2 with 16; narrower for small ``N``.

    Examples
    --------
    >>> dense_panel_width(768, 16, 32), dense_panel_width(10, 16, 32)
    (64, 16)
    """
    vectors = 4 if registers >= 32 else 2
    while vectors > 1 and n < vectors * lanes:
        vectors //= 2
    return vectors * lanes


def pack_dense_weight(weight: te.Tensor, width: int, transpose: bool = False) -> te.Tensor:
    """``weight`` ``[K, N]`` (``[N, K]`` with ``transpose``, as ``linear`` stores it) as panels
    ``[ceil(N/NR), K, NR]``, zero beyond ``N``.

    Examples
    --------
    >>> w = te.placeholder((768, 3072), "float32", "w")
    >>> [d.value for d in pack_dense_weight(w, 64).shape]
    [48, 768, 64]
    """
    k, n = (weight.shape[1], weight.shape[0]) if transpose else weight.shape
    n_int = as_int(n)
    zero = te.const(0, weight.dtype)

    def f(jb, kk, r):
        j = jb * width + r
        v = weight[j, kk] if transpose else weight[kk, j]
        return v if n_int % width == 0 else te.if_then_else(j < n_int, v, zero)

    return te.compute((ceil_div(n_int, width), k, width), f, "weight_packed")


def dense_packed(data: te.Tensor, weight: te.Tensor, out_features: int,
                 out_dtype: str) -> te.Tensor:
    """``data @ W`` for ``data`` ``(..., M, K)`` and ``W`` packed ``[ceil(N/NR), K, NR]``
    (``pack_dense_weight``): ``(..., M, N)``, block ``dense`` (``dense_panel`` and a copy when
    ``N`` is narrower than one panel).

    Examples
    --------
    >>> x = te.placeholder((te.var("n"), 768), "float32", "x")
    >>> w = te.placeholder((12, 768, 64), "float32", "w")
    >>> [str(d) for d in dense_packed(x, w, 768, "float32").shape]
    ['n', '768']
    """
    nr = as_int(weight.shape[2])
    k = te.reduce_axis((0, data.shape[-1]), "k")
    lead = len(data.shape) - 1

    def f(*idx):
        j = idx[-1]
        v = data[tuple(idx[:lead]) + (k.var,)].astype(out_dtype)
        return te.sum(v * weight[j // nr, k, j % nr].astype(out_dtype), axis=k)

    attrs = {SCHEDULE_RULE: RULE_DENSE, "width": nr}
    if out_features >= nr:
        return te.compute(tuple(data.shape[:-1]) + (out_features,), f, "dense", attrs=attrs)
    # narrower than one panel (a classifier's 10 outputs): the tile computes the whole
    # (zero-padded) panel into an intermediate, so its accumulators are a dense rows x NR block
    # (a tile clipped to 10 of 16 lanes would overlap its rows and stay in memory)
    full = te.compute(tuple(data.shape[:-1]) + (nr,), f, "dense_panel", attrs=attrs)
    return te.compute(tuple(data.shape[:-1]) + (out_features,), lambda *i: full[i], "dense")


def schedule_dense(sch: Schedule, name: str, target: Target,
                   gemv_rows: PrimExpr | None = None) -> bool:
    """``x @ W`` on panels ``[N/NR, K, NR]``: an ``MR x NR`` register tile (6 x 64 with
    AVX-512: 24 accumulators, four vector loads of one contiguous panel run and six broadcasts
    per step of ``k``), panels outermost and parallel so that a panel stays in cache while the
    row tiles stream over it, the epilogue computed in the write-back. Few rows (at most
    ``default_schedules.GEMV_MAX_ROWS``, static, or the symbolic ``gemv_rows`` of the small
    version) run a row at a time on a ``1 x NR`` tile with the rows outside the reduction,
    nothing masked. Returns whether the block took that row-vector version for ``gemv_rows``."""
    block = sch.get_block(name)
    blk = sch.get(block)
    width = ann_int(blk, "width")
    loops = sch.get_loops(block)
    *lead, i, j, k = loops
    ei = loop_extent(sch.get(i))
    gemv = gemv_rows is not None and ei is None and bool(sch.get(i).extent == gemv_rows)
    jo, ji = sch.split(j, [None, width])
    mr = MR if target.vector_width >= 512 or target.arch in ("aarch64", "arm") else 4
    if gemv:
        io, ii = None, i
        order = [jo] + lead + [i, k, ji]
        tile_loop = i
    else:
        if ei is None:
            io, ii = sch.split(i, [None, mr])
        elif ei > mr:
            d = max(f for f in range(1, mr + 1) if ei % f == 0)
            io, ii = sch.split(i, [None, d if d >= (mr + 1) // 2 else mr])
        else:
            io, ii = None, i
        order = [jo] + lead + ([io] if io is not None else []) + [k, ii, ji]
        tile_loop = io if io is not None else (lead[-1] if lead else jo)
    sch.reorder(*order)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, tile_loop)
    fuse_epilogue(sch, acc)
    init = sch.decompose_reduction(block, k)
    if not gemv:
        sch.unroll(ii)
    sch.vectorize(ji)
    outer = len(sch.get_loops(init)) - (1 if gemv else 2)
    finish_tile_block(sch, init, outer)
    finish_tile_block(sch, acc, outer)
    # parallel: the panels when there are enough of them, else the row tiles
    panels = loop_extent(sch.get(jo)) or 1
    rows_work = loop_work(loop_nodes(sch, lead + ([io] if io is not None else [])))
    if panels * rows_work * width * (loop_extent(sch.get(k)) or SYMBOLIC_EXTENT) < \
            16 * MIN_PARALLEL_WORK:
        return gemv
    if panels >= 2 * num_cores(target) or (io is None and not lead):
        sch.parallel(jo)
    elif io is not None:
        sch.parallel(io)
    else:
        sch.parallel(jo)
    return gemv


FAMILY = KernelFamily(
    name="dense", rule=RULE_DENSE, plan=dense_panel_width, compute=dense_packed,
    pack=pack_dense_weight, schedule=schedule_dense, tile=True)
