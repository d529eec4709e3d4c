"""Winograd F(2x2, 3x3) for NHWC 3x3 stride-1 convolutions (relax.backend.cpu.winograd): which
layers take it, the transformed weight against numpy, results against a float64 numpy
convolution on random inputs (even and odd sizes, padding, channels that fill no panel, a
symbolic batch, fused epilogues), and the schedule of its kernel."""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft import targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax import default_schedules as ds
from tilecraft.relax.transform import AlterLayout
from tilecraft.relax.transform.convert_layout import nhwc_pays
from tilecraft.relax.backend.cpu import ConvGeometry
from tilecraft.relax.backend.cpu import conv2d_strategy as strategy
from tilecraft.relax.backend.cpu import winograd as wg
from tilecraft.tensorir import te
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.stmt import For

from test_alter_layout import conv_ref

AVX2 = "llvm -mcpu=haswell"
RNG = np.random.default_rng(5)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def geometry(c, hw, o, k=3, stride=1, pad=1, groups=1, dilation=1):
    return ConvGeometry(c, hw, hw, o, (k, k), (stride, stride), (pad,) * 4,
                        (dilation, dilation), groups)


@pytest.mark.parametrize("g,applies", [
    (geometry(64, 56, 64), True),
    (geometry(16, 7, 16, pad=0), True),
    (geometry(64, 56, 64, stride=2), False),        # strided: F(2x2, 3x3) is for stride 1
    (geometry(64, 56, 64, k=1, pad=0), False),
    (geometry(64, 56, 64, dilation=2, pad=2), False),
    (geometry(64, 56, 64, groups=2), False),
    (geometry(8, 56, 64), False),                   # too few input channels
    (geometry(64, 56, 8), False),                   # too few output channels
])
def test_which_layers_take_winograd(g, applies):
    assert wg.winograd_applies(g) == applies


@pytest.mark.parametrize("g,pays", [
    (geometry(128, 28, 128), True),                 # weight 1 MB for 196 tiles
    (geometry(256, 14, 256), True),                 # weight 4.2 MB for 49 tiles
    (geometry(512, 7, 512), False),                 # weight 16.8 MB for 16 tiles: memory-bound
    (geometry(64, 7, 64), True),                    # weight 262 KB for 16 tiles: in L2
    (geometry(64, 56, 64), True),                   # V 3.2 MB, kept between calls
])
def test_which_layers_winograd_pays_for_on_avx512(g, pays):
    assert wg.winograd_pays(g, 16, 32) == pays
    assert wg.winograd_pays(g, 8, 16)               # AVX2: every layer it applies to


def test_winograd_layers_convert_to_nhwc(monkeypatch):
    # a layer Winograd computes converts whatever the direct NHWC kernel would be
    monkeypatch.setattr(strategy, "nhwc_kernel_plan", lambda g, lanes, registers: None)
    assert nhwc_pays(geometry(64, 20, 64), AVX2)
    assert not nhwc_pays(geometry(64, 20, 64, stride=2), AVX2)


def test_transformed_weight_matches_numpy():
    c, o, width = 5, 20, 16
    w = rand(3, 3, c, o)                                  # HWIO
    wt = te.placeholder((3, 3, c, o), "float32", "w")
    u = wg.pack_winograd_weight(wt, "HWIO", width)
    mod = targets.build(te.create_prim_func([wt, u]), "llvm")
    out = targets.empty(tuple(d.value for d in u.shape), "float32")
    mod["main"](targets.array(w), out)
    gm = np.array(wg.G)
    ref = np.einsum("ai,ijco,bj->abco", gm, w.astype(np.float64), gm).reshape(16, c, o)
    ref = np.concatenate([ref, np.zeros((16, c, 2 * width - o))], axis=2)
    ref = ref.reshape(16, c, 2, width).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)


def conv_module(c, hw, o, pad, batch, klayout="OIHW", residual=False):
    """NHWC conv 3x3 + bias (+ residual) + relu, and its float64 numpy reference."""
    w = rand(o, c, 3, 3) * 0.1
    b = rand(o)
    kernel = w if klayout == "OIHW" else w.transpose(2, 3, 1, 0)          # HWIO
    p = (pad,) * 4 if isinstance(pad, int) else pad
    oh, ow = hw + p[0] + p[2] - 2, hw + p[1] + p[3] - 2
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch, hw, hw, c), "float32"))
    params = [x]
    if residual:
        params.append(Var("r", TensorStructInfo((batch, oh, ow, o), "float32")))
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(kernel), padding=pad, data_layout="NHWC",
                                     kernel_layout=klayout))
            y = bb.emit(op.add(y, const(b.reshape(1, 1, 1, o))))
            if residual:
                y = bb.emit(op.add(y, params[1]))
            gv = bb.emit_output(bb.emit(op.nn.relu(y)))
        bb.emit_func_output(gv)

    def ref(xv, rv=None):
        t = conv_ref(xv, w.transpose(2, 3, 1, 0), padding=p, layout="NHWC") + b
        return np.maximum(t + (rv if rv is not None else 0), 0)
    return bb.get(), ref, (oh, ow)


def winograd_kernels(mod, target):
    new = AlterLayout(target)(mod)
    return [name for name, f in new.functions.items()
            if "winograd_gemm" in getattr(f, "script", lambda: "")()]


@pytest.mark.parametrize("c,hw,o,pad,batch,klayout,residual", [
    (64, 14, 64, 1, 1, "OIHW", False),      # ResNet-like: 7 x 7 tiles
    (32, 7, 48, 1, 1, "OIHW", True),        # odd: the last tiles half outside; a residual
    (16, 9, 16, 0, 2, "HWIO", False),       # no padding: 7 x 7 output
    (24, 8, 40, 1, "n", "OIHW", True),      # 40 channels: a partial panel; symbolic batch
    (16, 6, 32, (1, 0, 2, 1), 1, "OIHW", False),   # uneven padding: 7 x 5 output
])
def test_winograd_convolution_matches_numpy(c, hw, o, pad, batch, klayout, residual):
    mod, ref, (oh, ow) = conv_module(c, hw, o, pad, batch, klayout, residual)
    assert winograd_kernels(mod, "llvm"), "the layer did not take Winograd"
    vm = relax.VirtualMachine(relax.build(mod, "llvm"), targets.cpu(0))
    n = 3 if batch == "n" else batch
    xv = rand(n, hw, hw, c)
    args = [xv] + ([rand(n, oh, ow, o)] if residual else [])
    out = vm["main"](*[targets.array(a) for a in args]).numpy()
    expect = ref(*args)
    assert out.shape == expect.shape
    np.testing.assert_allclose(out, expect, rtol=1e-4, atol=1e-4)


def test_winograd_off_keeps_the_direct_kernel():
    mod, _, _ = conv_module(32, 8, 32, 1, 1)
    assert not [f for f in AlterLayout("llvm", winograd=False)(mod).functions.values()
                if "winograd_gemm" in getattr(f, "script", lambda: "")()]


def test_winograd_kernel_is_scheduled():
    # the GEMM: (position, panel) pairs fused and parallel, a 6-tile x 16-channel register
    # tile (rows unrolled, channels vectorized); both transforms vectorized over channels
    mod, _, _ = conv_module(64, 14, 64, 1, 1)
    target = f"{AVX2} -num-cores=2"
    tasks = [t for t in relax.extract_tasks(mod, target, baselines=False)
             if "winograd_gemm" in t.func.script()]
    assert len(tasks) == 1
    func = ds.apply(tasks[0].func, targets.Target(target))
    assert ds.is_scheduled(func)
    loops = []
    post_order_visit(func.body, lambda s: loops.append(s) if isinstance(s, For) else None)
    kinds = [(f.kind, f.extent.value) for f in loops if f.kind != "serial"]
    assert ("parallel", 16 * 4) in kinds        # 16 positions x 4 panels of 16 channels
    assert ("unrolled", wg.GEMM_ROWS) in kinds
    assert sum(1 for k, _ in kinds if k == "vectorized") >= 4   # init, tile, write-back,
    # transforms


def test_winograd_rounding_is_close_to_the_direct_kernel():
    # float32 Winograd F(2x2, 3x3) and the direct kernel differ by rounding only
    mod, ref, _ = conv_module(128, 14, 128, 1, 1)
    xv = rand(1, 14, 14, 128)
    outs = []
    for on in (True, False):
        exe = relax.build(mod, "llvm") if on else \
            relax.build(AlterLayout("llvm", winograd=False)(mod), "llvm")
        outs.append(relax.VirtualMachine(exe, targets.cpu(0))["main"](
            targets.array(xv)).numpy())
    expect = ref(xv)
    scale = np.abs(expect).max()
    for out in outs:
        assert np.abs(out - expect).max() / scale < 1e-5


def test_a_chain_of_3x3_layers_converts_and_runs_as_winograd():
    # VGG-like: 3x3 -> relu -> 3x3 (NCHW, no 1x1 layer to anchor the chain): Winograd layers
    # run faster in NHWC, so the chain converts; values against numpy
    w1, w2 = rand(32, 16, 3, 3) * 0.1, rand(32, 32, 3, 3) * 0.1
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((2, 16, 10, 10), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.relu(bb.emit(op.nn.conv2d(x, const(w1), padding=1))))
            gv = bb.emit_output(bb.emit(op.nn.conv2d(h, const(w2), padding=1)))
        bb.emit_func_output(gv)
    mod = bb.get()
    from tilecraft.relax.transform import ConvertLayout
    converted = ConvertLayout(AVX2)(mod)
    layouts = [b.value.attr_dict["data_layout"] for blk in converted["main"].body.blocks
               for b in blk.bindings
               if getattr(getattr(b.value, "op", None), "name", None) == "relax.nn.conv2d"]
    assert layouts == ["NHWC", "NHWC"]
    xv = rand(2, 16, 10, 10)
    out = relax.VirtualMachine(relax.build(mod, AVX2), targets.cpu(0))["main"](
        targets.array(xv)).numpy()
    expect = conv_ref(np.maximum(conv_ref(xv, w1, padding=1), 0), w2, padding=1)
    np.testing.assert_allclose(out, expect, rtol=1e-4, atol=1e-4)


def test_winograd_stages_run_image_by_image():
    # a symbolic batch: the batch loop is the outermost, and the transformed input and the
    # products are allocated inside it with one image's shape (16 positions x 49 tiles padded
    # to 54 x 64 channels), so they stay in the caches from stage to stage
    from tilecraft.tensorir.stmt import Allocate
    from tilecraft.tensorir.transform import lower
    mod, _, _ = conv_module(64, 14, 64, 1, "n", residual=True)
    target = f"{AVX2} -num-cores=2"
    tasks = [t for t in relax.extract_tasks(mod, target, baselines=False)
             if "winograd_gemm" in t.func.script()]
    func = lower(ds.apply(tasks[0].func, targets.Target(target)))
    batch = []
    post_order_visit(func.body, lambda s: batch.append(s) if isinstance(s, For) and
                     not hasattr(s.extent, "value") else None)
    assert len(batch) == 1, "one loop over the symbolic batch"
    inside = {}
    post_order_visit(batch[0].body, lambda s: inside.update({s.buffer.name: s.buffer.shape})
                     if isinstance(s, Allocate) else None)
    assert [d.value for d in inside["winograd_input"]] == [16 * 54 * 64]
    assert [d.value for d in inside["winograd_gemm"]] == [16 * 54 * 64]


@pytest.mark.parametrize("c,hw,o,pad,batch,band", [
    (64, 14, 64, 1, 1, 1),          # 7 rows of 7 tiles, a band a row
    (32, 7, 48, 1, "n", 2),         # odd: the last tiles half outside; symbolic batch
    (16, 6, 32, (1, 0, 2, 1), 2, 2),   # 7 x 5 output: 4 rows of 3 tiles, two bands
])
def test_banded_winograd_matches_numpy(monkeypatch, c, hw, o, pad, batch, band):
    # the three stages band by band (band_rows forced on small layers), with a residual
    monkeypatch.setattr(wg, "band_rows", lambda g: band)
    mod, ref, (oh, ow) = conv_module(c, hw, o, pad, batch, residual=True)
    assert winograd_kernels(mod, "llvm"), "the layer did not take Winograd"
    vm = relax.VirtualMachine(relax.build(mod, "llvm"), targets.cpu(0))
    n = 3 if batch == "n" else batch
    xv, rv = rand(n, hw, hw, c), rand(n, oh, ow, o)
    out = vm["main"](targets.array(xv), targets.array(rv)).numpy()
    np.testing.assert_allclose(out, ref(xv, rv), rtol=1e-4, atol=1e-4)


def test_bands_take_large_images_with_small_weights():
    # ResNet-18's 56 x 56 layer (V and M 6.4 MB an image): bands of 2 rows of 28 tiles; the
    # 28 x 28 one (3.2 MB, a 1 MB weight): 2 rows of 14; 256 -> 256 at 14 x 14 (a 4.2 MB
    # weight, read once a band) and small images: none
    assert wg.band_rows(geometry(64, 56, 64)) == 2
    assert wg.band_rows(geometry(128, 28, 128)) == 2
    assert wg.band_rows(geometry(256, 14, 256)) == 0
    assert wg.band_rows(geometry(64, 14, 64)) == 0


def test_banded_stages_allocate_one_band():
    # V and M allocated inside the band loop with one band's shape: 2 rows x 28 tiles padded
    # to 60 (a multiple of the 6-tile register tile) x 64 channels, 16 positions
    from tilecraft.tensorir.stmt import Allocate
    from tilecraft.tensorir.transform import lower
    mod, _, _ = conv_module(64, 56, 64, 1, 1)
    tasks = [t for t in relax.extract_tasks(mod, "llvm", baselines=False)
             if "winograd_gemm" in t.func.script()]
    func = lower(ds.apply(tasks[0].func, targets.Target("llvm")))
    sizes = {}
    post_order_visit(func.body, lambda s: sizes.update({s.buffer.name: s.buffer.shape[0].value})
                     if isinstance(s, Allocate) else None)
    assert sizes["winograd_input"] == sizes["winograd_gemm"] == 16 * 60 * 64
