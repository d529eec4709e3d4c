"""What the CPU design space holds for a float32 GEMM (1024^3 by default), beside numpy.

The tuner can only find what its design space contains. This benchmark takes points of
``metaschedule.default_space("llvm")`` for a GEMM and times them side by side with numpy
(OpenBLAS):

* ``hand recipe``: ``benchmarks/schedules/gemm.py``'s ``schedule_gemm``, for reference;
* ``space: recipe 6xNR``: the micro-kernel space with the recipe's decisions (a 6 x 4-vector
  register tile, panels of B outermost, all row tiles in level 1, the whole k in level 0) --
  the same program (``tests/metaschedule/test_space_e2e.py`` checks that);
* ``space: 8xNR tensorized``: a tile that divides 1024, so ``RewriteTensorize`` computes it with
  the ``outer_product`` / ``fill_zero`` micro-kernels;
* ``space: random #k``: random samples of the micro-kernel space (what an untrained search
  starts from).

Run: ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m benchmarks.space_gemm [size]``
(or ``python -m benchmarks.run space_gemm``).
"""
from __future__ import annotations

import sys
import time

import numpy as np

from tilecraft import targets
from tilecraft.tensorir import Schedule

from benchmarks.common import ensure_clean_openblas_env, side_by_side
from benchmarks.schedules.gemm import default_config, matmul_func, schedule_gemm


def _micro_kernel_design(space, func, target):
    from tilecraft.metaschedule.schedule_rule.base import ANN_TENSORIZE
    return next(d for d in space.generate(func, target)
                if any(i.kind == "annotate" and i.inputs[1] == ANN_TENSORIZE
                       for i in d.trace.instructions))


def _with_decisions(design, M, N, K, mr, nr):
    trace = design.trace
    cats = [n for n, i in enumerate(trace.instructions) if i.kind == "sample_categorical"]
    tiles = [n for n, i in enumerate(trace.instructions) if i.kind == "sample_tile"]
    mrs, nrs = (trace.instructions[c].inputs[0] for c in cats[:2])
    trace = trace.with_decision(cats[0], mrs.index(mr)).with_decision(cats[1], nrs.index(nr))
    trace = trace.with_decision(tiles[0], [1, -(-M // mr), 1])
    trace = trace.with_decision(tiles[1], [N // nr, 1, 1])
    trace = trace.with_decision(tiles[2], [K, 1])
    return trace.with_decision(cats[2], 0)


def run(size: int = 1024, random_samples: int = 4) -> list[dict]:
    from tilecraft import metaschedule as ms
    target = targets.Target("llvm")
    M = N = K = size
    func = matmul_func(M, N, K)
    space = ms.default_space(target)
    design = _micro_kernel_design(space, func, target)
    nr = default_config(target).nr
    lanes = ms.SpaceContext(target).lanes()
    candidates = {}
    hand = Schedule(func)
    schedule_gemm(hand, "C", target)
    candidates["hand recipe (schedule_gemm)"] = hand
    candidates[f"space: recipe 6x{nr}"] = space.finish(
        _with_decisions(design, M, N, K, 6, nr), func, target)
    nr8 = 2 * lanes
    tens = space.finish(_with_decisions(design, M, N, K, 8, nr8), func, target)
    tag = "tensorized" if any(i.kind == "tensorize" for i in tens.trace.instructions) \
        else "not tensorized"
    candidates[f"space: 8x{nr8} {tag}"] = tens
    for k in range(random_samples):
        sch = space.sample(design, func, target, seed=100 + k)
        if sch is not None:
            candidates[f"space: random #{k}"] = sch
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (M, K)).astype("float32")
    b = rng.uniform(-1, 1, (K, N)).astype("float32")
    expected = a @ b
    flop = 2.0 * M * N * K
    rows = []
    for name, sch in candidates.items():
        t0 = time.perf_counter()
        lib = targets.build(sch.mod, target)
        build_s = time.perf_counter() - t0
        c = np.zeros((M, N), "float32")
        fn = lib["main"]
        fn(a, b, c)
        err = float(np.abs(c - expected).max())
        ours, peer = side_by_side(lambda: fn(a, b, c), lambda: np.matmul(a, b, out=expected),
                                  number=3, rounds=5)
        rows.append({"schedule": name, "gflops": round(flop / ours / 1e9, 1),
                     "numpy_gflops": round(flop / peer / 1e9, 1),
                     "ratio": round(peer / ours, 3), "build_s": round(build_s, 2),
                     "max_err": err})
    return rows


if __name__ == "__main__":
    ensure_clean_openblas_env()
    from benchmarks.common import print_table, write_results
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    rows = run(size)
    print_table(rows, list(rows[0]))
    print(f"(written to {write_results('space_gemm', rows)})")
