"""The hand schedules of benchmarks/schedules (elementwise, softmax, conv2d): compiled == numpy.

Small odd sizes (tails everywhere), symbolic dims where the schedule supports them, a 256-bit
target beside the host, and the loop structure each schedule promises.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from tilecraft import targets
from benchmarks.schedules import conv2d as cv
from benchmarks.schedules import elementwise as ew
from benchmarks.schedules import softmax as sm
from tilecraft.tensorir import Schedule, te, transform
from tilecraft.tensorir.schedule import ScheduleError

HOST = "llvm"
AVX2 = "llvm -mcpu=haswell"
# the structure tests expect the host's vector width (16 float lanes on AVX-512, 8 on AVX2)
LANES = ew.vector_lanes(ew.as_target(HOST), "float32")

_erf = np.frompyfunc(math.erf, 1, 1)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def erf_np(x):
    return _erf(x.astype(np.float64)).astype(np.float64)


def compile_(sch, target=HOST):
    return targets.build(sch.mod, target)


def lowered_text(sch) -> str:
    return transform.lower(sch.mod)["main"].script()


# ----------------------------------------------------------------------------------------------
# elementwise

ELEMENTWISE = {
    "add": (ew.add_func, "T_add", 2, lambda a, b: a + b),
    "exp": (ew.exp_func, "T_exp", 1, lambda a: np.exp(a)),
    "gelu_tanh": (ew.gelu_tanh_func, "T_gelu", 1,
                  lambda a: 0.5 * a * (1 + np.tanh(ew.GELU_TANH_C * (a + ew.GELU_TANH_K * a ** 3)))),
    "gelu_erf": (ew.gelu_erf_func, "T_gelu", 1, lambda a: a * 0.5 * (1 + erf_np(a * ew.INV_SQRT2))),
}


@pytest.mark.parametrize("target", [HOST, AVX2])
@pytest.mark.parametrize("kernel", sorted(ELEMENTWISE))
def test_elementwise_symbolic(kernel, target, rng):
    make, block, n_in, ref = ELEMENTWISE[kernel]
    sch = Schedule(make())
    ew.schedule_elementwise(sch, block, target)
    text = sch.func.script()
    assert "T.parallel(" in text and "T.vectorized(" in text
    mod = compile_(sch, target)
    for size in (1, 15, 16, 17, 1000, 40003):
        ins = [rng.uniform(-4, 4, size).astype("float32") for _ in range(n_in)]
        out = np.full(size + 5, 7.0, "float32")
        mod["main"](*ins, out[:size])
        want = ref(*[x.astype(np.float64) for x in ins])
        np.testing.assert_allclose(out[:size], want, rtol=2e-6, atol=2e-7, err_msg=kernel)
        assert (out[size:] == 7.0).all()  # the masked tail wrote nothing beyond the array


def test_elementwise_tail_predicate_runs_whole_vectors_unmasked():
    # the split's predicate i_0 * L + i_1 < n is tested once per vector on its last lane:
    # whole vectors take a branch with plain loads and stores, only the last one masks
    sch = Schedule(ew.exp_func())
    ew.schedule_elementwise(sch, "T_exp", HOST)
    raw = compile_(sch).get_source("ll-raw")
    assert "vif.full" in raw and "vif.part" in raw
    assert f"load <{LANES} x float>" in raw and "llvm.masked.load" in raw


@pytest.mark.parametrize("shape", [(5, 37), (64, 37), (3, 5, 7), (2, 40000)])
def test_elementwise_static_and_broadcast(shape, rng):
    a = te.placeholder(shape, "float32", "A")
    bias = te.placeholder((shape[-1],), "float32", "bias")
    c = te.compute(shape, lambda *i: ew.gelu_tanh(a[i] + bias[i[-1]]), "C")
    sch = Schedule(te.create_prim_func([a, bias, c]))
    ew.schedule_elementwise(sch, "C", HOST)
    x = rng.standard_normal(shape).astype("float32")
    bv = rng.standard_normal(shape[-1]).astype("float32")
    out = np.zeros(shape, "float32")
    compile_(sch)["main"](x, bv, out)
    y = x.astype(np.float64) + bv
    np.testing.assert_allclose(out, 0.5 * y * (1 + np.tanh(ew.GELU_TANH_C * (y + ew.GELU_TANH_K * y ** 3))),
                               rtol=2e-6, atol=2e-6)
    # the broadcast input keeps the innermost axis as the vector axis (no gathers)
    assert "T.vectorized(" in lowered_text(sch)


def test_elementwise_pure_static_fuses_all_loops():
    a = te.placeholder((64, 37), "float32", "A")
    c = te.compute((64, 37), lambda i, j: te.exp(a[i, j]), "C")
    sch = Schedule(te.create_prim_func([a, c]))
    ew.schedule_elementwise(sch, "C", HOST)
    text = lowered_text(sch)
    assert f"for i_j_fused_0 in range({2368 // LANES}):" in text  # 2368 = 148 x 16, no tail
    assert f"T.vectorized({LANES})" in text


def test_schedule_injective_inlines_a_chain(rng):
    n = te.var("n")
    x = te.placeholder((n, 33), "float32", "x")
    cube = te.compute((n, 33), lambda i, j: x[i, j] * x[i, j] * x[i, j], "cube")
    inner = te.compute((n, 33), lambda i, j: ew.GELU_TANH_C * (x[i, j] + ew.GELU_TANH_K * cube[i, j]),
                       "inner")
    th = te.compute((n, 33), lambda i, j: te.tanh(inner[i, j]), "th")
    out = te.compute((n, 33), lambda i, j: 0.5 * x[i, j] * (1.0 + th[i, j]), "out")
    sch = Schedule(te.create_prim_func([x, out]))
    ew.schedule_injective(sch, HOST)
    assert [sch.get(b).name for b in sch.get_child_blocks(sch.get_block("root"))] == ["out"]
    a = rng.standard_normal((9, 33)).astype("float32")
    y = np.zeros_like(a)
    compile_(sch)["main"](a, y)
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(y, 0.5 * a64 * (1 + np.tanh(ew.GELU_TANH_C * (a64 + ew.GELU_TANH_K * a64 ** 3))),
                               rtol=2e-6, atol=2e-6)


def test_elementwise_rejects_a_reduction():
    a = te.placeholder((8, 8), "float32", "A")
    k = te.reduce_axis((0, 8), "k")
    s = te.compute((8,), lambda i: te.sum(a[i, k], axis=k), "S")
    sch = Schedule(te.create_prim_func([a, s]))
    with pytest.raises(ScheduleError, match="schedule_elementwise.*block S has reduce iter vars"):
        ew.schedule_elementwise(sch, "S", HOST)


# ----------------------------------------------------------------------------------------------
# softmax


def softmax_np(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def log_softmax_np(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


SOFTMAX_SHAPES = [  # (TE shape, the arrays it runs on)
    ((7, 37), [(7, 37)]),
    (("n", 100), [(5, 100), (1, 100)]),
    (("n", "m"), [(3, 77), (1, 1), (2, 16)]),
    ((2, 3, 48), [(2, 3, 48)]),
    ((4, 5), [(4, 5)]),
    ((9, 64), [(9, 64)]),
]


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape_te,shapes", SOFTMAX_SHAPES)
def test_softmax(kind, shape_te, shapes, rng):
    make, ref = ((sm.softmax_func, softmax_np) if kind == "softmax"
                 else (sm.log_softmax_func, log_softmax_np))
    sch = Schedule(make(shape_te))
    sm.schedule_softmax(sch, HOST)
    mod = compile_(sch)
    for shape in shapes:
        x = (rng.standard_normal(shape) * 4).astype("float32")
        y = np.zeros_like(x)
        mod["main"](x, y)
        np.testing.assert_allclose(y, ref(x), rtol=2e-6, atol=1e-7)


def test_softmax_fused_rows_structure(rng):
    # a static last axis that whole vectors cover: every stage under the parallel row loop,
    # the reductions vectorized through rfactor with local partial results
    sch = Schedule(sm.softmax_func((6, 64)))
    sm.schedule_softmax(sch, HOST)
    text = lowered_text(sch)
    assert text.count("T.parallel(") == 1
    # the partial results: one vector per row, allocated in the row loop (CompactBufferAllocation)
    assert f'T_softmax_maxelem_rf = T.allocate(({LANES},), "float32", scope="local")' in text
    assert text.count(f"T.vectorized({LANES})") == 5  # two inits, two partial reductions, the output
    assert "T_softmax_exp =" not in text        # inlined into both consumers
    x = rng.standard_normal((6, 64)).astype("float32")
    y = np.zeros_like(x)
    compile_(sch)["main"](x, y)
    np.testing.assert_allclose(y, softmax_np(x), rtol=2e-6, atol=1e-7)


def test_softmax_on_a_256_bit_target(rng):
    sch = Schedule(sm.softmax_func(("n", 40)))
    sm.schedule_softmax(sch, AVX2)
    assert "T.vectorized(8)" in sch.func.script()
    x = rng.standard_normal((3, 40)).astype("float32")
    y = np.zeros_like(x)
    compile_(sch, AVX2)["main"](x, y)
    np.testing.assert_allclose(y, softmax_np(x), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("shape_te,shape", [(("n", 96), (5, 96)), ((7, 50), (7, 50))])
def test_row_reduction_schedules_layer_norm(shape_te, shape, rng):
    # two reductions (sum, then the squared deviations), an elementwise mean between them,
    # broadcast gamma / beta in the output: the same schedule
    n, d = (te.var(s) if isinstance(s, str) else s for s in shape_te)
    x = te.placeholder((n, d), "float32", "x")
    gamma = te.placeholder((d,), "float32", "gamma")
    beta = te.placeholder((d,), "float32", "beta")
    k = te.reduce_axis((0, d), "k")
    total = te.compute((n,), lambda i: te.sum(x[i, k], axis=k), "total")
    mean = te.compute((n,), lambda i: total[i] * (1.0 / d), "mean")
    k2 = te.reduce_axis((0, d), "k2")
    var = te.compute((n,), lambda i: te.sum((x[i, k2] - mean[i]) * (x[i, k2] - mean[i]), axis=k2),
                     "var")
    out = te.compute((n, d), lambda i, j: (x[i, j] - mean[i]) / te.sqrt(var[i] * (1.0 / d) + 1e-5)
                     * gamma[j] + beta[j], "out")
    sch = Schedule(te.create_prim_func([x, gamma, beta, out]))
    sm.schedule_row_reduction(sch, HOST)
    a = rng.standard_normal(shape).astype("float32")
    g = rng.standard_normal(shape[1]).astype("float32")
    b = rng.standard_normal(shape[1]).astype("float32")
    y = np.zeros_like(a)
    compile_(sch)["main"](a, g, b, y)
    a64 = a.astype(np.float64)
    want = (a64 - a64.mean(1, keepdims=True)) / np.sqrt(a64.var(1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5)


def test_softmax_rejects_other_structures():
    a = te.placeholder((8, 8), "float32", "A")
    b = te.compute((8, 8), lambda i, j: a[i, j] + 1.0, "B")
    k = te.reduce_axis((0, 8), "k")
    c = te.compute((8,), lambda i: te.sum(b[i, k], axis=k), "C")   # ends in a reduction
    sch = Schedule(te.create_prim_func([a, c]))
    before = sch.func
    with pytest.raises(ScheduleError, match="schedule_row_reduction: expected one elementwise"):
        sm.schedule_softmax(sch, HOST)
    assert sch.func is before  # checked before anything changed
    x = te.placeholder((8,), "float32", "x")
    y = te.compute((8,), lambda i: x[i] * 2.0, "y")
    sch = Schedule(te.create_prim_func([x, y]))
    with pytest.raises(ScheduleError, match="no row axis"):
        sm.schedule_softmax(sch, HOST)


# ----------------------------------------------------------------------------------------------
# conv2d


def conv_np(x, w, padding, dilation):
    n, c, h, wd = x.shape
    k, _, kh, kw = w.shape
    (ph, pw), (dh, dw) = padding, dilation
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    oh, ow = h + 2 * ph - dh * (kh - 1), wd + 2 * pw - dw * (kw - 1)
    out = np.zeros((n, k, oh, ow))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("kc,nchw->nkhw", w[:, :, i, j],
                             xp[:, :, i * dh:i * dh + oh, j * dw:j * dw + ow])
    return out


CONV_CASES = [
    # (batch, in, out, height, width), kernel, padding, dilation
    ((1, 16, 16, 14, 14), 3, 1, 1),
    ((2, 3, 8, 9, 11), 3, 1, 1),
    ((1, 5, 6, 7, 7), (3, 1), (1, 0), 1),
    ((1, 4, 12, 10, 10), 3, 2, 2),
    ((1, 16, 32, 6, 6), 1, 0, 1),
    ((1, 3, 5, 8, 8), 5, 2, 1),
]


@pytest.mark.parametrize("dims,kernel,padding,dilation,target,tile",
                         [CONV_CASES[0] + (HOST, None)]   # the default 4 x 6 vector tile
                         + [c + (HOST, (None, 2)) for c in CONV_CASES[1:]]
                         + [c + (AVX2, (None, 2)) for c in CONV_CASES[:2]])
def test_conv2d(dims, kernel, padding, dilation, target, tile, rng):
    # small (R, V) tiles keep the unrolled bodies, and so the compile times, short
    n, c, k, h, w = dims
    func = cv.conv2d_nchw_func(n, c, k, h, w, kernel=kernel, padding=padding, dilation=dilation)
    sch = Schedule(func)
    oc_block, vectors = tile or (None, None)
    cv.schedule_conv2d_nchw(sch, target, oc_block=oc_block, vectors=vectors)
    mod = compile_(sch, target)
    kh, kw = cv._pair(kernel)
    x = rng.standard_normal((n, c, h, w)).astype("float32")
    wt = rng.standard_normal((k, c, kh, kw)).astype("float32")
    out = np.zeros([d.value for d in func.buffers[2].shape], "float32")
    mod["main"](x, wt, out)
    np.testing.assert_allclose(out, conv_np(x, wt, cv._pair(padding), cv._pair(dilation)),
                               rtol=1e-4, atol=1e-4)


def test_conv2d_micro_kernel_structure():
    sch = Schedule(cv.conv2d_nchw_func(1, 64, 64, 56, 56))
    cv.schedule_conv2d_nchw(sch, HOST)
    text = sch.func.script()
    assert 'T.block("conv2d_flat_local")' in text or "conv2d_flat_local" in text
    r, v = cv.choose_tile(64, 3264, LANES, cv.register_count(ew.as_target(HOST)))
    assert f"T.unroll({r})" in text and f"T.unroll({v})" in text  # 4 channels x 6 vectors
    assert f"T.vectorized({LANES})" in text
    assert cv.choose_tile(64, 3264, 16, 32) == (4, 6)
    assert cv.choose_tile(64, 3264, 8, 16) == (4, 2)
    g = cv.flat_geometry(56, 56, 3, 1, 1)
    assert (g.pad_w, g.out_len, g.pad_len) == (58, 3264, 3422)


def test_conv2d_bad_input():
    x = te.placeholder((1, 4, 8, 8), "float32", "x")
    with pytest.raises(ValueError, match="data has 4 channels but weight expects 3"):
        cv.conv2d_nchw(x, te.placeholder((8, 3, 3, 3), "float32", "w"))
    with pytest.raises(ValueError, match="does not fit"):
        cv.conv2d_nchw(x, te.placeholder((8, 4, 11, 11), "float32", "w"), padding=0)
    n = te.var("n")
    with pytest.raises(ValueError, match="static shapes"):
        cv.conv2d_nchw(te.placeholder((n, 4, 8, 8), "float32", "x"),
                       te.placeholder((8, 4, 3, 3), "float32", "w"))
    sch = Schedule(ew.exp_func())
    with pytest.raises(ScheduleError, match="schedule_conv2d_nchw"):
        cv.schedule_conv2d_nchw(sch, HOST)
