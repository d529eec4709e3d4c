"""``MultiLevelTilingDot4``: 8-bit multiply-accumulates (uint8 x int8 -> int32) tiled around
the ``dot4_u8i8`` intrinsic. Candidates drawn from the default CPU space are tensorized and
bit-exact against a numpy integer reference (random bytes with the extremes 0 / 255 / -128 /
127, odd shapes), through the interpreter and the LLVM build; the rule is in the space of
targets with a dot instruction only."""
import numpy as np
import pytest

from tilecraft import targets
from tilecraft import metaschedule as ms
from tilecraft.metaschedule.schedule_rule import analysis as A
from tilecraft.metaschedule.schedule_rule.base import ANN_TENSORIZE
from tilecraft.metaschedule.schedule_rule.multi_level_tiling_dot4 import (DOT4_FAMILY,
                                                                          dot4_operands)
from tilecraft.tensorir import interpret, te
from tilecraft.tensorir.expr import DOT4_U8I8, Call, Cast
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.schedule.intrinsics import dot4_funcs
from tilecraft.tensorir.functor import post_order_visit

LLVM = targets.Target("llvm")
RNG = np.random.default_rng(7)


def dense_u8i8(M, K, N, weight_first=False):
    """``C[i, j] = sum_k x[i, k] * w[k, j]``: uint8 x, int8 w, int32 C."""
    x = te.placeholder((M, K), "uint8", "x")
    w = te.placeholder((K, N), "int8", "w")
    k = te.reduce_axis((0, K), "k")

    def f(i, j):
        a, b = Cast("int32", x[i, k]), Cast("int32", w[k, j])
        return te.sum(b * a if weight_first else a * b, axis=k)
    return te.create_prim_func([x, w, te.compute((M, N), f, "C")])


def conv_nchw_u8i8(N, C, H, W, O, KH):
    """An unpadded NCHW convolution of uint8 data and int8 weight into int32: the reduction
    over channels is the dot4 step, the output columns the lanes (the data is the vector
    operand, the weight broadcast)."""
    x = te.placeholder((N, C, H, W), "uint8", "x")
    w = te.placeholder((O, C, KH, KH), "int8", "w")
    rc = te.reduce_axis((0, C), "rc")
    ry = te.reduce_axis((0, KH), "ry")
    rx = te.reduce_axis((0, KH), "rx")
    y = te.compute((N, O, H - KH + 1, W - KH + 1), lambda n, o, i, j: te.sum(
        Cast("int32", x[n, rc, i + ry, j + rx]) * Cast("int32", w[o, rc, ry, rx]),
        axis=[rc, ry, rx]), "conv")
    return te.create_prim_func([x, w, y])


def bytes_(shape, dtype):
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    a = RNG.integers(lo, hi, shape).astype(dtype)
    flat = a.reshape(-1)
    flat[:4] = [lo, hi - 1, lo, hi - 1]        # the extremes: 0 / 255, -128 / 127
    flat[-2:] = [hi - 1, lo]
    return a


def dense_ref(x, w):
    return x.astype(np.int64) @ w.astype(np.int64)


def conv_ref(x, w):
    n, c, h, wd = x.shape
    o, _, kh, _ = w.shape
    out = np.zeros((n, o, h - kh + 1, wd - kh + 1), np.int64)
    for ry in range(kh):
        for rx in range(kh):
            patch = x[:, :, ry:ry + out.shape[2], rx:rx + out.shape[3]].astype(np.int64)
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, ry, rx].astype(np.int64))
    return out


def dot4_calls(func) -> int:
    found = []
    post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, Call) and
                     n.op == DOT4_U8I8 else None)
    return len(found)


def tensorized_samples(func, count, seed=0):
    """Finished samples of the default space's dot4 designs (those annotated for the
    intrinsic), with at most 16 unrolled steps."""
    space = ms.default_space(LLVM)
    designs = [d for d in space.generate(func, LLVM)
               if any(dict(br.block.annotations).get(ANN_TENSORIZE) == DOT4_FAMILY
                      for br in A.all_blocks(d.func))]
    assert designs, "no dot4 design in the default space"
    out = []
    for n in range(count):
        sch = space.sample(designs[n % len(designs)], func, LLVM, seed=seed + n)
        assert sch is not None, space.last_rejection
        trace = sch.trace.without_postproc()
        for m, inst in enumerate(trace.instructions):
            if inst.kind == "sample_categorical" and inst.inputs[0][:2] == [0, 16]:
                trace = trace.with_decision(m, min(inst.decision, 1))
        sch = space.finish(trace, func, LLVM)
        assert sch is not None, space.last_rejection
        out.append(sch)
    return out


def test_dot4_intrinsic_bit_exact():
    for order, (ad, bd) in (("u8i8", ("uint8", "int8")), ("i8u8", ("int8", "uint8"))):
        desc, impl = dot4_funcs(8, order)
        a, b = bytes_((4,), ad), bytes_((4, 8), bd)
        c0 = RNG.integers(-1000, 1000, 8).astype(np.int32)
        want = c0 + a.astype(np.int64) @ b.astype(np.int64)
        for f in (desc, impl):
            c = c0.copy()
            interpret(f, a, b, c)
            np.testing.assert_array_equal(c, want)


def test_rule_recognizes_8bit_blocks_only():
    def info(func, name):
        return A.find_block_info(func, name)
    assert dot4_operands(info(dense_u8i8(3, 8, 16), "C")).order == "u8i8"
    assert dot4_operands(info(dense_u8i8(3, 8, 16, weight_first=True), "C")) is not None
    assert dot4_operands(info(conv_nchw_u8i8(1, 8, 6, 6, 4, 3), "conv")).order == "i8u8"
    # a reduction not divisible by 4, and float operands: other rules' business
    assert dot4_operands(info(dense_u8i8(3, 10, 16), "C")) is None
    x = te.placeholder((4, 8), "float32", "x")
    w = te.placeholder((8, 16), "float32", "w")
    k = te.reduce_axis((0, 8), "k")
    f = te.create_prim_func([x, w, te.compute((4, 16), lambda i, j: te.sum(
        x[i, k] * w[k, j], axis=k), "C")])
    assert dot4_operands(info(f, "C")) is None


@pytest.mark.parametrize("shape", [(5, 32, 48), (1, 64, 16), (7, 12, 40)])
def test_dense_candidates_bit_exact(shape):
    M, K, N = shape
    func = dense_u8i8(M, K, N, weight_first=(M == 7))
    x, w = bytes_((M, K), "uint8"), bytes_((K, N), "int8")
    want = dense_ref(x, w)
    for n, sch in enumerate(tensorized_samples(func, 3, seed=3 * M)):
        if n == 0:
            out = np.zeros((M, N), np.int32)
            interpret(sch.func, x, w, out)
            np.testing.assert_array_equal(out, want)
        lib = targets.build(sch.mod, LLVM)
        out = np.zeros((M, N), np.int32)
        lib["main"](x, w, out)
        np.testing.assert_array_equal(out, want)
    # the intrinsic made it into some candidate (full tiles)
    assert any(dot4_calls(s.func) for s in tensorized_samples(func, 4, seed=100))


@pytest.mark.parametrize("shape", [(1, 8, 9, 21, 6, 3), (2, 16, 5, 18, 4, 3)])
def test_conv_candidates_bit_exact(shape):
    n, c, h, wd, o, kh = shape
    func = conv_nchw_u8i8(n, c, h, wd, o, kh)
    x, w = bytes_((n, c, h, wd), "uint8"), bytes_((o, c, kh, kh), "int8")
    want = conv_ref(x, w)
    samples = tensorized_samples(func, 3, seed=5)
    for sch in samples:
        lib = targets.build(sch.mod, LLVM)
        out = np.zeros(want.shape, np.int32)
        lib["main"](x, w, out)
        np.testing.assert_array_equal(out, want)
    if (wd - kh + 1) % 4 == 0:     # (19 output columns: no full tile of lanes, no intrinsic)
        assert any(dot4_calls(s.func) for s in samples + tensorized_samples(func, 3, seed=50))


def test_vnni_candidate_emits_vpdpbusd():
    vnni = targets.Target("llvm -mtriple=x86_64-linux-gnu -mcpu=icelake-server "
                          "-mattr=+avx512f,+avx512vnni")
    func = dense_u8i8(4, 64, 64)
    sch = Schedule(func)
    b = sch.get_block("C")
    i, j, k = sch.get_loops(b)
    ko, ki = sch.split(k, [None, 4])
    jo, ji = sch.split(j, [None, 16])
    sch.reorder(i, jo, ko, ki, ji)
    sch.tensorize(ki, "dot4_u8i8_16")
    asm = targets.build(sch.mod, vnni).get_source("asm")
    assert "vpdpbusd" in asm


def test_rule_only_where_a_dot_instruction_is():
    def names(t):
        return [type(r).__name__ for r in ms.default_space(targets.Target(t)).rules]
    assert "MultiLevelTilingDot4" in names("llvm -mtriple=aarch64-linux-gnu -mattr=+neon,+dotprod")
    assert "MultiLevelTilingDot4" not in names("llvm -mtriple=aarch64-linux-gnu -mattr=+neon")
    assert "MultiLevelTilingDot4" in names("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell")


def test_seeds_are_the_int8_register_tile():
    """``SpaceGenerator.seeds``: the rule's recipe points (MR rows x L lanes in registers,
    panels outermost), tensorized and bit-exact."""
    func = dense_u8i8(8, 64, 64)
    space = ms.default_space(LLVM)
    seeds = [s for s in space.seeds(func, LLVM) if dot4_calls(s.func)]
    assert seeds
    x, w = bytes_((8, 64), "uint8"), bytes_((64, 64), "int8")
    for sch in seeds[:2]:
        out = np.zeros((8, 64), np.int32)
        targets.build(sch.mod, LLVM)["main"](x, w, out)
        np.testing.assert_array_equal(out, dense_ref(x, w))
