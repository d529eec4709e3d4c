"""RPC overhead on loopback: what a remote call, a session and a transfer cost beyond the kernel.

A server (``python -m tilecraft.rpc.server``) runs in its own process on 127.0.0.1; the kernel is tiny
(``B = A * 2 + 1`` over 4 floats), so a remote call's time is almost all overhead: framing,
JSON, two trips through the loopback TCP stack, the session process's dispatch. The target
is well under 1 ms per call. ``time_evaluator`` runs on the board's own clock, so its figure is
the kernel alone, for comparison. Uploads and array transfers give the throughput.

``python -m benchmarks.run rpc_overhead``
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from tilecraft import rpc
from tilecraft import targets
from tilecraft.tensorir import te

from .common import median_time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_kernel():
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] * 2.0 + 1.0, "B")
    return te.create_prim_func([A, B])


def start_server() -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen([sys.executable, "-m", "tilecraft.rpc.server", "--host", "127.0.0.1", "--port",
                             "0", "--key", "bench", "--max-upload-mb", "128",
                             "--max-array-mb", "64"],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError("the rpc server did not start")
    return proc, int(line.split()[4].rsplit(":", 1)[1])


def throughput(fn, nbytes: int, repeat: int = 3) -> float:
    """Median MB/s of ``fn`` moving ``nbytes``."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e6


def run() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="rpc-bench-") as tmp:
        lib = os.path.join(tmp, "tiny.so")
        targets.build(tiny_kernel(), "llvm").export_library(lib)
        local = targets.load_module(lib)
        proc, port = start_server()
        try:
            return _measure(lib, local, port)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _measure(lib: str, local, port: int) -> list[dict]:
    rows = []
    x = np.random.default_rng(0).standard_normal(4).astype("float32")
    y = np.empty_like(x)
    t_local = median_time(lambda: local["main"](x, y), number=2000)

    with rpc.connect("127.0.0.1", port) as sess:
        mod = sess.load_module(sess.upload(lib))
        a, b = sess.array(x), sess.empty((4,), "float32")
        mod["main"](a, b)
        np.testing.assert_allclose(b.numpy(), x * 2 + 1, rtol=1e-6)  # checked before timing
        fn = mod["main"]
        t_call = median_time(lambda: fn(a, b), number=200, repeat=7)
        t_board = mod.time_evaluator("main", sess.cpu(0), number=1000, repeat=5)(a, b).median
        t_read = median_time(b.numpy, number=200, repeat=7)
        t_info = median_time(sess.info, number=200, repeat=7)

        blob = os.urandom(64 << 20)
        up = throughput(lambda: sess.upload(blob, "blob.bin"), len(blob))
        big = np.random.default_rng(1).standard_normal(4 << 20).astype("float32")  # 16 MiB
        remote = sess.array(big)
        to_board = throughput(lambda: sess.array(big), big.nbytes)
        from_board = throughput(remote.numpy, big.nbytes)

    def open_close():
        with rpc.connect("127.0.0.1", port) as s:
            s.info()
    t_session = median_time(open_close, number=5, repeat=5, warmup=1)

    target = "< 1 ms"
    rows.append({"measure": "remote call, tiny kernel (loopback)", "value": t_call * 1e6,
                 "unit": "us/call", "note": f"target {target}; "
                                            f"{'met' if t_call < 1e-3 else 'MISSED'}"})
    rows.append({"measure": "  of which the kernel (board clock, time_evaluator)",
                 "value": t_board * 1e6, "unit": "us/call", "note": "network excluded"})
    rows.append({"measure": "local call, same library (ctypes)", "value": t_local * 1e6,
                 "unit": "us/call", "note": "no RPC"})
    rows.append({"measure": "round trip without a kernel (info)", "value": t_info * 1e6,
                 "unit": "us", "note": ""})
    rows.append({"measure": "read a 4-float array (.numpy())", "value": t_read * 1e6,
                 "unit": "us", "note": ""})
    rows.append({"measure": "open + close a session", "value": t_session * 1e3, "unit": "ms",
                 "note": "handshake, fork of the session process"})
    rows.append({"measure": "upload 64 MiB", "value": up, "unit": "MB/s", "note": ""})
    rows.append({"measure": "array to the board, 16 MiB", "value": to_board, "unit": "MB/s",
                 "note": ""})
    rows.append({"measure": "array from the board, 16 MiB", "value": from_board, "unit": "MB/s",
                 "note": ""})
    return rows
