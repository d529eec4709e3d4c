"""float32 GEMM on this CPU: the hand schedules of ``benchmarks/schedules/gemm.py`` beside numpy.

Rows: GEMM 1024^3 and 2048^3 against ``a @ b`` (OpenBLAS), and GEMM + bias + GELU (tanh form)
fused into the GEMM's register tiles against numpy doing the same in three steps (``a @ b``,
``+= bias``, GELU with ``np.tanh``, in place and with ``x * x * x``: ``numpy_bias_gelu``; the
formula typed as it reads, with temporaries and ``x ** 3``, is several times slower and only
reported as ``ratio_vs_numpy_as_written``). Each kernel is checked against numpy before it is
timed.

Timing: ``rounds`` rounds, each timing ``number`` calls of ours (``mod.time_evaluator``) and
then ``number`` calls of numpy's; the medians over rounds are reported and ``ratio`` is
``numpy seconds / tilecraft seconds`` (above 1: faster than numpy). Before each side the
process sleeps ``SETTLE_S``: after a call OpenBLAS keeps one worker thread spinning for about
0.1 s (our pool's workers spin for about 0.02 s), and a side timed while the other's threads
still spin measures that interference instead of the kernel. ``ratio_back_to_back`` is the
same comparison without the pause (``common.side_by_side``), for reference: on 2 cores it is
lower for us because OpenBLAS's spinning worker takes a share of a core away from our threads
at the start of every batch.

Run: ``python -m benchmarks.run gemm_cpu`` (``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE`` are
cleared so that numpy uses its best kernel).
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from tilecraft import targets
from tilecraft.targets.runtime.ndarray import aligned_copy, aligned_empty
from tilecraft.tensorir import Schedule

from .common import side_by_side
from .schedules.gemm import (GELU_C, matmul_bias_gelu_func, matmul_func, schedule_gemm,
                             schedule_gemm_bias_gelu)


def numpy_bias_gelu(a: np.ndarray, b: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``gelu(a @ b + bias)`` the way a numpy user writes it: three steps, in place where it
    can be."""
    x = a @ b
    x += bias
    t = x * x
    t *= x
    t *= np.float32(0.044715)
    t += x
    t *= np.float32(GELU_C)
    np.tanh(t, out=t)
    t += np.float32(1.0)
    t *= x
    t *= np.float32(0.5)
    return t


def numpy_bias_gelu_as_written(a: np.ndarray, b: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The same written as the formula reads (temporaries, ``x ** 3``): for reference only,
    it is several times slower than ``numpy_bias_gelu`` (``np.power`` on float32)."""
    x = a @ b + bias
    return 0.5 * x * (1 + np.tanh(GELU_C * (x + 0.044715 * x ** 3)))


SETTLE_S = 0.2   # seconds between the sides: both libraries' idle workers stop spinning


def measure(mod, args, peer, call_seconds: float, rounds: int, back_to_back: bool = True
            ) -> dict:
    """Seconds per call of ``mod["main"](*args)`` and of ``peer()``: medians over ``rounds``
    interleaved rounds, with (``ours``, ``peer``) and, if ``back_to_back``, without
    (``b2b_ratio``) a pause between the sides; ``call_seconds`` is a guess of one call's time
    (about 0.3 s of calls are timed per side and round)."""
    number = max(1, int(0.3 / max(call_seconds, 1e-4)))
    evaluator = mod.time_evaluator("main", targets.cpu(0), number=number, repeat=1)
    ours, theirs = [], []
    for _ in range(rounds):
        time.sleep(SETTLE_S)
        ours.append(evaluator(*args).mean)
        time.sleep(SETTLE_S)
        peer()  # the same one warm-up call time_evaluator makes
        t0 = time.perf_counter()
        for _ in range(number):
            peer()
        theirs.append((time.perf_counter() - t0) / number)
    out = {"ours": statistics.median(ours), "peer": statistics.median(theirs)}
    if back_to_back:
        f = mod["main"]
        b2b_ours, b2b_theirs = side_by_side(lambda: f(*args), peer, number=number, rounds=rounds)
        out["b2b_ratio"] = b2b_theirs / b2b_ours
    return out


def _row(kernel: str, flop: float, t: dict, checked: str) -> dict:
    return {"kernel": kernel, "tilecraft_GFLOP/s": flop / t["ours"] / 1e9,
            "numpy_GFLOP/s": flop / t["peer"] / 1e9, "ratio": t["peer"] / t["ours"],
            "tilecraft_ms": t["ours"] * 1e3, "numpy_ms": t["peer"] * 1e3,
            "ratio_back_to_back": t["b2b_ratio"], "checked": checked}


def bench_gemm(size: int, rounds: int = 9, target="llvm") -> dict:
    """One row: ``C = A @ B`` at ``size``^3."""
    m = n = k = size
    sch = Schedule(matmul_func(m, n, k))
    schedule_gemm(sch, "C", target)
    mod = targets.build(sch.mod, target)
    rng = np.random.default_rng(0)
    a = aligned_copy(rng.standard_normal((m, k), dtype=np.float32))
    b = aligned_copy(rng.standard_normal((k, n), dtype=np.float32))
    c = aligned_empty((m, n), np.float32)
    f = mod["main"]
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=2e-4, atol=2e-3 * np.sqrt(k))
    flop = 2.0 * m * n * k
    t = measure(mod, (a, b, c), lambda: a @ b, flop / 150e9, rounds)
    return _row(f"GEMM {m}x{n}x{k} f32", flop, t, "allclose vs a @ b")


def bench_gemm_bias_gelu(size: int = 1024, rounds: int = 9, target="llvm") -> dict:
    """One row: ``D = gelu(A @ B + bias)`` at ``size``^3, the epilogue fused into the GEMM."""
    m = n = k = size
    sch = Schedule(matmul_bias_gelu_func(m, n, k))
    schedule_gemm_bias_gelu(sch, "C", "D", target)
    mod = targets.build(sch.mod, target)
    rng = np.random.default_rng(1)
    a = aligned_copy(rng.standard_normal((m, k), dtype=np.float32) / np.float32(np.sqrt(k)))
    b = aligned_copy(rng.standard_normal((k, n), dtype=np.float32))
    bias = aligned_copy(rng.standard_normal(n, dtype=np.float32))
    d = aligned_empty((m, n), np.float32)
    f = mod["main"]
    f(a, b, bias, d)
    np.testing.assert_allclose(d, numpy_bias_gelu(a, b, bias), rtol=1e-3, atol=1e-3)
    flop = 2.0 * m * n * k
    t = measure(mod, (a, b, bias, d), lambda: numpy_bias_gelu(a, b, bias), flop / 150e9, rounds)
    row = _row(f"GEMM+bias+GELU {m}x{n}x{k} f32", flop, t,
               "allclose vs numpy a @ b + bias, tanh GELU")
    slow = measure(mod, (a, b, bias, d), lambda: numpy_bias_gelu_as_written(a, b, bias),
                   flop / 20e9, 3, back_to_back=False)
    row["ratio_vs_numpy_as_written"] = slow["peer"] / slow["ours"]
    return row


def run() -> list[dict]:
    """The benchmark's rows (see the module docstring)."""
    return [bench_gemm(1024), bench_gemm(2048, rounds=7), bench_gemm_bias_gelu(1024)]


if __name__ == "__main__":
    from .common import ensure_clean_openblas_env, print_table
    ensure_clean_openblas_env()
    rows = run()
    print_table(rows, list(dict.fromkeys(k for r in rows for k in r)))
