"""A cross-compiled aarch64 kernel on an emulated arm64 board, through a loopback tracker.

The board is Debian's aarch64 Python and numpy under qemu-user (``rpc/board/emulated_board.py``)
running the wheel installed the board's way. The ``arm64_board`` fixture (tests/conftest.py)
builds the board's root file system when it is missing (under a minute; root, mmdebstrap and a
Debian mirror); without qemu / mmdebstrap the tests are skipped, and fail under ``CI=true``.
"""
import subprocess

import numpy as np
import pytest

from tilecraft import rpc
from tilecraft import targets
from tilecraft.tensorir import te

from capabilities import needs_lld, requires_cross_toolchain
from rpc_testutil import FAULTY_C, HOST, Proc, start_tracker, wait_until

pytestmark = [needs_lld]   # links the aarch64 kernels

KEY = "emulated-arm64"


def kernel():
    """B = tanh(A) * exp(-|A|) + A * c over (n, 19): libm calls, vector columns, a scalar."""
    n = te.var("n")
    c = te.var("c", "float32")
    A = te.placeholder((n, 19), "float32", "A")
    B = te.compute((n, 19), lambda i, j: te.tanh(A[i, j]) * te.exp(-te.abs(A[i, j]))
                   + A[i, j] * c, "B")
    return te.create_prim_func([A, B, c])


@pytest.fixture(scope="module")
def board(arm64_board):
    tracker = start_tracker("--ping-interval", "2", "--ping-timeout", "10")
    cmd = arm64_board.server_command("--host", HOST, "--port", "0", "--key", KEY, "--tracker",
                                     f"{HOST}:{tracker.port}", "--tracker-retry", "0.5", "--insecure-local", "-v")
    server = Proc(cmd, env=arm64_board.env(), cwd=arm64_board.path, ready_timeout=180)
    try:
        client = rpc.connect_tracker(HOST, tracker.port)
        wait_until(lambda: client.summary()["queue_info"].get(KEY, {}).get("free"), 60,
                   "the emulated board to register")
        yield client, server
    finally:
        server.stop()
        tracker.stop()


def test_aarch64_kernel_on_the_emulated_board_matches_the_host(board, tmp_path, rng):
    client, server = board
    func = kernel()
    lib = tmp_path / "kernel-aarch64.so"
    targets.build(func, "raspberry-pi/4b-aarch64").export_library(str(lib))
    host = targets.build(func, "llvm")
    with client.request(KEY, timeout=60, session_timeout=60) as sess:
        assert sess.platform["machine"] == "aarch64"
        mod = sess.load_module(sess.upload(str(lib)))
        assert "aarch64" in mod.metadata["triple"]
        dev = sess.cpu(0)
        for rows in (1, 7, 64):
            x = (rng.standard_normal((rows, 19)) * 3).astype("float32")
            c = float(rng.uniform(-2, 2))
            a, b = sess.array(x, dev), sess.empty((rows, 19), "float32", dev)
            mod["main"](a, b, c)
            want = np.empty_like(x)
            host["main"](x, want, c)
            np.testing.assert_allclose(b.numpy(), want, rtol=2e-6, atol=2e-6)
            np.testing.assert_allclose(b.numpy(), np.tanh(x) * np.exp(-np.abs(x)) + x * c,
                                       rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="dimension 1 has extent 18"):
            mod["main"](a, sess.empty((rows, 18), "float32", dev), c)
        res = mod.time_evaluator("main", dev, number=3, repeat=2)(a, b, c)
        assert len(res.results) == 2 and all(t > 0 for t in res.results)
    # the board returns to the pool
    wait_until(lambda: client.summary()["queue_info"][KEY]["free"] == 1, 30, "the board free")


def test_a_segfault_on_the_emulated_board_ends_only_the_session(board, tmp_path):
    requires_cross_toolchain("aarch64-linux-gnu", with_qemu=False)
    client, server = board
    src = tmp_path / "faulty.c"
    src.write_text(FAULTY_C)
    lib = tmp_path / "faulty-aarch64.so"
    subprocess.run(["aarch64-linux-gnu-gcc", "-shared", "-fPIC", "-O1", "-o", str(lib),
                    str(src)], check=True, capture_output=True, timeout=60)
    with client.request(KEY, timeout=60, session_timeout=60) as sess:
        mod = sess.load_module(sess.upload(str(lib)))
        mod["ok"]()
        with pytest.raises(rpc.SessionLost, match="SIGSEGV"):
            mod["crash"]()
    assert server.alive()
    with client.request(KEY, timeout=60, session_timeout=60) as sess:
        assert sess.info()["machine"] == "aarch64"
