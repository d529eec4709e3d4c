"""Remote-tuning throughput: candidates measured per minute through ``RPCRunner`` with one and
with two loopback servers of one key.

A tracker and three servers run on 127.0.0.1: one server under key ``one``, two under key
``two``. The candidates are 128x128x128 float32 GEMMs, split differently, single-threaded (so
two boards on two cores do not fight over one), built once; each round measures the same batch
of trials with ``RPCRunner(key="one")`` and with ``RPCRunner(key="two")``, interleaved, with the
runner's default settings (number 3, repeat 1, min_repeat_ms 50, cache flush, a checked first
call). A trial is what the tuner pays per candidate on the board: upload, load, random inputs
sent, one checked call, outputs fetched and compared, the timing run. The target is >= 1.8x
with two servers.

Two servers can only be twice as fast if each has a core of its own: on this machine (two
cores, shared with other jobs) the client — the runner's threads, uploading and comparing —
competes with both, so the ratio says as much about the machine's load as about the runner;
``load_avg`` is recorded beside it.

``python -m benchmarks.run rpc_tune_throughput``
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time


from tilecraft import rpc
from tilecraft.metaschedule.arg_info import args_info, random_inputs, reference_outputs
from tilecraft.metaschedule.builder import BuilderInput, LocalBuilder
from tilecraft.metaschedule.rpc_runner import RPCRunner
from tilecraft.metaschedule.runner import RunnerInput, compare_outputs
from tilecraft.tensorir import Schedule, te

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIALS = 24        # per round and per setting
ROUNDS = 3
N = 128


def gemm():
    A = te.placeholder((N, N), "float32", "A")
    B = te.placeholder((N, N), "float32", "B")
    k = te.reduce_axis((0, N), "k")
    C = te.compute((N, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    return te.create_prim_func([A, B, C])


def candidates():
    mods = []
    for fi, fj in ((4, 8), (8, 16), (16, 8), (32, 16), (2, 32), (64, 8)):
        sch = Schedule(gemm())
        i, j, k = sch.get_loops(sch.get_block("C"))
        io, ii = sch.split(i, [None, fi])
        jo, ji = sch.split(j, [None, fj])
        sch.reorder(io, jo, k, ii, ji)
        sch.vectorize(ji)
        mods.append(sch.mod)
    return mods


def _start(args: list[str]) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE, text=True,
                            env=env, cwd=REPO, stderr=subprocess.DEVNULL)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError(f"{' '.join(args)} did not start")
    return proc, int(line.split()[4].rsplit(":", 1)[1])


def run() -> list[dict]:
    procs = []
    try:
        tracker, tport = _start(["rpc.tracker", "--host", "127.0.0.1", "--port", "0",
                                 "--insecure-local"])
        procs.append(tracker)
        for key in ("one", "two", "two"):
            procs.append(_start(["rpc.server", "--host", "127.0.0.1", "--port", "0", "--key", key,
                                 "--tracker", f"127.0.0.1:{tport}", "--insecure-local"])[0])
        client = rpc.connect_tracker("127.0.0.1", tport)
        deadline = time.monotonic() + 60
        while True:
            q = client.summary()["queue_info"]
            if q.get("one", {}).get("free") == 1 and q.get("two", {}).get("free") == 2:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the servers did not register: {q}")
            time.sleep(0.1)
        with tempfile.TemporaryDirectory(prefix="rpc-tune-bench-") as tmp:
            with LocalBuilder(work_dir=tmp) as builder:
                built = builder.build([BuilderInput(m, "llvm") for m in candidates()])
            bad = [b.error_msg for b in built if b.error_msg]
            if bad:
                raise RuntimeError(f"candidates did not build: {bad}")
            func = gemm()
            infos = args_info(func)
            ref = reference_outputs(func, infos, 0)
            inputs = [RunnerInput(built[i % len(built)].artifact_path, "llvm", infos, {}, 0, ref)
                      for i in range(TRIALS)]
            rows = _measure(tport, inputs)
            rows += _breakdown(client, inputs[0])
            return rows
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def _measure(tport: int, inputs) -> list[dict]:
    runners = {n: RPCRunner(("127.0.0.1", tport), key, cleanup=False)
               for n, key in ((1, "one"), (2, "two"))}
    for r in runners.values():          # warm up: sessions, the boards' first loads
        r.run(inputs[:4])
    times: dict[int, list[float]] = {1: [], 2: []}
    failures = {1: 0, 2: 0}
    loads = []
    for _ in range(ROUNDS):
        for n, runner in runners.items():
            time.sleep(0.2)
            loads.append(os.getloadavg()[0])
            t0 = time.perf_counter()
            res = runner.run(inputs)
            times[n].append(time.perf_counter() - t0)
            failures[n] += sum(r.error_msg is not None for r in res)
            assert runner.last_num_workers == n
    rows = []
    per_min = {n: len(inputs) / statistics.median(t) * 60 for n, t in times.items()}
    for n in (1, 2):
        rows.append({"servers": n, "trials_per_round": len(inputs), "rounds": ROUNDS,
                     "median_s_per_round": statistics.median(times[n]),
                     "trials_per_min": per_min[n], "speedup": per_min[n] / per_min[1],
                     "failed_trials": failures[n],
                     "note": "" if n == 1 else
                     f"target >= 1.8x: {'met' if per_min[2] / per_min[1] >= 1.8 else 'MISSED'}; "
                     f"{os.cpu_count()} cores, load avg {statistics.mean(loads):.1f} during "
                     f"the runs"})
    return rows


def _breakdown(client, inp) -> list[dict]:
    """Where one trial's time goes: the steps RPCRunner takes, timed one by one on key "one"."""
    steps: dict[str, list[float]] = {}

    def step(name, fn):
        t0 = time.perf_counter()
        out = fn()
        steps.setdefault(name, []).append(time.perf_counter() - t0)
        return out

    with client.request("one", timeout=60) as sess:
        dev = sess.cpu(0)
        for _ in range(5):
            data = open(inp.artifact_path, "rb").read()
            mod = step("upload + load the library", lambda: sess.load_module(
                sess.upload(data, "candidate.so")))
            arrays = random_inputs(inp.args_info, inp.seed)
            args = step("make and send the inputs", lambda: [sess.array(a, dev) for a in arrays])
            step("checked call: run, fetch, compare", lambda: (
                mod["main"](*args), compare_outputs([args[2].numpy()], inp.reference)))
            step("timing run (number 3, min_repeat_ms 50, 32 MiB flush)", lambda: mod.time_evaluator(
                "main", dev, number=3, repeat=1, min_repeat_ms=50,
                cache_flush_bytes=32 << 20)(*args))
    total = sum(statistics.median(v) for v in steps.values())
    return [{"servers": "1 (one trial)", "note": f"{name}: {statistics.median(v) * 1e3:.1f} ms "
                                                 f"({statistics.median(v) / total:.0%})"}
            for name, v in steps.items()]
