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
from tilecraft.tensorir.stmt import Allocate, Buffer, BufferStore, Evaluate, For, IfThenElse, seq

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


def _ldmatrix_func(op, trans: int, mul: int, add: int) -> PrimFunc:
    """One warp: a (64, 4)-word shared tile (64 rows of 8 halves) copied from ``S``; lane
    ``l`` gives row ``(mul l + add) % 64`` (``mul`` odd: distinct rows) to ``op`` and writes
    the words it receives to ``O[l]``."""
    n = 4 if op == E.TC_LDMATRIX_X4 else 2
    Sg = Buffer("S", (64, 4), "uint32")
    O = Buffer("O", (32, n), "uint32")
    sh = Buffer("tile", (64, 4), "uint32", scope="shared")
    d = Buffer("d", (n,), "uint32", scope="local")
    tx, i = Var("tx"), Var("i")
    body = seq(
        For(i, 0, 2, "unrolled", Evaluate(call(E.TC_LOAD_B128, sh[tx * 2 + i, 0],
                                                Sg[tx * 2 + i, 0], dtype="int32"))),
        Evaluate(call(op, d[0], sh[floormod(tx * mul + add, 64), 0], const(trans, "int32"), dtype="int32")),
        For(i, 0, n, "unrolled", BufferStore(O, d[i], [tx, i])))
    body = For(tx, 0, 32, "thread_binding", Allocate(d, body), thread_tag="threadIdx.x")
    body = Allocate(sh, body)
    handles = [Var(x.name, "handle") for x in (Sg, O)]
    return PrimFunc(handles, body, dict(zip(handles, (Sg, O))),
                    attrs={"global_symbol": "ldm", "tir.is_scheduled": True})


@pytest.mark.parametrize("trans", [0, 1])
@pytest.mark.parametrize("op", [E.TC_LDMATRIX_X4, E.TC_LDMATRIX_X2])
def test_ldmatrix_matches_numpy(dev, op, trans):
    """``ldmatrix`` (.x4 / .x2, with and without ``.trans``) from row addresses in random
    order (an odd stride): each lane's words as the PTX ISA lays them out."""
    n = 4 if op == E.TC_LDMATRIX_X4 else 2
    rng = np.random.default_rng(2)
    mul, add = 2 * int(rng.integers(0, 32)) + 1, int(rng.integers(0, 64))
    mod = targets.build(_ldmatrix_func(op, trans, mul, add), TARGET)
    src = mod.get_source()
    assert ('asm volatile("ldmatrix' in src) == REAL
    assert (".trans.shared" in src) == bool(REAL and trans)
    S = rng.integers(0, 2 ** 32, (64, 4), dtype=np.uint64).astype(np.uint32)
    P = (np.arange(32) * mul + add) % 64
    out = targets.empty((32, n), "uint32", dev)
    mod["ldm"](targets.array(S, dev), out)
    H = S.view(np.uint16)                     # (64, 8) halves
    want = np.zeros((32, n), np.uint32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for r in range(n):
            if trans:
                lo, hi = H[P[8 * r + 2 * t], g], H[P[8 * r + 2 * t + 1], g]
                want[lane, r] = np.uint32(lo) | (np.uint32(hi) << np.uint32(16))
            else:
                want[lane, r] = S[P[8 * r + g], t]
    np.testing.assert_array_equal(out.numpy(), want)


def test_cp_async(dev):
    """``cp.async`` of 16 bytes a lane into a shared tile, commit, wait; each lane then reads
    another lane's row (the barrier the lowering inserts after the wait)."""
    G = Buffer("G", (64, 4), "uint32")
    O = Buffer("O", (64, 4), "uint32")
    sh = Buffer("tile", (64, 4), "uint32", scope="shared")
    tx, i = Var("tx"), Var("i")
    body = For(tx, 0, 64, "thread_binding", seq(
        Evaluate(call(E.TC_CP_ASYNC, sh[63 - tx, 0], G[tx, 0], dtype="int32")),
        Evaluate(call(E.TC_CP_COMMIT, dtype="int32")),
        Evaluate(call(E.TC_CP_WAIT, const(0, "int32"), dtype="int32")),
        For(i, 0, 4, "unrolled", BufferStore(O, sh[floormod(tx + 5, 64), i], [tx, i]))),
        thread_tag="threadIdx.x")
    body = Allocate(sh, body)
    handles = [Var(x.name, "handle") for x in (G, O)]
    func = PrimFunc(handles, body, dict(zip(handles, (G, O))),
                    attrs={"global_symbol": "cp", "tir.is_scheduled": True})
    mod = targets.build(func, TARGET)
    assert ("cp.async.wait_group 0" in mod.get_source()) == REAL
    rng = np.random.default_rng(3)
    g = rng.integers(0, 2 ** 32, (64, 4), dtype=np.uint64).astype(np.uint32)
    out = targets.empty((64, 4), "uint32", dev)
    mod["cp"](targets.array(g, dev), out)
    np.testing.assert_array_equal(out.numpy(), g[63 - (np.arange(64) + 5) % 64])


def _cp_groups_func() -> PrimFunc:
    """64 work-items: each fills its rows of two shared tiles from ``Old``, issues a
    ``cp.async`` of its row of ``G1`` into the first (group 0) and of ``G2`` into the second
    (group 1), and writes its own rows to ``O``: (0) tile 1 before any wait, (1, 2) tiles 1
    and 2 after ``wait_group 1``, (3) tile 2 after ``wait_group 0``; and (4) the row of tile 2
    that work-item ``(tx + 32) % 64`` copied, after its own ``wait_group 0`` and no barrier
    (the lowering places its barrier after the copies, as if they landed when issued)."""
    Old = Buffer("Old", (2, 64, 4), "uint32")
    G1 = Buffer("G1", (64, 4), "uint32")
    G2 = Buffer("G2", (64, 4), "uint32")
    O = Buffer("O", (5, 64, 4), "uint32")
    sh1 = Buffer("tile1", (64, 4), "uint32", scope="shared")
    sh2 = Buffer("tile2", (64, 4), "uint32", scope="shared")
    tx, i = Var("tx"), Var("i")

    def out(k, tile):
        return For(i, 0, 4, "unrolled", BufferStore(O, tile[tx, i], [k, tx, i]))
    commit = Evaluate(call(E.TC_CP_COMMIT, dtype="int32"))
    body = For(tx, 0, 64, "thread_binding", seq(
        For(i, 0, 4, "unrolled", seq(BufferStore(sh1, Old[0, tx, i], [tx, i]),
                                     BufferStore(sh2, Old[1, tx, i], [tx, i]))),
        Evaluate(call(E.TC_CP_ASYNC, sh1[tx, 0], G1[tx, 0], dtype="int32")), commit,
        Evaluate(call(E.TC_CP_ASYNC, sh2[tx, 0], G2[tx, 0], dtype="int32")), commit,
        out(0, sh1),
        Evaluate(call(E.TC_CP_WAIT, const(1, "int32"), dtype="int32")),
        out(1, sh1), out(2, sh2),
        Evaluate(call(E.TC_CP_WAIT, const(0, "int32"), dtype="int32")),
        out(3, sh2),
        For(i, 0, 4, "unrolled", BufferStore(O, sh2[floormod(tx + 32, 64), i], [4, tx, i]))),
        thread_tag="threadIdx.x")
    body = Allocate(sh1, Allocate(sh2, body))
    handles = [Var(x.name, "handle") for x in (Old, G1, G2, O)]
    return PrimFunc(handles, body, dict(zip(handles, (Old, G1, G2, O))),
                    attrs={"global_symbol": "cp_groups", "tir.is_scheduled": True})


def _runs_work_items_in_turn() -> bool:
    """Does the OpenCL device run a work-group's items one after another between barriers
    (a CPU driver: PoCL), so that what one reads of another's shared memory is determined?"""
    from tilecraft.targets.opencl_backend import list_devices
    return "CPU" in list_devices()[0]["type"].upper()


def test_cp_async_lands_at_its_wait(dev):
    """The emulation's ``cp.async`` is asynchronous: a work-item's copy is not in shared
    memory before its ``wait_group`` (a barrier between does not land it), ``wait_group 1``
    lands the older group only and ``wait_group 0`` the newer one too. Another work-item sees
    the copy only once the copier's wait has run: on a CPU driver, which runs work-items
    0..63 in turn up to the next barrier, items 0..31 read the old rows of items 32..63 (not
    yet at their wait) and items 32..63 the copied rows of 0..31."""
    if REAL:
        pytest.skip("on the hardware a copy may land any time before its wait: what a thread "
                    "reads before the wait is undefined (this checks the emulation's order)")
    if not _runs_work_items_in_turn():
        pytest.skip("the OpenCL device is not a CPU driver: the order in which work-items "
                    "run, which the test reads, is not defined")
    mod = targets.build(_cp_groups_func(), TARGET)
    src = mod.get_source()
    assert "tc_cp_copy tc_cp_queue[2];" in src            # two copies pending at most
    rng = np.random.default_rng(4)

    def words(*shape):
        return rng.integers(0, 2 ** 32, shape, dtype=np.uint64).astype(np.uint32)
    old, g1, g2 = words(2, 64, 4), words(64, 4), words(64, 4)
    out = targets.empty((5, 64, 4), "uint32", dev)
    mod["cp_groups"](targets.array(old, dev), targets.array(g1, dev), targets.array(g2, dev),
                     out)
    got = out.numpy()
    np.testing.assert_array_equal(got[0], old[0])          # before the wait: not there
    np.testing.assert_array_equal(got[1], g1)              # wait_group 1: group 0 landed,
    np.testing.assert_array_equal(got[2], old[1])          # group 1 still pending
    np.testing.assert_array_equal(got[3], g2)              # wait_group 0: all landed
    np.testing.assert_array_equal(got[4][:32], old[1][32:])   # not yet landed by 32..63
    np.testing.assert_array_equal(got[4][32:], g2[:32])       # landed by 0..31


def _cp_stmt(op, *args):
    return Evaluate(call(op, *args, dtype="int32"))


def test_cp_async_queue_capacity():
    """The emulated queue's size: the most copies pending at once, through groups, waits,
    both branches of a conditional and the trips of a loop; a clear error where a loop keeps
    adding copies without a wait."""
    from tilecraft.targets.gpu_codegen import CodegenError
    from tilecraft.targets.opencl_backend.tensor_core import cp_async_queue_capacity
    G = Buffer("G", (64, 4), "uint32")
    sh = Buffer("sh", (64, 4), "uint32", scope="shared")
    k, n = Var("k"), Var("n")
    copy = _cp_stmt(E.TC_CP_ASYNC, sh[0, 0], G[0, 0])
    commit = _cp_stmt(E.TC_CP_COMMIT)

    def wait(m):
        return _cp_stmt(E.TC_CP_WAIT, const(m, "int32"))
    # a ring of 3 stages, 2 copies a stage, the copies of a step conditional
    two = For(Var("e"), 0, 2, "unrolled", copy)
    ring = seq(two, commit, two, commit,
               For(k, 0, n, "serial", seq(wait(1), IfThenElse(k < n - 2, two), commit)))
    assert cp_async_queue_capacity(ring) == 4
    # wait_group 1 keeps the one committed group; the copies not committed it never waits for
    assert cp_async_queue_capacity(seq(two, commit, two, wait(1), two)) == 6
    assert cp_async_queue_capacity(seq(two, commit, two, commit, wait(1), two)) == 4
    assert cp_async_queue_capacity(seq(two, commit, wait(0), two, commit, wait(0))) == 2
    endless = For(k, 0, n, "serial", seq(copy, commit))       # no wait: grows with n
    with pytest.raises(Exception, match="cp.async emulation"):
        cp_async_queue_capacity(endless)
    # building such a kernel for the emulation fails the same way, naming the kernel
    tx = Var("tx")
    body = Allocate(sh, For(tx, 0, 32, "thread_binding", seq(endless, wait(0)),
                            thread_tag="threadIdx.x"))
    handles = [Var(x.name, "handle") for x in (G,)] + [n]
    func = PrimFunc(handles, body, {handles[0]: G},
                    attrs={"global_symbol": "endless", "tir.is_scheduled": True})
    with pytest.raises(CodegenError, match="cp.async emulation"):
        targets.build(func, Target("opencl -device=nvidia-emulated"))
