"""Helpers of the search / cost-model tests: a small GEMM workload, a random schedule generator
for it that does not depend on the design-space rules, and measurement of candidates."""
from __future__ import annotations

import numpy as np

from tilecraft import targets
from tilecraft.tensorir import Schedule, ScheduleError, te


def gemm_func(m: int = 128, n: int = 128, k: int = 128, dtype: str = "float32"):
    """``C = A @ B``; ``m`` may be a symbolic var."""
    A = te.placeholder((m, k), dtype, "A")
    B = te.placeholder((k, n), dtype, "B")
    r = te.reduce_axis((0, k), "k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), "C")
    return te.create_prim_func([A, B, C])


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def random_gemm_schedule(func, rng: np.random.Generator) -> Schedule:
    """A random but valid tiling of the GEMM block "C": 3-level tiles of i and j, 2-level k,
    one of a few loop orders, optional local accumulator, vectorize / unroll / parallel."""
    while True:
        sch = Schedule(func)
        try:
            b = sch.get_block("C")
            i, j, k = sch.get_loops(b)
            ext = [int(sch.get(l).extent.value) for l in (i, j, k)]

            def tile(n, parts, inner_choices):
                # inner factors first; small ones keep the unrolled code (and its build) small
                out = []
                rest = n
                for p in range(parts - 1):
                    ds = [d for d in _divisors(rest) if d <= 64]
                    if p == 0:
                        ds = [d for d in ds if d in inner_choices] or [1]
                    d = int(rng.choice(ds))
                    out.append(d)
                    rest //= d
                return [rest] + out[::-1]

            ti = tile(ext[0], 3, inner_choices={1, 2, 4, 8})
            tj = tile(ext[1], 3, inner_choices={1, 4, 8, 16, 32})
            tk = tile(ext[2], 2, inner_choices={1, 2, 4, 8, 16, 32})
            i0, i1, i2 = sch.split(i, ti)
            j0, j1, j2 = sch.split(j, tj)
            k0, k1 = sch.split(k, tk)
            order = int(rng.integers(0, 3))
            if order == 0:
                sch.reorder(i0, j0, k0, i1, j1, k1, i2, j2)
            elif order == 1:
                sch.reorder(i0, j0, i1, j1, k0, k1, i2, j2)
            else:
                sch.reorder(i0, j0, k0, k1, i1, j1, i2, j2)
            if rng.random() < 0.5:
                acc = sch.cache_write(b, 0, "local")
                sch.reverse_compute_at(acc, j1 if order == 1 else j0)
            if rng.random() < 0.6:
                sch.decompose_reduction(b, k0)
            if rng.random() < 0.8 and tj[2] > 1:
                sch.vectorize(j2)
            if rng.random() < 0.5 and ti[2] > 1:
                sch.unroll(i2)
            if rng.random() < 0.7:
                sch.parallel(sch.fuse(i0, j0))
            return sch
        except ScheduleError:
            continue


def measure_candidate(sch: Schedule, args, target="llvm", number: int = 5) -> float:
    """Seconds per call of the scheduled function (checked against numpy first)."""
    mod = targets.build(sch.mod, target)
    a, b, c = args
    c[...] = 0
    mod["main"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-3)
    ev = mod.time_evaluator("main", targets.cpu(0), number=number, repeat=3)
    return float(min(ev(a, b, c).results))


def small_space():
    """A CPU design space with short unrolling and small inner tiles: candidates build in a
    fraction of a second, so tuning tests take seconds."""
    from tilecraft.metaschedule import (AutoInline, MultiLevelTiling, ParallelVectorizeUnroll,
                              ReuseConfig, SpaceGenerator)
    return SpaceGenerator(rules=[
        AutoInline(),
        MultiLevelTiling("SSRSRS", max_innermost_factor=16,
                         reuse_write=ReuseConfig("may", (1, 2), "local")),
        ParallelVectorizeUnroll(max_jobs_per_core=16, max_vectorize_extent=16,
                                unroll_max_steps=(0, 16)),
    ])
