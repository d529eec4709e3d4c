"""The int8 dense, convolution and depthwise kernels, and a tuner candidate of
``MultiLevelTilingDot4``, cross-compiled for aarch64 (with ``+dotprod``: ``sdot``; without:
the widening sequence) run on the emulated arm64 board bit-exactly, under the same skip /
slow rules as ``test_rpc_board.py``."""
import shutil

import numpy as np
import pytest

from tilecraft import rpc, targets
from tilecraft.relax import default_schedules
from tilecraft.relax.backend.cpu import conv2d_int8, cpu_tile_params
from tilecraft.relax.backend.cpu.dense_int8 import dense_u8i8, pack_dense_int8_weight
from tilecraft.relax.backend.cpu.geometry import ConvGeometry
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


# a stride-2 3x3 convolution: 6 input channels (a word and a half), 8 outputs, padded
CONV = ConvGeometry(6, 9, 9, 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)


def conv_reference(x, w, stride: int, pad: int):
    """int64 NCHW convolution with zero padding (no groups, no dilation): the oracle."""
    x = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    o, _, kh, kw = w.shape
    oh, ow = (x.shape[2] - kh) // stride + 1, (x.shape[3] - kw) // stride + 1
    out = np.zeros((x.shape[0], o, oh, ow), np.int64)
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j].astype(np.int64))
    return out


def conv_kernel(target):
    """uint8 NCHW data (1, 6, 9, 9) x int8 OIHW weight, packed by the family's own packings."""
    t = targets.Target(target)
    plan = conv2d_int8.plan_conv2d_u8i8(CONV, *cpu_tile_params(t))
    x = te.placeholder((1, 6, 9, 9), "uint8", "x")
    w = te.placeholder((8, 6, 3, 3), "int8", "w")
    words = conv2d_int8.pack_conv2d_u8_words(x, plan)
    packed = conv2d_int8.pack_conv2d_int8_weight(w, "OIHW", plan.oc_block)
    y = conv2d_int8.conv2d_nchw_u8i8(words, packed, plan, 8)
    return default_schedules.apply(te.create_prim_func([x, w, y]), t)


@pytest.fixture(scope="module")
def board():
    root = eb.ensure_root(ROOT)
    tracker = start_tracker("--ping-interval", "2", "--ping-timeout", "10")
    cmd = eb.board_command(root, "tilecraft.rpc.server", [
        "--host", HOST, "--port", "0", "--key", KEY, "--tracker", f"{HOST}:{tracker.port}",
        "--tracker-retry", "0.5", "--insecure-local"])
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


@pytest.mark.parametrize("mattr", ["+dotprod", ""])
def test_int8_conv_kernel_on_the_emulated_board(board, tmp_path, mattr):
    target = AARCH64 + ("," + mattr if mattr else "")
    lib = tmp_path / "int8-conv-aarch64.so"
    mod = targets.build(conv_kernel(target), target)
    if mattr:
        assert "sdot" in mod.get_source("asm")
    mod.export_library(str(lib))
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (1, 6, 9, 9)).astype(np.uint8)
    x[0, :, 0] = 255
    w = rng.integers(-128, 128, (8, 6, 3, 3)).astype(np.int8)
    w[0] = -128
    with board.request(KEY, timeout=60, session_timeout=120) as sess:
        rmod = sess.load_module(sess.upload(str(lib)))
        y = sess.empty((1, 8, 5, 5), "int32", sess.cpu(0))
        rmod["main"](sess.array(x), sess.array(w), y)
        np.testing.assert_array_equal(y.numpy(), conv_reference(x, w, 2, 1))


def tuner_dot4_candidate(target):
    """A point of the tuner's space for ``target`` (``MultiLevelTilingDot4``'s seed: the int8
    register tile) of a plain uint8 x int8 -> int32 GEMM (6 x K x 24: 24 columns, whole
    vectors of 4 lanes), tensorized with ``dot4_u8i8``."""
    from tilecraft import metaschedule as ms
    from tilecraft.tensorir.expr import Cast
    x = te.placeholder((6, K), "uint8", "x")
    w = te.placeholder((K, 24), "int8", "w")
    k = te.reduce_axis((0, K), "k")
    y = te.compute((6, 24), lambda i, j: te.sum(Cast("int32", x[i, k]) * Cast("int32", w[k, j]),
                                                axis=k), "C")
    func = te.create_prim_func([x, w, y])
    space = ms.default_space(targets.Target(target))
    seeds = [s for s in space.seeds(func, target)
             if 'call_intrin("int32", "dot4_u8i8"' in s.func.script()]
    assert seeds, "no tensorized seed"
    return seeds[0]


def test_tuner_dot4_candidate_on_the_emulated_board(board, tmp_path):
    target = AARCH64 + ",+dotprod"
    lib = tmp_path / "dot4-rule-aarch64.so"
    mod = targets.build(tuner_dot4_candidate(target).mod, target)
    assert "sdot" in mod.get_source("asm")
    mod.export_library(str(lib))
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (6, K)).astype(np.uint8)
    x[0] = 255
    w = rng.integers(-128, 128, (K, 24)).astype(np.int8)
    w[:, 0] = -128
    with board.request(KEY, timeout=60, session_timeout=120) as sess:
        rmod = sess.load_module(sess.upload(str(lib)))
        y = sess.empty((6, 24), "int32", sess.cpu(0))
        rmod["main"](sess.array(x), sess.array(w), y)
        np.testing.assert_array_equal(y.numpy(), x.astype(np.int64) @ w.astype(np.int64))


def test_int8_depthwise_kernel_on_the_emulated_board(board, tmp_path):
    """The int8 depthwise kernel (``depthwise_int8``: bytes widened in the flat NCHW tile) for
    aarch64, stride 2 and padding, bit-exact."""
    from tilecraft.relax.backend.cpu import conv2d_nchw, depthwise_int8
    target = AARCH64 + ",+dotprod"
    t = targets.Target(target)
    g = ConvGeometry(8, 9, 9, 8, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 8)
    plan = depthwise_int8.plan_depthwise_u8i8(g, *cpu_tile_params(t))
    x = te.placeholder((1, 8, 9, 9), "uint8", "x")
    w = te.placeholder((8, 1, 3, 3), "int8", "w")
    packed = conv2d_nchw.pack_conv2d_nchw_weight(w, "OIHW", plan.oc_block)
    y = depthwise_int8.depthwise_conv2d_nchw_u8i8(x, packed, plan)
    func = default_schedules.apply(te.create_prim_func([x, w, y]), t)
    lib = tmp_path / "dw-int8-aarch64.so"
    targets.build(func, target).export_library(str(lib))
    rng = np.random.default_rng(3)
    xv = rng.integers(0, 256, (1, 8, 9, 9)).astype(np.uint8)
    xv[0, 0] = 255
    wv = rng.integers(-128, 128, (8, 1, 3, 3)).astype(np.int8)
    wv[0] = -128
    # a depthwise convolution: channel c alone with its filter
    want = np.concatenate([conv_reference(xv[:, c:c + 1], wv[c:c + 1], 2, 1) for c in range(8)],
                          axis=1)
    with board.request(KEY, timeout=60, session_timeout=120) as sess:
        rmod = sess.load_module(sess.upload(str(lib)))
        yv = sess.empty((1, 8, 5, 5), "int32", sess.cpu(0))
        rmod["main"](sess.array(xv), sess.array(wv), yv)
        np.testing.assert_array_equal(yv.numpy(), want)
