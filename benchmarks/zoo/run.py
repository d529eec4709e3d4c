"""The model zoo: every model through tilecraft, onnxruntime and PyTorch eager, side by side.

``python -m benchmarks.zoo.run [--models a,b] [--target llvm] [--show] [--list]`` (also
``tilecraft zoo`` and ``python -m benchmarks.run zoo``). For each model of
``benchmarks.zoo.models.ZOO``:

1. the ONNX model is imported with ``relax.frontend.from_onnx`` (symbolic dims stay symbolic)
   and built with ``relax.build(mod, target, upper_bounds=...)``: untuned, every kernel gets
   the default schedules (a tuned column is added once ``relax.tune`` exists);
2. the output is checked against onnxruntime on the timed inputs and on the extra inputs
   (other sequence lengths, the same executable), ``rtol 1e-3``;
3. tilecraft, onnxruntime (``intra_op_num_threads`` = the cores, all graph optimizations) and
   PyTorch eager (``torch.no_grad``, the same threads; for the models written in PyTorch) are
   timed in turn, interleaved round by round (``benchmarks.common.side_by_side``'s method);
4. ``vm.profile`` splits tilecraft's time by kernel kind (convolution, matmul, softmax, ...).

Writes ``benchmarks/results/zoo-<target>.json``, ``zoo-<target>.md`` (the markdown table) and
``zoo-<target>.png`` (latency ratios, matplotlib). Columns: ``tilecraft_ms``,
``onnxruntime_ms``, ``torch_ms``, ``vs_ort`` = onnxruntime / tilecraft (above 1: we are
faster), ``vs_torch``, ``build_s``, ``kernels`` (kernel calls per run), ``top_kinds`` (the
kernel kinds with the largest shares of tilecraft's time), ``check``.

Targets (issue 5): untuned within 1.5x of onnxruntime (``vs_ort >= 0.67``) on each model at
batch 1, and ahead of it (``vs_ort > 1``) on the MLP-Mixer and the BERT layer.

``TILECRAFT_ZOO_ROUNDS`` (default 5) sets the interleaved rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback

import numpy as np

from ..common import RESULTS_DIR, ensure_clean_openblas_env, machine_info

TARGET_RATIO = 1 / 1.5
AHEAD_MODELS = ("mlp_mixer", "bert_layer")

# kernel kind by the first of these words in a (fused) kernel's name; fused names list their
# ops in order, so a conv with an epilogue is a convolution
KINDS = [("conv2d_transpose", "conv_transpose"), ("conv", "conv"), ("matmul", "matmul"),
         ("dense", "matmul"), ("linear", "matmul"), ("einsum", "matmul"),
         ("softmax", "softmax"), ("layer_norm", "layer_norm"), ("batch_norm", "batch_norm"),
         ("lrn", "lrn"),
         ("pool", "pool"), ("mean", "reduce"), ("sum", "reduce"), ("max", "reduce"),
         ("take", "gather"), ("gather", "gather"), ("concat", "concat"),
         ("permute_dims", "transpose"), ("transpose", "transpose"), ("reshape", "reshape"),
         ("strided_slice", "slice"), ("split", "slice"), ("pad", "pad"),
         ("resize", "resize")]


def kernel_kind(name: str) -> str:
    low = name.lower()
    for word, kind in KINDS:
        if word in low:
            return kind
    return "elementwise"


def _timed_fns(vm, sess, torch_module, inputs: dict, threads: int):
    from tilecraft import targets
    args = [targets.array(a) for a in inputs.values()]
    fn = vm["main"]
    fns = {"tilecraft": lambda: fn(*args), "onnxruntime": lambda: sess.run(None, inputs)}
    if torch_module is not None:
        import torch
        torch.set_num_threads(threads)
        tins = [torch.from_numpy(a) for a in inputs.values()]

        def eager():
            with torch.no_grad():
                return torch_module(*tins)
        fns["torch"] = eager
    return fns, args


def _ort_session(model, threads: int, profile_prefix: str | None = None):
    """An onnxruntime CPU session of ``model`` with all graph optimizations on ``threads``
    threads; ``profile_prefix``: with onnxruntime's profiler on, writing there."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _check(vm, sess, inputs: dict, rtol: float, atol: float) -> float:
    ours = vm["main"](*inputs.values())
    ours = [o.numpy() for o in (ours if isinstance(ours, tuple) else [ours])]
    ref = sess.run(None, inputs)
    worst = 0.0
    for o, r in zip(ours, ref):
        if o.shape != r.shape:
            raise AssertionError(f"shape {o.shape} vs onnxruntime's {r.shape}")
        np.testing.assert_allclose(o, r, rtol=rtol, atol=atol)
        worst = max(worst, float(np.max(np.abs(o.astype(np.float64) - r))) if o.size else 0.0)
    return worst


def tune_work_dir(z) -> str:
    """Where a zoo model's tuning database lives: ``$TILECRAFT_ZOO_TUNE_WORK/<model>`` or
    ``<tmp>/tilecraft-zoo-tune-<model>``; a second run with the same directory resumes."""
    import tempfile
    root = os.environ.get("TILECRAFT_ZOO_TUNE_WORK")
    return os.path.join(root, z.name) if root else \
        os.path.join(tempfile.gettempdir(), f"tilecraft-zoo-tune-{z.name}")


def _tuning_minutes(records) -> float:
    """Tuning time from the records' timestamps: the sum of the gaps between consecutive
    records, leaving out gaps over 10 minutes (a killed run resumed later)."""
    times = sorted(r.timestamp for r in records if r.timestamp is not None)
    return sum(b - a for a, b in zip(times, times[1:]) if b - a < 600) / 60


def tuning_summary(tasks, db, target) -> tuple[list[dict], int, float]:
    """Per task: trials, baseline (default schedule) and best ms in the database, and which
    ``relax.build`` uses; also the model's trials and tuning minutes."""
    from tilecraft import metaschedule
    hashes = {metaschedule.workload_hash(t.func): t for t in tasks}
    records = [r for r in db.get_all_tuning_records() if r.workload.shash in hashes]
    per_task = []
    for shash, t in hashes.items():
        recs = [r for r in records if r.workload.shash == shash]
        base = metaschedule.baseline_record(db, t, target)
        best = db.query_tuning_record(t.func, target)
        # by program, not trace: a record of the default schedule by another trace is it too
        uses_default = best is None or (
            t.baseline is not None and metaschedule.workload_hash(best.as_schedule(t.func).func)
            == metaschedule.workload_hash(t.baseline.func))
        per_task.append({
            "task": t.name, "weight": t.weight, "trials": len(recs),
            "baseline_ms": base.mean_secs * 1e3 if base is not None and base.ok else None,
            "best_ms": best.mean_secs * 1e3 if best is not None else None,
            "uses": "default schedule" if uses_default else "tuned record"})
    return per_task, len(records), _tuning_minutes(records)


def _tuned(mod, target, z, trials: int, row: dict, tune_options: dict | None = None):
    """A VM of the model built with ``relax.tune``'s database (``trials`` in all: a database
    that already has some, from an earlier or killed run in ``tune_work_dir(z)``, is topped
    up), or None (noted in ``row``) while the tuner does not exist."""
    from tilecraft import relax
    from tilecraft import metaschedule
    if not hasattr(relax, "tune"):
        row["tuned_note"] = "relax.tune is not available yet"
        return None
    work_dir = tune_work_dir(z)
    ub = z.upper_bounds or None
    # the kernels of the database's layout decisions (relax.tune_layouts), where it has them
    tasks = relax.extract_tasks(mod, target, upper_bounds=ub,
                                database=metaschedule.Database(work_dir))
    _, done, _ = tuning_summary(tasks, metaschedule.Database(work_dir), target)
    t0 = time.perf_counter()
    if trials > done:
        db = relax.tune(mod, target, max_trials=trials - done, work_dir=work_dir,
                        upper_bounds=ub, progress=False, **(tune_options or {}))
    else:
        db = metaschedule.Database(work_dir)
    row["tune_s"] = time.perf_counter() - t0
    exe = relax.build(mod, target, database=db, upper_bounds=ub)
    tasks = relax.extract_tasks(mod, target, upper_bounds=ub, database=db)
    per_task, n, minutes = tuning_summary(tasks, db, target)
    row["tune_trials"] = n
    row["tune_minutes"] = minutes
    row["tune_work_dir"] = work_dir
    row["tune_tasks"] = per_task
    return relax.VirtualMachine(exe)


def measure(z, target: str, threads: int, rounds: int, quiet: bool = False,
            tune_trials: int = 0, tune_options: dict | None = None) -> dict:
    """One zoo row (see the module docstring); ``tune_trials`` > 0 adds a tuned column
    (``relax.tune`` up to that many trials in all, ``tune_options`` its keyword arguments,
    then ``relax.build(..., database=...)``; the tuned output is checked against onnxruntime
    too, and all three are timed interleaved)."""
    from tilecraft import relax
    from tilecraft.relax.frontend import from_onnx
    from tilecraft.timing import calls_per_round, interleaved

    row = {"model": z.name, "description": z.description}
    t0 = time.perf_counter()
    mod = from_onnx(z.onnx_model)
    row["import_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    exe = relax.build(mod, target, upper_bounds=z.upper_bounds or None)
    row["build_s"] = time.perf_counter() - t0
    vm = relax.VirtualMachine(exe)
    sess = _ort_session(z.onnx_model, threads)
    rtol, atol = 1e-3, 1e-4
    worst = _check(vm, sess, z.inputs, rtol, atol)
    for extra in z.extra_inputs:
        worst = max(worst, _check(vm, sess, extra, rtol, atol))
    sizes = [tuple(a.shape) for a in z.inputs.values()]
    row["check"] = (f"allclose onnxruntime rtol {rtol:g} atol {atol:g} (max abs diff "
                    f"{worst:.1e}; {1 + len(z.extra_inputs)} input set(s))")
    tuned_vm = None
    if tune_trials:
        tuned_vm = _tuned(mod, target, z, tune_trials, row, tune_options)
        if tuned_vm is not None:
            tw = _check(tuned_vm, sess, z.inputs, rtol, atol)
            for extra in z.extra_inputs:
                tw = max(tw, _check(tuned_vm, sess, extra, rtol, atol))
            row["tuned_check"] = f"allclose onnxruntime rtol {rtol:g} atol {atol:g} (max " \
                                 f"abs diff {tw:.1e})"
    fns, args = _timed_fns(vm, sess, z.torch_module, z.inputs, threads)
    if tuned_vm is not None:
        tfn = tuned_vm["main"]
        fns["tuned"] = lambda: tfn(*args)
    number = calls_per_round(fns["tilecraft"], 0.3)
    names = list(fns)
    times = dict(zip(names, interleaved([fns[n] for n in names], number, rounds)))
    row["inputs"] = ", ".join(str(s) for s in sizes)
    row["tilecraft_ms"] = times["tilecraft"] * 1e3
    row["onnxruntime_ms"] = times["onnxruntime"] * 1e3
    row["torch_ms"] = times["torch"] * 1e3 if "torch" in times else None
    row["vs_ort"] = times["onnxruntime"] / times["tilecraft"]
    row["vs_torch"] = times["torch"] / times["tilecraft"] if "torch" in times else None
    if "tuned" in times:
        row["tuned_ms"] = times["tuned"] * 1e3
        row["tuned_vs_ort"] = times["onnxruntime"] / times["tuned"]
        row["tuned_vs_untuned"] = times["tilecraft"] / times["tuned"]
    prof = vm.profile(*args, number=max(2, min(number, 10)))
    kinds: dict[str, float] = {}
    kernels: dict[str, float] = {}
    calls = 0
    total = sum(r["total_ms"] for r in prof.rows) or 1.0
    for r in prof.rows:
        if r["name"] == "(vm)":
            kinds["(vm)"] = kinds.get("(vm)", 0.0) + r["total_ms"]
            continue
        calls += r["calls"]
        k = kernel_kind(r["name"])
        kinds[k] = kinds.get(k, 0.0) + r["total_ms"]
        kernels[r["name"]] = r["total_ms"]
    row["kernels"] = calls // max(prof.runs, 1)
    row["kind_percent"] = {k: 100.0 * v / total for k, v in
                           sorted(kinds.items(), key=lambda kv: -kv[1])}
    row["top_kinds"] = ", ".join(f"{k} {p:.0f}%" for k, p in
                                 list(row["kind_percent"].items())[:3])
    row["top_kernels"] = [{"name": k, "percent": 100.0 * v / total} for k, v in
                          sorted(kernels.items(), key=lambda kv: -kv[1])[:5]]
    target_ratio = 1.0 if z.name in AHEAD_MODELS else TARGET_RATIO
    row["target_vs_ort"] = target_ratio
    row["target_met"] = bool(row["vs_ort"] >= target_ratio)
    return row


def _fmt(v, digits=2):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def markdown_table(rows: list[dict], target: str, note: str = "") -> str:
    tuned = any("tuned_ms" in r for r in rows)
    cols = ["model", "inputs", "tilecraft ms", "onnxruntime ms", "PyTorch ms"] + \
        (["tuned ms"] if tuned else []) + \
        ["vs ORT", "vs PyTorch", "target", "build s", "kernels", "where the time goes"]
    align = ["---", "---"] + ["---:"] * (5 if tuned else 4) + ["---:", "---", "---:", "---:",
                                                              "---"]
    lines = [f"Zoo on `{target}` (untuned, batch 1). vs = peer time / tilecraft time "
             f"(above 1: tilecraft is faster). {note}".strip(), "",
             "| " + " | ".join(cols) + " |", "| " + " | ".join(align) + " |"]
    for r in rows:
        if "error" in r:
            cells = [r["model"]] + [""] * (len(cols) - 2) + [r["error"][:160]]
            cells[cols.index("target")] = "failed"
            lines.append("| " + " | ".join(cells) + " |")
            continue
        goal = (f"{'>' if r['model'] in AHEAD_MODELS else '>='} {r['target_vs_ort']:.2f} "
                f"{'met' if r['target_met'] else 'missed'}")
        cells = [r["model"], r["inputs"], _fmt(r["tilecraft_ms"]), _fmt(r["onnxruntime_ms"]),
                 _fmt(r["torch_ms"])] + ([_fmt(r.get("tuned_ms"))] if tuned else []) + \
            [_fmt(r["vs_ort"]), _fmt(r["vs_torch"]), goal, _fmt(r["build_s"], 1),
             str(r["kernels"]), r["top_kinds"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def bar_chart(rows: list[dict], path: str, target: str) -> str | None:
    """Latency ratios (peer / tilecraft) per model, log scale; None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return None
    names = [r["model"] for r in ok]
    x = np.arange(len(ok))
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(ok) + 2), 4.2))
    ort = [r["vs_ort"] for r in ok]
    tch = [r["vs_torch"] or 0 for r in ok]
    ax.bar(x - 0.2, ort, 0.4, label="onnxruntime / tilecraft")
    ax.bar(x + 0.2, tch, 0.4, label="PyTorch eager / tilecraft")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(TARGET_RATIO, color="red", linewidth=0.8, linestyle="--",
               label="target: within 1.5x of onnxruntime")
    ax.set_yscale("log")
    ax.set_xticks(x, names, rotation=35, ha="right")
    ax.set_ylabel("latency ratio (above 1: tilecraft faster)")
    ax.set_title(f"tilecraft zoo on {target}, untuned, batch 1")
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def _atomic_write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def paths(target: str) -> dict[str, str]:
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", target)
    return {ext: os.path.join(RESULTS_DIR, f"zoo-{tag}.{ext}") for ext in ("json", "md", "png")}


def run(names=None, target: str = "llvm", quiet: bool = False,
        tune_trials: int = 0) -> list[dict]:
    """Measure ``names`` (default: the whole zoo); write the JSON, table and chart; return the
    rows. A model that fails gets a row with its ``error`` (the others still run)."""
    from tilecraft.progress import iterate
    from .models import ZOO
    names = list(names or ZOO)
    for n in names:
        if n not in ZOO:
            raise SystemExit(f"unknown zoo model {n!r}; known: {', '.join(ZOO)}")
    threads = os.cpu_count() or 1
    rounds = int(os.environ.get("TILECRAFT_ZOO_ROUNDS", "5"))
    rows = []
    for name in iterate(names, "zoo", quiet=quiet):
        t0 = time.perf_counter()
        try:
            z = ZOO[name]()
            row = measure(z, target, threads, rounds, quiet, tune_trials)
        except Exception as err:  # keep going: one broken model must not hide the others
            row = {"model": name, "error": f"{type(err).__name__}: {err}".splitlines()[0],
                   "traceback": traceback.format_exc()[-2000:]}
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        if not quiet:
            msg = row.get("error") or (f"{row['tilecraft_ms']:.2f} ms vs onnxruntime "
                                       f"{row['onnxruntime_ms']:.2f} ms ({row['vs_ort']:.2f}x)")
            print(f"  {name}: {msg}", file=sys.stderr, flush=True)
        write([row], target)           # after each model: a long run keeps what it measured
    return rows


def write(rows: list[dict], target: str) -> dict[str, str]:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    p = paths(target)
    old = {}
    if os.path.exists(p["json"]):        # merge: a partial run keeps the other models' rows
        try:
            with open(p["json"], encoding="utf-8") as f:
                old = {r["model"]: r for r in json.load(f).get("rows", [])}
        except (OSError, ValueError):
            old = {}
    for r in rows:
        old[r["model"]] = r
    from .models import ZOO
    order = {n: i for i, n in enumerate(ZOO)}
    merged = sorted(old.values(), key=lambda r: order.get(r["model"], 1 << 20))
    note = (f"Measured {time.strftime('%Y-%m-%d')} on {machine_info().get('cpu', '?')} "
            f"({os.cpu_count()} cores, shared with other jobs: noisy).")
    doc = {"benchmark": f"zoo-{target}", "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "machine": machine_info(), "target": target, "note": note, "rows": merged}
    _atomic_write(p["json"], json.dumps(doc, indent=2) + "\n")
    _atomic_write(p["md"], markdown_table(merged, target, note))
    bar_chart(merged, p["png"], target)
    return p


def main(argv=None) -> int:
    ensure_clean_openblas_env()
    parser = argparse.ArgumentParser(prog="tilecraft zoo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--show", action="store_true", help="print the last table")
    parser.add_argument("--list", action="store_true", help="list the models")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--tune-trials", type=int, default=0,
                        help="also tune each model with relax.tune (that many trials) and "
                             "time the tuned build")
    args = parser.parse_args(argv)
    if args.list:
        from .models import ZOO
        for n in ZOO:
            print(n)
        return 0
    p = paths(args.target)
    if args.show:
        if not os.path.exists(p["md"]):
            print(f"no zoo results for {args.target} yet: run `tilecraft zoo`", file=sys.stderr)
            return 1
        with open(p["md"], encoding="utf-8") as f:
            print(f.read())
        return 0
    names = [n.strip() for n in args.models.split(",")] if args.models else None
    rows = run(names, args.target, args.quiet, args.tune_trials)
    with open(p["md"], encoding="utf-8") as f:
        print(f.read())
    print(f"(written to {p['json']}, {p['md']}, {p['png']})")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
