"""float16 on the emulated arm64 board: kernels and a mixed-precision model cross-compiled for
AArch64 with half-precision arithmetic (``+fullfp16``: native ``half`` registers, 8 lanes per NEON
vector) and without it (``cortex-a72``: float32 arithmetic on half storage), run under qemu-user
through a loopback tracker and checked against numpy's float16 arithmetic and the host.

The board is the ``arm64_board`` fixture of tests/conftest.py (as in ``test_rpc_board.py``:
skipped without qemu / mmdebstrap, its root file system built when missing).
"""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft import rpc
from tilecraft import targets
from tilecraft.models import mlp
from tilecraft.relax.rpc_plugin import RemoteVirtualMachine
from tilecraft.relax.transform import ToMixedPrecision
from tilecraft.tensorir import Schedule, te

from capabilities import needs_lld
from rpc_testutil import HOST, Proc, start_tracker, wait_until

pytestmark = [needs_lld]   # links the aarch64 code

KEY = "emulated-arm64-fp16"
FULLFP16 = "llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+fullfp16 -num-cores=2"
NO_FP16_ARITH = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -num-cores=2"


@pytest.fixture(scope="module")
def board(arm64_board):
    tracker = start_tracker("--ping-interval", "2", "--ping-timeout", "10")
    cmd = arm64_board.server_command("--host", HOST, "--port", "0", "--key", KEY, "--tracker",
                                     f"{HOST}:{tracker.port}", "--tracker-retry", "0.5",
                                     "--plugin", "tilecraft.relax.rpc_plugin",
                                     "--insecure-local", "-v")
    server = Proc(cmd, env=arm64_board.env(), cwd=arm64_board.path, ready_timeout=180)
    try:
        client = rpc.connect_tracker(HOST, tracker.port)
        wait_until(lambda: client.summary()["queue_info"].get(KEY, {}).get("free"), 60,
                   "the emulated board to register")
        yield client
    finally:
        server.stop()
        tracker.stop()


def half_kernel():
    """C = A * B + A / B - 0.3 (float16, each operation rounded), vectorized by 8."""
    n = te.var("n")
    A = te.placeholder((n,), "float16", "A")
    B = te.placeholder((n,), "float16", "B")
    C = te.compute((n,), lambda i: A[i] * B[i] + A[i] / B[i] - te.const(0.3, "float16"), "C")
    sch = Schedule(te.create_prim_func([A, B, C]))
    (i,) = sch.get_loops(sch.get_block("C"))
    _, v = sch.split(i, [None, 8])
    sch.vectorize(v)
    return sch.mod["main"]


def test_fullfp16_computes_in_half_registers():
    asm = targets.build(half_kernel(), FULLFP16).get_source("asm")
    assert "fmul\tv" in asm and ".8h" in asm          # 8 half lanes per multiply
    asm = targets.build(half_kernel(), NO_FP16_ARITH).get_source("asm")
    assert "fcvtl" in asm and not any("fmul" in ln and ".8h" in ln for ln in asm.splitlines())


@pytest.mark.parametrize("target", [FULLFP16, NO_FP16_ARITH], ids=["fullfp16", "cortex-a72"])
def test_half_kernel_on_the_board_matches_numpy_op_for_op(board, target, tmp_path, rng):
    lib = tmp_path / "half.so"
    targets.build(half_kernel(), target).export_library(str(lib))
    with board.request(KEY, timeout=60, session_timeout=120) as sess:
        mod = sess.load_module(sess.upload(str(lib)))
        dev = sess.cpu(0)
        for n in (5, 64, 203):
            a = rng.uniform(-4, 4, n).astype("float16")
            b = rng.uniform(0.5, 4, n).astype("float16")
            c = sess.empty((n,), "float16", dev)
            mod["main"](sess.array(a, dev), sess.array(b, dev), c)
            # numpy rounds every float16 operation to half; so do both targets
            np.testing.assert_array_equal(c.numpy(), a * b + a / b - np.float16(0.3))


def test_mixed_precision_mlp_on_the_board(board, tmp_path, rng):
    m = mlp(in_features=64, hidden=(96, 96), out_features=10, seed=3)
    mod16 = ToMixedPrecision(out_dtype="float16")(m.mod)
    path = relax.build(mod16, FULLFP16).export_library(str(tmp_path / "mlp16.tcx"))
    host = relax.VirtualMachine(relax.build(mod16, "llvm"), targets.cpu(0))
    with board.request(KEY, timeout=60, session_timeout=120) as sess:
        vm = RemoteVirtualMachine(sess, sess.upload(path))
        for batch in (1, 6):
            x, = m.make_inputs(rng, batch=batch)
            y = vm["main"](x)
            ref = m.reference(x)
            # float16 accumulation over 64-96 terms: about 1e-3 of the output's scale
            scale = np.abs(ref).max()
            np.testing.assert_allclose(y, ref, rtol=0, atol=5e-3 * scale)
            # the host rounds each multiply and add; the board fuses them (FMLA): close
            np.testing.assert_allclose(y, host["main"](x).numpy(), rtol=0, atol=2e-3 * scale)
