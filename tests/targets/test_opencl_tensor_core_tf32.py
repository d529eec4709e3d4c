"""The 3xTF32 intrinsics of the OpenCL back end (``targets.opencl_backend.tensor_core``): the
float32 -> tf32 split (``TC_TF32_BIG`` / ``TC_TF32_SMALL``, ``cvt.rna.tf32.f32``) against an
independent float64 model of round-to-nearest-ties-away, and one warp's m16n8k8 tf32 mma on
fragments loaded by the PTX ISA's layout, against a numpy model of the same arithmetic and,
as three mma of the split operands, against float64.

On PoCL the intrinsics are the emulation (``-device=nvidia-emulated``);
``TILECRAFT_TC_DEVICE=nvidia`` runs the same kernels on NVIDIA's driver (``cvt`` and ``mma``
in inline PTX), where the comparisons with the model have a tolerance for the hardware's own
summation.
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


def tf32_model(x: np.ndarray) -> np.ndarray:
    """``x`` (float32) rounded to 10 mantissa bits, to nearest, ties away from zero, computed
    in float64 from the exponent (normal numbers; an independent model of cvt.rna.tf32)."""
    x = np.asarray(x, np.float64)
    out = np.zeros_like(x)
    nz = x != 0
    e = np.floor(np.log2(np.abs(x[nz])))
    q = np.exp2(e - 10)                   # the tf32 ulp at x's exponent
    out[nz] = np.sign(x[nz]) * np.floor(np.abs(x[nz]) / q + 0.5) * q
    return out


def split_model(x: np.ndarray):
    """(big, small) of float32 ``x`` as float64 values."""
    big = tf32_model(x)
    return big, tf32_model((x.astype(np.float64) - big).astype(np.float32))


def _split_func(n: int) -> PrimFunc:
    X = Buffer("X", (n,), "float32")
    O = Buffer("O", (2, n), "uint32")
    tx = Var("tx")
    big = call(E.TC_TF32_BIG, X[tx], dtype="uint32")
    body = For(tx, 0, n, "thread_binding", seq(
        BufferStore(O, big, [0, tx]),
        BufferStore(O, call(E.TC_TF32_SMALL, X[tx], big, dtype="uint32"), [1, tx])),
        thread_tag="threadIdx.x")
    handles = [Var(b.name, "handle") for b in (X, O)]
    return PrimFunc(handles, body, dict(zip(handles, (X, O))),
                    attrs={"global_symbol": "split", "tir.is_scheduled": True})


def test_split_rounds_to_nearest_ties_away(dev):
    """Random values over many exponents, exact ties (both signs) and the values next to
    them, and values that round up into the next binade."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(160) * np.exp2(rng.integers(-60, 60, 160))).astype(np.float32)
    base = np.float32(1.0) + np.arange(1, 17, dtype=np.float32) * np.float32(2.0 ** -10)
    ties = base + np.float32(2.0 ** -11)                        # exactly half an ulp above
    near = np.concatenate([np.nextafter(ties, np.float32(0)), np.nextafter(ties, np.float32(9))])
    up = np.float32(2.0) - np.float32(2.0 ** -12)               # rounds to 2.0
    x = np.concatenate([x, ties, -ties, near, [up, -up, 0.0, 1.0]]).astype(np.float32)
    n = x.size
    mod = targets.build(_split_func(n), TARGET)
    out = targets.empty((2, n), "uint32", dev)
    mod["split"](targets.array(x, dev), out)
    got = out.numpy()
    assert (got[0] & 0x1fff == 0).all(), "the low 13 bits of big are not zero"
    got[1] &= 0xffffe000          # (small's: as the cvt leaves them; the mma ignores them)
    big, small = split_model(x)
    np.testing.assert_array_equal(got[0].view(np.float32).astype(np.float64), big)
    np.testing.assert_array_equal(got[1].view(np.float32).astype(np.float64), small)
    # ties go away from zero
    np.testing.assert_array_equal(got[0, 160:160 + 16].view(np.float32), base + 2.0 ** -10)
    # big + small holds x to about 2^-21 of its magnitude
    rel = np.abs(big + small - x) / np.abs(np.where(x == 0, 1, x))
    assert rel.max() < 2.0 ** -20


def _mma_func(passes: int) -> PrimFunc:
    """One warp: ``C (16 x 8) = A (16 x 8) @ B (8 x 8)`` from float32 A and Bᵀ, each element
    split in the kernel; ``passes`` 3: small x big + big x small + big x big, 1: big x big."""
    A = Buffer("A", (16, 8), "float32")
    Bt = Buffer("Bt", (8, 8), "float32")
    C = Buffer("C", (16, 8), "float32")
    ab = Buffer("ab", (4,), "uint32", scope="local")
    asm = Buffer("as", (4,), "uint32", scope="local")
    bb = Buffer("bb", (2,), "uint32", scope="local")
    bs = Buffer("bs", (2,), "uint32", scope="local")
    c = Buffer("c", (4,), "float32", scope="local")
    tx, i = Var("tx"), Var("i")
    g, t = floordiv(tx, 4), floormod(tx, 4)
    a_el = [A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4]]
    b_el = [Bt[g, t], Bt[g, t + 4]]

    def split(vals, big, small):
        return [BufferStore(big, call(E.TC_TF32_BIG, v, dtype="uint32"), [j])
                for j, v in enumerate(vals)] + \
            [BufferStore(small, call(E.TC_TF32_SMALL, v, big[j], dtype="uint32"), [j])
             for j, v in enumerate(vals)]

    def mma(a, b):
        return Evaluate(call(E.TC_MMA_TF32, c[0], a[0], b[0], dtype="int32"))
    mmas = ([mma(asm, bb), mma(ab, bs)] if passes == 3 else []) + [mma(ab, bb)]
    body = seq(*split(a_el, ab, asm), *split(b_el, bb, bs),
               For(i, 0, 4, "unrolled", BufferStore(c, const(0.0, "float32"), [i])),
               *mmas,
               For(i, 0, 4, "unrolled", BufferStore(
                   C, c[i], [g + 8 * floordiv(i, 2), t * 2 + floormod(i, 2)])))
    for buf in (c, bs, bb, asm, ab):
        body = Allocate(buf, body)
    body = For(tx, 0, 32, "thread_binding", body, thread_tag="threadIdx.x")
    handles = [Var(x.name, "handle") for x in (A, Bt, C)]
    return PrimFunc(handles, body, dict(zip(handles, (A, Bt, C))),
                    attrs={"global_symbol": "mma", "tir.is_scheduled": True})


def mma_model(A: np.ndarray, B: np.ndarray, passes: int) -> np.ndarray:
    """The emulation's arithmetic in numpy: the split operands' products (exact in float32)
    added into a float32 accumulator over k in order, pass after pass."""
    (ab, asm), (bb, bs) = split_model(A), split_model(B)
    pairs = ([(asm, bb), (ab, bs)] if passes == 3 else []) + [(ab, bb)]
    acc = np.zeros((A.shape[0], B.shape[1]), np.float32)
    for a, b in pairs:
        for k in range(A.shape[1]):
            acc = (acc + np.outer(a[:, k], b[k]).astype(np.float32)).astype(np.float32)
    return acc


@pytest.mark.parametrize("passes", [3, 1])
def test_one_mma(dev, passes):
    rng = np.random.default_rng(1 + passes)
    A = (rng.standard_normal((16, 8)) * np.exp2(rng.integers(-8, 8, (16, 8)))).astype(np.float32)
    B = (rng.standard_normal((8, 8)) * np.exp2(rng.integers(-8, 8, (8, 8)))).astype(np.float32)
    mod = targets.build(_mma_func(passes), TARGET)
    c = targets.empty((16, 8), "float32", dev)
    mod["mma"](targets.array(A, dev), targets.array(np.ascontiguousarray(B.T), dev), c)
    got = c.numpy().astype(np.float64)
    exact = A.astype(np.float64) @ B.astype(np.float64)
    scale = np.abs(A).astype(np.float64) @ np.abs(B).astype(np.float64)
    model = mma_model(A, B, passes).astype(np.float64)
    # the model: exactly on the emulation; within float32 summation on the hardware
    assert (np.abs(got - model) / scale).max() <= (2.0 ** -20 if REAL else 0.0)
    err = (np.abs(got - exact) / scale).max()
    if passes == 3:
        assert err < 2.0 ** -19, f"3xTF32 error {err:.2e} is not float32-level"
    else:
        assert 2.0 ** -16 < err < 2.0 ** -9, f"1xTF32 error {err:.2e} is not TF32-level"


def test_source_forms():
    """``cvt.rna.tf32.f32`` and the m16n8k8 mma in inline PTX for ``-device=nvidia``; the
    emulation's functions and scratch for ``-device=nvidia-emulated``; plain ``opencl``
    refuses the intrinsics."""
    from tilecraft.targets.opencl_backend import tensor_core as tc
    ptx = targets.build(_mma_func(3), Target("opencl -device=nvidia"))
    src = ptx.get_source()
    assert f'asm volatile("{tc.MMA_TF32_PTX}"' in src and tc.CVT_TF32_PTX in src
    assert "emulated" not in src and tc.REQUIREMENT in ptx.extensions
    emu = targets.build(_mma_func(3), Target("opencl -device=nvidia-emulated")).get_source()
    assert "tc_mma_tf32_emulated(tc_mma_scratch, " in emu and "asm" not in emu
    assert f"__local uint {tc.SCRATCH_NAME}[192]" in emu
    with pytest.raises(Exception, match="-device=nvidia"):
        targets.build(_mma_func(3), Target("opencl"))
