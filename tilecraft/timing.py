"""Interleaved timing of two callables (the machine's noise spreads over both sides), and a
description of the machine for results."""
from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable

import numpy as np


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


def machine_info() -> dict:
    """What a measurement ran on: Python, numpy, the architecture, the cores, the CPU's name.

    Examples
    --------
    >>> sorted(machine_info())                                    # doctest: +SKIP
    ['cpu', 'cpus', 'machine', 'numpy', 'python']
    """
    info = {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "numpy": np.__version__}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info["cpu"] = next((line.split(":", 1)[1].strip() for line in f
                                if line.startswith("model name")), "")
    except OSError:
        pass
    return info
