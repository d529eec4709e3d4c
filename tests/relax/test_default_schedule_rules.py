"""Default-schedule rules on their lowered form: the attention scores' tile is unmasked in its
main part and kept in a constant-size local tile (registers) despite symbolic strides;
elementwise kernels do not fuse a symbolic loop into their parallel loop; strided reads are not
vectorized into gathers; window reductions and narrow dense layers get register tiles. Values
are checked against numpy on random inputs."""
import re

import numpy as np

from tilecraft import targets
from tilecraft.relax import default_schedules as ds
from tilecraft.relax.backend import cpu
from tilecraft.relax.backend.cpu import conv2d_nchw_cvec as cvec
from tilecraft.relax.backend.cpu import dense
from tilecraft.relax.backend.cpu import conv2d_nchw as flat
from tilecraft.relax.backend.cpu import conv2d_strategy as strategy
from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.transform import lower

TARGET = Target("llvm")
# the tile sizes asserted below are AVX-512's (16 lanes, 32 registers): the structure is checked
# on that target's schedule whatever the host, the values on the host's own build
AVX512 = Target("llvm -mcpu=skylake-avx512")
RNG = np.random.default_rng(3)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def _lowered(func, target: Target = TARGET):
    """The host's scheduled function and the lowered text of ``target``'s schedule."""
    g = ds.apply(func, TARGET)
    return g, lower(g if target is TARGET else ds.apply(func, target)).script()


def test_attention_scores_unmasked_main_part_and_register_tile():
    b, s = te.var("b"), te.var("s")
    q = te.placeholder((b, 12, s, 64), "float32", "q")
    kt = te.placeholder((b, 12, 64, s), "float32", "kt")
    k = te.reduce_axis((0, 64), "k")
    sc = te.compute((b, 12, s, s), lambda n, h, i, j: te.sum(q[n, h, i, k] * kt[n, h, k, j],
                                                             axis=k), "matmul")
    c = te.placeholder((1,), "float32", "c")
    d = te.compute((b, 12, s, s), lambda n, h, i, j: sc[n, h, i, j] / c[0], "divide")
    g, text = _lowered(te.create_prim_func([q, kt, c, d]), AVX512)
    # the accumulators: a constant 6 x 16 tile (one vector of the symbolic key positions, so
    # a short sequence wastes fewer lanes) allocated in the tile loop, not (b, 12, s, s)
    allocs = re.findall(r'matmul_local = T.allocate\(\((\d+),\), "float32", scope="local"\)',
                        text)
    assert allocs and set(allocs) == {"96"}, allocs
    # the main part (j_0 < s // 16) runs the reduction without a lane test
    main = text.split("if j_0 < s // 16:")[1].split("else:")[0]
    assert "for k in range(64)" in main and "< s" not in main.split("for k in range(64)")[1]
    mod = targets.build(g, "llvm")
    for n, sv in ((1, 5), (1, 37), (2, 64)):
        qs, ks = rand(n, 12, sv, 64), rand(n, 12, 64, sv)
        out = np.zeros((n, 12, sv, sv), "float32")
        mod["main"](qs, ks, np.array([8.0], "float32"), out)
        np.testing.assert_allclose(out, qs @ ks / 8.0, rtol=1e-4, atol=1e-4)


def test_elementwise_symbolic_batch_parallel_loop_not_fused():
    n = te.var("n")
    x = te.placeholder((n, 64, 28, 28), "float32", "x")
    y = te.compute(x.shape, lambda a, b, c, d: te.max(x[a, b, c, d], te.const(0.0, "float32")),
                   "relu")
    g, text = _lowered(te.create_prim_func([x, y]))
    assert "for a in range(n):" in text and "T.parallel(1792)" in text
    assert "assert" not in text          # no per-element bounds check left in the vector loop



def _outermost_parallel_only(text: str) -> None:
    par = [line for line in text.splitlines() if "T.parallel(" in line]
    assert par, text
    for line in par:
        assert line.startswith("    for ") and not line.startswith("     "), line


def test_attention_layout_copy_one_parallel_launch():
    # (batch, seq, 4 * 64) -> (batch, 4, seq, 64): the head loop (4 x 64 floats, less than a
    # launch's work) runs in parallel outside the symbolic loops, not once per batch element
    b, s = te.var("b"), te.var("s")
    x = te.placeholder((b, s, 256), "float32", "x")
    y = te.compute((b, 4, s, 64), lambda i, h, t, d: x[i, t, h * 64 + d], "heads")
    g, text = _lowered(te.create_prim_func([x, y]))
    _outermost_parallel_only(text)
    mod = targets.build(g, "llvm")
    for bv, sv in ((1, 8), (2, 5), (3, 17)):
        xs, out = rand(bv, sv, 256), np.zeros((bv, 4, sv, 64), "float32")
        mod["main"](xs, out)
        np.testing.assert_array_equal(out, xs.reshape(bv, sv, 4, 64).transpose(0, 2, 1, 3))


def test_attention_key_transpose_one_parallel_launch():
    # (batch, seq, 4 * 64) -> (batch, 4, 64, seq), the keys transposed: square tiles, the
    # head and tile loops in parallel outermost
    b, s = te.var("b"), te.var("s")
    x = te.placeholder((b, s, 256), "float32", "x")
    y = te.compute((b, 4, 64, s), lambda i, h, d, t: x[i, t, h * 64 + d], "keys_t")
    g, text = _lowered(te.create_prim_func([x, y]))
    _outermost_parallel_only(text)
    mod = targets.build(g, "llvm")
    for bv, sv in ((1, 8), (2, 5), (3, 17)):
        xs, out = rand(bv, sv, 256), np.zeros((bv, 4, 64, sv), "float32")
        mod["main"](xs, out)
        np.testing.assert_array_equal(out, xs.reshape(bv, sv, 4, 64).transpose(0, 2, 3, 1))

def test_transpose_reads_stay_scalar():
    x = te.placeholder((64, 96), "float32", "x")
    y = te.compute((96, 64), lambda i, j: x[j, i], "T")
    g, text = _lowered(te.create_prim_func([x, y]))
    assert "T.vectorized" not in text        # a gather per vector: slower than scalar code
    mod = targets.build(g, "llvm")
    xs, out = rand(64, 96), np.zeros((96, 64), "float32")
    mod["main"](xs, out)
    np.testing.assert_array_equal(out, xs.T)


def test_window_reduction_register_vector():
    # stride-1 3x3 max pool with padding: the window loops inside a vector of output columns
    n = te.var("n")
    x = te.placeholder((n, 8, 20, 20), "float32", "x")
    ry, rx = te.reduce_axis((0, 3), "ry"), te.reduce_axis((0, 3), "rx")
    pad = te.compute((n, 8, 22, 22), lambda a, b, c, d: te.if_then_else(
        te.all(c >= 1, c < 21, d >= 1, d < 21), x[a, b, c - 1, d - 1], te.const(-1e30, "float32")),
        "pad")
    y = te.compute((n, 8, 20, 20), lambda a, b, c, d: te.max(pad[a, b, c + ry, d + rx],
                                                             axis=[ry, rx]), "pool")
    g, text = _lowered(te.create_prim_func([x, y]), AVX512)
    assert re.search(r'pool_local = T.allocate\(\(16,\), "float32", scope="local"\)', text)
    mod = targets.build(g, "llvm")
    xs = rand(2, 8, 20, 20)
    out = np.zeros((2, 8, 20, 20), "float32")
    mod["main"](xs, out)
    xp = np.pad(xs, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-1e30)
    want = np.max([xp[:, :, a:a + 20, b:b + 20] for a in range(3) for b in range(3)], axis=0)
    np.testing.assert_array_equal(out, want)


def test_narrow_dense_tile_is_a_whole_panel():
    n = te.var("n")
    x = te.placeholder((n, 64), "float32", "x")
    w = te.placeholder((1, 64, 16), "float32", "w")
    y = dense.dense_packed(x, w, 10, "float32")
    g, text = _lowered(te.create_prim_func([x, w, y]), AVX512)
    assert 'dense_panel_local = T.allocate((96,), "float32", scope="local")' in text
    mod = targets.build(g, "llvm")
    for rows in (1, 2, 13):
        xs, ws = rand(rows, 64), rand(1, 64, 16)
        out = np.zeros((rows, 10), "float32")
        mod["main"](xs, ws, out)
        np.testing.assert_allclose(out, xs @ ws[0][:, :10], rtol=1e-4, atol=1e-4)


def _conv_pad_loops(hw: int, target: Target):
    """A 3x3 tiles-across-rows convolution on ``hw x hw`` and its lowered form."""
    g = cpu.ConvGeometry(64, hw, hw, 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    plan = cvec.cvec_tiles_plan(g, 8, 16)
    x = te.placeholder((1, 64, hw, hw), "float32", "x")
    w = te.placeholder((1, 64, 3, 3, 32), "float32", "w")
    y = cvec.conv2d_nchw_cvec(x, w, plan, "float32")
    f = te.create_prim_func([x, w, y])
    return f, lower(ds.apply(f, target)).script()


def test_short_ragged_padding_rows_stay_scalar():
    """A 7 x 7 plane padded by one has 9-wide rows: under two AVX2 vectors with a ragged end,
    they are copied scalar (LLVM's masked 9-lane vector ran ~100 cycles a row on Zen 3); the
    16-wide rows of a 14 x 14 plane stay vectorized. Values checked on the host."""
    haswell = Target("llvm -mcpu=haswell")
    f7, pad7 = _conv_pad_loops(7, haswell)
    _, pad14 = _conv_pad_loops(14, haswell)
    assert "T.vectorized(9)" not in pad7 and "range(9)" in pad7, pad7
    assert "T.vectorized(16)" in pad14, pad14
    mod = targets.build(ds.apply(f7, TARGET), "llvm")
    xs, ws = rand(1, 64, 7, 7), rand(1, 64, 3, 3, 32)
    out = np.zeros((1, 32, 7, 7), "float32")
    mod["main"](xs, ws, out)
    wt = ws[0].transpose(3, 0, 1, 2)             # (O, I, KH, KW)
    xp = np.pad(xs[0], ((0, 0), (1, 1), (1, 1)))
    ref = np.zeros((32, 7, 7))
    for ry in range(3):
        for rx in range(3):
            ref += np.einsum("oi,iyx->oyx", wt[:, :, ry, rx], xp[:, ry:ry + 7, rx:rx + 7])
    np.testing.assert_allclose(out[0], ref, rtol=1e-4, atol=1e-4)


def _flat_1x1(cores: int):
    """A 1x1 64 -> 64 convolution on 28 x 28 as the AVX2 flat kernel (4 x 2, input in place,
    49 position tiles in 7 chunks), scheduled for ``cores`` cores: (func, lowered text)."""
    g = cpu.ConvGeometry(64, 28, 28, 64, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    plan = strategy.nchw_kernel_plan(g, 8, 16)
    assert isinstance(plan, flat.NchwPlan) and plan.direct_in and \
        (plan.oc_block, plan.vectors) == (4, 2)
    x = te.placeholder((1, 64, 28, 28), "float32", "x")
    w = te.placeholder((16, 64, 1, 1, 4), "float32", "w")
    y = flat.conv2d_nchw_packed(x, w, plan, "float32")
    f = te.create_prim_func([x, w, y])
    return f, lower(ds.apply(f, Target(f"llvm -mcpu=haswell -num-cores={cores}"))).script()


def test_uneven_position_chunks_split_the_channel_blocks_over_the_cores():
    """7 position chunks on 2 cores would keep one core idle an eighth of the time: the cores
    take halves of the channel blocks instead (a parallel loop of 2); on 7 cores the 49
    position tiles split evenly and stay the parallel loop. Values checked on the host's
    build."""
    f, two = _flat_1x1(2)
    _, seven = _flat_1x1(7)
    assert "T.parallel(2)" in two and "T.parallel(7)" not in two, two
    assert "T.parallel(49)" in seven, seven
    mod = targets.build(ds.apply(f, TARGET), "llvm")
    xs, ws = rand(1, 64, 28, 28), rand(16, 64, 1, 1, 4)
    out = np.zeros((1, 64, 28, 28), "float32")
    mod["main"](xs, ws, out)
    wt = ws.transpose(0, 4, 1, 2, 3).reshape(64, 64)         # [O/R, I, 1, 1, R] -> (O, I)
    np.testing.assert_allclose(out[0], np.einsum("oi,iyx->oyx", wt, xs[0]), rtol=1e-4,
                               atol=1e-4)
