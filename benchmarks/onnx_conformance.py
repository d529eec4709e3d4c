"""ONNX backend node tests: how many tilecraft passes, beside onnxruntime, on one harness.

The cases are ONNX's own, generated in memory by ``onnx.backend.test.case.node.collect_testcases``
(one model per case with inputs and expected outputs). Each is imported with
``relax.frontend.from_onnx``, built with ``relax.build(mod, "llvm -opt-level=0")`` (LLVM's
optimizations change no result, only the build time of ~3,000 tiny kernels), run on the
``relax.VirtualMachine`` and compared with the expected outputs as ONNX's backend test runner does
(same shapes, same dtypes, ``assert_allclose`` with the case's rtol / atol). onnxruntime runs
the same models on the same inputs.

Two counts:

* **plain**: the model as it comes, the case's inputs as they come (bfloat16, float8 and 4- / 2-bit
  arrays as ``ml_dtypes`` arrays) and its outputs compared with their declared dtypes. This is the
  headline, the count onnxruntime's is set beside, and the one the CI allow-list keeps.
* **frozen**: where the plain import fails because an input that sets an axis, a size or a count
  is computed at run time (``UnsupportedError.constant_inputs``), the harness also makes those
  inputs initializers with the case's values and imports again, as a model that holds them
  would. The frozen count is the plain passes plus those.

Building ~1,900 tiny models one by one would take long (each ``relax.build`` JITs an LLVM
module), so cases are imported into shared modules, one function each, and built together; a
module that fails to build is split to find the case at fault. Two worker processes share the
work.

Usage::

    python -m benchmarks.onnx_conformance            # both runtimes, JSON + table
    python -m benchmarks.onnx_conformance -k reduce_sum,top_k --no-onnxruntime   # a subset
    python -m benchmarks.onnx_conformance --update-allowlist   # rewrite the test allow-list

Writes ``benchmarks/results/onnx_conformance/<machine>.json``.
"""
from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
import warnings

import numpy as np

ALLOWLIST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                         "onnx", "unsupported_cases.txt")
CHUNK = 24           # cases per shared module
WORKERS = 2
# LLVM's optimizations do not change results (no fast-math), only the time to build ~3,000
# tiny kernels: the conformance run builds without them
TARGET = "llvm -opt-level=0"

_CASES = None


def collect_cases():
    """ONNX's node test cases (generated in memory once per process), sorted by name."""
    global _CASES
    if _CASES is None:
        import onnx.backend.test.case.node as node_cases
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            cases = node_cases.collect_testcases(None)
        _CASES = sorted(cases, key=lambda c: c.name)
    return _CASES


def _array(v):
    import onnx
    from onnx import numpy_helper
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, np.generic):
        return np.asarray(v)
    return v


# ml_dtypes types (bfloat16, float8, 4- and 2-bit): compared in float32, as ONNX's runner does
_ML_DTYPES = {"bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
              "float4_e2m1fn", "float8_e8m0fnu", "int4", "uint4", "int2", "uint2"}


def case_data(case):
    """[(inputs, expected outputs)] as numpy arrays (TensorProtos and numpy scalars converted)."""
    out = []
    for inputs, outputs in case.data_sets:
        out.append(([_array(v) for v in inputs], [_array(v) for v in outputs]))
    return out


def graph_inputs(model):
    inits = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def bind_inputs(model, values: dict):
    """A copy of ``model`` whose graph inputs ``values`` are initializers of those values."""
    import onnx
    from onnx import numpy_helper
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [i for i in m.graph.input if i.name not in values]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    for name, arr in values.items():
        m.graph.initializer.append(numpy_helper.from_array(np.asarray(arr), name))
    return m


def compare(expected, got, rtol, atol):
    """Raise AssertionError unless ``got`` matches ``expected`` as ONNX's runner demands."""
    if len(got) != len(expected):
        raise AssertionError(f"{len(got)} outputs, expected {len(expected)}")
    for k, (e, g) in enumerate(zip(expected, got)):
        if isinstance(e, (list, tuple)):
            if not isinstance(g, (list, tuple)):
                raise AssertionError(f"output {k} should be a sequence")
            compare(list(e), list(g), rtol, atol)
            continue
        if e is None or g is None:
            if (e is None) != (g is None):
                raise AssertionError(f"output {k}: {g!r} vs expected {e!r}")
            continue
        g = np.asarray(g)
        if tuple(g.shape) != tuple(e.shape):
            raise AssertionError(f"output {k} has shape {g.shape}, expected {e.shape}")
        if e.dtype == object:
            np.testing.assert_array_equal(g, e)
            continue
        if g.dtype != e.dtype:
            raise AssertionError(f"output {k} has dtype {g.dtype}, expected {e.dtype}")
        if e.dtype.name in _ML_DTYPES:   # as ONNX's runner compares bfloat16: in float32
            if e.dtype.name == "bfloat16":
                rtol = max(rtol, 2 ** -6)   # two bfloat16 ulps, as ONNX's runner allows
            g, e = g.astype(np.float32), e.astype(np.float32)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"output {k}")


def _first_line(err) -> str:
    problems = getattr(err, "problems", None)
    if problems:
        return (f"{type(err).__name__}: " + "; ".join(problems[:3]))[:400]
    text = str(err).strip().splitlines()
    return (f"{type(err).__name__}: " + (text[0] if text else ""))[:400]


# ---------------------------------------------------------------------------------------------
# tilecraft


def _import_into(bb, case, fname):
    """Import ``case`` as function ``fname`` of ``bb`` as it comes; return its data or raise."""
    from tilecraft.relax.frontend.onnx.importer import GraphImporter
    from tilecraft.relax.frontend.onnx import ops  # noqa: F401  (registers the converters)
    GraphImporter().import_model(case.model, bb, fname)
    return case_data(case)


def _import_frozen(bb, case, fname, err):
    """After the plain import failed with ``err``: import ``case`` as ``fname`` with the inputs
    ``err`` names as needed at import time made initializers of the case's values. Returns the
    data without those inputs; raises when that is not possible or does not help."""
    from tilecraft.relax.frontend import UnsupportedError
    from tilecraft.relax.frontend.onnx.importer import GraphImporter
    data = case_data(case)
    model = case.model
    order = graph_inputs(model)
    values = {}
    for _ in range(4):   # a bound input may reveal the next one (Dropout: training_mode, ratio)
        names = [n for n in getattr(err, "constant_inputs", []) if n in order and n not in values]
        only_constants = all("constant" in p or "known when the model is imported" in p
                             for p in getattr(err, "problems", ["?"]))
        if not names or not only_constants:
            raise err
        for n in names:
            k = order.index(n)
            arrs = [d[0][k] for d in data]
            if any(not np.array_equal(arrs[0], a) for a in arrs[1:]):
                raise err
            values[n] = arrs[0]
        try:
            GraphImporter().import_model(bind_inputs(model, values), bb, fname)
            break
        except UnsupportedError as again:
            err = again
    else:
        raise RuntimeError("the constant inputs could not be resolved")
    keep = [k for k, n in enumerate(order) if n not in values]
    return [([ins[k] for k in keep], outs) for ins, outs in data]


def _numpy(v):
    """A VM result as numpy arrays (tuples, the sequences, as lists)."""
    from tilecraft.targets.runtime.ndarray import NDArray
    if isinstance(v, tuple):
        return [_numpy(x) for x in v]
    return v.numpy() if isinstance(v, NDArray) else v


def _run_function(vm, fname, data, case):
    for inputs, expected in data:
        out = vm[fname](*inputs)
        # one graph output: the result itself (a tuple when it is a sequence)
        got = [_numpy(out)] if len(expected) == 1 else _numpy(out)
        compare(expected, got, case.rtol, case.atol)


def _run_chunk(cases) -> dict:
    """Import, build and run a list of cases in shared modules; name -> result dict."""
    from tilecraft import relax
    from tilecraft import targets
    from tilecraft.relax import BlockBuilder
    from tilecraft.relax.frontend import UnsupportedError
    results = {}
    pending = []   # (case, fname, data, key): key "status" (plain) or "frozen"
    bb = BlockBuilder()
    t0 = time.process_time()
    for k, case in enumerate(cases):
        fname = f"case{k}"
        try:
            pending.append((case, fname, _import_into(bb, case, fname), "status"))
            results[case.name] = {}
            continue
        except Exception as err:   # noqa: BLE001 - every failure is a result here
            results[case.name] = {"status": "import", "error": _first_line(err),
                                  "frozen": "import", "frozen_error": _first_line(err)}
            if not (isinstance(err, UnsupportedError) and err.constant_inputs):
                continue
            first = err
        try:
            data = _import_frozen(bb, case, fname + "_frozen", first)
            pending.append((case, fname + "_frozen", data, "frozen"))
        except Exception as err:   # noqa: BLE001
            results[case.name]["frozen_error"] = _first_line(err)
    _build_and_run(bb, pending, results, relax, targets)
    cpu = round(time.process_time() - t0, 2)
    for case in cases:   # the chunk's CPU time, to find the costly cases
        r = results[case.name]
        if r["status"] == "pass":   # a plain pass passes frozen too
            r["frozen"] = "pass"
        r["chunk_cpu_seconds"] = cpu
    return results


def _set(results, case, key, status, error=""):
    r = results.setdefault(case.name, {})
    r[key] = status
    err_key = "error" if key == "status" else "frozen_error"
    if error:
        r[err_key] = error
    if key == "status":
        r.setdefault("frozen", status)
        if error:
            r.setdefault("frozen_error", error)


def _build_and_run(bb, pending, results, relax, targets):
    if not pending:
        return
    mod = bb.get()
    names = {p[1] for p in pending}
    from tilecraft.relax.expr import Function
    funcs = {n: f for n, f in mod.functions.items() if not isinstance(f, Function) or n in names}
    from tilecraft.tensorir.function import IRModule
    try:
        exe = relax.build(IRModule(funcs), TARGET)
    except Exception as err:   # noqa: BLE001
        if len(pending) == 1:
            case, _, _, key = pending[0]
            _set(results, case, key, "build", _first_line(err))
            return
        half = len(pending) // 2
        for part in (pending[:half], pending[half:]):
            _build_and_run(bb, part, results, relax, targets)
        return
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    for case, fname, data, key in pending:
        try:
            with np.errstate(all="ignore"):
                _run_function(vm, fname, data, case)
            _set(results, case, key, "pass")
        except AssertionError as err:
            _set(results, case, key, "mismatch", _first_line(err))
        except Exception as err:   # noqa: BLE001
            _set(results, case, key, "run", _first_line(err))


def _worker(args):
    names, = args
    by_name = {c.name: c for c in collect_cases()}
    cases = [by_name[n] for n in names]
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(0, len(cases), CHUNK):
            try:
                out.update(_run_chunk(cases[i:i + CHUNK]))
            except Exception as err:   # noqa: BLE001 - keep going; name the chunk's cases
                for c in cases[i:i + CHUNK]:
                    out.setdefault(c.name, {"status": "harness", "error": _first_line(err),
                                            "frozen": "harness"})
    return out


def run_tilecraft(names=None, workers: int = WORKERS) -> dict:
    """name -> {"status": "pass" | "import" | "build" | "run" | "mismatch" (the plain result),
    "frozen": the same with the inputs needed at import time made constants, "error",
    "frozen_error", ...}."""
    cases = collect_cases()
    names = [c.name for c in cases] if names is None else list(names)
    if workers <= 1 or len(names) < 2 * CHUNK:
        return _worker((names,))
    # interleave chunks so both workers get a similar mix of cheap and costly cases
    chunks = [names[i:i + CHUNK] for i in range(0, len(names), CHUNK)]
    parts = [[n for ch in chunks[w::workers] for n in ch] for w in range(workers)]
    # fresh interpreters (spawn), not forks: a fork inherits whatever the caller holds (a test
    # run's GPU driver threads, resource limits), and a worker that dies makes the executor
    # raise instead of leaving the run waiting for results that never come
    ctx = multiprocessing.get_context("spawn")
    out = {}
    try:
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            for part in pool.map(_worker, [(p,) for p in parts]):
                out.update(part)
    except BrokenProcessPool as err:
        raise RuntimeError(f"a conformance worker died while running its cases ({err}); run "
                           f"them in one process to see which: run_tilecraft(workers=1)") from err
    return out


# ---------------------------------------------------------------------------------------------
# onnxruntime


def run_onnxruntime(names=None) -> dict:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    out = {}
    for case in collect_cases():
        if names is not None and case.name not in names:
            continue
        try:
            sess = ort.InferenceSession(case.model.SerializeToString(), so,
                                        providers=["CPUExecutionProvider"])
            order = graph_inputs(case.model)
            for inputs, expected in case_data(case):
                feeds = {n: v for n, v in zip(order, inputs)}
                got = sess.run(None, feeds)
                compare(expected, got, case.rtol, case.atol)
            out[case.name] = {"status": "pass"}
        except AssertionError as err:
            out[case.name] = {"status": "mismatch", "error": _first_line(err)}
        except Exception as err:   # noqa: BLE001
            out[case.name] = {"status": "error", "error": _first_line(err)}
    return out


# ---------------------------------------------------------------------------------------------
# the allow-list (tests/onnx/unsupported_cases.txt)


def reason_of(result: dict) -> str:
    """A short, groupable reason for a failed case."""
    err = result.get("error", "")
    import re
    m = re.search(r"element type (\w+)", err) or re.search(r"casting to (\w+)", err)
    if m:
        return f"no tilecraft dtype for {m.group(1)}"
    m = re.search(r"is a (sequence|optional|map|sparse_tensor)", err)
    if m:
        return f"{m.group(1)} values are not supported"
    m = re.search(r"operator domain '([\w.]+)'", err)
    if m:
        return f"operators of the domain {m.group(1)} are not supported"
    m = re.search(r"the operator (\w+) \(version \d+\) is not supported", err)
    if m:
        return f"operator {m.group(1)} is not supported"
    if "imports no opset of the standard ONNX domain" in err:
        return "models of other domains only (ai.onnx.ml, ai.onnx.preview.training)"
    m = re.search(r"node '[^']*' \((\w+), opset \d+\)(?: -> \w+)?: (.*)", err)
    if m:
        return f"{m.group(1)}: {m.group(2)[:90]}"
    if result["status"] == "mismatch":
        return "results differ beyond the tolerance (float16 / float32 rounding)"
    return f"{result['status']} error: " + err[:100]


def read_allowlist(path: str = ALLOWLIST) -> dict:
    """case name -> reason. The file has ``## reason`` headers, then one case name a line."""
    out = {}
    if not os.path.exists(path):
        return out
    reason = ""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("## "):
                reason = line[3:].strip()
            elif line.strip() and not line.startswith("#"):
                out[line.strip()] = reason
    return out


def write_allowlist(results: dict, path: str = ALLOWLIST) -> None:
    groups = collections.defaultdict(list)
    for name, r in sorted(results.items()):
        if r["status"] != "pass":
            groups[reason_of(r)].append(name)
    lines = ["# ONNX backend node test cases tilecraft does not pass yet, grouped by reason.",
             "# tests/onnx/test_node_conformance.py expects exactly these to fail: a case that",
             "# starts passing must be removed (python -m benchmarks.onnx_conformance",
             "# --update-allowlist rewrites this file).", ""]
    for reason in sorted(groups, key=lambda r: (-len(groups[r]), r)):
        lines.append(f"## {reason}")
        lines += groups[reason]
        lines.append("")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------


def summarize(ours: dict, peer: dict | None) -> dict:
    total = len(collect_cases())
    passed = sum(1 for r in ours.values() if r["status"] == "pass")
    frozen = sum(1 for r in ours.values() if r.get("frozen") == "pass")
    doc = {"cases": total,
           # plain: the models and inputs as they come (the headline)
           "tilecraft_pass": passed, "tilecraft_rate": round(passed / total, 4),
           # frozen: also counting cases that pass once their axes / sizes / counts are constants
           "tilecraft_pass_frozen": frozen, "tilecraft_rate_frozen": round(frozen / total, 4),
           "tilecraft_failures": dict(collections.Counter(
               r["status"] for r in ours.values() if r["status"] != "pass"))}
    if peer is not None:
        p = sum(1 for r in peer.values() if r["status"] == "pass")
        doc.update({"onnxruntime_pass": p, "onnxruntime_rate": round(p / total, 4),
                    "both_pass": sum(1 for n, r in ours.items() if r["status"] == "pass" and
                                     peer.get(n, {}).get("status") == "pass")})
    return doc


def run() -> list[dict]:
    """For ``python -m benchmarks.run onnx_conformance``."""
    ours = run_tilecraft()
    peer = run_onnxruntime()
    s = summarize(ours, peer)
    return [{"runtime": "tilecraft", "passed": s["tilecraft_pass"], "cases": s["cases"],
             "rate": s["tilecraft_rate"], "passed_frozen": s["tilecraft_pass_frozen"]},
            {"runtime": "onnxruntime", "passed": s["onnxruntime_pass"], "cases": s["cases"],
             "rate": s["onnxruntime_rate"]}]


def _cpu_seconds(resource) -> float:
    """User + system CPU time of this process and its finished children."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update-allowlist", action="store_true",
                        help="rewrite tests/onnx/unsupported_cases.txt from this run")
    parser.add_argument("--no-onnxruntime", action="store_true")
    parser.add_argument("-k", default=None,
                        help="only cases whose name contains one of these (comma-separated)")
    parser.add_argument("--workers", type=int, default=WORKERS)
    args = parser.parse_args(argv)
    names = None
    if args.k:
        keys = args.k.split(",")
        names = [c.name for c in collect_cases() if any(k in c.name for k in keys)]
    import resource
    t0 = time.time()
    c0 = _cpu_seconds(resource)
    ours = run_tilecraft(names, args.workers)
    t_ours = time.time() - t0
    cpu_ours = _cpu_seconds(resource) - c0
    peer = None
    t_peer = 0.0
    if not args.no_onnxruntime:
        t0 = time.time()
        peer = run_onnxruntime(set(names) if names else None)
        t_peer = time.time() - t0
    s = summarize(ours, peer)
    s["tilecraft_seconds"] = round(t_ours, 1)
    s["tilecraft_cpu_seconds"] = round(cpu_ours, 1)
    s["onnxruntime_seconds"] = round(t_peer, 1)
    print(json.dumps(s, indent=2))
    if names is None:
        from benchmarks.common import write_results
        rows = [{"case": n, "tilecraft": ours[n]["status"],
                 "tilecraft_error": ours[n].get("error", ""),
                 "tilecraft_frozen": ours[n].get("frozen", ""),
                 "tilecraft_frozen_error": ours[n].get("frozen_error", "")
                 if ours[n].get("frozen") != "pass" else "",
                 "tilecraft_chunk_cpu_seconds": ours[n].get("chunk_cpu_seconds", ""),
                 "onnxruntime": (peer or {}).get(n, {}).get("status", ""),
                 "onnxruntime_error": (peer or {}).get(n, {}).get("error", "")}
                for n in sorted(ours)]
        path = write_results("onnx_conformance", rows, extra={"summary": s})
        print(f"(written to {path})")
        if args.update_allowlist:
            write_allowlist(ours)
            print(f"(allow-list written to {ALLOWLIST})")
    else:
        for n in sorted(ours):
            r = ours[n]
            if r["status"] != "pass":
                frozen = " (passes frozen)" if r.get("frozen") == "pass" else ""
                print(f"{n}: {r['status']}{frozen}: {r.get('error', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
