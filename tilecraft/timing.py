"""Interleaved timing of two callables (the machine's noise spreads over both sides)."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def calls_per_round(fn: Callable[[], object], budget_s: float = 0.2) -> int:
    """How many calls make a round of about ``budget_s`` (at least 1, at most 1000)."""
    t0 = time.perf_counter()
    fn()
    dt = max(time.perf_counter() - t0, 1e-7)
    return max(1, min(1000, int(budget_s / dt)))


def interleaved(fns: list[Callable[[], object]], number: int, rounds: int) -> list[float]:
    """Median seconds per call of each of ``fns``, timed round by round in turn."""
    for f in fns:
        f()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for f, out in zip(fns, samples):
            time.sleep(0.05)   # let a peer's spinning thread pool go idle first
            t0 = time.perf_counter()
            for _ in range(number):
                f()
            out.append((time.perf_counter() - t0) / number)
    return [statistics.median(s) for s in samples]
