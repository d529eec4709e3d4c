"""blockize, tensorize and the tensor-intrinsic registry: interpreter (and compiled) results
against numpy on random data, printed structure, JSON trace round trips, the illegal cases
(which leave the schedule unchanged), and ``intrinsics.available`` for target-like objects."""
import json

import numpy as np
import pytest

from tilecraft.tensorir import te, var
from tilecraft.tensorir.interpret import interpret
from tilecraft.tensorir.schedule import Schedule, ScheduleError, Trace
from tilecraft.tensorir.schedule import intrinsics, tree
from tilecraft.tensorir.schedule.intrinsics import TensorIntrin
from tilecraft.tensorir.expr import TIRError
from tilecraft.tensorir.stmt import For
from tilecraft.tensorir.structural import structural_equal

RNG = np.random.default_rng(11)


def rand(*shape, dtype="float32"):
    if dtype == "int8":
        return RNG.integers(-128, 128, shape).astype("int8")
    return RNG.standard_normal(shape).astype(dtype)


def matmul(M=64, K=64, N=64, dtype="float32", swapped=False):
    A = te.placeholder((M, K), dtype, "A")
    B = te.placeholder((K, N), dtype, "B")
    k = te.reduce_axis((0, K), "k")
    if swapped:  # B * A: the intrinsic's A * B must still match
        C = te.compute((M, N), lambda i, j: te.sum(B[k, j] * A[i, k], axis=k), "C")
    else:
        C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    return te.create_prim_func([A, B, C])


def matvec(n=9, m=64, dtype="float32", acc="float32"):
    A = te.placeholder((n, m), dtype, "A")
    x = te.placeholder((m,), dtype, "x")
    k = te.reduce_axis((0, m), "k")
    if acc == dtype:
        y = te.compute((n,), lambda i: te.sum(A[i, k] * x[k], axis=k), "y")
    else:
        y = te.compute((n,), lambda i: te.sum(A[i, k].astype(acc) * x[k].astype(acc), axis=k),
                       "y")
    return te.create_prim_func([A, x, y])


def run_matmul(func, M=64, K=64, N=64, dtype="float32", compiled=None, **kw):
    a, b = rand(M, K, dtype=dtype), rand(K, N, dtype=dtype)
    c = np.full((M, N), np.nan, dtype)
    if compiled is None:
        interpret(func, a, b, c, **kw)
    else:
        compiled["main"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def run_matvec(func, n=9, m=64, dtype="float32", acc="float32", compiled=None):
    a, x = rand(n, m, dtype=dtype), rand(m, dtype=dtype)
    y = np.zeros((n,), acc) + (np.nan if acc == "float32" else 7)
    if compiled is None:
        interpret(func, a, x, y)
    else:
        compiled["main"](a, x, y)
    ref = a.astype(acc) @ x.astype(acc)
    if acc == "int32":
        np.testing.assert_array_equal(y, ref)
    else:
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def tile(sch, MR, NR, k_outside=True):
    """Split i, j by the micro-tile; loops i_0, j_0, k, i_1, j_1 (or i_0, j_0, i_1, j_1, k)."""
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    i0, i1 = sch.split(i, [None, MR])
    j0, j1 = sch.split(j, [None, NR])
    if k_outside:
        sch.reorder(i0, j0, k, i1, j1)
    else:
        sch.reorder(i0, j0, i1, j1, k)
    return c, i0, j0, k, i1, j1


def round_trip(sch, orig):
    data = json.loads(json.dumps(sch.trace.to_json()))
    again = Trace.from_json(data).apply(orig)
    assert structural_equal(again.func, sch.func), again.func.script()


def expect_error(sch, fn, *patterns):
    before, n = sch.func, len(sch.trace)
    with pytest.raises(ScheduleError) as info:
        fn()
    for p in patterns:
        assert p in str(info.value), str(info.value)
    assert sch.func is before and structural_equal(sch.func, before)
    assert len(sch.trace) == n
    return str(info.value)


def names(func):
    return [br.block.name for br in tree.all_blocks(func)]


def build(mod):
    from tilecraft import targets
    return targets.build(mod, "llvm")


def host_isas():
    from tilecraft import targets
    return intrinsics.target_isas(targets.Target("llvm"))


# ---------------------------------------------------------------------------------------------
# blockize


def test_blockize_tiled_matmul_structure_correctness_and_trace():
    f = matmul()
    sch = Schedule(f)
    c, i0, j0, k, i1, j1 = tile(sch, 4, 16)
    co = sch.blockize(i1)
    text = sch.func.script()
    assert names(sch.func) == ["root", "C_o", "C_init", "C"]
    assert 'with T.block("C_o"):' in text
    assert "vi_o = T.axis.spatial(16, i_0)" in text
    assert "vj_o = T.axis.spatial(4, j_0)" in text
    assert "vk = T.axis.reduce(64, k)" in text
    assert "vi_i = T.axis.spatial(4, i_1)" in text
    assert "vj_i = T.axis.spatial(16, j_1)" in text
    assert "T.reads(A[vi_o * 4:vi_o * 4 + 4, vk], B[vk, vj_o * 16:vj_o * 16 + 16])" in text
    assert "T.writes(C[vi_o * 4:vi_o * 4 + 4, vj_o * 16:vj_o * 16 + 16])" in text
    assert "C[vi_o * 4 + vi_i, vj_o * 16 + vj_i] = C[vi_o * 4 + vi_i, vj_o * 16 + vj_i] + " \
           "A[vi_o * 4 + vi_i, vk] * B[vk, vj_o * 16 + vj_i]" in text
    # the init moved to the outer block; the inner block lost it
    outer = sch.get(co)
    assert outer.init is not None and sch.get(c).init is None
    assert [iv.kind for iv in outer.iter_vars] == ["spatial", "spatial", "reduce"]
    # the loops keep their variables
    assert isinstance(sch.get(i1), For) and isinstance(sch.get(k), For)
    assert [sch.get(x).loop_var.name for x in sch.get_loops(co)] == ["i_0", "j_0", "k"]
    run_matmul(sch.func)
    round_trip(sch, f)


def test_blockize_whole_reduction_inside_then_decompose():
    M, K, N = 12, 10, 16
    f = matmul(M, K, N)
    sch = Schedule(f)
    c, i0, j0, k, i1, j1 = tile(sch, 4, 8, k_outside=False)
    co = sch.blockize(i1)
    text = sch.func.script()
    # the reduce iter var is entirely inside: its outer part is a unit reduce iter var
    assert "vk_o = T.axis.reduce(1, 0)" in text
    assert "vk_i = T.axis.reduce(10, k)" in text
    run_matmul(sch.func, M, K, N)
    init = sch.decompose_reduction(co, j0)
    assert sch.get(co).init is None and sch.get(init).name == "C_o_init"
    run_matmul(sch.func, M, K, N)
    round_trip(sch, f)


def test_blockize_tail_tiles_and_symbolic_rows():
    n = var("n")
    f = matmul(n, 6, 12)
    sch = Schedule(f)
    c, i0, j0, k, i1, j1 = tile(sch, 4, 4)
    sch.blockize(i1)
    text = sch.func.script()
    # the tail predicate stays on the inner block, on the outer iter var
    assert "T.where(vi_o * 4 + i_1 < n)" in text, text
    for rows in (7, 8, 13):
        run_matmul(sch.func, rows, 6, 12)
    round_trip(sch, f)


def test_blockize_nested_and_unit_iters():
    f = matmul(8, 8, 8)
    sch = Schedule(f)
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    i0, i1, i2 = sch.split(i, [2, 1, 4])
    sch.reorder(i0, j, k, i1, i2)
    keep = sch.copy()
    sch.blockize(i1)
    # preserve_unit_iters: the unit loop i_1 stays in the inner binding
    assert "vi_i = T.axis.spatial(4, i_1 * 4 + i_2)" in sch.func.script()
    run_matmul(sch.func, 8, 8, 8)
    keep.blockize(keep.get_loops(keep.get_block("C"))[3], preserve_unit_iters=False)
    assert "vi_i = T.axis.spatial(4, i_2)" in keep.func.script()
    run_matmul(keep.func, 8, 8, 8)
    # blockize again inside the outer block
    co2 = sch.blockize(i2)
    assert sch.get(co2).name == "C_o_1"
    run_matmul(sch.func, 8, 8, 8)
    round_trip(sch, f)


def test_blockize_list_of_blocks():
    n = 10
    A = te.placeholder((n, 6), "float32", "A")
    B = te.compute((n, 6), lambda i, j: A[i, j] * 2.0, "B")
    C = te.compute((n, 6), lambda i, j: B[i, j] + 1.0, "C")
    f = te.create_prim_func([A, C])
    sch = Schedule(f)
    b, c = sch.get_block("B"), sch.get_block("C")
    sch.compute_at(b, sch.get_loops(c)[0])
    outer = sch.blockize([b, c])
    text = sch.func.script()
    assert sch.get(outer).name == "B_C_o"
    assert "vi_o = T.axis.spatial(10, i)" in text
    assert [iv.var.name for iv in sch.get(outer).iter_vars] == ["vi_o"]
    a = rand(n, 6)
    out = np.full((n, 6), np.nan, "float32")
    interpret(sch.func, a, out)
    np.testing.assert_allclose(out, a * 2 + 1, rtol=1e-6)
    round_trip(sch, f)
    # a single block
    sch2 = Schedule(f)
    single = sch2.blockize([sch2.get_block("C")])
    assert sch2.get(single).name == "C_o"
    assert [iv.var.name for iv in sch2.get(single).iter_vars] == ["vi_o", "vj_o"]
    interpret(sch2.func, a, out)
    np.testing.assert_allclose(out, a * 2 + 1, rtol=1e-6)


def test_blockize_illegal():
    f = matmul(8, 6, 6)
    sch = Schedule(f)
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    # non-affine: a fused loop split by a factor that does not divide the row length
    fused = sch.fuse(i, j)
    f0, f1 = sch.split(fused, [None, 4])
    expect_error(sch, lambda: sch.blockize(f1), "blockize", "block C", "affine")
    # not a multiple: the inner part of a split-of-a-split with a tail
    sch = Schedule(f)
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    i0, i1 = sch.split(i, [None, 4])
    i10, i11 = sch.split(i1, [None, 3])
    expect_error(sch, lambda: sch.blockize(i11), "blockize", "block C", "not a multiple")
    # two blocks below the loop
    A = te.placeholder((8,), "float32", "A")
    B = te.compute((8,), lambda i: A[i] + 1.0, "B")
    C = te.compute((8,), lambda i: B[i] * 2.0, "C")
    g = te.create_prim_func([A, C])
    sch = Schedule(g)
    b, c = sch.get_block("B"), sch.get_block("C")
    loop = sch.get_loops(c)[0]
    sch.compute_at(b, loop)
    expect_error(sch, lambda: sch.blockize(loop), "blockize", "exactly one block", "SeqStmt")
    expect_error(sch, lambda: sch.blockize([]), "blockize", "LoopRV")
    expect_error(sch, lambda: sch.blockize([b, b]), "blockize", "more than once")
    # not consecutive / other blocks in between
    D = te.compute((8,), lambda i: A[i] - 1.0, "D")
    E = te.compute((8,), lambda i: A[i] * 3.0, "E")
    F = te.compute((8,), lambda i: A[i] * 4.0, "F")
    h = te.create_prim_func([A, D, E, F])
    sch = Schedule(h)
    d, f_ = sch.get_block("D"), sch.get_block("F")
    expect_error(sch, lambda: sch.blockize([d, f_]), "blockize", "not consecutive")


# ---------------------------------------------------------------------------------------------
# tensorize


GEMMS = [  # (isa, MR, NR, M, K, N, vector type in the raw LLVM IR)
    ("avx512", 4, 16, 64, 64, 64, "<16 x float>"),
    ("avx512", 6, 16, 48, 32, 64, "<16 x float>"),
    ("avx512", 2, 32, 16, 8, 64, "<16 x float>"),
    ("avx2", 4, 8, 32, 16, 32, "<8 x float>"),
    ("neon", 4, 4, 16, 12, 16, "<4 x float>"),
]


@pytest.mark.parametrize("isa,MR,NR,M,K,N,vec", GEMMS)
def test_tensorize_gemm_outer_product(isa, MR, NR, M, K, N, vec):
    f = matmul(M, K, N)
    sch = Schedule(f)
    c, i0, j0, k, i1, j1 = tile(sch, MR, NR)
    sch.tensorize(i1, f"outer_product_f32_{isa}_{MR}x{NR}")
    co = sch.get_block("C_o")
    text = sch.func.script()
    assert f"for ji in T.vectorized({intrinsics.ISA_LANES[isa]}):" in text
    assert f"for i in T.unroll({MR}):" in text
    assert 'T.block("C")' not in text  # the inner block is replaced
    run_matmul(sch.func, M, K, N)
    # the init too: decompose the outer block, tensorize the init with the fill intrinsic
    init = sch.decompose_reduction(co, j0)
    sch.tensorize(init, f"fill_zero_f32_{isa}_{MR}x{NR}")
    assert 'T.block("C_init")' not in sch.func.script()
    run_matmul(sch.func, M, K, N)
    round_trip(sch, f)
    mod = build(sch.mod)
    run_matmul(sch.func, M, K, N, compiled=mod)
    raw = mod.get_source("ll-raw")
    # the impl's vectorized loops are vector code (on any x86 host: TIR is portable)
    assert vec in raw and "fmul " + vec in raw and "fadd " + vec in raw


def test_tensorize_avx512_vector_fma_on_host():
    if "avx512" not in host_isas():
        pytest.skip("the host has no AVX-512 (targets.Target('llvm').vector_width < 512)")
    f = matmul(32, 16, 32)
    sch = Schedule(f)
    c, i0, j0, k, i1, j1 = tile(sch, 4, 16)
    sch.tensorize(i1, "outer_product_f32_avx512_4x16")
    mod = build(sch.mod)
    run_matmul(sch.func, 32, 16, 32, compiled=mod)
    ir = mod.get_source("ll")
    assert "<16 x float>" in ir
    assert ("fmul <16 x float>" in ir and "fadd <16 x float>" in ir) or "llvm.fma.v16f32" in ir
    assert "zmm" in mod.get_source("asm")


def test_tensorize_commuted_product_and_block_rv():
    f = matmul(16, 8, 16, swapped=True)
    sch = Schedule(f)
    c, i0, j0, k, i1, j1 = tile(sch, 4, 16)
    co = sch.blockize(i1)
    sch.tensorize(co, "outer_product_f32_avx512_4x16")
    run_matmul(sch.func, 16, 8, 16)
    round_trip(sch, f)


@pytest.mark.parametrize("isa,L", [("avx2", 16), ("avx512", 16), ("neon", 8), ("avx2", 8)])
def test_tensorize_dot_product_row_reduction(isa, L):
    f = matvec(9, 64)
    sch = Schedule(f)
    y = sch.get_block("y")
    i, k = sch.get_loops(y)
    k0, k1 = sch.split(k, [None, L])
    sch.tensorize(k1, f"dot_product_f32_{isa}_{L}")
    text = sch.func.script()
    assert 'acc = T.alloc_buffer(' in text and "y[vi] = y[vi] + acc[0]" in text
    assert "A[vi, vk_o * " in text
    run_matvec(sch.func)
    round_trip(sch, f)
    mod = build(sch.mod)
    run_matvec(sch.func, compiled=mod)
    lanes = intrinsics.ISA_LANES[isa]
    assert f"<{lanes} x float>" in mod.get_source("ll-raw")


def test_tensorize_dot_product_int8():
    f = matvec(5, 64, "int8", "int32")
    sch = Schedule(f)
    y = sch.get_block("y")
    i, k = sch.get_loops(y)
    k0, k1 = sch.split(k, [None, 32])
    yo = sch.blockize(k1)
    sch.tensorize(yo, "dot_product_i8i32_avx2_32")
    run_matvec(sch.func, 5, 64, "int8", "int32")
    sch.decompose_reduction(yo, k0)
    run_matvec(sch.func, 5, 64, "int8", "int32")
    round_trip(sch, f)
    mod = build(sch.mod)
    run_matvec(sch.func, 5, 64, "int8", "int32", compiled=mod)
    raw = mod.get_source("ll-raw")
    assert "<8 x i32>" in raw and "sext <8 x i8>" in raw
    # the int8 intrinsic does not match a float32 reduction
    g = matvec(5, 64)
    sch = Schedule(g)
    i, k = sch.get_loops(sch.get_block("y"))
    k0, k1 = sch.split(k, [None, 32])
    yo = sch.blockize(k1)
    expect_error(sch, lambda: sch.tensorize(yo, "dot_product_i8i32_avx2_32"),
                 "tensorize", "'y_o'", "dot_product_i8i32_avx2_32", "dtype")


def test_tensorize_mismatches_leave_the_schedule_unchanged():
    # wrong dtype
    sch = Schedule(matmul(16, 8, 16, dtype="float64"))
    c, i0, j0, k, i1, j1 = tile(sch, 4, 16)
    co = sch.blockize(i1)
    msg = expect_error(sch, lambda: sch.tensorize(co, "outer_product_f32_avx512_4x16"),
                       "tensorize", "'C_o'", "outer_product_f32_avx512_4x16", "dtype")
    assert "float64" in msg and "float32" in msg
    # wrong tile shape (also through the loop form: nothing is blockized)
    sch = Schedule(matmul(16, 8, 16))
    c, i0, j0, k, i1, j1 = tile(sch, 4, 8)
    msg = expect_error(sch, lambda: sch.tensorize(i1, "outer_product_f32_avx512_4x16"),
                       "tensorize", "'C_o'", "extent 8", "16", "tile shape")
    co = sch.blockize(i1)
    expect_error(sch, lambda: sch.tensorize(co, "outer_product_f32_avx512_8x16"),
                 "tensorize", "extent 4", "8")
    # a computation that is not the intrinsic's: C = A * 2 elementwise, and a max-reduction
    A = te.placeholder((16, 16), "float32", "A")
    B = te.compute((16, 16), lambda i, j: A[i, j] * 2.0, "B")
    sch = Schedule(te.create_prim_func([A, B]))
    i, j = sch.get_loops(sch.get_block("B"))
    i0, i1 = sch.split(i, [None, 4])
    bo = sch.blockize(i1)
    expect_error(sch, lambda: sch.tensorize(bo, "outer_product_f32_avx512_4x16"),
                 "tensorize", "'B_o'", "computes")
    k = te.reduce_axis((0, 16), "k")
    Mx = te.compute((4,), lambda i: te.max(A[i, k], axis=k), "M")
    sch = Schedule(te.create_prim_func([A, Mx]))
    i, kk = sch.get_loops(sch.get_block("M"))
    expect_error(sch, lambda: sch.tensorize(kk, "dot_product_f32_avx512_16"),
                 "tensorize", "'M_o'", "dot_product_f32_avx512_16")
    # a block that is not blockized, an unknown intrinsic, a bad family size
    sch = Schedule(matmul(16, 8, 16))
    c, i0, j0, k, i1, j1 = tile(sch, 4, 16)
    expect_error(sch, lambda: sch.tensorize(c, "outer_product_f32_avx512_4x16"),
                 "tensorize", "'C'", "blockize")
    expect_error(sch, lambda: sch.tensorize(i1, "no_such_intrinsic"), "tensorize",
                 "no_such_intrinsic")
    expect_error(sch, lambda: sch.tensorize(i1, "outer_product_f32_avx512_4x8"), "tensorize",
                 "multiple of the 16")
    # a partial tile (tail) does not match
    sch = Schedule(matmul(10, 8, 16))
    c, i0, j0, k, i1, j1 = tile(sch, 4, 16)
    expect_error(sch, lambda: sch.tensorize(i1, "outer_product_f32_avx512_4x16"),
                 "tensorize", "predicate")


# ---------------------------------------------------------------------------------------------
# the registry


def test_register_and_get_custom_intrinsic():
    desc, impl = intrinsics.outer_product_funcs(2, 8, lanes=4)
    name = "test_tensorize_outer_2x8"
    intrin = TensorIntrin.register(name, desc, impl, override=True)
    assert TensorIntrin.get(name) is intrin and intrin.isa is None
    with pytest.raises(TIRError, match="already registered"):
        TensorIntrin.register(name, desc, impl)
    assert TensorIntrin.get("nope", allow_missing=True) is None
    with pytest.raises(TIRError, match="no tensor intrinsic named 'nope'"):
        TensorIntrin.get("nope")
    other_desc, _ = intrinsics.outer_product_funcs(2, 16, lanes=4)
    with pytest.raises(TIRError, match="one shape and dtype"):
        TensorIntrin.register("test_tensorize_bad", other_desc, impl)
    f = matmul(8, 4, 16)
    sch = Schedule(f)
    c, i0, j0, k, i1, j1 = tile(sch, 2, 8)
    sch.tensorize(i1, name)
    run_matmul(sch.func, 8, 4, 16)
    round_trip(sch, f)


class _Target:
    def __init__(self, arch, mattr=(), vector_width=128):
        self.arch, self.mattr, self.vector_width = arch, tuple(mattr), vector_width


def test_available_for_target_like_objects():
    avx512 = intrinsics.available(_Target("x86_64", ["+avx512f"], 512))
    avx2 = intrinsics.available(_Target("x86_64", ["+avx2", "+fma"], 256))
    neon = intrinsics.available(_Target("aarch64", ["+neon"], 128))
    sse = intrinsics.available(_Target("x86_64", [], 128))
    assert "outer_product_f32_avx512_4x16" in avx512 and "outer_product_f32_avx2_6x16" in avx512
    assert "dot_product_f32_avx512_16" in avx512 and "fill_zero_f32_avx512_4x16" in avx512
    assert "outer_product_f32_avx2_4x8" in avx2 and "dot_product_i8i32_avx2_32" in avx2
    assert not any("avx512" in n for n in avx2) and not any("neon" in n for n in avx2)
    assert "outer_product_f32_neon_4x4" in neon and "dot_product_i8i32_neon_8" in neon
    assert not any("avx" in n for n in neon)
    assert not any(n.startswith(("outer_product_f32_", "dot_product_")) for n in sse)
    assert intrinsics.available(_Target("arm", [], 64)) == intrinsics.available(
        _Target("riscv64", [], 128))
    assert "outer_product_f32_neon_2x8" in intrinsics.available(_Target("arm", ["+neon"], 128))
    # every listed name resolves
    for n in avx512[:5] + neon[-5:]:
        assert TensorIntrin.get(n).name == n
    with pytest.raises(TIRError, match="vector_width"):
        intrinsics.available(object())


def test_available_for_real_targets():
    from tilecraft import targets
    pi = intrinsics.available(targets.Target("raspberry-pi/4b-aarch64"))
    assert "outer_product_f32_neon_4x4" in pi and not any("avx" in n for n in pi)
    x86 = intrinsics.available(targets.Target("llvm -mtriple=x86_64-linux-gnu -mattr=+avx2,+fma"))
    assert "outer_product_f32_avx2_4x8" in x86 and not any("avx512" in n for n in x86)
