"""Build time of the zoo: ``python -m benchmarks.run build_time`` (every model below) or
``python -m benchmarks.build_time [--models a,b] [--rounds N] [--jobs N]``.

For each model, in one run, each measurement in a fresh process (nothing carries over between
them but the kernel cache directory), ``--rounds`` times in turn:

* tilecraft: the import (``relax.frontend.from_onnx``) and ``relax.build(mod, "llvm")``, cold
  (an empty kernel cache) and warm (the kernel cache the cold build filled: every graph pass
  runs, no kernel is compiled); wall and CPU seconds (this process and its compiler workers),
  and the phases of ``exe.build_stats``; then, reported apart, ``whole_build_cache=True``
  warm: a build that stored the executable, then one that takes it whole from the cache
  (no graph pass, no kernel lookup);
* Apache TVM (where its interpreter is found: ``$TVM_PYTHON``, else
  ``/work/tvm-venv/bin/python``; ``pip install apache-tvm==0.27.0.post1
  apache-tvm-ffi==0.1.14.post1 onnx``): ``relax.frontend.onnx.from_onnx`` and
  ``tvm.compile(mod, "llvm")`` -- its default pipeline, naive untuned kernels
  (``benchmarks/tvm_build_peer.py``);
* onnxruntime: the creation of an ``InferenceSession``.

The same ONNX file (the zoo's model with its seeded random weights) goes to all three. Times
are medians over the rounds; ratios are the peer's time over ours (above 1: we build faster).
The load average before and after the run is recorded: the machine may be shared.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

WRITES_RESULTS = True   # benchmarks.run: run() writes build_time/<machine>.json itself

MODELS = ("squeezenet", "resnet50", "inception_v1", "densenet121", "shufflenet", "mlp",
          "bert_layer")
# the targets (seconds, 2 cores): ResNet-50 cold <= 5, warm <= 1; every model cold <= 10
TARGET_COLD = {"resnet50": 5.0}
TARGET_WARM = {"resnet50": 1.0}
DEFAULT_TARGET_COLD = 10.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cpu_seconds() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


# -- children -------------------------------------------------------------------------------------

def child_tilecraft(onnx_path: str, cache: str, jobs: int | None, bounds: dict,
                    whole: bool = False) -> dict:
    """Import and build in this (fresh) process; the times and the build's stats."""
    import onnx
    from tilecraft import relax
    from tilecraft.relax.frontend import from_onnx
    model = onnx.load(onnx_path)
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    mod = from_onnx(model)
    t1 = time.perf_counter()
    exe = relax.build(mod, "llvm", upper_bounds=bounds or None, cache=cache, jobs=jobs,
                      whole_build_cache=whole)
    t2 = time.perf_counter()
    st = exe.build_stats
    return {"import_s": t1 - t0, "build_s": t2 - t1, "cpu_s": _cpu_seconds() - cpu0,
            "stats": st.as_dict()}


def child_onnxruntime(onnx_path: str) -> dict:
    import onnxruntime as ort
    t0 = time.perf_counter()
    ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    return {"session_s": time.perf_counter() - t0}


def _child(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("kind")
    p.add_argument("--onnx", required=True)
    p.add_argument("--cache")
    p.add_argument("--jobs", type=int)
    p.add_argument("--bounds", default="{}")
    p.add_argument("--whole-build", action="store_true")
    a = p.parse_args(argv)
    if a.kind == "tilecraft":
        out = child_tilecraft(a.onnx, a.cache, a.jobs, json.loads(a.bounds), a.whole_build)
    else:
        out = child_onnxruntime(a.onnx)
    print("RESULT " + json.dumps(out))
    return 0


# -- the parent -----------------------------------------------------------------------------------

def _run_child(cmd: list[str], env=None) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"exit {proc.returncode}: {tail}"}


def _tvm_python() -> str | None:
    cand = os.environ.get("TVM_PYTHON") or "/work/tvm-venv/bin/python"
    if not os.path.exists(cand):
        return None
    probe = subprocess.run([cand, "-c", "import tvm"], capture_output=True, text=True)
    return cand if probe.returncode == 0 else None


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def measure(name: str, rounds: int, jobs: int | None, work: str, tvm: str | None,
            quiet: bool = False) -> dict:
    """One model's row."""
    from tilecraft.zoo import models
    import onnx
    z = models.ZOO[name]()
    path = os.path.join(work, f"{name}.onnx")
    onnx.save(z.onnx_model, path)
    shapes = {k: list(v.shape) for k, v in z.inputs.items()}
    me = [sys.executable, "-m", "benchmarks.build_time", "--child"]
    env = dict(os.environ)
    env.pop("TILECRAFT_CACHE", None)     # the benchmark chooses the cache directory
    cold, warm, whole, peer, ort_s, errors = [], [], [], [], [], []
    for r in range(rounds):
        cache = os.path.join(work, f"cache-{name}-{r}")
        shutil.rmtree(cache, ignore_errors=True)
        args = ["--onnx", path, "--cache", cache, "--bounds", json.dumps(z.upper_bounds)] + \
            (["--jobs", str(jobs)] if jobs else [])
        c = _run_child(me + ["tilecraft"] + args, env)
        w = _run_child(me + ["tilecraft"] + args, env)
        _run_child(me + ["tilecraft", "--whole-build"] + args, env)   # stores the executable
        h = _run_child(me + ["tilecraft", "--whole-build"] + args, env)
        if "error" not in h and not h["stats"].get("whole_build_hit"):
            h = {"error": "the whole-build cache missed on an unchanged model"}
        o = _run_child(me + ["onnxruntime", "--onnx", path], env)
        t = {"error": "apache-tvm not found (TVM_PYTHON, /work/tvm-venv)"}
        if tvm:
            t = _run_child([tvm, os.path.join(ROOT, "benchmarks", "tvm_build_peer.py"), path,
                            json.dumps(shapes)],
                           {k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        for res, into in ((c, cold), (w, warm), (h, whole), (t, peer), (o, ort_s)):
            if "error" in res:
                errors.append(res["error"])
            else:
                into.append(res)
        shutil.rmtree(cache, ignore_errors=True)
        if not quiet:
            print(f"  {name} round {r + 1}: cold {c.get('build_s', float('nan')):.2f} s, warm "
                  f"{w.get('build_s', float('nan')):.2f} s, whole-build warm "
                  f"{h.get('build_s', float('nan')):.2f} s, TVM "
                  f"{t.get('build_s', float('nan')):.2f} s, load {_load()}", flush=True)
    row = {"model": name}
    if cold:
        row["import_s"] = _median([c["import_s"] for c in cold])
        row["cold_s"] = _median([c["build_s"] for c in cold])
        row["cold_cpu_s"] = _median([c["cpu_s"] for c in cold])
        mid = sorted(cold, key=lambda c: c["build_s"])[len(cold) // 2]["stats"]
        row.update({"kernels": mid["kernels"], "distinct": mid["distinct"], "jobs": mid["jobs"],
                    "cold_phases": {k: round(v, 3) for k, v in mid["phases"].items()},
                    "cold_kernel_phases": {k: round(v, 3) for k, v in
                                           mid["kernel_phases"].items()}})
    if warm:
        row["warm_s"] = _median([w["build_s"] for w in warm])
        row["warm_hits"] = warm[0]["stats"]["cache_hits"]
        mid = sorted(warm, key=lambda w: w["build_s"])[len(warm) // 2]["stats"]
        row["warm_phases"] = {k: round(v, 3) for k, v in mid["phases"].items()}
    if whole:
        row["whole_warm_s"] = _median([w["build_s"] for w in whole])
        row["whole_warm_cpu_s"] = _median([w["cpu_s"] for w in whole])
    if warm:
        row["warm_cpu_s"] = _median([w["cpu_s"] for w in warm])
    if peer:
        row["tvm_import_s"] = _median([p["import_s"] for p in peer])
        row["tvm_build_s"] = _median([p["build_s"] for p in peer])
        row["tvm_version"] = peer[0].get("version")
    if ort_s:
        row["ort_session_s"] = _median([o["session_s"] for o in ort_s])
    if cold and peer:
        row["cold_vs_tvm"] = (row["tvm_import_s"] + row["tvm_build_s"]) / \
            (row["import_s"] + row["cold_s"])
    if warm and peer:
        row["warm_vs_tvm"] = (row["tvm_import_s"] + row["tvm_build_s"]) / \
            (row["import_s"] + row["warm_s"])
    row["target_cold_s"] = TARGET_COLD.get(name, DEFAULT_TARGET_COLD)
    if name in TARGET_WARM:
        row["target_warm_s"] = TARGET_WARM[name]
    if errors:
        row["error"] = "; ".join(dict.fromkeys(errors))
    return row


def markdown_table(rows: list[dict]) -> str:
    """The rows as the table of the docs (seconds; medians)."""
    def f(v):
        return "-" if v is None else f"{v:.2f}"
    lines = ["| model | kernels (distinct) | tilecraft import + cold build | "
             "warm build (kernel cache) | warm build (whole-build cache) | "
             "TVM import + build | cold vs TVM | onnxruntime session |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r.get("cold_vs_tvm")
        lines.append(f"| {r['model']} | {r.get('kernels', '-')} ({r.get('distinct', '-')}) | "
                     f"{f(r.get('import_s'))} + {f(r.get('cold_s'))} | {f(r.get('warm_s'))} | "
                     f"{f(r.get('whole_warm_s'))} | "
                     f"{f(r.get('tvm_import_s'))} + {f(r.get('tvm_build_s'))} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}x'} | "
                     f"{f(r.get('ort_session_s'))} |")
    return "\n".join(lines)


def run(names=None, rounds: int = 3, jobs: int | None = None, quiet: bool = False) -> list[dict]:
    """The rows (``benchmarks.run``'s interface); writes ``build_time/<machine>.json``."""
    from .common import write_results
    names = list(names or MODELS)
    tvm = _tvm_python()
    load_before = _load()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tilecraft-build-time-") as work:
        for name in names:
            rows.append(measure(name, rounds, jobs, work, tvm, quiet))
    extra = {"rounds": rounds, "jobs": jobs or os.cpu_count(), "cores": os.cpu_count(),
             "load_average_before": load_before, "load_average_after": _load(),
             "tvm_python": tvm, "table": markdown_table(rows)}
    path = write_results("build_time", rows, extra)
    if not quiet:
        print(markdown_table(rows))
        print(f"(written to {path})")
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        return _child(argv[1:])
    from .common import ensure_clean_openblas_env
    ensure_clean_openblas_env()
    p = argparse.ArgumentParser(prog="python -m benchmarks.build_time",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--models", help=f"comma-separated (default: {','.join(MODELS)})")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, help="relax.build's jobs (default: one per core)")
    a = p.parse_args(argv)
    names = [n.strip() for n in a.models.split(",")] if a.models else None
    rows = run(names, a.rounds, a.jobs)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
