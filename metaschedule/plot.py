"""The tuning curve: best-so-far against trials, per task, from a ``work_dir``.

``tuning_curve(work_dir)`` reads the database's records in the order they were measured and
returns, per workload, the best time (and GFLOP/s, when ``tasks.json`` knows its flop) after
each trial. ``plot_tuning_curve(work_dir)`` draws it with matplotlib (optional: a clear
``ImportError`` when it is missing) into ``work_dir/tuning_curve.png``.

Examples
--------
>>> from tilecraft import metaschedule
>>> path = metaschedule.plot_tuning_curve("tune/")            # doctest: +SKIP
>>> curves = metaschedule.tuning_curve("tune/")               # doctest: +SKIP
>>> curves["matmul"]["best_gflops"][-1]                        # doctest: +SKIP
151.2
"""
from __future__ import annotations

import math
import os

from tilecraft.optional import import_optional

from .database import Database
from .tune import read_tasks_file

__all__ = ["tuning_curve", "plot_tuning_curve"]


def tuning_curve(work_dir: str | os.PathLike, target=None) -> dict[str, dict]:
    """Per task (its name from ``tasks.json``, else the workload hash): ``trials`` (1, 2, ...),
    ``secs`` (each trial's mean time, ``inf`` when it failed), ``best_secs`` (best so far)
    and, when the flop count is known, ``best_gflops``."""
    work_dir = os.fspath(work_dir)
    if not os.path.isdir(work_dir):
        raise FileNotFoundError(f"tuning_curve: no work_dir {work_dir!r}")
    tasks = {t["shash"]: t for t in read_tasks_file(work_dir)}
    db = Database(work_dir)
    want = None
    if target is not None:
        from .database import target_key
        want = target_key(target)
    curves: dict[str, dict] = {}
    for rec in db.get_all_tuning_records():
        if want is not None and rec.target != want:
            continue
        info = tasks.get(rec.workload.shash, {})
        name = info.get("name") or rec.workload.shash[:12]
        c = curves.setdefault(name, {"shash": rec.workload.shash, "flop": info.get("flop"),
                                     "trials": [], "secs": [], "best_secs": []})
        t = rec.mean_secs
        best = min(c["best_secs"][-1], t) if c["best_secs"] else t
        c["trials"].append(len(c["trials"]) + 1)
        c["secs"].append(t)
        c["best_secs"].append(best)
    for c in curves.values():
        if c["flop"]:
            c["best_gflops"] = [c["flop"] / b / 1e9 if math.isfinite(b) else 0.0
                                for b in c["best_secs"]]
    return curves


def plot_tuning_curve(work_dir: str | os.PathLike, path: str | os.PathLike | None = None,
                      target=None) -> str:
    """Draw best-so-far GFLOP/s (or milliseconds, when the flop count is unknown) against
    trials for every task of ``work_dir``; returns the image path (default
    ``work_dir/tuning_curve.png``).

    Raises
    ------
    ImportError
        When matplotlib is not installed (``pip install 'tilecraft[bench]'``).
    ValueError
        When ``work_dir`` holds no tuning records.
    """
    matplotlib = import_optional("matplotlib", "plot_tuning_curve")
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    curves = tuning_curve(work_dir, target)
    if not curves:
        raise ValueError(f"plot_tuning_curve: {os.fspath(work_dir)!r} holds no tuning records")
    path = os.fspath(path) if path is not None else os.path.join(os.fspath(work_dir),
                                                                 "tuning_curve.png")
    use_gflops = all("best_gflops" in c for c in curves.values())
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, c in curves.items():
        if use_gflops:
            ax.plot(c["trials"], c["best_gflops"], label=name)
        else:
            ax.plot(c["trials"], [b * 1e3 if math.isfinite(b) else float("nan")
                                  for b in c["best_secs"]], label=name)
    ax.set_xlabel("trials")
    ax.set_ylabel("best GFLOP/s so far" if use_gflops else "best time so far (ms)")
    ax.set_title("tuning curve")
    ax.grid(True, alpha=0.3)
    if len(curves) <= 12:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
