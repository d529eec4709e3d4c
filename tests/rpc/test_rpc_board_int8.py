"""The int8 dense kernel cross-compiled for aarch64 (with ``+dotprod``: ``sdot``; without:
the widening sequence) runs on the emulated arm64 board bit-exactly, under the same skip /
slow rules as ``test_rpc_board.py``."""
import shutil

import numpy as np
import pytest

from tilecraft import rpc, targets
from tilecraft.relax import default_schedules
from tilecraft.relax.backend.cpu.dense_int8 import dense_u8i8, pack_dense_int8_weight
from tilecraft.rpc.board import emulated_board as eb
from tilecraft.tensorir import te

from rpc_testutil import HOST, Proc, start_tracker, wait_until

ROOT = eb.default_root()
READY = eb.root_ready(ROOT)
MISSING = eb.missing_tools(build=not READY)
if shutil.which("ld.lld") is None:
    MISSING.append("ld.lld (to link the aarch64 kernel)")

pytestmark = [pytest.mark.skipif(bool(MISSING), reason="emulated board needs: "
                                                       + "; ".join(MISSING))]
if not READY:
    pytestmark.append(pytest.mark.slow)

KEY = "emulated-arm64-int8"
K, N = 40, 20
AARCH64 = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76 -mattr=+neon"


def kernel(target):
    """int32 words (m, K/4) x int8 weight (K, N) packed by the kernel's own packing."""
    m = te.var("m")
    x = te.placeholder((m, K // 4), "int32", "x")
    w = te.placeholder((K, N), "int8", "w")
    packed = pack_dense_int8_weight(w, 16)
    y = dense_u8i8(x, packed, N)
    func = te.create_prim_func([x, w, y])
    return default_schedules.apply(func, targets.Target(target))


@pytest.fixture(scope="module")
def board():
    root = eb.ensure_root(ROOT)
    tracker = start_tracker("--ping-interval", "2", "--ping-timeout", "10")
    cmd = eb.board_command(root, "tilecraft.rpc.server", [
        "--host", HOST, "--port", "0", "--key", KEY, "--tracker", f"{HOST}:{tracker.port}",
        "--tracker-retry", "0.5"])
    server = Proc(cmd, env=eb.board_env(), ready_timeout=180)
    try:
        client = rpc.connect_tracker(HOST, tracker.port)
        wait_until(lambda: client.summary()["queue_info"].get(KEY, {}).get("free"), 60,
                   "the emulated board to register")
        yield client
    finally:
        server.stop()
        tracker.stop()


@pytest.mark.parametrize("mattr", ["+dotprod", ""])
def test_int8_dense_kernel_on_the_emulated_board(board, tmp_path, mattr):
    target = AARCH64 + ("," + mattr if mattr else "")
    lib = tmp_path / "int8-aarch64.so"
    mod = targets.build(kernel(target), target)
    if mattr:
        assert "sdot" in mod.get_source("asm")
    mod.export_library(str(lib))
    rng = np.random.default_rng(0)
    with board.request(KEY, timeout=60, session_timeout=120) as sess:
        rmod = sess.load_module(sess.upload(str(lib)))
        for m in (1, 7):
            xb = rng.integers(0, 256, (m, K)).astype(np.uint8)
            xb[0] = 255
            w = rng.integers(-128, 128, (K, N)).astype(np.int8)
            w[0] = -128
            words = xb.view(np.int32).reshape(m, K // 4)
            y = sess.empty((m, N), "int32", sess.cpu(0))
            rmod["main"](sess.array(words), sess.array(w), y)
            np.testing.assert_array_equal(y.numpy(), xb.astype(np.int64) @ w.astype(np.int64))
