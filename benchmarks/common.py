"""Shared helpers of the benchmarks: timing, side-by-side ratios, JSON results, a printed table.

This machine is shared and noisy, so every figure is a median over repeats, and each kernel is
compared with its peer measured in the same process, interleaved, and reported as a ratio.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Callable

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def ensure_clean_openblas_env() -> None:
    """Re-exec without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE so numpy runs its best kernel.

    Those variables are set on some machines to work around old OpenBLAS bugs; they slow a current
    numpy, and comparing against a handicapped peer would flatter us.
    """
    if any(k in os.environ for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")):
        env = {k: v for k, v in os.environ.items()
               if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
        os.execvpe(sys.executable, [sys.executable] + sys.argv, env)


def median_time(fn: Callable[[], object], number: int = 5, repeat: int = 7,
                warmup: int = 2) -> float:
    """Median over ``repeat`` runs of the mean time of ``number`` calls, in seconds."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)


def side_by_side(ours: Callable[[], object], peer: Callable[[], object], number: int = 5,
                 rounds: int = 5) -> tuple[float, float]:
    """Time ``ours`` and ``peer`` interleaved round by round; return their median seconds per call.

    Interleaving spreads the machine's noise over both sides instead of favouring one.
    """
    for f in (ours, peer):
        f(); f()
    a, b = [], []
    for _ in range(rounds):
        for fn, out in ((ours, a), (peer, b)):
            # let the other side's worker threads go idle first: onnxruntime's pool spin-waits
            # after each run and would otherwise steal a core from whatever runs next
            time.sleep(0.05)
            fn()
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            out.append((time.perf_counter() - t0) / number)
    return statistics.median(a), statistics.median(b)


def machine_info() -> dict:
    info = {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count()}
    try:
        import numpy as np
        info["numpy"] = np.__version__
    except ImportError:  # pragma: no cover
        pass
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info["cpu"] = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")),
                               "")
    except OSError:
        pass
    return info


def write_results(name: str, rows: list[dict], extra: dict | None = None) -> str:
    """Write ``benchmarks/results/<name>.json`` atomically; return its path."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    doc = {"benchmark": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "machine": machine_info(), "rows": rows}
    if extra:
        doc.update(extra)
    fd, tmp = tempfile.mkstemp(dir=RESULTS_DIR, prefix=f".{name}.", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def print_table(rows: list[dict], columns: list[str]) -> None:
    """A plain aligned table on stdout."""
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def _fmt(v) -> str:
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.3e}"
        return f"{v:.3f}"
    return str(v)
