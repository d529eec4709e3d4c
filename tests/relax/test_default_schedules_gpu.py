"""relax.gpu_schedules on the kernels of models: GEMM (WebGPU's permuted B tile), convolutions
with a symbolic batch as tiled implicit GEMMs (a 2-D image tile per work-group, weights and
window in shared memory, a register tile per thread), max pooling, batch matmul and dense with
symbolic or small dims. Each kernel's schedule is checked structurally (what rule it got) and
its results against numpy on random inputs, symbolic dims at two values, on OpenCL (PoCL in CI)
and WebGPU (lavapipe in CI)."""
import numpy as np
import pytest

import gpu_testutil as gpu
from tilecraft import targets
from tilecraft.relax import const, gpu_schedules as gs
from tilecraft.relax.backend.gpu import gemm
from tilecraft.relax import op
from tilecraft.relax.build import _run_pipeline, legalize
from tilecraft.relax.op import nn
from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.function import PrimFunc
from capabilities import gpu_device

RNG = np.random.default_rng(5)


@pytest.fixture(scope="module", params=["opencl", "webgpu"])
def gpu_dev(request):
    return gpu_device(request.param)


def _kernels(mod, target):
    """The legalized kernels of ``mod`` by name (what relax.build schedules)."""
    mod = legalize(_run_pipeline(mod, None, Target(target)))
    return {n: f for n, f in mod.functions.items() if isinstance(f, PrimFunc)}


def _threads(func):
    return {lp.thread_tag for lp in gs._loops_of(func) if lp.kind == "thread_binding"}


def _scopes(func):
    from tilecraft.tensorir.functor import post_order_visit
    from tilecraft.tensorir.stmt import Block
    found = set()

    def visit(n):
        if isinstance(n, Block):
            for b in n.alloc_buffers:
                found.add(b.scope)
    post_order_visit(func.body, visit)
    return found


_conv_ref = gpu.conv2d_nchw_reference


def _maxpool_ref(img):
    """3x3, stride 2, padding 1 (ResNet's stem pool)."""
    n, c, h, w = img.shape
    p = np.pad(img, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    oh, ow = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    return np.max([p[:, :, dy:dy + 2 * oh:2, dx:dx + 2 * ow:2]
                   for dy in range(3) for dx in range(3)], axis=0)


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_conv_symbolic_batch_is_a_tiled_implicit_gemm(kind):
    """Structure only (no device): the conv gets the GEMM rule with the batch on blockIdx.z,
    shared-memory tiles and a register tile, within each target's limits."""
    n = te.var("n")
    w = RNG.standard_normal((64, 32, 3, 3)).astype("float32")
    mod = gpu.module([("x", (n, 32, 28, 28), "float32")],
                     lambda x: [nn.relu(nn.conv2d(x, const(w), padding=(1, 1)))])
    (func,) = _kernels(mod, kind).values()
    g = gs.apply(func, Target(kind))
    assert {"blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y"} <= \
        _threads(g)
    assert {"shared", "local"} <= _scopes(g)


def _gemm(M, N, K):
    A = te.placeholder((M, K), "float32", "A")
    B = te.placeholder((K, N), "float32", "B")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    return te.create_prim_func([A, B, C])


def _bound(func, tag):
    return {lp.extent.value for lp in gs._loops_of(func)
            if lp.kind == "thread_binding" and lp.thread_tag == tag}


def test_gemm_tiles_are_laid_out_for_vector_fragments():
    """Both targets: 16 x 16 threads of 8 x 8; A's shared tile transposed (OpenCL: rows padded
    by 4 words), B's in runs of 4 columns per thread, register fragments per k step and the
    k-step loop annotated for the register prefetch."""
    for kind, bk in (("webgpu", gemm.GEMM_BK_WEBGPU), ("opencl", gemm.GEMM_BK)):
        g = gs.apply(_gemm(2048, 2048, 64), Target(kind))
        text = g.script()
        assert "B_shared[v0, v1 // 4 % 2, v1 // 8, v1 % 4]" in text, kind
        assert "A_shared[v1, v0]" in text, kind
        assert "A_shared_local" in text and "B_shared_local" in text
        assert "register_prefetch" in text
        assert _bound(g, "threadIdx.x") == {16} and _bound(g, "threadIdx.y") == {16}
        assert _bound(g, "blockIdx.x") == {16}         # 128 columns per work-group: 8 x 8 each
        k0 = [lp for lp in gs._loops_of(g) if lp.loop_var.name == "k_0"]
        assert k0 and k0[0].extent.value == 64 // bk
    # the padded rows: 132 words apart in OpenCL, none in WebGPU at a k-step of 16
    from tilecraft.tensorir.transform import lower
    cl = lower(gs.apply(_gemm(2048, 2048, 64), Target("opencl")), Target("opencl")).script()
    assert "k_1 * 132" in cl


def test_small_outputs_get_smaller_register_tiles():
    """A 256 x 256 GEMM has only 4 work-groups of 128 x 128; the tile shrinks (registers per
    thread halved) until it has GEMM_MIN_GROUPS, to fill the GPU at batch 1."""
    g = gs.apply(_gemm(256, 256, 64), Target("opencl"))
    groups = next(iter(_bound(g, "blockIdx.x"))) * next(iter(_bound(g, "blockIdx.y")))
    assert groups >= gemm.GEMM_MIN_GROUPS
    big = gs.apply(_gemm(4096, 4096, 64), Target("opencl"))
    assert _bound(big, "blockIdx.x") == {32} and _bound(big, "blockIdx.y") == {32}


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
@pytest.mark.parametrize("shape", [(1024, 512, 48), (1056, 1040, 40)])
def test_gpu_gemm_tile_with_fragments_and_prefetch_runs(kind, shape):
    """The GPU GEMM tile (``Target("opencl")``, not PoCL's CPU variant: float4 fragments,
    aligned vector loads, the register prefetch) against numpy, on PoCL / lavapipe: a full tile
    and one with tails in every dimension (1056 = 8 x 128 + 32)."""
    dev, _ = gpu_device(kind)
    M, N, K = shape
    mod = targets.build(gs.apply(_gemm(M, N, K), Target(kind)), Target(kind))
    src = mod.source if kind == "opencl" else mod.get_source()
    if shape == (1024, 512, 48):    # the full tile reads its fragments as vectors
        assert ("__local const float4" if kind == "opencl" else "vec4<f32> = s_") in src
    assert "prefetch" in src
    a = RNG.standard_normal((M, K)).astype("float32")
    b = RNG.standard_normal((K, N)).astype("float32")
    c = targets.empty((M, N), "float32", dev)
    mod[mod.entry_name](targets.array(a, dev), targets.array(b, dev), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_webgpu_gemm_runs():
    dev, target = gpu_device("webgpu")
    M, N, K = 160, 136, 48    # tails in every dimension
    A = te.placeholder((M, K), "float32", "A")
    B = te.placeholder((K, N), "float32", "B")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    mod = targets.build(gs.apply(te.create_prim_func([A, B, C]), Target(target)), target)
    a, b = RNG.standard_normal((M, K)).astype("float32"), RNG.standard_normal((K, N)).astype(
        "float32")
    c = targets.empty((M, N), "float32", dev)
    mod[mod.entry_name](targets.array(a, dev), targets.array(b, dev), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_resnet_kernels_symbolic_batch(gpu_dev):
    """ResNet's kernel kinds at small sizes: 3x3 / 1x1 / strided convs with bias and relu,
    the stem's max pool, a residual add, global pooling and the classifier."""
    dev, target = gpu_dev
    w3 = (RNG.standard_normal((24, 8, 3, 3)) * 0.3).astype("float32")
    w1 = (RNG.standard_normal((16, 24, 1, 1)) * 0.3).astype("float32")
    ws = (RNG.standard_normal((16, 8, 3, 3)) * 0.3).astype("float32")
    bias = RNG.standard_normal((1, 24, 1, 1)).astype("float32")
    fc = RNG.standard_normal((10, 16)).astype("float32")

    def body(x):
        a = nn.relu(op.add(nn.conv2d(x, const(w3), padding=(1, 1)), const(bias)))
        b = nn.conv2d(a, const(w1))
        c = nn.conv2d(x, const(ws), strides=(2, 2), padding=(1, 1))
        p = nn.max_pool2d(b, pool_size=3, strides=2, padding=1)
        r = nn.relu(op.add(p, c))
        g = op.reshape(nn.adaptive_avg_pool2d(r, output_size=(1, 1)), (-1, 16))
        return [a, b, p, r, op.matmul(g, op.permute_dims(const(fc), (1, 0)))]

    def ref(x):
        a = np.maximum(_conv_ref(x, w3, 1, 1) + bias, 0)
        b = _conv_ref(a, w1, 1, 0)
        c = _conv_ref(x, ws, 2, 1)
        p = _maxpool_ref(b)
        r = np.maximum(p + c, 0)
        return [a, b, p, r, r.mean((2, 3)) @ fc.T]

    mod = gpu.module([("x", ("n", 8, 14, 14), "float32")], body)
    gpu.check(dev, target, mod, lambda n: [RNG.standard_normal((n, 8, 14, 14)).astype(
        "float32")], ref, sizes=(1, 5), rtol=1e-3, atol=1e-3)


def test_bert_kernels_symbolic_batch(gpu_dev):
    """A BERT layer's kernel kinds: dense over (batch, seq, hidden) with bias and GELU-free
    epilogue, batch matmuls of the attention (scores and context) with a symbolic batch."""
    dev, target = gpu_dev
    s, h, heads = 24, 32, 2
    wq = (RNG.standard_normal((h, h)) * 0.2).astype("float32")
    bq = RNG.standard_normal((h,)).astype("float32")

    def body(x):
        q = op.add(op.matmul(x, const(wq)), const(bq))                  # (n, s, h)
        qh = op.permute_dims(op.reshape(q, (-1, s, heads, h // heads)), (0, 2, 1, 3))
        kt = op.permute_dims(qh, (0, 1, 3, 2))
        sc = op.matmul(qh, kt)                                           # (n, heads, s, s)
        ctx = op.matmul(nn.softmax(sc, axis=-1), qh)                     # (n, heads, s, d)
        return [q, sc, ctx]

    def ref(x):
        q = x @ wq + bq
        qh = q.reshape(-1, s, heads, h // heads).transpose(0, 2, 1, 3)
        sc = qh @ qh.transpose(0, 1, 3, 2)
        e = np.exp(sc - sc.max(-1, keepdims=True))
        return [q, sc, (e / e.sum(-1, keepdims=True)) @ qh]

    mod = gpu.module([("x", ("n", s, h), "float32")], body)
    gpu.check(dev, target, mod, lambda n: [RNG.standard_normal((n, s, h)).astype("float32")],
              ref, sizes=(1, 5), rtol=1e-3, atol=1e-3)


def test_dense_with_symbolic_batch_gets_a_full_tile_and_its_gelu_epilogue():
    """A transformer's FFN dense over ``(n, 128, 768)`` with bias and GELU (``x * erf(x)``:
    its result read twice): the epilogue in the register write-back (no kernel of its own);
    beside the batch-1 tile of 32 rows, from ``GEMM_SMALL_BATCH`` on a tile sized for
    ``GEMM_NOMINAL_BATCH`` sequences, 64 x 128 (192 work-groups of 128 x 128 at batch 8 would
    leave 72 of 132 multiprocessors idle in their second wave: ``GEMM_BALANCE_MPS``), and from
    ``GEMM_LARGE_BATCH`` on 128 x 128 (24 work-groups a sequence)."""
    n = te.var("n")
    A = te.placeholder((n, 128, 768), "float32", "A")
    W = te.placeholder((768, 3072), "float32", "W")
    bias = te.placeholder((3072,), "float32", "bias")
    k = te.reduce_axis((0, 768), "k")
    C = te.compute((n, 128, 3072), lambda b, s, j: te.sum(A[b, s, k] * W[k, j], axis=k), "C")
    D = te.compute((n, 128, 3072), lambda b, s, j: C[b, s, j] + bias[j], "D")
    E = te.compute((n, 128, 3072),
                   lambda b, s, j: D[b, s, j] * (te.erf(D[b, s, j] * 0.7071) + 1.0) * 0.5, "E")
    for kind in ("opencl", "webgpu"):
        g = gs.apply(te.create_prim_func([A, W, bias, E]), Target(kind))
        bx = [lp for lp in gs._loops_of(g) if lp.kind == "thread_binding" and
              lp.thread_tag == "blockIdx.x"]
        # one kernel per batch variant: the GELU is not a kernel of its own
        assert len(bx) == 3, kind
        assert f"if n < {gemm.GEMM_SMALL_BATCH}" in g.script()
        assert 24 in {lp.extent.value for lp in bx}, kind    # 3072 / 128 columns a group
        assert _bound(g, "blockIdx.y") == {1, 2, 4}, kind   # 128, 64 and 32 rows
        assert "T.erf" in g.script()


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_symbolic_batch_gemm_runs_the_tile_of_its_batch(kind):
    """A dense over ``(n, 128, 32)`` gets two schedules (``backend.gpu.batch_dispatch``): the
    tile sized for batch 1 below ``GEMM_SMALL_BATCH``, the one sized for
    ``GEMM_NOMINAL_BATCH`` from it on; the host picks per call. Both against numpy, with the
    GPU tile (``Target(kind)``, not PoCL's CPU variant), at batches on both sides."""
    dev, _ = gpu_device(kind)
    n = te.var("n")
    A = te.placeholder((n, 128, 32), "float32", "A")
    W = te.placeholder((32, 256), "float32", "W")
    bias = te.placeholder((256,), "float32", "bias")
    k = te.reduce_axis((0, 32), "k")
    C = te.compute((n, 128, 256), lambda b, s, j: te.sum(A[b, s, k] * W[k, j], axis=k), "C")
    D = te.compute((n, 128, 256), lambda b, s, j: te.max(C[b, s, j] + bias[j], 0.0), "D")
    g = gs.apply(te.create_prim_func([A, W, bias, D]), Target(kind))
    assert f"if n < {gemm.GEMM_SMALL_BATCH}" in g.script()
    mod = targets.build(g, Target(kind))
    w = RNG.standard_normal((32, 256)).astype("float32")
    b = RNG.standard_normal((256,)).astype("float32")
    for nb in (1, gemm.GEMM_SMALL_BATCH - 1, gemm.GEMM_SMALL_BATCH, 6):
        a = RNG.standard_normal((nb, 128, 32)).astype("float32")
        out = targets.empty((nb, 128, 256), "float32", dev)
        mod[mod.entry_name](targets.array(a, dev), targets.array(w, dev), targets.array(b, dev),
                            out)
        np.testing.assert_allclose(out.numpy(), np.maximum(a @ w + b, 0), rtol=1e-4,
                                   atol=1e-4)


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_conv_padding_is_inlined_into_the_window_fetch(kind):
    """Structure: a padded convolution (with its relu) lowers to one device kernel, the
    padding loaded into the shared window tile with bounds checks (no padding kernel)."""
    from tilecraft.tensorir.transform import lower_device
    n = te.var("n")
    w = RNG.standard_normal((32, 16, 3, 3)).astype("float32")
    mod = gpu.module([("x", (n, 16, 15, 13), "float32")],
                     lambda x: [nn.relu(nn.conv2d(x, const(w), strides=(2, 2),
                                                  padding=(1, 1)))])
    (func,) = _kernels(mod, kind).values()
    g = gs.apply(func, Target(kind))
    assert "shared" in _scopes(g)
    split = lower_device(g, Target(kind))
    assert len(split.kernels) == 1


def test_padded_convolutions_at_odd_sizes(gpu_dev):
    """ResNet-50 / MobileNet-V2 kinds of padded convolution on odd image sizes: 3x3 stride 1
    and 2, the 7x7 stride-2 stem (padding 3), a MobileNet-V2 block's padded part (1x1 expand
    with ReLU6, 3x3 depthwise stride 2 with ReLU6), asymmetric padding. (The block's 1x1
    projection at this size: ``test_pointwise_conv_on_an_odd_image``.)"""
    dev, target = gpu_dev
    w3 = (RNG.standard_normal((24, 8, 3, 3)) * 0.3).astype("float32")
    w7 = (RNG.standard_normal((16, 8, 7, 7)) * 0.1).astype("float32")
    we = (RNG.standard_normal((16, 8, 1, 1)) * 0.3).astype("float32")
    wd = (RNG.standard_normal((16, 1, 3, 3)) * 0.3).astype("float32")
    wa = (RNG.standard_normal((8, 8, 3, 2)) * 0.3).astype("float32")

    def body(x):
        a = nn.conv2d(x, const(w3), padding=(1, 1))
        b = nn.relu(nn.conv2d(x, const(w3), strides=(2, 2), padding=(1, 1)))
        c = nn.conv2d(x, const(w7), strides=(2, 2), padding=(3, 3))
        e = op.clip(nn.conv2d(x, const(we)), 0.0, 6.0)
        d = op.clip(nn.conv2d(e, const(wd), strides=(2, 2), padding=(1, 1), groups=16),
                    0.0, 6.0)
        f = nn.conv2d(x, const(wa), padding=(2, 0, 1, 1))
        return [a, b, c, d, f]

    def ref(x):
        e = np.clip(_conv_ref(x, we, 1, 0), 0, 6)
        d = np.concatenate([_conv_ref(e[:, i:i + 1], wd[i:i + 1], 2, 1) for i in range(16)], 1)
        xf = np.pad(x.astype("float64"), ((0, 0), (0, 0), (2, 1), (0, 1)))
        return [_conv_ref(x, w3, 1, 1), np.maximum(_conv_ref(x, w3, 2, 1), 0),
                _conv_ref(x, w7, 2, 3), np.clip(d, 0, 6), _conv_ref(xf, wa, 1, 0)]

    mod = gpu.module([("x", ("n", 8, 13, 11), "float32")], body)
    gpu.check(dev, target, mod, lambda n: [RNG.standard_normal((n, 8, 13, 11)).astype(
        "float32")], ref, sizes=(1, 3), rtol=1e-3, atol=1e-3)


def test_pointwise_conv_on_an_odd_image(gpu_dev):
    """A MobileNet-V2 projection (1x1, 16 -> 8 channels) on a 13 x 11 image. On PoCL the CPU
    variant of the GEMM tile (``opencl -device=cpu``: 8 x 6 threads, the reduction step not
    unrolled) gives wrong values for some outputs (so does ``main`` before the padding change;
    the GPU tile on PoCL and lavapipe are right): an open bug, like the batch matmul PoCL
    computed wrong with 16 x 16 work-items (docs/gpu.md)."""
    dev, target = gpu_dev
    if target == "opencl -device=cpu":
        pytest.xfail("PoCL + the CPU variant of the GEMM tile: wrong 1x1 conv on 13 x 11 "
                     "(open bug, see the docstring)")
    wp = (RNG.standard_normal((8, 16, 1, 1)) * 0.3).astype("float32")
    mod = gpu.module([("x", ("n", 16, 13, 11), "float32")],
                     lambda x: [nn.conv2d(x, const(wp))])
    gpu.check(dev, target, mod, lambda n: [RNG.standard_normal((n, 16, 13, 11)).astype(
        "float32")], lambda x: [_conv_ref(x, wp, 1, 0)], sizes=(1, 3), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_dense_over_symbolic_rows_gets_a_small_row_tile_below_64_rows(kind):
    """ResNet-50's classifier ``(batch, 2048) x (2048, 1000)``: the rows are the symbolic
    batch. Below GEMM_SMALL_ROWS rows a tile sized for GEMM_NOMINAL_ROWS runs (63 column
    work-groups of 16 rows), from there on the full 128 x 128 tile (8 column work-groups)."""
    w = np.zeros((1000, 2048), "float32")
    mod = gpu.module([("x", ("batch", 2048), "float32")],
                     lambda x: [op.matmul(x, op.permute_dims(const(w), (1, 0)))])
    (func,) = _kernels(mod, kind).values()
    g = gs.apply(func, Target(kind))
    script = g.script()
    assert f"if batch < {gemm.GEMM_SMALL_ROWS}" in script
    launches = [(lp.thread_tag, str(lp.extent)) for lp in gs._loops_of(g)
                if lp.thread_tag and lp.thread_tag.startswith("blockIdx")]
    assert ("blockIdx.x", "63") in launches and ("blockIdx.x", "8") in launches


def test_dense_over_symbolic_rows_runs_both_tiles(gpu_dev):
    dev, target = gpu_dev
    w = (RNG.standard_normal((40, 96)) * 0.2).astype("float32")
    b = RNG.standard_normal(40).astype("float32")
    mod = gpu.module([("x", ("n", 96), "float32")],
                     lambda x: [op.add(op.matmul(x, op.permute_dims(const(w), (1, 0))),
                                       const(b))])
    gpu.check(dev, target, mod, lambda n: [RNG.standard_normal((n, 96)).astype("float32")],
              lambda x: [x @ w.T + b], sizes=(1, 3, 70), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_large_batch_gets_a_third_tile(kind):
    """A BERT-like FFN dense over ``(n, 128, 64) x (64, 3072)``: sized for
    ``GEMM_NOMINAL_BATCH`` its 128 x 128 tile (192 work-groups) is halved to 64 x 128 to keep
    the multiprocessors busy to the end (``GEMM_BALANCE_MPS``); sized for
    ``GEMM_LARGE_NOMINAL_BATCH`` it stays 128 x 128 (384), run from ``GEMM_LARGE_BATCH`` on.
    Three schedules in one function; each against numpy with the GPU tile at batches on both
    sides of both thresholds."""
    dev, _ = gpu_device(kind)
    n = te.var("n")
    A = te.placeholder((n, 128, 64), "float32", "A")
    W = te.placeholder((64, 3072), "float32", "W")
    k = te.reduce_axis((0, 64), "k")
    C = te.compute((n, 128, 3072), lambda b, s, j: te.sum(A[b, s, k] * W[k, j], axis=k), "C")
    g = gs.apply(te.create_prim_func([A, W, C]), Target(kind))
    text = g.script()
    assert f"if n < {gemm.GEMM_SMALL_BATCH}" in text and f"if n < {gemm.GEMM_LARGE_BATCH}" in text
    assert {1, 2} <= _bound(g, "blockIdx.y")        # 128 / 128 and 128 / 64 rows a group
    mod = targets.build(g, Target(kind))
    w = RNG.standard_normal((64, 3072)).astype("float32")
    for nb in (1, gemm.GEMM_LARGE_BATCH - 1, gemm.GEMM_LARGE_BATCH, 13):
        a = RNG.standard_normal((nb, 128, 64)).astype("float32")
        out = targets.empty((nb, 128, 3072), "float32", dev)
        mod[mod.entry_name](targets.array(a, dev), targets.array(w, dev), out)
        np.testing.assert_allclose(out.numpy(), a @ w, rtol=1e-4, atol=1e-4, err_msg=f"n={nb}")
