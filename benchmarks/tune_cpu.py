"""Tuning on this CPU: ``metaschedule.tune_tir`` kernels beside numpy / OpenBLAS, onnxruntime and
Apache TVM's MetaSchedule, in one run.

Rows:

* **GEMM 1024³ f32** after 64 and after 256 trials (one tuning run, resumed from its database
  at 64), each against ``a @ b`` (OpenBLAS) side by side: targets ``ratio >= 0.9`` after 64
  trials, ``>= 1.1`` after 256. ``ratio`` is numpy seconds / tilecraft seconds (above 1:
  faster than numpy); the tuned kernel is checked against ``a @ b`` first.
* **tuning throughput**: trials per minute of that run (search, build and measurement), and
  the best-so-far curve (in ``benchmarks/results/tune_cpu_gemm/<machine>.json``, drawn beside
  it as ``<machine>.png``).
* **Apache TVM** MetaSchedule on the same GEMM and trial count, when a Python with
  ``apache-tvm`` is found (``$TVM_PYTHON``, else ``/work/tvm-venv/bin/python``; it runs
  ``benchmarks/tvm_tune_peer.py`` in that interpreter): its trials per minute, its tuned
  kernel's GFLOP/s, and ours / TVM's ratio.
* **The Ansor operator suite** at batch 1 (``benchmarks/ansor_suite.py``: C1D, C2D, C3D, GMM,
  GRP, DIL, DEP, T2D, CAP, NRM with Ansor's shapes), 128 trials each, against onnxruntime
  (2 threads; the peer gets its channels-first layout prepared outside the timed call) or
  numpy; each tuned kernel is checked against the peer's result first.
* **ResNet-50 tuned end to end** (``bench_resnet50``: ``relax.tune`` with up to 3000 trials,
  then untuned, tuned and onnxruntime timed interleaved; ``benchmarks/results/
  tune_resnet50/<machine>.json``): only with ``TILECRAFT_TUNE_RESNET=1`` or ``python -m
  benchmarks.tune_cpu --resnet50`` (hours on two cores; it resumes from its database in
  ``$TILECRAFT_ZOO_TUNE_WORK/resnet50``, up to ``$TILECRAFT_RESNET_TRIALS`` trials in all).

Quick mode (``TILECRAFT_BENCH_QUICK=1`` or ``python -m benchmarks.tune_cpu --quick``): the
same rows with a few trials each (a smoke run of every path, minutes instead of hours).
``TILECRAFT_TUNE_WORK=dir`` keeps the tuning databases there (default: a temporary directory),
``TILECRAFT_TUNE_OPS=C1D,GMM`` picks operators of the suite, ``TILECRAFT_TUNE_PARTS=gemm,tvm``
the parts of the benchmark (default ``gemm,tvm,suite``); ``TILECRAFT_SUITE_RETIME=1`` re-times
the suite's databases already in ``TILECRAFT_TUNE_WORK`` instead of tuning them again.

Run: ``python -m benchmarks.run tune_cpu``. The full run takes hours on a 2-core machine.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from tilecraft import targets
from tilecraft.targets.runtime.ndarray import aligned_copy, aligned_empty
from tilecraft import metaschedule
from tilecraft.metaschedule import apply_best, tune_tir, tuning_curve
from tilecraft.timing import calls_per_round
from tilecraft.tuning import TUNED

from .common import RESULTS_DIR, results_path, side_by_side, write_results
from .gemm_cpu import measure

GEMM_SIZE = 1024
GEMM_CHECKPOINTS = (64, 256)
GEMM_TARGETS = {64: 0.9, 256: 1.1}
SUITE_TRIALS = 128
PER_ITER = 32


def _quick() -> bool:
    return os.environ.get("TILECRAFT_BENCH_QUICK", "") not in ("", "0")


def _work_root() -> str:
    root = os.environ.get("TILECRAFT_TUNE_WORK")
    if root:
        os.makedirs(root, exist_ok=True)
        return root
    return tempfile.mkdtemp(prefix="tilecraft-tune-cpu-")


def _fresh(path: str) -> str:
    if os.path.exists(path):
        shutil.rmtree(path)
    return path


def _gemm_func(n: int):
    from tilecraft.tensorir import te
    A = te.placeholder((n, n), "float32", "A")
    B = te.placeholder((n, n), "float32", "B")
    k = te.reduce_axis((0, n), "k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    return te.create_prim_func([A, B, C])


def _search(quick: bool) -> dict:
    return {"population_size": 32, "genetic_num_iters": 2} if quick else {}


# ---------------------------------------------------------------------------------------------


def bench_gemm(work_root: str, quick: bool) -> tuple[list[dict], dict]:
    """GEMM rows at each checkpoint; also the tuning statistics."""
    n = 256 if quick else GEMM_SIZE
    checkpoints = (8, 16) if quick else GEMM_CHECKPOINTS
    per_iter = 8 if quick else PER_ITER
    func = _gemm_func(n)
    work = _fresh(os.path.join(work_root, f"gemm{n}"))
    rng = np.random.default_rng(0)
    a = aligned_copy(rng.standard_normal((n, n), dtype=np.float32))
    b = aligned_copy(rng.standard_normal((n, n), dtype=np.float32))
    c = aligned_empty((n, n), np.float32)
    flop = 2.0 * n ** 3
    rows, done, tune_secs = [], 0, 0.0
    for cp in checkpoints:
        t0 = time.time()
        db = tune_tir(func, "llvm", max_trials=cp - done, work_dir=work,
                      num_trials_per_iter=per_iter, seed=0, search=_search(quick))
        tune_secs += time.time() - t0
        done = cp
        sch = apply_best(db, func, "llvm")
        row = {"kernel": f"GEMM {n}^3 f32", "trials": cp, "peer": "numpy a @ b (OpenBLAS)"}
        if sch is None:
            row["error"] = "no valid schedule found"
            rows.append(row)
            continue
        mod = targets.build(sch.mod, "llvm")
        mod["main"](a, b, c)
        np.testing.assert_allclose(c, a @ b, rtol=2e-4, atol=2e-3 * np.sqrt(n))
        t = measure(mod, (a, b, c), lambda: a @ b, flop / 100e9, rounds=3 if quick else 7,
                    back_to_back=False)
        row.update({"tilecraft_GFLOP/s": flop / t["ours"] / 1e9,
                    "peer_GFLOP/s": flop / t["peer"] / 1e9, "ratio": t["peer"] / t["ours"],
                    "target_ratio": GEMM_TARGETS.get(cp), "tilecraft_ms": t["ours"] * 1e3,
                    "trials_per_min": cp / tune_secs * 60, "checked": "allclose vs a @ b"})
        rows.append(row)
    curve = tuning_curve(work).get("main", {})
    stats = {"size": n, "trials": done, "tune_seconds": tune_secs,
             "trials_per_min": done / tune_secs * 60 if tune_secs else 0.0,
             "curve_best_gflops": curve.get("best_gflops", []), "work_dir": work}
    return rows, stats


def _tvm_python() -> str | None:
    cand = os.environ.get("TVM_PYTHON") or "/work/tvm-venv/bin/python"
    if not os.path.exists(cand):
        return None
    probe = subprocess.run([cand, "-c", "import tvm"], capture_output=True, text=True)
    return cand if probe.returncode == 0 else None


def bench_tvm(work_root: str, quick: bool, ours: dict) -> tuple[dict, dict | None]:
    """Apache TVM MetaSchedule on the same GEMM and trials (in its own interpreter)."""
    n, trials = ours["size"], ours["trials"]
    row = {"kernel": f"GEMM {n}^3 f32 (Apache TVM MetaSchedule)", "trials": trials}
    py = _tvm_python()
    if py is None:
        row["error"] = ("apache-tvm not found (set TVM_PYTHON or pip install apache-tvm into "
                        "/work/tvm-venv)")
        return row, None
    out = os.path.join(work_root, "tvm_peer.json")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tvm_tune_peer.py")
    cmd = [py, script, "--size", str(n), "--trials", str(trials), "--per-iter",
           str(8 if quick else PER_ITER), "--out", out, "--database", "memory",
           "--work-dir", _fresh(os.path.join(work_root, "tvm_work"))]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        row["error"] = f"TVM run failed: {proc.stderr.strip().splitlines()[-1:]}"
        return row, None
    with open(out, encoding="utf-8") as f:
        res = json.load(f)
    row.update({"tvm_version": res.get("tvm"), "tvm_GFLOP/s": res.get("gflops"),
                "tvm_trials_per_min": res.get("trials_per_min"),
                "tilecraft_trials_per_min": ours["trials_per_min"],
                "tilecraft_GFLOP/s": ours.get("best_gflops")})
    if res.get("gflops") and ours.get("best_gflops"):
        row["ratio_vs_tvm"] = ours["best_gflops"] / res["gflops"]
    return row, res


def bench_suite(work_root: str, quick: bool) -> list[dict]:
    from .ansor_suite import NAMES, suite
    names = [x for x in os.environ.get("TILECRAFT_TUNE_OPS", "").split(",") if x] or list(NAMES)
    trials = 8 if quick else SUITE_TRIALS
    retime = os.environ.get("TILECRAFT_SUITE_RETIME") == "1"
    rows = []
    for op in suite(names):
        row = {"kernel": op.name, "trials": trials, "peer": op.peer_name}
        work = os.path.join(work_root, f"suite_{op.name}")
        if retime and os.path.isdir(work):
            db = metaschedule.Database(work)    # re-time what an earlier run found
            row["timing"] = "re-timed database"
        else:
            _fresh(work)
            t0 = time.time()
            try:
                db = tune_tir(op.func, "llvm", max_trials=trials, work_dir=work,
                              num_trials_per_iter=8 if quick else PER_ITER, seed=0,
                              search=_search(quick))
            except metaschedule.TuneError as err:
                row["error"] = str(err)
                rows.append(row)
                continue
            row["tune_min"] = (time.time() - t0) / 60
        sch = apply_best(db, op.func, "llvm")
        if sch is None:
            row["error"] = "no valid schedule found"
            rows.append(row)
            continue
        mod = targets.build(sch.mod, "llvm")
        # on 64-byte-aligned arrays, as the VM's buffers and the tuner's runner (numpy's own
        # are 16-byte aligned: a kernel's vector loads then straddle cache lines)
        inputs = [aligned_copy(a) for a in op.inputs]
        out = aligned_empty(op.out_shape, np.float32)
        f = mod["main"]
        f(*inputs, out)
        ref = op.reference()
        np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-3 * max(1.0, np.abs(ref).max()))

        def ours():
            return f(*inputs, out)
        # enough calls per round (~0.1 s) that a microsecond kernel is not timed by one call
        number = max(5, calls_per_round(ours, 0.1))
        ours_s, peer_s = side_by_side(ours, op.peer, number=number, rounds=3 if quick else 7)
        row.update({"tilecraft_GFLOP/s": op.flop / ours_s / 1e9,
                    "peer_GFLOP/s": op.flop / peer_s / 1e9, "ratio": peer_s / ours_s,
                    "tilecraft_ms": ours_s * 1e3, "checked": f"allclose vs {op.peer_name}"})
        rows.append(row)
    return rows


RESNET_TRIALS = 3000
# the search of a ResNet-50 convolution costs about a second per candidate scored (replay,
# postprocessing and lowering for its features, on this loaded 2-core machine): a population
# of 128 over 3 generations spends ~10 minutes searching per batch of 16, a smaller one ~1
RESNET_TUNE_OPTIONS = {"num_trials_per_iter": 16, "seed": 0,
                       "search": {"population_size": 32, "genetic_num_iters": 2}}


def bench_resnet50(trials: int = RESNET_TRIALS, rounds: int = 7,
                   tune_options: dict | None = None) -> dict:
    """ResNet-50 (the zoo's light model) tuned end to end with up to ``trials`` trials (issue
    6: ``<= 3000``, latency ``<=`` onnxruntime's), measured in one process interleaved round by
    round: untuned build, tuned build, onnxruntime (2 threads). The database lives in
    ``tilecraft.zoo.run.tune_work_dir`` (``$TILECRAFT_ZOO_TUNE_WORK/resnet50``): a run that
    finds trials there (a long tuning run, killed or not) tops them up to ``trials`` (none
    when it has them) and measures. Writes ``benchmarks/results/tune_resnet50/<machine>.json``."""
    row = {"kernel": "ResNet-50 end to end (relax.tune)", "trials_budget": trials}
    try:
        from tilecraft.zoo import models as zoo_models
        from tilecraft.zoo import run as zoo_run
        z = zoo_models.ZOO["resnet50"]()
    except (ImportError, KeyError, OSError) as err:
        row["error"] = f"the zoo's resnet50 is not available: {type(err).__name__}: {err}"
        return row
    opts = dict(RESNET_TUNE_OPTIONS if tune_options is None else tune_options)
    load_before = os.getloadavg()[0]
    zrow = zoo_run.measure(z, "llvm", threads=2, rounds=rounds, quiet=True,
                           tune_trials=trials, tune_options=opts)
    row.update({k: zrow.get(k) for k in (
        "tune_trials", "tune_minutes", "tilecraft_ms", "tuned_ms", "onnxruntime_ms", "vs_ort",
        "tuned_vs_ort", "tuned_vs_untuned", "check", "tuned_check", "tuned_note",
        "tune_work_dir")})
    row["target"] = "tuned_vs_ort >= 1 (latency <= onnxruntime's) with <= 3000 trials"
    row["target_met"] = bool(row.get("tuned_vs_ort") and row["tuned_vs_ort"] >= 1.0)
    tasks = zrow.get("tune_tasks", [])
    write_results("tune_resnet50", [row], {
        "tasks": tasks, "tune_options": opts,
        "machine_note": "untuned, tuned and onnxruntime interleaved round by round in one "
                        "process, medians; load average (1 min) before tuning "
                        f"{load_before:.2f}, after timing {os.getloadavg()[0]:.2f}"})
    row["tasks_tuned"] = sum(t["uses"] == TUNED for t in tasks)
    row["tasks"] = len(tasks)
    return row


def print_resnet50(row: dict, tasks: list[dict] | None = None) -> None:
    """The ResNet-50 row and its per-task table on stdout."""
    from .common import print_table
    cols = ["tune_trials", "tune_minutes", "tilecraft_ms", "tuned_ms", "onnxruntime_ms",
            "tuned_vs_ort", "tuned_vs_untuned", "tasks_tuned", "tasks", "target_met"]
    print_table([row], [c for c in cols if c in row] + (["error"] if "error" in row else []))
    if tasks:
        print()
        print_table(tasks, ["task", "weight", "trials", "baseline_ms", "best_ms", "uses"])


# run() writes its parts' results itself (``benchmarks.run`` does not write them again)
WRITES_RESULTS = True


def run(quick: bool | None = None) -> list[dict]:
    """The rows (see the module docstring). A full run writes each part it ran to its own
    results file: ``tune_cpu_gemm`` (the GEMM, throughput and TVM rows, the best-so-far curve
    in the file and drawn beside it as ``<machine>.png``) and ``tune_cpu_suite``; a quick run
    (a smoke test of every path) writes none."""
    quick = _quick() if quick is None else quick
    parts = set(os.environ.get("TILECRAFT_TUNE_PARTS", "gemm,tvm,suite").split(","))
    work_root = _work_root()
    gemm_rows, suite_rows, stats, tvm_res = [], [], {}, None
    if "gemm" in parts:
        gemm_rows, stats = bench_gemm(work_root, quick)
        best = [r for r in gemm_rows if "tilecraft_GFLOP/s" in r]
        stats["best_gflops"] = best[-1]["tilecraft_GFLOP/s"] if best else None
        gemm_rows.append({"kernel": f"tuning throughput (GEMM {stats['size']}^3)",
                          "trials": stats["trials"], "trials_per_min": stats["trials_per_min"],
                          "tune_min": stats["tune_seconds"] / 60})
        if "tvm" in parts:
            tvm_row, tvm_res = bench_tvm(work_root, quick, stats)
            gemm_rows.append(tvm_row)
    if "suite" in parts:
        suite_rows = bench_suite(work_root, quick)
    resnet_rows = [bench_resnet50()] if os.environ.get("TILECRAFT_TUNE_RESNET") else []
    rows = gemm_rows + suite_rows + resnet_rows
    for r in rows:
        r["mode"] = "quick" if quick else "full"
    if quick:
        print("(quick mode: no results written)", file=sys.stderr)
        return rows
    if gemm_rows:
        try:
            stats["curve_png"] = os.path.relpath(metaschedule.plot_tuning_curve(
                stats["work_dir"], results_path("tune_cpu_gemm", suffix=".png")), RESULTS_DIR)
        except ImportError as err:
            stats["curve_png"] = f"not drawn: {err}"
        path = write_results("tune_cpu_gemm", gemm_rows, {"curve": stats, "tvm_curve": tvm_res})
        print(f"(written to {path})")
    if suite_rows:
        print(f"(written to {write_results('tune_cpu_suite', suite_rows)})")
    return rows


if __name__ == "__main__":
    from .common import ensure_clean_openblas_env, print_table
    ensure_clean_openblas_env()
    if "--quick" in sys.argv:
        os.environ["TILECRAFT_BENCH_QUICK"] = "1"
    if "--resnet50" in sys.argv:         # only the ResNet-50 row (tunes, or resumes, then times)
        # TILECRAFT_RESNET_TRIALS: the trials in all (a database that has them is not tuned
        # further: set it to what a long background run reached to only measure)
        r = bench_resnet50(int(os.environ.get("TILECRAFT_RESNET_TRIALS", RESNET_TRIALS)))
        with open(results_path("tune_resnet50"), encoding="utf-8") as f:
            print_resnet50(r, json.load(f).get("tasks"))
        sys.exit(0)
    out = run()
    print_table(out, list(dict.fromkeys(k for r in out for k in r)))
