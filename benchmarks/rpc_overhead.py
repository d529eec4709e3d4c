"""RPC overhead on loopback: what a remote call, a session and a transfer cost beyond the kernel,
and what authentication (a MAC and a sequence number on every frame) adds to each.

Two servers (``python -m tilecraft.rpc.server``) run in their own processes on 127.0.0.1: one
with a token (every session authenticated, every frame MAC'd: HMAC-SHA256), one without
(``--insecure-local``: plain frames, the protocol as it was before frames were authenticated).
Every figure is measured on both, interleaved, so the machine's noise falls on both alike:
small requests call by call (one on each server in turn, thousands of pairs; the median of
each side), transfers round by round (``common.side_by_side``). ``auth/plain`` is the time
ratio (above 1: the MAC costs).

The kernel is tiny (``B = A * 2 + 1`` over 4 floats), so a remote call's time is almost all
overhead: framing, JSON, two trips through the loopback TCP stack, the session process's
dispatch. Targets: a remote call well under 1 ms; the MAC at most 20 us per small call and at
most 10% on a 64 MiB upload. ``time_evaluator`` runs on the board's own clock, so its figure
is the kernel alone, for comparison.

``python -m benchmarks.run rpc_overhead``
"""
from __future__ import annotations

import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from tilecraft import rpc
from tilecraft import targets
from tilecraft.tensorir import te

from .common import median_time, side_by_side

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_kernel():
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] * 2.0 + 1.0, "B")
    return te.create_prim_func([A, B])


def start_server(*security: str) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen([sys.executable, "-m", "tilecraft.rpc.server", "--host", "127.0.0.1",
                             "--port", "0", "--key", "bench", "--max-upload-mb", "128",
                             "--max-array-mb", "64", *security],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                            cwd=REPO)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError("the rpc server did not start")
    return proc, int(line.split()[4].rsplit(":", 1)[1])


def paired(ours, peer, pairs: int, warmup: int = 50) -> tuple[float, float]:
    """Call ``ours`` and ``peer`` alternately ``pairs`` times each; their median seconds per
    call. Alternating call by call gives both the same moments of a noisy machine."""
    for _ in range(warmup):
        ours()
        peer()
    a, b = [], []
    for _ in range(pairs):
        for fn, out in ((ours, a), (peer, b)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(a), statistics.median(b)


def run() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="rpc-bench-") as tmp:
        lib = os.path.join(tmp, "tiny.so")
        targets.build(tiny_kernel(), "llvm").export_library(lib)
        token_file = os.path.join(tmp, "token")
        with open(token_file, "w") as f:
            f.write(secrets.token_hex(32))
        procs = []
        try:
            plain, plain_port = start_server("--insecure-local")
            procs.append(plain)
            authed, auth_port = start_server("--token-file", token_file)
            procs.append(authed)
            with open(token_file) as f:
                token = f.read()
            return _measure(lib, plain_port, auth_port, token)
        finally:
            for proc in procs:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


class _Side:
    """One server's session, kernel and arrays."""

    def __init__(self, lib: str, port: int, token):
        self.port, self.token = port, token
        self.sess = rpc.connect("127.0.0.1", port, token=token)
        self.mod = self.sess.load_module(self.sess.upload(lib))
        x = np.random.default_rng(0).standard_normal(4).astype("float32")
        self.a, self.b = self.sess.array(x), self.sess.empty((4,), "float32")
        self.mod["main"](self.a, self.b)
        np.testing.assert_allclose(self.b.numpy(), x * 2 + 1, rtol=1e-6)  # checked first
        self.fn = self.mod["main"]
        self.big = np.random.default_rng(1).standard_normal(4 << 20).astype("float32")
        self.remote_big = self.sess.array(self.big)

    def open_close(self):
        with rpc.connect("127.0.0.1", self.port, token=self.token) as s:
            s.info()


def _measure(lib: str, plain_port: int, auth_port: int, token: str) -> list[dict]:
    local = targets.load_module(lib)
    x = np.random.default_rng(0).standard_normal(4).astype("float32")
    y = np.empty_like(x)
    t_local = median_time(lambda: local["main"](x, y), number=2000)
    blob = os.urandom(64 << 20)

    P, A = _Side(lib, plain_port, None), _Side(lib, auth_port, token)
    assert A.sess.authenticated and not P.sess.authenticated
    try:
        t_board = A.mod.time_evaluator("main", A.sess.cpu(0), number=1000,
                                       repeat=5)(A.a, A.b).median
        pairs = {
            "call": paired(lambda: A.fn(A.a, A.b), lambda: P.fn(P.a, P.b), 3000),
            "info": paired(A.sess.info, P.sess.info, 2000),
            "read": paired(A.b.numpy, P.b.numpy, 2000),
            "session": paired(A.open_close, P.open_close, 40, warmup=2),
            "upload": side_by_side(lambda: A.sess.upload(blob, "blob.bin"),
                                   lambda: P.sess.upload(blob, "blob.bin"), number=1, rounds=11),
            "to_board": side_by_side(lambda: A.sess.array(A.big), lambda: P.sess.array(P.big),
                                     number=2, rounds=9),
            "from_board": side_by_side(A.remote_big.numpy, P.remote_big.numpy, number=2,
                                       rounds=9),
        }
    finally:
        A.sess.close()
        P.sess.close()

    rows = []

    def per_call(measure, key, scale, unit, note=""):
        t_auth, t_plain = pairs[key]
        rows.append({"measure": measure, "unit": unit, "plain": t_plain * scale,
                     "authenticated": t_auth * scale, "auth/plain": t_auth / t_plain,
                     "MAC cost": f"{(t_auth - t_plain) * 1e6:+.1f} us", "note": note})

    def rate(measure, key, nbytes, note=""):
        t_auth, t_plain = pairs[key]
        rows.append({"measure": measure, "unit": "MB/s", "plain": nbytes / t_plain / 1e6,
                     "authenticated": nbytes / t_auth / 1e6, "auth/plain": t_auth / t_plain,
                     "MAC cost": f"{(t_auth / t_plain - 1) * 100:+.1f}%", "note": note})

    t_call_auth, t_call_plain = pairs["call"]
    added = (t_call_auth - t_call_plain) * 1e6
    per_call("remote call, tiny kernel (loopback)", "call", 1e6, "us/call",
             f"target < 1 ms: {'met' if t_call_auth < 1e-3 else 'MISSED'}; MAC target "
             f"<= 20 us: {'met' if added <= 20 else 'MISSED'}")
    rows.append({"measure": "  of which the kernel (board clock, time_evaluator)", "unit":
                 "us/call", "authenticated": t_board * 1e6, "note": "network excluded"})
    rows.append({"measure": "local call, same library (ctypes)", "unit": "us/call",
                 "plain": t_local * 1e6, "note": "no RPC"})
    per_call("round trip without a kernel (info)", "info", 1e6, "us")
    per_call("read a 4-float array (.numpy())", "read", 1e6, "us")
    per_call("open + close a session", "session", 1e3, "ms",
             "handshake (proofs, key derivation), fork of the session process")
    up_auth, up_plain = pairs["upload"]
    rate("upload 64 MiB", "upload", len(blob),
         f"MAC target <= 10% slower: {'met' if up_auth / up_plain <= 1.10 else 'MISSED'}")
    rate("array to the board, 16 MiB", "to_board", A.big.nbytes)
    rate("array from the board, 16 MiB", "from_board", A.big.nbytes)
    return rows
