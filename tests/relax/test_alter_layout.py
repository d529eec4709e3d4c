"""AlterLayout (weight pre-packing), DecomposeOpsForInference, FoldScaleAxis and the default
schedules of the packed kernels: before/after text, results against numpy on random inputs
(symbolic batch), the packing folded out of the executable, epilogues fused."""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft import targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, TupleGetItem, Var, const, op
from tilecraft.relax import default_schedules as ds
from tilecraft.relax.printer import to_script
from tilecraft.relax.transform import (AlterLayout, CanonicalizeBindings, DeadCodeElimination,
                             DecomposeOpsForInference, FoldConstant, FoldScaleAxis, FuseOps,
                             FuseTIR, LegalizeOps, get_pipeline)
from tilecraft.relax.transform import alter_layout
from tilecraft.relax.backend import cpu
from tilecraft.relax.backend.cpu import conv2d_nchw_cvec as cvec
from tilecraft.relax.backend.cpu import conv2d_nchw as flat
from tilecraft.relax.backend.cpu import conv2d_strategy as strategy
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.stmt import Allocate
from tilecraft.tensorir.transform import lower

RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def conv_ref(x, w, strides=1, padding=0, dilation=1, groups=1, layout="NCHW"):
    """numpy NCHW / NHWC convolution (OIHW / HWIO weights), float64."""
    if layout == "NHWC":
        x = x.transpose(0, 3, 1, 2)
        w = w.transpose(3, 2, 0, 1)
    x, w = x.astype(np.float64), w.astype(np.float64)
    s, d = (strides, strides) if isinstance(strides, int) else strides, dilation
    p = (padding,) * 4 if isinstance(padding, int) else padding
    n, c, h, wd = x.shape
    o, i, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])))
    oh = (h + p[0] + p[2] - d * (kh - 1) - 1) // s[0] + 1
    ow = (wd + p[1] + p[3] - d * (kw - 1) - 1) // s[1] + 1
    out = np.zeros((n, o, oh, ow))
    opg = o // groups
    for g in range(groups):
        for a in range(kh):
            for b in range(kw):
                patch = xp[:, g * i:(g + 1) * i, a * d:a * d + s[0] * (oh - 1) + 1:s[0],
                           b * d:b * d + s[1] * (ow - 1) + 1:s[1]]
                out[:, g * opg:(g + 1) * opg] += np.einsum("nchw,oc->nohw", patch,
                                                           w[g * opg:(g + 1) * opg, :, a, b])
    return out.transpose(0, 2, 3, 1) if layout == "NHWC" else out


def kernels_of(exe) -> list[str]:
    return exe.kernel_names


# ---------------------------------------------------------------------------------------------
# AlterLayout: the rewrite


def _conv_module(w, shape=("n", 16, 12, 12), relu=True, **attrs):
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.conv2d(x, const(w), **attrs))
            if relu:
                h = bb.emit(op.nn.relu(h))
            gv = bb.emit_output(h)
        bb.emit_func_output(gv)
    return bb.get()


def test_alter_layout_text_and_folded_packing():
    w = rand(32, 16, 3, 3)
    mod = _conv_module(w, padding=1)
    after = AlterLayout("llvm")(mod)
    text = to_script(after["main"])
    g = cpu.ConvGeometry(16, 12, 12, 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    plan = strategy.nchw_kernel_plan(g, *_tile())
    r = plan.width if isinstance(plan, cvec.ChannelVectorPlan) else plan.oc_block
    assert (f'R.call_tir(pack_conv2d_nchw_weight, (metadata["relax.expr.Constant"][0],), '
            f'out_sinfo=R.Tensor(({32 // r}, 16, 3, 3, {r}), "float32"))') in text
    assert 'R.call_tir(conv2d_nchw, (x, lv' in text
    assert "R.nn.relu(lv)" in text            # the epilogue is still an operator
    assert after["pack_conv2d_nchw_weight"].attr_dict["op_pattern"] == 2     # INJECTIVE
    assert after["conv2d_nchw"].attr_dict["op_pattern"] == 4                 # OUT_EWISE_FUSABLE
    # the input module is unchanged (passes return new IR)
    assert "R.nn.conv2d" in to_script(mod["main"])
    # after legalization and folding, the packed weight is a constant: no packing kernel left
    folded = FoldConstant()(LegalizeOps()(after))
    main = to_script(DeadCodeElimination()(folded)["main"])
    assert "pack_conv2d_nchw_weight" not in main
    packed = [c for c in _constants(folded) if c.shape == (32 // r, 16, 3, 3, r)]
    assert packed and np.array_equal(packed[0],
                                     w.reshape(32 // r, r, 16, 3, 3).transpose(0, 2, 3, 4, 1))
    # other targets are left alone
    assert AlterLayout("opencl")(mod) is mod


def _tile():
    return cpu.cpu_tile_params(targets.Target("llvm"))


def _constants(mod):
    out = []
    post_order_visit(mod["main"], lambda n: out.append(n.data)
                     if isinstance(n, relax.Constant) else None)
    return out


def test_packing_kernel_not_in_the_executable():
    w = rand(8, 4, 3, 3)
    exe = relax.build(_conv_module(w, shape=("n", 4, 9, 9), padding=1), "llvm")
    assert not any(k.startswith("pack_") for k in kernels_of(exe))
    assert kernels_of(exe) == ["fused_conv2d_nchw_relu"]
    # a weight computed at run time is packed on every call (and still right)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 4, 9, 9), "float32"))
    wv = Var("w", TensorStructInfo((8, 4, 3, 3), "float32"))
    with bb.function("main", [x, wv]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(op.nn.conv2d(x, wv, padding=1)))
        bb.emit_func_output(gv)
    exe2 = relax.build(bb.get(), "llvm")
    assert "pack_conv2d_nchw_weight" in kernels_of(exe2)
    xs = rand(2, 4, 9, 9)
    out = relax.VirtualMachine(exe2)["main"](xs, w).numpy()
    np.testing.assert_allclose(out, conv_ref(xs, w, padding=1), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# convolutions: many shapes, one build


NCHW_CASES = [  # (C, O, H, W, k, attrs)
    (16, 32, 12, 12, 1, {}),                                          # 1x1, in place
    (16, 16, 14, 14, 3, {"padding": 1}),                              # 3x3 s1
    (8, 16, 13, 13, 3, {"padding": 1, "strides": 2}),                 # 3x3 s2, odd size
    (16, 32, 12, 12, 1, {"strides": 2}),                              # 1x1 s2 (downsample)
    (3, 16, 23, 23, 7, {"padding": 3, "strides": 2}),                 # the 7x7 stem
    (16, 16, 10, 10, 3, {"padding": 1, "groups": 16}),                # depthwise
    (16, 16, 11, 11, 3, {"padding": 1, "groups": 16, "strides": 2}),  # depthwise s2
    (16, 32, 9, 9, 3, {"padding": 1, "groups": 4}),                   # grouped
    (8, 8, 11, 11, 3, {"padding": 2, "dilation": 2}),                 # dilated
    (8, 12, 10, 12, 3, {}),                                           # no padding, 12 channels
    (6, 8, 9, 9, (1, 7), {"padding": (0, 3, 0, 3)}),                  # Inception's 1x7
    (8, 16, 35, 35, 3, {"strides": 2}),        # 17 x 17 out: the widened 17 x 16 tile (AVX-512)
    (64, 128, 9, 9, 5, {"padding": 2, "groups": 2}),  # AlexNet's 2 groups: tiles in one group
]


def _many_convs(cases, layout="NCHW"):
    """One module, a function per case (``f0``, ``f1``...): a conv + bias + relu each."""
    bb = BlockBuilder()
    refs = []
    for k, (c, o, h, w_, ks, attrs) in enumerate(cases):
        kh, kw = (ks, ks) if isinstance(ks, int) else ks
        g = attrs.get("groups", 1)
        w = rand(o, c // g, kh, kw)
        b = rand(o)
        if layout == "NHWC":
            shape, wt = ("n", h, w_, c), w.transpose(2, 3, 1, 0).copy()
            extra = {"data_layout": "NHWC", "kernel_layout": "HWIO"}
            bias = b
        else:
            shape, wt, extra, bias = ("n", c, h, w_), w, {}, b.reshape(o, 1, 1)
        x = Var("x", TensorStructInfo(shape, "float32"))
        with bb.function(f"f{k}", [x]):
            with bb.dataflow():
                y = bb.emit(op.nn.conv2d(x, const(wt), **attrs, **extra))
                y = bb.emit(op.nn.relu(bb.emit(op.add(y, const(bias)))))
                gv = bb.emit_output(y)
            bb.emit_func_output(gv)
        refs.append((shape, wt, bias, attrs))
    return bb.get(), refs


NHWC_CASES = [
    (16, 32, 12, 12, 1, {}), (16, 32, 14, 14, 3, {"padding": 1}),
    (8, 40, 13, 13, 3, {"padding": 1, "strides": 2}), (16, 32, 12, 12, 1, {"strides": 2}),
    (32, 32, 10, 10, 3, {"padding": 1, "groups": 32}),
    (3, 16, 23, 23, 7, {"padding": 3, "strides": 2}),
    (64, 64, 9, 9, 3, {"padding": 1, "groups": 2})]
FAST = {"NCHW": [0, 2, 3, 4, 6, 7, 8, 11, 12], "NHWC": [0, 2, 4, 6]}   # every feature, fewer
# compiles


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_shapes_match_numpy(layout):
    cases = NCHW_CASES if layout == "NCHW" else NHWC_CASES
    _check_convs([cases[k] for k in FAST[layout]], layout)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_shapes_match_numpy_all(layout):
    _check_convs(NCHW_CASES if layout == "NCHW" else NHWC_CASES, layout)


def _check_convs(cases, layout):
    mod, refs = _many_convs(cases, layout)
    altered = AlterLayout("llvm")(mod)
    for k in range(len(cases)):
        assert "R.nn.conv2d" not in to_script(altered[f"f{k}"]), cases[k]
    exe = relax.build(mod, "llvm")
    assert not any(k.startswith("pack_") for k in kernels_of(exe))
    vm = relax.VirtualMachine(exe)
    for k, (shape, w, bias, attrs) in enumerate(refs):
        for n in (1, 2):
            xs = rand(n, *shape[1:])
            want = np.maximum(conv_ref(xs, w, attrs.get("strides", 1), attrs.get("padding", 0),
                                       attrs.get("dilation", 1), attrs.get("groups", 1),
                                       layout) + bias, 0)
            got = vm[f"f{k}"](xs).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(cases[k]))
    # each function is one fused kernel: conv + bias + relu
    assert exe.stats()["f0"]["kernel_calls"] == 1


@pytest.mark.parametrize("kernel", ["flat", "cvec"])
def test_each_nchw_kernel_matches_numpy(kernel, monkeypatch):
    """Both NCHW kernels on every feature (``nchw_kernel_plan`` picks one per geometry; here
    each is forced where it applies: the channel-vector kernel has no depthwise form, and the
    flat one takes the depthwise convolutions that x86 gives to the row kernel)."""
    def forced(g, lanes, registers):
        tile = cvec.plan_conv2d_nchw_cvec(g, lanes, registers) if kernel == "cvec" else None
        return tile or flat.plan_conv2d_nchw(g, lanes, registers)
    monkeypatch.setattr(strategy, "nchw_kernel_plan", forced)
    monkeypatch.setattr(alter_layout._Alter, "depthwise_rows", lambda self, g: False)
    _check_convs([NCHW_CASES[k] for k in FAST["NCHW"]], "NCHW")


DEPTHWISE_CASES = [  # (C, O, H, W, k, attrs), groups = C; strided: x86 takes the row kernel
    (16, 16, 10, 10, 3, {"padding": 1, "strides": 2}),                # MobileNet's 3x3 s2
    (24, 24, 13, 13, 3, {"padding": 1, "strides": 2}),                # odd size
    (8, 8, 20, 37, 5, {"padding": (2, 1, 2, 3), "strides": (1, 2)}),  # asymmetric pads
    (8, 8, 23, 23, 3, {"padding": 2, "dilation": 2, "strides": 2}),   # dilated
    (8, 8, 9, 40, (1, 7), {"padding": (0, 3, 0, 3), "strides": (2, 3)}),  # 1x7, a tail
    (32, 32, 7, 7, 3, {"strides": 2}),                                # no padding
    (8, 8, 9, 50, 3, {"padding": 1, "strides": 2}),                   # 25 columns: a tail
]


@pytest.mark.parametrize("layout", ["NCHW"])
def test_depthwise_rows_kernel_matches_numpy(layout):
    """The depthwise row kernel (x86's strided NCHW depthwise form) on strides, dilation,
    asymmetric and no padding, a non-square window, rows with a vector tail; batches 1 and 2;
    the bias and relu fused."""
    cases = [(c, o, h, w, k, dict(attrs, groups=c)) for c, o, h, w, k, attrs in DEPTHWISE_CASES]
    mod, _ = _many_convs(cases, layout)
    altered = AlterLayout("llvm -mtriple=x86_64-linux-gnu")(mod)
    kernels = [f.script() for _, f in altered.functions.items() if isinstance(f, PrimFunc)]
    assert sum('T.block("dw_rows")' in k for k in kernels) == len(cases)
    _check_convs(cases, layout)


def test_channel_vector_plan():
    g = cpu.ConvGeometry(512, 7, 7, 512, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    p = cvec.plan_conv2d_nchw_cvec(g, 16, 32)
    assert (p.rows, p.width) == (7, 32)              # 14 accumulators; 7 x 64 would be 28
    assert isinstance(strategy.nchw_kernel_plan(g, 16, 32), cvec.ChannelVectorPlan)
    # a tie in accumulators goes to the channel block whose weight slice stays in L1: a 1x1
    # 256 -> 1024 layer at 14 x 14 takes 14 x 16 (16 KiB) over 7 x 32 (32 KiB); with 1024
    # input channels neither fits and 7 x 32 halves the broadcasts
    one = cpu.ConvGeometry(256, 14, 14, 1024, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    assert (cvec.plan_conv2d_nchw_cvec(one, 16, 32).rows,
            cvec.plan_conv2d_nchw_cvec(one, 16, 32).width) == (14, 16)
    wide = cpu.ConvGeometry(1024, 14, 14, 256, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    assert (cvec.plan_conv2d_nchw_cvec(wide, 16, 32).rows,
            cvec.plan_conv2d_nchw_cvec(wide, 16, 32).width) == (7, 32)
    stem = cpu.ConvGeometry(3, 224, 224, 64, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1)
    p = cvec.plan_conv2d_nchw_cvec(stem, 16, 32)
    assert (p.rows, p.width) == (4, 64) and 112 % p.rows == 0
    # AVX2: at most 12 accumulators, and the weight vectors and a broadcast fit beside them
    for geom in (g, stem):
        p = cvec.plan_conv2d_nchw_cvec(geom, 8, 16)
        assert p.rows * p.vectors <= 12 and p.rows * p.vectors + p.vectors + 1 <= 16
    # a 56 x 56 stride-1 plane stays on the flat kernel; a depthwise one has no tile
    big = cpu.ConvGeometry(64, 56, 56, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert isinstance(strategy.nchw_kernel_plan(big, 16, 32), flat.NchwPlan)
    dw = cpu.ConvGeometry(32, 14, 14, 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 32)
    assert cvec.plan_conv2d_nchw_cvec(dw, 16, 32) is None
    # a 17-wide output has no divisor up to 16 but 1: the tile widens to 17 x 16 (17
    # accumulators) rather than run 1 x 64; AVX2 cannot, and its 1 x 32 tile is narrow, so
    # (a long reduction) it takes the tiles across rows, 3 x 32 in reduction chunks of 48
    incep = cpu.ConvGeometry(288, 35, 35, 384, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), 1)
    p = cvec.plan_conv2d_nchw_cvec(incep, 16, 32)
    assert (p.rows, p.width) == (17, 16)
    assert isinstance(strategy.nchw_kernel_plan(incep, 16, 32), cvec.ChannelVectorPlan)
    p = strategy.nchw_kernel_plan(incep, 8, 16)
    assert (p.rows, p.width, p.across_rows, p.k_chunk) == (3, 32, True, 48)
    # with fewer multiply-adds per output the AVX2 rule keeps the row tiles or the flat kernel
    # (a 1x1 layer: the 4 x 2 flat tile that reads the input in place, not the 4 x 3 one
    # that needs a padded copy of it)
    short = cpu.ConvGeometry(64, 56, 56, 256, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    p = strategy.nchw_kernel_plan(short, 8, 16)
    assert isinstance(p, flat.NchwPlan) and (p.oc_block, p.vectors, p.direct_in) == (4, 2, True)
    assert (flat.plan_conv2d_nchw(short, 16, 32).oc_block,
            flat.plan_conv2d_nchw(short, 16, 32).vectors) == (2, 7)    # AVX-512 unchanged
    # a strided KxK stem reads its input in place as row tiles (4 x 16), no phase planes
    p = strategy.nchw_kernel_plan(stem, 8, 16)
    assert isinstance(p, cvec.ChannelVectorPlan) and (p.rows, p.width) == (4, 16)
    # 12 accumulators on any plane; the reduction in chunks whose weights fit 8 KiB
    for geom, tile in ((cpu.ConvGeometry(2048, 7, 7, 512, (1, 1), (1, 1), (0,) * 4, (1, 1), 1),
                        (3, 32, 64)),
                       (cpu.ConvGeometry(512, 7, 7, 48, (3, 3), (1, 1), (1,) * 4, (1, 1), 1),
                        (6, 16, 128))):
        p = strategy.nchw_kernel_plan(geom, 8, 16)
        assert (p.rows, p.width, p.k_chunk) == tile and p.across_rows
    # a prime width beyond the widened tile (Inception's 149) stays narrow: the flat kernel
    prime = cpu.ConvGeometry(32, 149, 149, 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert cvec.is_narrow(cvec.plan_conv2d_nchw_cvec(prime, 16, 32), 32)
    assert isinstance(strategy.nchw_kernel_plan(prime, 16, 32), flat.NchwPlan)


def test_conv_kernels_get_their_schedule():
    """The dedicated rules apply (a failing rule would leave the generic fallback): the tile
    loops are unrolled and vectorized, and the accumulators are a small local tile (the
    Winograd kernel's transformed input and products are local buffers of one image)."""
    w = rand(32, 16, 3, 3)
    for attrs, shape in (({"padding": 1}, ("n", 16, 14, 14)), ({}, ("n", 16, 14, 14)),
                         ({"padding": 1, "data_layout": "NHWC", "kernel_layout": "HWIO"},
                          ("n", 14, 14, 16))):
        wt = w if "data_layout" not in attrs else w.transpose(2, 3, 1, 0).copy()
        if not attrs.get("padding") and "data_layout" not in attrs:
            wt = rand(32, 16, 1, 1)
        mod = get_pipeline()(_conv_module(wt, shape=shape, **attrs))
        (name, func), = [(k, f) for k, f in mod.functions.items() if isinstance(f, PrimFunc)]
        g = ds.apply(func, targets.Target("llvm"))
        kinds = [loop.kind for loop in ds._loops_of(g)]
        assert "unrolled" in kinds and "vectorized" in kinds and "parallel" in kinds, name
        local = []
        post_order_visit(lower(g).body, lambda n: local.append(n)
                         if isinstance(n, Allocate) and n.buffer.scope == "local" else None)
        # Winograd (the NHWC layer): 16 positions x 49 tiles (padded to 54) x 16 or 32 channels
        per_image = {a.buffer.name: a.buffer.shape[0].value for a in local
                     if a.buffer.name in ("winograd_input", "winograd_gemm")}
        assert per_image in ({}, {"winograd_input": 16 * 54 * 16,
                                  "winograd_gemm": 16 * 54 * 32}), (name, per_image)
        tiles = [a for a in local if a.buffer.name not in per_image]
        assert tiles and all(len(a.buffer.shape) == 1 and a.buffer.shape[0].value <= 24 * 16
                             for a in tiles), name


# ---------------------------------------------------------------------------------------------
# dense


def test_dense_matmul_and_linear_packed():
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 48), "float32"))
    w1, w2, w3, b3 = rand(48, 96), rand(96, 10), rand(40, 96), rand(40)
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.relu(bb.emit(op.matmul(x, const(w1)))))
            a = bb.emit(op.matmul(h, const(w2)))                  # N = 10: one narrow panel
            c = bb.emit(op.linear(h, const(w3), const(b3)))       # N = 40: a zero-padded panel
            gv = bb.emit_output(relax.Tuple([a, c]))
        bb.emit_func_output(gv)
    mod = bb.get()
    text = to_script(AlterLayout("llvm")(mod)["main"])
    assert "pack_dense_weight" in text and "R.call_tir(dense, " in text
    assert "R.matmul" not in text and "R.linear" not in text
    exe = relax.build(mod, "llvm", upper_bounds={"n": 16})
    assert not any(k.startswith("pack_") for k in kernels_of(exe))
    vm = relax.VirtualMachine(exe)
    for n in (1, 3, 7, 16, 23):
        xs = rand(n, 48)
        got_a, got_c = (t.numpy() for t in vm["main"](xs))
        hh = np.maximum(xs.astype(np.float64) @ w1, 0)
        np.testing.assert_allclose(got_a, hh @ w2, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got_c, hh @ w3.T + b3, rtol=1e-4, atol=1e-4)


def test_dense_batched_rows_and_epilogue():
    # (b, s, K) @ (K, N) + bias, gelu: a 3-D input, both leading dims symbolic, one kernel
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("b", "s", 32), "float32"))
    w, b = rand(32, 128), rand(128)
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.add(bb.emit(op.matmul(x, const(w))), const(b)))
            gv = bb.emit_output(bb.emit(op.nn.relu(h)))
        bb.emit_func_output(gv)
    exe = relax.build(bb.get(), "llvm")
    assert exe.stats()["main"]["kernel_calls"] == 1
    vm = relax.VirtualMachine(exe)
    for shape in ((1, 1), (2, 5), (1, 13)):
        xs = rand(*shape, 32)
        np.testing.assert_allclose(vm["main"](xs).numpy(), np.maximum(xs @ w + b, 0),
                                   rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# batch norm: decomposed, folded into the conv, fused


def _bn_params(c):
    return [(1 + 0.1 * rand(c)), 0.1 * rand(c), 0.1 * rand(c),
            RNG.uniform(0.5, 1.5, c).astype("float32")]


def _bottleneck_module(c=16, width=8, hw=10):
    """conv1x1 -> bn -> relu -> conv3x3 -> bn -> relu -> conv1x1 -> bn -> + x -> relu."""
    convs = [(c, width, 1, 0), (width, width, 3, 1), (width, c, 1, 0)]
    params = [(rand(o, i, k, k), _bn_params(o), p) for i, o, k, p in convs]
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", c, hw, hw), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for k, (w, bn, pad) in enumerate(params):
                h = bb.emit(op.nn.conv2d(h, const(w), padding=pad))
                t = bb.emit(op.nn.batch_norm(h, *map(const, bn), axis=1, epsilon=1e-5))
                h = bb.emit(TupleGetItem(t, 0))
                if k < 2:
                    h = bb.emit(op.nn.relu(h))
            gv = bb.emit_output(bb.emit(op.nn.relu(bb.emit(op.add(h, x)))))
        bb.emit_func_output(gv)

    def reference(xs):
        h = xs.astype(np.float64)
        for k, (w, (g, b, m, v), pad) in enumerate(params):
            h = conv_ref(h, w, padding=pad)
            s = (slice(None), None, None)
            h = (h - m[s]) / np.sqrt(v[s] + 1e-5) * g[s] + b[s]
            if k < 2:
                h = np.maximum(h, 0)
        return np.maximum(h + xs, 0)
    return bb.get(), reference


def test_decompose_batch_norm_text_and_values():
    mod, reference = _bottleneck_module()
    dec = DecomposeOpsForInference()(mod)
    text = to_script(dec["main"])
    assert "R.nn.batch_norm" not in text
    assert "R.rsqrt(R.add(" in text or "R.rsqrt(lv" in text
    assert "R.multiply(lv" in text and "R.reshape(" in text
    # folded: conv -> multiply by a constant -> add a constant
    folded = CanonicalizeBindings()(FoldConstant()(dec))
    text = to_script(DeadCodeElimination()(folded)["main"])
    assert "R.rsqrt" not in text and "R.nn.batch_norm" not in text
    # the scale goes into the weights: the convs are followed by an add only
    scaled = DeadCodeElimination()(FoldScaleAxis()(folded))
    text = to_script(scaled["main"])
    assert "R.multiply" not in text
    assert text.count("R.nn.conv2d") == 3 and text.count("R.add(") == 4
    # the decomposition and the folded scale keep the values (the legalized kernels on the VM)
    xs = rand(2, 16, 10, 10)
    for m in (dec, scaled):
        exe = relax.build(m, "llvm", pipeline=[LegalizeOps(), FuseOps(), FuseTIR()])
        np.testing.assert_allclose(relax.VirtualMachine(exe)["main"](xs).numpy(),
                                   reference(xs), rtol=1e-4, atol=1e-4)


def test_bottleneck_fuses_into_three_kernels():
    mod, reference = _bottleneck_module()
    exe = relax.build(mod, "llvm")
    # kernels before fusion: 3 convs, 3 batch norms, 3 relus, 1 add
    assert exe.stats()["main"]["kernel_calls"] == 3
    names = kernels_of(exe)
    assert all(n.startswith("fused_conv2d_nchw") for n in names), names
    assert any("add" in n and n.endswith("relu2") or n.count("add") >= 2 for n in names), names
    vm = relax.VirtualMachine(exe)
    for n in (1, 3):
        xs = rand(n, 16, 10, 10)
        np.testing.assert_allclose(vm["main"](xs).numpy(), reference(xs), rtol=1e-4,
                                   atol=1e-4)


def test_fold_scale_axis_only_per_channel():
    w = rand(8, 4, 3, 3)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, 4, 6, 6), "float32"))
    s_chan, s_pix = rand(8, 1, 1), rand(1, 1, 6)
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.multiply(bb.emit(op.nn.conv2d(x, const(w), padding=1)),
                                    const(s_chan)))
            c = bb.emit(op.nn.conv2d(x, const(w), padding=1))
            b = bb.emit(op.multiply(c, const(s_pix)))       # varies along W: not foldable
            d = bb.emit(op.multiply(c, const(s_chan)))      # c has two uses: not foldable
            gv = bb.emit_output(relax.Tuple([a, b, d]))
        bb.emit_func_output(gv)
    mod = bb.get()
    out = DeadCodeElimination()(FoldScaleAxis()(mod))
    text = to_script(out["main"])
    assert text.count("R.multiply") == 2 and text.count("R.nn.conv2d") == 2
    xs = rand(1, 4, 6, 6)
    conv = conv_ref(xs, w, padding=1)
    exe = relax.build(out, "llvm")
    got = [t.numpy() for t in relax.VirtualMachine(exe)["main"](xs)]
    for g, want in zip(got, (conv * s_chan, conv * s_pix, conv * s_chan)):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# pooling


def _pool_ref(x, kind, k, s, p, count_include_pad=False):
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)), constant_values=fill)
    ones = np.pad(np.ones(x.shape), ((0, 0), (0, 0), (p, p), (p, p)),
                  constant_values=1.0 if count_include_pad else 0.0)
    oh, ow = (x.shape[2] + 2 * p - k) // s + 1, (x.shape[3] + 2 * p - k) // s + 1
    taps = [(a, b) for a in range(k) for b in range(k)]
    win = [xp[:, :, a:a + s * (oh - 1) + 1:s, b:b + s * (ow - 1) + 1:s] for a, b in taps]
    if kind == "max":
        return np.max(win, axis=0)
    cnt = sum(ones[:, :, a:a + s * (oh - 1) + 1:s, b:b + s * (ow - 1) + 1:s] for a, b in taps)
    return np.sum(win, axis=0) / cnt


def test_pooling_layers_match_numpy():
    cases = [("max", 3, 2, 1, {}), ("max", 3, 2, 0, {}), ("avg", 2, 2, 0, {}),
             ("avg", 3, 2, 1, {"count_include_pad": True}),          # phases, constant divisor
             ("avg", 3, 2, 1, {}),                                   # varying divisor: kept
             ("avg", 3, 1, 1, {}), ("max", 3, 1, 1, {})]             # stride 1: in place
    bb = BlockBuilder()
    for k, (kind, ks, st, pad, extra) in enumerate(cases):
        x = Var("x", TensorStructInfo(("n", 8, 13, 13), "float32"))
        pool = op.nn.max_pool2d if kind == "max" else op.nn.avg_pool2d
        with bb.function(f"f{k}", [x]):
            with bb.dataflow():
                gv = bb.emit_output(bb.emit(pool(x, ks, st, pad, **extra)))
            bb.emit_func_output(gv)
    x = Var("x", TensorStructInfo(("n", 32, 7, 7), "float32"))
    with bb.function("gap", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(op.nn.adaptive_avg_pool2d(x, 1)))
        bb.emit_func_output(gv)
    mod = bb.get()

    def phased(m):
        return [k for k in range(len(cases)) if "R.nn." not in to_script(m[f"f{k}"])]
    # strided, constant divisor: on phase planes, except on x86: separable, any stride
    arm = AlterLayout("llvm -mtriple=aarch64-linux-gnu")(mod)
    assert phased(arm) == [0, 1, 2, 3]
    x86 = AlterLayout("llvm -mtriple=x86_64-linux-gnu")(mod)
    assert phased(x86) == [0, 1, 2, 3, 6]
    kernels = [f for name, f in x86.functions.items()
               if isinstance(f, PrimFunc) and "pool" in name]
    assert len(kernels) == 5 and all("pool_rows" in f.script() for f in kernels)
    # both forms run right here: the module as the host builds it, and the phase-plane kernels
    for m in (mod, arm):
        vm = relax.VirtualMachine(relax.build(m, "llvm"))
        for k, (kind, ks, st, pad, extra) in enumerate(cases):
            for n in (1, 2):
                xs = rand(n, 8, 13, 13)
                np.testing.assert_allclose(vm[f"f{k}"](xs).numpy(),
                                           _pool_ref(xs, kind, ks, st, pad,
                                                     extra.get("count_include_pad", False)),
                                           rtol=1e-5, atol=1e-5, err_msg=str(cases[k]))
        xs = rand(2, 32, 7, 7)
        np.testing.assert_allclose(vm["gap"](xs).numpy(), xs.mean(axis=(2, 3), keepdims=True),
                                   rtol=1e-5, atol=1e-5)


def _pool_brute(x, kind, k, s, pads, out_hw):
    """Window by window over the data elements only (padding never wins, and the average
    divides by the whole window)."""
    (kh, kw), (sh, sw), (pt, pl) = k, s, pads[:2]
    n, c, h, w = x.shape
    out = np.empty((n, c) + tuple(out_hw))
    for y in range(out_hw[0]):
        for xx in range(out_hw[1]):
            r0, c0 = y * sh - pt, xx * sw - pl
            win = x[:, :, max(r0, 0):max(r0 + kh, 0), max(c0, 0):max(c0 + kw, 0)]
            out[:, :, y, xx] = win.max(axis=(2, 3)) if kind == "max" else \
                win.sum(axis=(2, 3)) / (kh * kw)
    return out


@pytest.mark.parametrize("kind,k,s,pads,ceil", [
    ("max", (3, 3), (2, 2), (1, 1, 1, 1), False),     # ResNet's
    ("max", (2, 3), (1, 2), (0, 1, 1, 0), False),     # rectangular, asymmetric padding
    ("max", (3, 3), (2, 2), (0, 0, 0, 0), True),      # ceil mode: the last window overhangs
    ("max", (5, 5), (3, 3), (2, 2, 2, 2), False),
    ("avg", (3, 3), (2, 2), (1, 1, 1, 1), False),     # count_include_pad: constant divisor
    ("avg", (2, 2), (1, 1), (0, 0, 0, 0), False),
])
def test_separable_pooling_matches_brute_force(kind, k, s, pads, ceil):
    """The x86 form (``pool2d_nchw_separable``: rows, then columns of one padded row) on odd
    sizes, against a window-by-window reference, for two batch sizes of one build."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 5, 17, 19), "float32"))
    extra = {"ceil_mode": ceil} if kind == "max" else {"count_include_pad": True}
    pool = op.nn.max_pool2d if kind == "max" else op.nn.avg_pool2d
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(pool(x, k, s, pads, **extra)))
        bb.emit_func_output(gv)
    mod = bb.get()
    out_hw = [d.value for d in mod["main"].ret_struct_info.shape[2:]]
    x86 = AlterLayout("llvm -mtriple=x86_64-linux-gnu")(mod)
    assert any("pool_rows" in f.script() for f in x86.functions.values()
               if isinstance(f, PrimFunc)), "not the separable kernel"
    vm = relax.VirtualMachine(relax.build(mod, "llvm"))
    for n in (1, 3):
        xs = rand(n, 5, 17, 19)
        np.testing.assert_allclose(vm["main"](xs).numpy(), _pool_brute(xs, kind, k, s, pads, out_hw),
                                   rtol=1e-5, atol=1e-6)


def test_avx2_tiles_run_here():
    """A 256-bit target (8 lanes, 16 vector registers) plans other tiles; this x86 machine runs
    them too."""
    mod, reference = _bottleneck_module(c=16, width=8, hw=9)
    exe = relax.build(mod, "llvm -mtriple=x86_64-linux-gnu -mcpu=haswell")
    vm = relax.VirtualMachine(exe)
    xs = rand(2, 16, 9, 9)
    np.testing.assert_allclose(vm["main"](xs).numpy(), reference(xs), rtol=1e-4, atol=1e-4)
