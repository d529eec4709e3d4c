"""The tensor-core intrinsics of the OpenCL back end (``targets.opencl_backend.tensor_core``)
alone: one warp's m16n8k16 mma on fragments loaded by the PTX ISA's layout (as the lead's
probe on the H100 did), against numpy; the pack intrinsics; the source forms.

On PoCL the mma is the emulation (``-device=nvidia-emulated``); ``TILECRAFT_TC_DEVICE=nvidia``
runs the same kernels with the inline PTX on NVIDIA's driver.
"""
import os

import numpy as np
import pytest

from capabilities import opencl_device
from tilecraft import targets
from tilecraft.targets import Target
from tilecraft.tensorir import expr as E
from tilecraft.tensorir.expr import Var, call, const, floordiv, floormod
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.stmt import Allocate, Buffer, BufferStore, Evaluate, For, seq

REAL = os.environ.get("TILECRAFT_TC_DEVICE", "") == "nvidia"
TARGET = Target("opencl -device=nvidia" if REAL else "opencl -device=nvidia-emulated")


@pytest.fixture(scope="module")
def dev():
    return targets.opencl("NVIDIA") if REAL else opencl_device()[0]


def _mma_func() -> PrimFunc:
    """One warp: ``C (16 x 8, float32) = A (16 x 16) @ B (16 x 8)``, A given as (16, 8) words
    of two halves (row-major), B as Bᵀ (8, 8) words; fragments as in the PTX ISA."""
    Aw = Buffer("A", (16, 8), "uint32")
    Bw = Buffer("Bt", (8, 8), "uint32")
    C = Buffer("C", (16, 8), "float32")
    a = Buffer("a", (4,), "uint32", scope="local")
    b = Buffer("b", (2,), "uint32", scope="local")
    c = Buffer("c", (4,), "float32", scope="local")
    tx, i = Var("tx"), Var("i")
    g, t = floordiv(tx, 4), floormod(tx, 4)
    body = seq(
        BufferStore(a, Aw[g, t], [0]), BufferStore(a, Aw[g + 8, t], [1]),
        BufferStore(a, Aw[g, t + 4], [2]), BufferStore(a, Aw[g + 8, t + 4], [3]),
        BufferStore(b, Bw[g, t], [0]), BufferStore(b, Bw[g, t + 4], [1]),
        For(i, 0, 4, "unrolled", BufferStore(c, const(0.0, "float32"), [i])),
        Evaluate(call(E.TC_MMA, c[0], a[0], b[0], dtype="int32")),
        For(i, 0, 4, "unrolled", BufferStore(
            C, c[i], [g + 8 * floordiv(i, 2), t * 2 + floormod(i, 2)])))
    for buf in (c, b, a):
        body = Allocate(buf, body)
    body = For(tx, 0, 32, "thread_binding", body, thread_tag="threadIdx.x")
    handles = [Var(x.name, "handle") for x in (Aw, Bw, C)]
    return PrimFunc(handles, body, dict(zip(handles, (Aw, Bw, C))),
                    attrs={"global_symbol": "mma", "tir.is_scheduled": True})


def test_one_mma_matches_numpy(dev):
    mod = targets.build(_mma_func(), TARGET)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((16, 16)).astype(np.float16)
    B = rng.standard_normal((16, 8)).astype(np.float16)
    c = targets.empty((16, 8), "float32", dev)
    mod["mma"](targets.array(A.view(np.uint32).copy(), dev),
                targets.array(np.ascontiguousarray(B.T).view(np.uint32).copy(), dev), c)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert np.abs(c.numpy() - ref).max() < 1e-4 * np.abs(ref).max()


def test_pack_intrinsics(dev):
    """``TC_PACK_LO`` / ``TC_PACK_HI`` pair the halves of two words; ``TC_PACK_HALF2`` rounds
    two floats to float16 into one word."""
    X = Buffer("X", (64,), "uint32")
    Y = Buffer("Y", (64,), "uint32")
    F = Buffer("F", (128,), "float32")
    O = Buffer("O", (3, 64), "uint32")
    tx = Var("tx")
    body = For(tx, 0, 64, "thread_binding", seq(
        BufferStore(O, call(E.TC_PACK_LO, X[tx], Y[tx], dtype="uint32"), [0, tx]),
        BufferStore(O, call(E.TC_PACK_HI, X[tx], Y[tx], dtype="uint32"), [1, tx]),
        BufferStore(O, call(E.TC_PACK_HALF2, F[2 * tx], F[2 * tx + 1], dtype="uint32"),
                    [2, tx])), thread_tag="threadIdx.x")
    handles = [Var(x.name, "handle") for x in (X, Y, F, O)]
    func = PrimFunc(handles, body, dict(zip(handles, (X, Y, F, O))),
                    attrs={"global_symbol": "pack", "tir.is_scheduled": True})
    mod = targets.build(func, TARGET)
    rng = np.random.default_rng(1)
    x = rng.integers(0, 2 ** 32, 64, dtype=np.uint64).astype(np.uint32)
    y = rng.integers(0, 2 ** 32, 64, dtype=np.uint64).astype(np.uint32)
    f = rng.standard_normal(128).astype(np.float32)
    out = targets.empty((3, 64), "uint32", dev)
    mod["pack"](targets.array(x, dev), targets.array(y, dev), targets.array(f, dev), out)
    got = out.numpy()
    np.testing.assert_array_equal(got[0], (x & 0xffff) | (y << 16))
    np.testing.assert_array_equal(got[1], (x >> 16) | (y & 0xffff0000))
    np.testing.assert_array_equal(got[2], f.astype(np.float16).view(np.uint32))


def test_source_forms():
    """The PTX statement for ``-device=nvidia``, the emulation's call and scratch for
    ``-device=nvidia-emulated``, an error naming ``-device=nvidia`` for plain ``opencl``."""
    from tilecraft.targets.opencl_backend import tensor_core as tc
    ptx = targets.build(_mma_func(), Target("opencl -device=nvidia")).get_source()
    assert f'asm volatile("{tc.MMA_PTX}"' in ptx and "tc_mma_emulated" not in ptx
    emu = targets.build(_mma_func(), Target("opencl -device=nvidia-emulated")).get_source()
    assert "tc_mma_emulated(tc_mma_scratch, " in emu and "asm" not in emu
    assert f"__local uint {tc.SCRATCH_NAME}[192]" in emu          # one warp: 32 x 6 words
    with pytest.raises(Exception, match="-device=nvidia"):
        targets.build(_mma_func(), Target("opencl"))
