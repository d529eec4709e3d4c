"""The int4 weight-only dense kernel cross-compiled for aarch64 NEON (16-column panels: the
codes as ``pack_q4_words``' words, each vector of codes a shift, a mask and a convert) runs on
the emulated arm64 board to float rounding of the dequantized weight, under the same skip /
slow rules as ``test_rpc_board.py``. (``tests/relax/test_quantize.py`` checks the packings
themselves against numpy.)"""
import shutil

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.relax import default_schedules
from tilecraft.relax.backend.cpu import cpu_tile_params
from tilecraft.relax.backend.cpu.dense import dense_panel_width
from tilecraft.relax.backend.cpu.dense_int4 import dense_q4_packed
from tilecraft.relax.transform.quantize_int4 import dequantize_int4, quantize_weight_int4
from tilecraft.tensorir import te

import test_rpc_board_int8 as int8_board

AARCH64, MISSING, READY = int8_board.AARCH64, int8_board.MISSING, int8_board.READY
board = int8_board.board            # the emulated board's fixture (its tracker and server)

pytestmark = [pytest.mark.skipif(bool(MISSING), reason="emulated board needs: "
                                                       + "; ".join(MISSING))]
if not READY:
    pytestmark.append(pytest.mark.slow)
if shutil.which("ld.lld") is None:
    pytestmark.append(pytest.mark.skip(reason="ld.lld is not installed"))

KEY = "emulated-arm64-int8"
K, N, G = 67, 40, 32        # odd K, K not a multiple of the group, a ragged last panel


def panel_width(target: str) -> int:
    t = targets.Target(target)
    width = dense_panel_width(N, *cpu_tile_params(t))
    assert width == 4 * cpu_tile_params(t)[0]        # 4 vectors: the words layout
    return width


def q4_kernel(target: str):
    """float32 x (m, K) times the int4 weight on its panels (the kernel as relax.build makes
    it: the panels are the build-time constants' packings, parameters of the kernel)."""
    width = panel_width(target)
    panels, k2, groups = -(-N // width), (K + 1) // 2, -(-K // G)
    m = te.var("m")
    x = te.placeholder((m, K), "float32", "x")
    q = te.placeholder((panels, k2, width // 4), "int32", "q")
    s = te.placeholder((panels, groups, width), "float32", "s")
    o = te.placeholder((panels, groups, width), "float32", "o")
    y = dense_q4_packed(x, q, s, o, G, N)
    return default_schedules.apply(te.create_prim_func([x, q, s, o, y]), targets.Target(target))


def pack(codes: np.ndarray, s: np.ndarray, o: np.ndarray, width: int):
    """numpy's ``pack_q4_words`` (byte ``c`` of word ``i``: column ``c * width/4 + i``) and
    ``pack_q4_panels``, zero beyond ``N``."""
    panels = -(-N // width)

    def padded(a):
        out = np.zeros((a.shape[0], panels * width), a.dtype)
        out[:, :N] = a
        return out
    q = padded(codes).reshape(-1, panels, 4, width // 4).transpose(1, 0, 3, 2).copy()
    sp, op = (padded(a).reshape(-1, panels, width).transpose(1, 0, 2).copy() for a in (s, o))
    return q.view(np.int32)[..., 0].copy(), sp, op


def test_int4_dense_kernel_on_the_emulated_board(board, tmp_path):
    lib = tmp_path / "int4-aarch64.so"
    mod = targets.build(q4_kernel(AARCH64), AARCH64)
    asm = mod.get_source("asm")
    assert "fmla" in asm and "ucvtf\tv" in asm        # the codes unpacked in vectors
    mod.export_library(str(lib))
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.5, (K, N)).astype(np.float32)
    codes, s, o = quantize_weight_int4(w, G, False)
    wd = dequantize_int4(codes, s, o, K, G).astype(np.float64)
    qp, sp, op = pack(codes, s, o, panel_width(AARCH64))
    with board.request(KEY, timeout=60, session_timeout=120) as sess:
        rmod = sess.load_module(sess.upload(str(lib)))
        for m in (1, 5):
            x = rng.normal(size=(m, K)).astype(np.float32)
            y = sess.empty((m, N), "float32", sess.cpu(0))
            rmod["main"](sess.array(x), sess.array(qp), sess.array(sp), sess.array(op), y)
            want = x.astype(np.float64) @ wd
            np.testing.assert_allclose(y.numpy(), want, rtol=1e-4,
                                       atol=1e-4 * np.abs(want).max())
