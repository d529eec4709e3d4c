"""The model zoo: every model through tilecraft, onnxruntime and PyTorch eager, side by side.

``tilecraft zoo [--models a,b] [--target llvm] [--out DIR] [--show] [--list]`` (also
``python -m benchmarks.run zoo``, which writes through ``benchmarks.common.write_results``).
For each model of ``tilecraft.zoo.models.ZOO``:

1. the ONNX model is imported with ``relax.frontend.from_onnx`` (symbolic dims stay symbolic)
   and built with ``relax.build(mod, target, upper_bounds=...)``: untuned, every kernel gets
   the default schedules (``tune_trials`` adds a tuned column: ``relax.tune``, then
   ``relax.build(..., database=...)``);
2. the output is checked against onnxruntime on the timed inputs and on the extra inputs
   (other sequence lengths, the same executable), ``rtol 1e-3``;
3. tilecraft, onnxruntime (``intra_op_num_threads`` = the cores, all graph optimizations) and
   PyTorch eager (``torch.no_grad``, the same threads; for the models written in PyTorch) are
   timed in turn, interleaved round by round (``tilecraft.timing.interleaved``);
4. ``vm.profile`` splits tilecraft's time by kernel kind (convolution, matmul, softmax, ...).

``write(rows, target, out_dir)`` writes ``zoo-<target>.json``, ``zoo-<target>.md`` (the markdown
table) and ``zoo-<target>.png`` (latency ratios, matplotlib) into ``out_dir``, merged with the
rows already there. Columns: ``tilecraft_ms``, ``onnxruntime_ms``, ``torch_ms``, ``vs_ort`` =
onnxruntime / tilecraft (above 1: we are faster), ``vs_torch``, ``build_s``, ``kernels``
(kernel calls per run), ``top_kinds`` (the kernel kinds with the largest shares of
tilecraft's time), ``check``.

onnxruntime (the ``[bench]`` extra) is required: every row is checked against it. Without
PyTorch (the ``[torch]`` extra) the models written in PyTorch get a row that says they were
skipped and why.

Targets (issue 5): untuned within 1.5x of onnxruntime (``vs_ort >= 0.67``) on each model at
batch 1, and ahead of it (``vs_ort > 1``) on the MLP-Mixer and the BERT layer.

``TILECRAFT_ZOO_ROUNDS`` (default 5) sets the interleaved rounds.
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
import traceback
from typing import Callable

import numpy as np

from tilecraft import metaschedule, relax, targets
from tilecraft.relax.frontend import from_onnx
from tilecraft.targets.fileio import atomic_write

from ..devices import open_device
from ..errors import has_module, missing_message, require
from ..progress import iterate
from ..timing import calls_per_round, interleaved, machine_info
from ..tuning import kernel_choices, records_of, trials_done, tuning_minutes
from .models import NEEDS_TORCH, ZOO, ZooModel

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


def _timed_fns(vm, dev, sess, torch_module, inputs: dict, threads: int):
    """The callables timed side by side, and tilecraft's arguments (on its device)."""
    args = [targets.array(a, dev) for a in inputs.values()]
    fn = vm["main"]

    def ours():
        fn(*args)
        dev.sync()            # a GPU queue runs behind the host: time the work, not the enqueue
    fns = {"tilecraft": ours, "onnxruntime": lambda: sess.run(None, inputs)}
    if torch_module is not None:
        import torch
        torch.set_num_threads(threads)
        tins = [torch.from_numpy(a) for a in inputs.values()]

        def eager():
            with torch.no_grad():
                return torch_module(*tins)
        fns["torch"] = eager
    return fns, args


def ort_session(model, threads: int, profile_prefix: str | None = None):
    """An onnxruntime CPU session of ``model`` with all graph optimizations on ``threads``
    threads; ``profile_prefix``: with onnxruntime's profiler on, writing there."""
    ort = require("onnxruntime", "the zoo")
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


def tune_work_dir(z: ZooModel) -> str:
    """Where a zoo model's tuning database lives by default: ``$TILECRAFT_ZOO_TUNE_WORK/<model>``
    or ``<tmp>/tilecraft-zoo-tune-<model>``; a second run with the same directory resumes."""
    root = os.environ.get("TILECRAFT_ZOO_TUNE_WORK")
    return os.path.join(root, z.name) if root else \
        os.path.join(tempfile.gettempdir(), f"tilecraft-zoo-tune-{z.name}")


def _tuned(mod, target, dev, z, trials: int, row: dict, work_dir: str,
           tune_options: dict | None = None, quiet: bool = True):
    """A VM of the model built with ``relax.tune``'s database in ``work_dir`` (``trials`` in
    all: a database that already has some, from an earlier or killed run, is topped up)."""
    ub = z.upper_bounds or None
    # the kernels of the database's layout decisions (relax.tune_layouts), where it has them
    tasks = relax.extract_tasks(mod, target, upper_bounds=ub,
                                database=metaschedule.Database(work_dir))
    done = trials_done(tasks, metaschedule.Database(work_dir), target)
    t0 = time.perf_counter()
    if trials > done:
        db = relax.tune(mod, target, max_trials=trials - done, work_dir=work_dir,
                        upper_bounds=ub, progress=not quiet, **(tune_options or {}))
    else:
        db = metaschedule.Database(work_dir)
    row["tune_s"] = time.perf_counter() - t0
    exe = relax.build(mod, target, database=db, upper_bounds=ub)
    tasks = relax.extract_tasks(mod, target, upper_bounds=ub, database=db)
    row["tune_trials"] = trials_done(tasks, db, target)
    row["tune_minutes"] = tuning_minutes(records_of(tasks, db, target))
    row["tune_work_dir"] = work_dir
    row["tune_tasks"] = kernel_choices(tasks, db, target)
    return relax.VirtualMachine(exe, dev)


def measure(z: ZooModel, target: str, threads: int, rounds: int, quiet: bool = False,
            tune_trials: int = 0, tune_options: dict | None = None,
            tune_dir: str | None = None, device: int = 0) -> dict:
    """One zoo row (see the module docstring); ``tune_trials`` > 0 adds a tuned column
    (``relax.tune`` up to that many trials in all in ``tune_dir`` (default
    ``tune_work_dir(z)``), ``tune_options`` its keyword arguments, then ``relax.build(...,
    database=...)``; the tuned output is checked against onnxruntime too, and all are timed
    interleaved). ``device``: which device of the target's kind runs tilecraft's side."""
    dev, dev_name = open_device(target, device)
    row = {"model": z.name, "description": z.description, "device": dev_name}
    t0 = time.perf_counter()
    mod = from_onnx(z.onnx_model)
    row["import_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    exe = relax.build(mod, target, upper_bounds=z.upper_bounds or None)
    row["build_s"] = time.perf_counter() - t0
    vm = relax.VirtualMachine(exe, dev)
    sess = ort_session(z.onnx_model, threads)
    rtol, atol = 1e-3, 1e-4
    worst = _check(vm, sess, z.inputs, rtol, atol)
    for extra in z.extra_inputs:
        worst = max(worst, _check(vm, sess, extra, rtol, atol))
    sizes = [tuple(a.shape) for a in z.inputs.values()]
    row["check"] = (f"allclose onnxruntime rtol {rtol:g} atol {atol:g} (max abs diff "
                    f"{worst:.1e}; {1 + len(z.extra_inputs)} input set(s))")
    tuned_vm = None
    if tune_trials:
        tuned_vm = _tuned(mod, target, dev, z, tune_trials, row, tune_dir or tune_work_dir(z),
                          tune_options, quiet)
        tw = _check(tuned_vm, sess, z.inputs, rtol, atol)
        for extra in z.extra_inputs:
            tw = max(tw, _check(tuned_vm, sess, extra, rtol, atol))
        row["tuned_check"] = f"allclose onnxruntime rtol {rtol:g} atol {atol:g} (max " \
                             f"abs diff {tw:.1e})"
    fns, args = _timed_fns(vm, dev, sess, z.torch_module, z.inputs, threads)
    if tuned_vm is not None:
        tfn = tuned_vm["main"]

        def tuned():
            tfn(*args)
            dev.sync()
        fns["tuned"] = tuned
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
    """The zoo's table in markdown: one line per row (failed and skipped rows say why)."""
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
        if "error" in r or "skipped" in r:
            cells = [r["model"]] + [""] * (len(cols) - 2) + \
                [r.get("error", r.get("skipped", ""))[:160]]
            cells[cols.index("target")] = "failed" if "error" in r else "skipped"
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
    """Latency ratios (peer / tilecraft) per model, log scale, written to ``path``; None
    without matplotlib (the ``[bench]`` extra) or without a measured row."""
    if not has_module("matplotlib"):
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [r for r in rows if "error" not in r and "skipped" not in r]
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


def target_tag(target: str) -> str:
    """The target as a file-name part: ``"opencl -device=cpu"`` -> ``"opencl_-device_cpu"``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(target))


def paths(target: str, out_dir: str) -> dict[str, str]:
    """The files ``write`` makes in ``out_dir``: ``{"json": ..., "md": ..., "png": ...}``."""
    tag = target_tag(target)
    return {ext: os.path.join(out_dir, f"zoo-{tag}.{ext}") for ext in ("json", "md", "png")}


def note() -> str:
    """The line under the table: when and where it was measured."""
    return (f"Measured {time.strftime('%Y-%m-%d')} on {machine_info().get('cpu', '?')} "
            f"({os.cpu_count()} cores).")


def skipped_row(name: str) -> dict | None:
    """The row of a model that cannot run here (a PyTorch model without torch), else None."""
    if name in NEEDS_TORCH and not has_module("torch"):
        return {"model": name, "skipped": missing_message("torch", f"zoo model {name}")}
    return None


def run(names=None, target: str = "llvm", quiet: bool = False, tune_trials: int = 0,
        out_dir: str | None = None, on_rows: Callable[[list[dict]], None] | None = None,
        tune_root: str | None = None, tune_options: dict | None = None,
        device: int = 0) -> list[dict]:
    """Measure ``names`` (default: the whole zoo) and return the rows. A model that fails gets
    a row with its ``error``, one that cannot run here (PyTorch missing) a row with why it was
    ``skipped``; the others still run.

    After each model the rows so far are saved: with ``out_dir``, by ``write`` (merged with
    the rows already there); with ``on_rows``, by calling it (``benchmarks.zoo`` writes
    through ``benchmarks.common.write_results``). With ``tune_trials`` each model is tuned in
    ``tune_root/<model>`` (default ``tune_work_dir``).

    Raises ``MissingExtraError`` without onnxruntime (the ``[bench]`` extra) and ``KeyError``
    for an unknown name.
    """
    require("onnxruntime", "tilecraft zoo")
    names = list(names or ZOO)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        raise KeyError(f"unknown zoo model {unknown[0]!r}; known: {', '.join(ZOO)}")
    threads = os.cpu_count() or 1
    rounds = int(os.environ.get("TILECRAFT_ZOO_ROUNDS", "5"))
    rows = []
    for name in iterate(names, "zoo", quiet=quiet):
        t0 = time.perf_counter()
        row = skipped_row(name)
        if row is None:
            try:
                z = ZOO[name]()
                tune_dir = os.path.join(tune_root, name) if tune_root else None
                row = measure(z, target, threads, rounds, quiet, tune_trials, tune_options,
                              tune_dir, device)
            except Exception as err:  # keep going: one broken model must not hide the others
                row = {"model": name, "error": f"{type(err).__name__}: {err}".splitlines()[0],
                       "traceback": traceback.format_exc()[-2000:]}
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        if not quiet:
            msg = row.get("error") or row.get("skipped") or (
                f"{row['tilecraft_ms']:.2f} ms vs onnxruntime {row['onnxruntime_ms']:.2f} ms "
                f"({row['vs_ort']:.2f}x)")
            print(f"  {name}: {msg}", file=sys.stderr, flush=True)
        if out_dir is not None:
            write([row], target, out_dir)   # after each model: a long run keeps what it measured
        if on_rows is not None:
            on_rows(list(rows))
    return rows


def write(rows: list[dict], target: str, out_dir: str) -> dict[str, str]:
    """Write the JSON, the markdown table and the chart (when matplotlib is installed) into
    ``out_dir``, merged with the rows of other models already there; returns the paths of the
    files written."""
    os.makedirs(out_dir, exist_ok=True)
    p = paths(target, out_dir)
    old = {}
    if os.path.exists(p["json"]):        # merge: a partial run keeps the other models' rows
        try:
            with open(p["json"], encoding="utf-8") as f:
                old = {r["model"]: r for r in json.load(f).get("rows", [])}
        except (OSError, ValueError):
            old = {}
    for r in rows:
        old[r["model"]] = r
    order = {n: i for i, n in enumerate(ZOO)}
    merged = sorted(old.values(), key=lambda r: order.get(r["model"], 1 << 20))
    doc = {"benchmark": f"zoo-{target}", "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "machine": machine_info(), "target": target, "note": note(), "rows": merged}
    atomic_write(p["json"], json.dumps(doc, indent=2) + "\n", durable=True)
    atomic_write(p["md"], markdown_table(merged, target, note()))
    written = {"json": p["json"], "md": p["md"]}
    if bar_chart(merged, p["png"], target) is not None:
        written["png"] = p["png"]
    return written
