"""The steps of ``docs/gemm-tutorial.md``, measured: from the naive GEMM loop to the fast one.

``python -m benchmarks.gemm_steps [SIZE]`` (default 1024) builds the GEMM ``C = A @ B`` once per
step, checks it against numpy, times it interleaved with numpy's ``a @ b`` (the protocol of
``benchmarks/gemm_cpu.py``) and prints a table (GFLOP/s of each, their ratio); the rows are also
written to ``benchmarks/results/gemm_steps/<machine>.json``. Each ``step_*`` function below is the
schedule the tutorial shows, so the numbers there can be reproduced.
``python -m benchmarks.gemm_steps [SIZE] --tiles`` compares register tiles on one thread.

The schedules build on one another:

0. ``naive``: the loops ``te`` makes (``i, j, k``); ``B`` is read down a column.
1. ``reorder_vectorize``: ``i, k, j`` with ``j`` vectorized: contiguous rows of ``B`` and ``C``.
2. ``tiling``: ``MR x NR`` tiles of ``C`` with ``k`` outside the tile, so a tile of ``C`` stays
   in L1 while ``k`` sweeps (but it is still loaded and stored every ``k``).
3. ``packing``: ``B`` packed into ``NR``-wide panels, read contiguously.
4. ``micro_kernel``: register blocking: the tile's accumulators in a ``local`` buffer (registers),
   init out of the ``k`` loop, rows unrolled: the BLAS micro-kernel (one core).
5. ``parallel``: the same on every core: ``schedule_gemm``, the final schedule.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from tilecraft import targets
from tilecraft.tensorir import Schedule

from .common import ensure_clean_openblas_env, print_table, write_results
from .gemm_cpu import measure
from .schedules.gemm import GemmConfig, default_config, matmul_func, schedule_gemm

MR, NR = 6, 64   # the tile of steps 2-4 (the final schedule takes default_config's)


def step_naive(sch: Schedule) -> None:
    """Nothing: ``for i, j, k`` as ``te`` made it."""


def step_reorder_vectorize(sch: Schedule) -> None:
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    sch.reorder(i, k, j)          # B[k, j] and C[i, j] are now read along rows
    sch.vectorize(j)              # ... as vectors


def step_tiling(sch: Schedule) -> None:
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    io, ii = sch.split(i, [None, MR])
    jo, ji = sch.split(j, [None, NR])
    sch.reorder(jo, io, k, ii, ji)    # one MR x NR tile of C per (jo, io); k sweeps it
    sch.vectorize(ji)


def _pack_b(sch: Schedule, c) -> None:
    bp = sch.cache_read(c, 1, "global")                    # B_global = B ...
    sch.transform_layout(bp, ("write", 0), lambda k, n: [n // NR, k, n % NR])  # ... as panels
    k_ax, n_ax = sch.get_loops(bp)
    no, ni = sch.split(n_ax, [None, NR])
    sch.reorder(no, k_ax, ni)
    sch.vectorize(ni)


def step_packing(sch: Schedule) -> None:
    c = sch.get_block("C")
    _pack_b(sch, c)
    step_tiling(sch)


def step_micro_kernel(sch: Schedule) -> None:
    c = sch.get_block("C")
    _pack_b(sch, c)
    i, j, k = sch.get_loops(c)
    io, ii = sch.split(i, [None, MR])
    jo, ji = sch.split(j, [None, NR])
    sch.reorder(jo, io, k, ii, ji)
    acc = sch.cache_write(c, 0, "local")        # the tile's accumulators ...
    sch.reverse_compute_at(acc, io)             # ... written back once per tile
    init = sch.decompose_reduction(c, k)        # C_local = 0 before the k loop
    sch.unroll(ii)
    sch.vectorize(ji)
    for blk in (init, acc):
        loops = sch.get_loops(blk)
        sch.unroll(loops[-2])
        sch.vectorize(loops[-1])


def step_parallel(sch: Schedule) -> None:
    schedule_gemm(sch, "C", "llvm")


STEPS = [
    ("0 naive", step_naive),
    ("1 reorder + vectorize", step_reorder_vectorize),
    ("2 tiling", step_tiling),
    ("3 packing", step_packing),
    ("4 micro-kernel", step_micro_kernel),
    ("5 parallel (schedule_gemm)", step_parallel),
]


def run(size: int = 1024, rounds: int = 5) -> list[dict]:
    m = n = k = size
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.empty((m, n), np.float32)
    ref = a @ b
    flop = 2.0 * m * n * k
    rows = []
    for name, step in STEPS:
        sch = Schedule(matmul_func(m, n, k))
        step(sch)
        mod = targets.build(sch.mod, "llvm")
        f = mod["main"]
        t0 = time.perf_counter()
        f(a, b, c)
        once = time.perf_counter() - t0
        np.testing.assert_allclose(c, ref, rtol=2e-4, atol=2e-3 * np.sqrt(k))
        # the protocol of benchmarks/gemm_cpu.py (one call per round for the slow steps)
        t = measure(mod, (a, b, c), lambda: a @ b, once, rounds if once < 1 else 3,
                    back_to_back=False)
        rows.append({"step": name, "tilecraft_GFLOP/s": flop / t["ours"] / 1e9,
                     "numpy_GFLOP/s": flop / t["peer"] / 1e9, "ratio": t["peer"] / t["ours"]})
        print(f"{name:28s} {flop / t['ours'] / 1e9:8.1f} GFLOP/s   numpy "
              f"{flop / t['peer'] / 1e9:7.1f}", flush=True)
    return rows


TILES = [GemmConfig(mr=mr, nr=nr) for mr, nr in
         [(6, 64), (4, 64), (8, 32), (6, 32), (12, 32), (14, 32)]] + \
    [GemmConfig(mr=12, nr=32, pack_a=True), GemmConfig(mc=96)]


def run_tiles(size: int = 1024, repeats: int = 15) -> list[dict]:
    """``schedule_gemm`` with each of ``TILES`` on ONE thread: the best of ``repeats`` timings
    (the micro-kernel's own speed; the best, not the median, filters out other processes)."""
    m = n = k = size
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.empty((m, n), np.float32)
    ref = a @ b
    rows = []
    for cfg in TILES:
        sch = Schedule(matmul_func(m, n, k))
        schedule_gemm(sch, "C", "llvm", cfg)
        mod = targets.build(sch.mod, "llvm")
        mod["main"](a, b, c)
        np.testing.assert_allclose(c, ref, rtol=2e-4, atol=2e-3 * np.sqrt(k))
        mod.num_threads = 1
        res = mod.time_evaluator("main", targets.cpu(0), number=1, repeat=repeats)(a, b, c)
        extra = ", ".join(x for x in (f"mc={cfg.mc}" if cfg.mc else "",
                                      "pack A" if cfg.pack_a else "") if x)
        rows.append({"tile": f"{cfg.mr} x {cfg.nr}" + (f" ({extra})" if extra else ""),
                     "1-thread GFLOP/s": 2.0 * m * n * k / min(res.results) / 1e9})
        print(rows[-1], flush=True)
    return rows


def main(argv=None) -> int:
    ensure_clean_openblas_env()
    argv = list(sys.argv[1:] if argv is None else argv)
    tiles = "--tiles" in argv
    argv = [x for x in argv if x != "--tiles"]
    size = int(argv[0]) if argv else 1024
    if tiles:
        rows = run_tiles(size)
        print()
        print_table(rows, ["tile", "1-thread GFLOP/s"])
        return 0
    print(f"GEMM {size}^3 float32; default tile {default_config()}; steps 2-4 use "
          f"{GemmConfig(mr=MR, nr=NR)}")
    rows = run(size)
    print()
    print_table(rows, ["step", "tilecraft_GFLOP/s", "numpy_GFLOP/s", "ratio"])
    print(f"(written to {write_results('gemm_steps', rows, {'size': size})})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
