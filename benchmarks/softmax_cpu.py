"""BERT's attention softmax alone on the CPU (``relax/backend/cpu/softmax.py``): the fused
kernel ``softmax(scores / 8 - 1)`` over ``(n, 4, s, s)``, built once with symbolic ``n`` and
``s`` and once for each concrete shape, one thread, side by side.

Each row reports the per-call thread CPU time (median of ``TILECRAFT_BENCH_ROUNDS`` interleaved
rounds, each round the median of 5 calls) of the symbolic and the concrete build, and their
ratio (issue #30 asks for symbolic <= 1.05x concrete). Both builds are checked against numpy
first. ``TILECRAFT_SOFTMAX_SIZES`` picks rows (a regex over ``"n x s"``).

Run: ``python -m benchmarks.softmax_cpu`` (the lead: on the GPU host's CPU, as other CPU
benchmarks).

Examples
--------
>>> from benchmarks.softmax_cpu import scores_function
>>> f = scores_function((1, 4, 8, 8))                        # doctest: +SKIP
"""
from __future__ import annotations

import os
import re
import statistics
import time

import numpy as np

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, op

SIZES = [(1, 8), (1, 17), (8, 100), (8, 128), (2, 384)]
UPPER_BOUNDS = {"n": 8, "s": 512}


def scores_function(shape, upper_bounds: dict | None = None, threads: int = 1):
    """The VM's ``main``: ``softmax(x / 8 - 1)`` over the last axis of ``shape`` (ints or
    names of symbolic dims), built for ``llvm`` and run on ``threads`` threads."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.divide(x, relax.const(np.float32(8.0))))
            y = bb.emit(op.add(y, relax.const(np.float32(-1.0))))
            gv = bb.emit_output(bb.emit(op.nn.softmax(y, axis=-1)))
        bb.emit_func_output(gv)
    exe = relax.build(bb.get(), "llvm", upper_bounds=upper_bounds)
    exe.kernel_module.num_threads = threads
    return relax.VirtualMachine(exe, targets.cpu(0))["main"]


def reference(x: np.ndarray) -> np.ndarray:
    y = x.astype(np.float64) / 8.0 - 1.0
    e = np.exp(y - y.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _cpu_ms(fn, calls: int = 5) -> float:
    times = []
    for _ in range(calls):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return statistics.median(times) * 1e3


def measure(symbolic, n: int, s: int, rounds: int = 15, seed: int = 0) -> dict:
    """One row: the symbolic build ``symbolic`` and a concrete build at ``n x s``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 8, (n, 4, s, s)).astype("float32")
    concrete = scores_function((n, 4, s, s))
    arg = targets.array(x)
    want = reference(x)
    for name, f in (("symbolic", symbolic), ("concrete", concrete)):
        err = float(np.abs(f(arg).numpy() - want).max())
        if err > 1e-5:
            raise AssertionError(f"{name} {n} x {s}: off numpy by {err}")
    fns = {"symbolic_ms": lambda: symbolic(arg), "concrete_ms": lambda: concrete(arg)}
    samples = {k: [] for k in fns}
    for _ in range(rounds):
        for k in rng.permutation(list(fns)):
            fns[k]()
            samples[k].append(_cpu_ms(fns[k]))
    row = {"size": f"{n} x {s}"}
    row.update({k: statistics.median(v) for k, v in samples.items()})
    row["ratio"] = row["symbolic_ms"] / row["concrete_ms"]
    return row


def run() -> list[dict]:
    pick = re.compile(os.environ.get("TILECRAFT_SOFTMAX_SIZES", ".*"))
    rounds = int(os.environ.get("TILECRAFT_BENCH_ROUNDS", "15"))
    symbolic = scores_function(("n", 4, "s", "s"), UPPER_BOUNDS)
    rows = []
    for n, s in SIZES:
        if not pick.search(f"{n} x {s}"):
            continue
        row = measure(symbolic, n, s, rounds)
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()},
              flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    from .common import print_table
    print(f"load average {os.getloadavg()}")
    result = run()
    print_table(result, list(dict.fromkeys(k for r in result for k in r)))
