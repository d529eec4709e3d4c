"""ConvertLayout (NCHW convolutions, pooling and the elementwise operators between them run in
NHWC) and the tiled transpose schedule: which calls convert, where the permutations go, and
results against numpy on random inputs (static and symbolic batch)."""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft import targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax import default_schedules as ds
from tilecraft.relax.transform import ConvertLayout, get_pipeline
from tilecraft.relax.transform.convert_layout import nhwc_pays
from tilecraft.relax.backend.cpu import ConvGeometry
from tilecraft.relax.backend.cpu import conv2d_nchw_cvec as cvec
from tilecraft.relax.backend.cpu import conv2d_nhwc as nhwc
from tilecraft.relax.backend.cpu.padding import pad_nhwc
from tilecraft.relax.backend.cpu import conv2d_strategy as strategy
from tilecraft.tensorir import te
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.stmt import For

from test_alter_layout import conv_ref

AVX2 = "llvm -mtriple=x86_64-linux-gnu -mattr=+avx2,+fma"
AVX512 = "llvm -mtriple=x86_64-linux-gnu -mattr=+avx512f"
NEON = "llvm -mtriple=aarch64-linux-gnu"
RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def bottleneck(batch, c=16, hw=8, mid=16, out=32):
    """conv 1x1 + bias + relu -> conv 3x3 + bias (rank-3 bias) + relu -> conv 1x1 + bias,
    plus a projection of the input, add, relu, max pool, flatten: a ResNet block."""
    w1, w2, w3, wp = (rand(mid, c, 1, 1) * 0.2, rand(mid, mid, 3, 3) * 0.1,
                      rand(out, mid, 1, 1) * 0.2, rand(out, c, 1, 1) * 0.2)
    b1, b2, b3 = rand(1, mid, 1, 1), rand(mid, 1, 1), rand(1, out, 1, 1)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch, c, hw, hw), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.relu(bb.emit(op.add(bb.emit(op.nn.conv2d(x, const(w1))),
                                                  const(b1)))))
            y = bb.emit(op.add(bb.emit(op.nn.conv2d(y, const(w2), padding=1)), const(b2)))
            y = bb.emit(op.nn.relu(y))
            y = bb.emit(op.add(bb.emit(op.nn.conv2d(y, const(w3))), const(b3)))
            p = bb.emit(op.nn.conv2d(x, const(wp)))
            y = bb.emit(op.nn.relu(bb.emit(op.add(y, p))))
            y = bb.emit(op.multiply(y, const(np.float32(0.5))))
            y = bb.emit(op.nn.max_pool2d(y, pool_size=2, strides=2))
            gv = bb.emit_output(bb.emit(op.reshape(y, (-1, out * (hw // 2) ** 2))))
        bb.emit_func_output(gv)

    def ref(xv):
        relu = lambda a: np.maximum(a, 0)
        t = relu(conv_ref(xv, w1) + b1)
        t = relu(conv_ref(t, w2, padding=1) + b2)
        t = relu(conv_ref(t, w3) + b3 + conv_ref(xv, wp)) * 0.5
        n = xv.shape[0]
        t = t.reshape(n, out, hw // 2, 2, hw // 2, 2).max(axis=(3, 5))
        return t.reshape(n, -1)
    return bb.get(), ref


def calls(mod, name):
    out = []
    for blk in mod["main"].body.blocks:
        for b in blk.bindings:
            v = b.value
            if getattr(getattr(v, "op", None), "name", None) == name:
                out.append(v)
    return out


def test_rewrite_converts_the_chain_and_permutes_only_at_the_ends():
    mod, _ = bottleneck(2)
    new = ConvertLayout(AVX2, convertible=lambda call: True)(mod)
    convs = calls(new, "relax.nn.conv2d")
    assert len(convs) == 4
    assert all(c.attr_dict["data_layout"] == "NHWC" and c.attr_dict["out_layout"] == "NHWC"
               and c.attr_dict["kernel_layout"] == "OIHW" for c in convs)
    pools = calls(new, "relax.nn.max_pool2d")
    assert [p.attr_dict["layout"] for p in pools] == ["NHWC"]
    perms = [tuple(p.attr_dict["axes"]) for p in calls(new, "relax.permute_dims")
             if p.args[0].struct_info.ndim == 4 and
             not isinstance(p.args[0], relax.Constant)]
    # the input once (shared by the two convolutions that read it), the pooled result once;
    # the rest are the biases (constants, folded at build time)
    activations = [p for p in calls(new, "relax.permute_dims")
                   if isinstance(p.args[0], Var) and p.args[0].name_hint == "x"]
    assert len(activations) == 1
    assert perms.count((0, 3, 1, 2)) == 1
    # the original is untouched (passes return new IR)
    assert all(c.attr_dict["data_layout"] == "NCHW" for c in calls(mod, "relax.nn.conv2d"))


@pytest.mark.parametrize("batch", [1, 3, "n"])
def test_converted_model_matches_numpy(batch):
    n = 3 if batch == "n" else batch
    mod, ref = bottleneck(batch)
    new = ConvertLayout(AVX2, convertible=lambda call: True)(mod)
    xv = rand(n, 16, 8, 8)
    vm = relax.VirtualMachine(relax.build(new, "llvm"), targets.cpu(0))
    got = vm["main"](targets.array(xv)).numpy()
    np.testing.assert_allclose(got, ref(xv), rtol=1e-4, atol=1e-4)


def test_default_rule_keeps_the_stem_and_unmeasured_targets():
    # 3 image channels: NCHW; grouped: NCHW; AVX-512: the 1x1, depthwise and dense 3x3 layers
    # (measured on par or faster in NHWC; Winograd's 1.4-1.8x); NEON: only the 1x1 and
    # depthwise layers (its NHWC 3x3 kernels are unmeasured)
    stem = ConvGeometry(3, 224, 224, 64, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1)
    big = ConvGeometry(64, 56, 56, 256, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    grouped = ConvGeometry(64, 56, 56, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2)
    dense3 = ConvGeometry(64, 56, 56, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    dw = ConvGeometry(64, 56, 56, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 64)
    assert nhwc_pays(big, AVX2)
    assert not nhwc_pays(stem, AVX2)
    assert not nhwc_pays(grouped, AVX2)
    assert nhwc_pays(dw, AVX2) and nhwc_pays(dw, AVX512)
    assert nhwc_pays(big, AVX512)
    assert nhwc_pays(dense3, AVX512)
    assert not nhwc_pays(dense3, NEON) and nhwc_pays(big, NEON) and nhwc_pays(dw, NEON)
    assert not nhwc_pays(big, "opencl")


def test_avx512_anchors_chains_on_layers_winograd_pays_for():
    # ResNet-18's 28 x 28 and 56 x 56 3x3 layers anchor a chain on AVX-512 (Winograd
    # 1.4-1.6x); its 512 -> 512 layer at 7 x 7 (a 16.8 MB transformed weight for 16 tiles)
    # and a 1x1 layer only run on par in NHWC and anchor nothing; with 16 registers every
    # 3x3 layer and the 1x1 one anchor
    def conv(c, hw, k=3):
        x = Var("x", TensorStructInfo((1, c, hw, hw), "float32"))
        return op.nn.conv2d(x, const(rand(c, c, k, k)), padding=k // 2)
    pays, large, small, one = conv(128, 28), conv(64, 56), conv(512, 7), conv(64, 56, k=1)
    cl512, cl2 = ConvertLayout(AVX512), ConvertLayout(AVX2)
    assert cl512.default_anchor(pays) and cl512.default_anchor(large)
    assert not cl512.default_anchor(small) and not cl512.default_anchor(one)
    assert cl2.default_anchor(pays) and cl2.default_anchor(large) and cl2.default_anchor(one)
    assert cl2.default_anchor(small)


def _inverted_residual(n=2, c=16, hw=9, expand=48):
    """MobileNet-V2's block: 1x1 expand + ReLU6, depthwise 3x3 + ReLU6, 1x1 project, the
    residual add; the bias of each layer added."""
    w1, w2, w3 = rand(expand, c, 1, 1) * 0.3, rand(expand, 1, 3, 3) * 0.3, \
        rand(c, expand, 1, 1) * 0.3
    b1, b2, b3 = rand(expand, 1, 1), rand(expand, 1, 1), rand(c, 1, 1)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((n, c, hw, hw), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(op.add(bb.emit(op.nn.conv2d(x, const(w1))), const(b1)))
            t = bb.emit(op.clip(t, 0.0, 6.0))
            t = bb.emit(op.add(bb.emit(op.nn.conv2d(t, const(w2), padding=1, groups=expand)),
                               const(b2)))
            t = bb.emit(op.clip(t, 0.0, 6.0))
            t = bb.emit(op.add(bb.emit(op.nn.conv2d(t, const(w3))), const(b3)))
            gv = bb.emit_output(bb.emit(op.add(t, x)))
        bb.emit_func_output(gv)

    def ref(xv):
        t = np.clip(conv_ref(xv, w1) + b1, 0, 6)
        t = np.clip(conv_ref(t, w2, padding=1, groups=expand) + b2, 0, 6)
        return conv_ref(t, w3) + b3 + xv
    return bb.get(), ref


def test_depthwise_chain_converts_on_avx512_and_results_hold():
    # a depthwise layer anchors its chain on both register counts; an AVX-512 chain of 1x1
    # layers alone (no depthwise) stays NCHW (test_default_pipeline_converts_on_avx2...)
    mod, ref = _inverted_residual()
    for target in (AVX512, AVX2):
        new = ConvertLayout(target)(mod)
        assert {c.attr_dict["data_layout"] for c in calls(new, "relax.nn.conv2d")} == {"NHWC"}
    xv = rand(2, 16, 9, 9)
    vm = relax.VirtualMachine(relax.build(mod, "llvm"), targets.cpu(0))
    np.testing.assert_allclose(vm["main"](targets.array(xv)).numpy(), ref(xv), rtol=1e-4,
                               atol=1e-4)


def test_default_pipeline_converts_on_avx2_and_results_hold():
    # the pipeline's rule on an AVX2 target: the 8 x 8 layers keep 4-pixel tiles that
    # divide the row, so they convert (in NHWC end to end), and the model still computes
    # the same; on AVX-512 too (its 3x3 layer takes Winograd); NEON keeps NCHW
    mod, ref = bottleneck(2, c=16, hw=8, mid=16, out=32)
    seq = get_pipeline(target=AVX2)
    names = [p.name for p in seq.passes]
    assert names.index("ConvertLayout") < names.index("AlterLayout")
    converted = ConvertLayout(AVX2)(mod)
    assert all(c.attr_dict["data_layout"] == "NHWC"
               for c in calls(converted, "relax.nn.conv2d"))
    assert all(c.attr_dict["data_layout"] == "NHWC"
               for c in calls(ConvertLayout(AVX512)(mod), "relax.nn.conv2d"))
    kept = ConvertLayout(NEON)(mod)
    assert all(c.attr_dict["data_layout"] == "NCHW" for c in calls(kept, "relax.nn.conv2d"))
    xv = rand(2, 16, 8, 8)
    for m in (converted, mod):
        vm = relax.VirtualMachine(relax.build(m, "llvm"), targets.cpu(0))
        np.testing.assert_allclose(vm["main"](targets.array(xv)).numpy(), ref(xv),
                                   rtol=1e-4, atol=1e-4)


def test_elementwise_with_a_full_nchw_operand_and_unknown_consumers():
    # add(conv_nhwc, y) with y a 4-D NCHW parameter: y is permuted; softmax over the channel
    # axis is not elementwise, so it reads the NCHW form
    w, w2 = rand(16, 16, 1, 1) * 0.3, rand(16, 16, 1, 1) * 0.3
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((2, 16, 4, 4), "float32"))
    y = Var("y", TensorStructInfo((2, 16, 4, 4), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            t = bb.emit(op.add(bb.emit(op.nn.conv2d(x, const(w))), y))
            t = bb.emit(op.nn.conv2d(bb.emit(op.nn.relu(t)), const(w2)))
            t = bb.emit(op.nn.softmax(t, axis=1))
            gv = bb.emit_output(t)
        bb.emit_func_output(gv)
    mod = bb.get()
    new = ConvertLayout(AVX2, convertible=lambda call: True)(mod)
    assert all(c.attr_dict["data_layout"] == "NHWC" for c in calls(new, "relax.nn.conv2d"))
    softmax = calls(new, "relax.nn.softmax")[0]
    assert softmax.args[0].struct_info.shape[1].value == 16     # NCHW
    xv, yv = rand(2, 16, 4, 4), rand(2, 16, 4, 4)
    vm = relax.VirtualMachine(relax.build(new, "llvm"), targets.cpu(0))
    z = conv_ref(np.maximum(conv_ref(xv, w) + yv, 0), w2)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    np.testing.assert_allclose(vm["main"](targets.array(xv), targets.array(yv)).numpy(),
                               e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-5)


def test_a_lone_convolution_stays_nchw():
    # one convolution would pay a permutation on each side: left as it is
    w = rand(16, 16, 1, 1)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, 16, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(op.nn.relu(bb.emit(op.add(bb.emit(op.nn.conv2d(x, const(w))),
                                                  const(rand(16, 1, 1))))))
            gv = bb.emit_output(bb.emit(op.nn.max_pool2d(t, pool_size=2)))
        bb.emit_func_output(gv)
    mod = bb.get()
    new = ConvertLayout(AVX2, convertible=lambda call: True)(mod)
    assert [c.attr_dict["data_layout"] for c in calls(new, "relax.nn.conv2d")] == ["NCHW"]
    assert not calls(new, "relax.permute_dims")


def test_bad_convertible_is_a_type_error():
    with pytest.raises(TypeError, match="convertible must be callable"):
        ConvertLayout(AVX2, convertible=True)


# ---------------------------------------------------------------------------------------------
# the tiled transpose


def transpose_module(shape, axes):
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(op.permute_dims(x, axes)))
        bb.emit_func_output(gv)
    return bb.get()


@pytest.mark.parametrize("shape,axes", [
    ((1, 28, 28, 512), (0, 3, 1, 2)),      # NHWC -> NCHW: tiled 16 x 14
    ((2, 7, 7, 30), (0, 3, 1, 2)),         # tails on both sides of the tile
    ((1, 64, 12, 12), (0, 2, 3, 1)),       # NCHW -> NHWC: the input's axis right outside
    ((3, 5, 40, 33), (2, 0, 3, 1)),
])
def test_transpose_values(shape, axes):
    xv = rand(*shape)
    vm = relax.VirtualMachine(relax.build(transpose_module(shape, axes), "llvm"),
                              targets.cpu(0))
    np.testing.assert_array_equal(vm["main"](targets.array(xv)).numpy(), xv.transpose(axes))


def test_symbolic_batch_transpose_values():
    mod = transpose_module(("n", 9, 9, 24), (0, 3, 1, 2))
    vm = relax.VirtualMachine(relax.build(mod, "llvm"), targets.cpu(0))
    for b in (1, 4):
        xv = rand(b, 9, 9, 24)
        np.testing.assert_array_equal(vm["main"](targets.array(xv)).numpy(),
                                      xv.transpose(0, 3, 1, 2))


def _loop_extents(func):
    out = []

    def visit(s):
        if isinstance(s, For):
            out.append(s.extent.value if hasattr(s.extent, "value") else None)
    post_order_visit(func.body, visit)
    return out


def test_nhwc_to_nchw_is_scheduled_in_tiles():
    tasks = relax.extract_tasks(transpose_module((1, 28, 28, 512), (0, 3, 1, 2)), "llvm",
                                baselines=False)
    func = ds.apply(tasks[0].func, targets.Target("llvm"))
    extents = _loop_extents(func)
    assert 16 in extents and 14 in extents       # 16 channels x 14 columns per tile
    # NCHW -> NHWC reads whole lines already: no tiles
    tasks = relax.extract_tasks(transpose_module((1, 64, 12, 12), (0, 2, 3, 1)), "llvm",
                                baselines=False)
    assert 16 not in _loop_extents(ds.apply(tasks[0].func, targets.Target("llvm")))


# ---------------------------------------------------------------------------------------------
# the NHWC kernels for planes no pixel tile divides

HASWELL = "llvm -mcpu=haswell"     # AVX2: 8 lanes, 16 vector registers


def nhwc_conv_module(c, hw, o, k, stride, pad, residual):
    w, b = rand(o, c, k, k) * 0.1, rand(o)
    oh = (hw + 2 * pad - k) // stride + 1
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", hw, hw, c), "float32"))
    r = Var("r", TensorStructInfo(("n", oh, oh, o), "float32"))
    with bb.function("main", [x, r]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(w), strides=stride, padding=pad,
                                     data_layout="NHWC"))
            y = bb.emit(op.add(y, const(b)))
            if residual:
                y = bb.emit(op.add(y, r))
            gv = bb.emit_output(bb.emit(op.nn.relu(y)))
        bb.emit_func_output(gv)

    def ref(xv, rv):
        out = conv_ref(xv, w.transpose(2, 3, 1, 0), stride, pad, layout="NHWC") + b
        return np.maximum(out + rv if residual else out, 0)
    return bb.get(), ref, oh


@pytest.mark.parametrize("c,hw,o,k,stride,pad,residual,kind", [
    (64, 14, 32, 1, 1, 0, True, "flat"),        # 196 pixels: 32 tiles of 6 + 4 across rows
    (512, 7, 32, 1, 1, 0, True, "flat"),        # 49 pixels: 8 tiles of 6 + 1 across rows
    (512, 14, 32, 1, 2, 0, True, "tiles"),      # strided, long reduction, 7-wide rows: cvec
    (64, 28, 32, 3, 1, 1, True, "rows"),        # 28-wide rows: 4 tiles of 6 + 4
    (64, 13, 32, 3, 2, 1, False, "tiles"),      # strided 3x3 with padding, 576 MACs/output
    (256, 13, 32, 3, 2, 1, False, "tiles"),     # 1 KiB pixels: padded with a line of channels
    (256, 9, 32, 3, 2, 1, True, "rows"),        # the same on the pixel tiles (5 divide 5)
])
def test_nhwc_kernels_without_a_row_tile_match_numpy(c, hw, o, k, stride, pad, residual, kind):
    g = ConvGeometry(c, hw, hw, o, (k, k), (stride, stride), (pad,) * 4, (1, 1), 1)
    plan = strategy.nhwc_kernel_plan(g, 8, 16)
    assert (kind == "flat") == (isinstance(plan, nhwc.NhwcPlan) and plan.flat)
    assert (kind == "tiles") == isinstance(plan, cvec.ChannelVectorPlan)
    mod, ref, oh = nhwc_conv_module(c, hw, o, k, stride, pad, residual)
    exe = relax.build(mod, HASWELL)
    assert exe.stats()["main"]["kernel_calls"] <= 2       # (padding) + conv with its epilogue
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    for n in (1, 2):
        xv, rv = rand(n, hw, hw, c), rand(n, oh, oh, o)
        np.testing.assert_allclose(vm["main"](targets.array(xv), targets.array(rv)).numpy(),
                                   ref(xv, rv), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c,hw,o,k,stride,pad,registers,rows,flat", [
    (64, 56, 64, 3, 1, 1, 16, 6, False),    # 9 tiles of 6 + 2, not 14 of 4
    (128, 28, 128, 3, 1, 1, 16, 6, False),  # 4 tiles of 6 + 4, not 7 of 4
    (64, 20, 64, 3, 1, 1, 16, 5, False),    # 3 tiles of 6 + 2 would be too ragged: 4 of 5
    (256, 14, 1024, 1, 1, 0, 16, 6, True),  # the plane: 32 tiles of 6 + 4
    (64, 57, 64, 3, 1, 1, 32, 14, False),   # AVX-512, KxK: 4 tiles of 14 + 1, not 3 of 19
    (64, 50, 64, 1, 1, 1, 32, 12, False),   # AVX-512, 1x1 (padded, 52 wide): 4 of 12 + 4
    (64, 20, 64, 3, 1, 1, 32, 10, False),   # 12 + 8 would be too ragged: 2 of 10
    (64, 56, 64, 3, 1, 1, -32, 8, False),   # NEON's 32 registers (4 lanes): a dividing tile
])
def test_nhwc_tile_takes_ragged_rows(c, hw, o, k, stride, pad, registers, rows, flat):
    g = ConvGeometry(c, hw, hw, o, (k, k), (stride, stride), (pad,) * 4, (1, 1), 1)
    # -32: NEON (4 lanes, 32 registers)
    lanes = {32: 16, 16: 8, -32: 4}[registers]
    registers = abs(registers)
    plan = strategy.nhwc_kernel_plan(g, lanes, registers)
    assert isinstance(plan, nhwc.NhwcPlan) and (plan.rows, plan.flat) == (rows, flat)
    assert nhwc.nhwc_tile_fills(plan)


@pytest.mark.parametrize("hw,cores,parallel_extent", [
    (7, 2, 4),      # 9 tiles of 6 over 49 pixels split badly on 2 cores: the 4 panels
    (14, 2, 33),    # 33 tiles over 196 pixels split well: the tiles
    (7, 1, 9),      # one core: the first loop with work for it
])
def test_nhwc_plane_tiles_run_in_parallel_where_they_split_evenly(hw, cores, parallel_extent):
    mod, ref, oh = nhwc_conv_module(64, hw, 64, 1, 1, 0, True)
    target = f"{HASWELL} -num-cores={cores}"
    tasks = [t for t in relax.extract_tasks(mod, target, baselines=False) if "conv" in t.name]
    func = ds.apply(tasks[0].func, targets.Target(target))
    loops = []
    post_order_visit(func.body, lambda s: loops.append(s) if isinstance(s, For) else None)
    parallel = [f.extent.value for f in loops if f.kind == "parallel"]
    assert parallel == [parallel_extent]
    exe = relax.build(mod, target)
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    xv, rv = rand(1, hw, hw, 64), rand(1, oh, oh, 64)
    np.testing.assert_allclose(vm["main"](targets.array(xv), targets.array(rv)).numpy(),
                               ref(xv, rv), rtol=1e-4, atol=1e-4)


def test_nhwc_tiles_copy_reads_channel_runs():
    # the copy out of the channel-blocked tile buffer is vectorized in runs of the tile's
    # width (it reads ``[.., o // 32, p, o % 32]``), not left scalar as a transpose
    mod, _, _ = nhwc_conv_module(512, 14, 64, 3, 2, 1, False)     # strided: not Winograd
    tasks = [t for t in relax.extract_tasks(mod, HASWELL, baselines=False) if "conv" in t.name]
    func = ds.apply(tasks[0].func, targets.Target(HASWELL))
    assert "conv2d_tiles" in func.script()
    vectorized = []
    post_order_visit(func.body, lambda s: vectorized.append(s.extent.value)
                     if isinstance(s, For) and s.kind == "vectorized" else None)
    assert 32 in vectorized


def test_nhwc_pays_on_the_tiles_and_ragged_rows_do_not():
    one = ConvGeometry(2048, 7, 7, 512, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    three = ConvGeometry(256, 14, 14, 256, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    flat = ConvGeometry(1024, 14, 14, 256, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    strided = ConvGeometry(256, 28, 28, 256, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)
    for g in (one, three, flat, strided):
        assert nhwc_pays(g, AVX2), g
    # a short strided reduction on a 7-wide row: neither a dividing pixel tile nor the tiles
    # (nor Winograd, which is for stride 1)
    ragged = ConvGeometry(16, 14, 14, 32, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)
    assert not nhwc_pays(ragged, AVX2)


def test_nhwc_padding_offsets_1kib_pixels_by_a_line():
    x = te.placeholder((1, 14, 14, 512), "float32", "x")
    g = ConvGeometry(512, 14, 14, 512, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)
    assert [d.value for d in pad_nhwc(x, g).shape] == [1, 16, 16, 512 + 16]
    x = te.placeholder((1, 14, 14, 96), "float32", "x")
    g = ConvGeometry(96, 14, 14, 96, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert [d.value for d in pad_nhwc(x, g).shape] == [1, 16, 16, 96]


def test_broadcast_to_a_target_shape_reads_nchw():
    # broadcast_to's shape argument is NCHW: the op is not converted, it reads the NCHW form
    w1, w2 = rand(16, 16, 1, 1) * 0.3, rand(16, 16, 1, 1) * 0.3
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, 16, 4, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(op.nn.relu(bb.emit(op.nn.conv2d(x, const(w1)))))
            t = bb.emit(op.nn.conv2d(t, const(w2)))
            gv = bb.emit_output(bb.emit(op.broadcast_to(t, (3, 16, 4, 4))))
        bb.emit_func_output(gv)
    new = ConvertLayout(AVX2, convertible=lambda call: True)(bb.get())
    assert all(c.attr_dict["data_layout"] == "NHWC" for c in calls(new, "relax.nn.conv2d"))
    xv = rand(1, 16, 4, 4)
    vm = relax.VirtualMachine(relax.build(new, "llvm"), targets.cpu(0))
    want = np.broadcast_to(conv_ref(np.maximum(conv_ref(xv, w1), 0), w2), (3, 16, 4, 4))
    np.testing.assert_allclose(vm["main"](targets.array(xv)).numpy(), want, rtol=1e-4,
                               atol=1e-5)


def test_a_chain_without_a_1x1_anchor_stays_nchw():
    # direct 3x3 layers alone run on par in NHWC (VGG-19 lost 4% converted before Winograd):
    # a chain of them (dilated here, so not Winograd layers, which anchor) stays NCHW unless
    # an anchor is given
    ws = [rand(16, 16, 3, 3) * 0.1 for _ in range(3)]
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, 16, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = x
            for w in ws:
                t = bb.emit(op.nn.relu(bb.emit(op.nn.conv2d(t, const(w), padding=2,
                                                            dilation=2))))
            gv = bb.emit_output(t)
        bb.emit_func_output(gv)
    mod = bb.get()
    kept = ConvertLayout(AVX2, convertible=lambda call: True)(mod)
    assert {c.attr_dict["data_layout"] for c in calls(kept, "relax.nn.conv2d")} == {"NCHW"}
    new = ConvertLayout(AVX2, convertible=lambda call: True, anchor=lambda call: True)(mod)
    assert {c.attr_dict["data_layout"] for c in calls(new, "relax.nn.conv2d")} == {"NHWC"}
    xv = rand(1, 16, 8, 8)
    want = xv
    for w in ws:
        want = np.maximum(conv_ref(want, w, padding=2, dilation=2), 0)
    vm = relax.VirtualMachine(relax.build(new, "llvm"), targets.cpu(0))
    np.testing.assert_allclose(vm["main"](targets.array(xv)).numpy(), want, rtol=1e-4,
                               atol=1e-4)
    with pytest.raises(TypeError, match="anchor must be callable"):
        ConvertLayout("llvm", anchor=3)



def _stem_and_block(batch, hw=34, c=16, expand=48):
    """A stem (3 -> c, 3x3 stride 2, bias, ReLU6) into MobileNet-V2's inverted residual
    (``_inverted_residual``'s layers)."""
    ws, bs = rand(c, 3, 3, 3) * 0.3, rand(c, 1, 1)
    w1, w2, w3 = rand(expand, c, 1, 1) * 0.3, rand(expand, 1, 3, 3) * 0.3, \
        rand(c, expand, 1, 1) * 0.3
    b1, b2, b3 = rand(expand, 1, 1), rand(expand, 1, 1), rand(c, 1, 1)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch, 3, hw, hw), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(op.nn.conv2d(x, const(ws), strides=2, padding=1))
            s = bb.emit(op.clip(bb.emit(op.add(s, const(bs))), 0.0, 6.0))
            t = bb.emit(op.add(bb.emit(op.nn.conv2d(s, const(w1))), const(b1)))
            t = bb.emit(op.clip(t, 0.0, 6.0))
            t = bb.emit(op.add(bb.emit(op.nn.conv2d(t, const(w2), padding=1, groups=expand)),
                               const(b2)))
            t = bb.emit(op.clip(t, 0.0, 6.0))
            t = bb.emit(op.add(bb.emit(op.nn.conv2d(t, const(w3))), const(b3)))
            gv = bb.emit_output(bb.emit(op.add(t, s)))
        bb.emit_func_output(gv)

    def ref(xv):
        s = np.clip(conv_ref(xv, ws, strides=2, padding=1) + bs, 0, 6)
        t = np.clip(conv_ref(s, w1) + b1, 0, 6)
        t = np.clip(conv_ref(t, w2, padding=1, groups=expand) + b2, 0, 6)
        return conv_ref(t, w3) + b3 + s
    return bb.get(), ref


def _activation_permutes(mod, axes):
    # the permutations of images (not of the per-channel biases, 1 x 1 planes)
    return [p for p in calls(mod, "relax.permute_dims")
            if p.args[0].struct_info.ndim == 4 and tuple(p.attr_dict["axes"]) == axes and
            getattr(p.args[0].struct_info.shape[-1], "value", 0) > 1]


def test_stem_heads_the_nhwc_chain_on_avx512():
    # the stem reads the NCHW image and writes NHWC: no permutation into NHWC is left (the
    # result's permutation back to NCHW is); with 16 registers (unmeasured) or head=False it
    # stays NCHW with a permutation after it
    mod, _ = _stem_and_block(2)
    new = ConvertLayout(AVX512)(mod)
    layouts = [(c.attr_dict["data_layout"], c.attr_dict["out_layout"])
               for c in calls(new, "relax.nn.conv2d")]
    assert layouts == [("NCHW", "NHWC")] + [("NHWC", "NHWC")] * 3
    assert not _activation_permutes(new, (0, 2, 3, 1))
    assert len(_activation_permutes(new, (0, 3, 1, 2))) == 1
    for old in (ConvertLayout(AVX512, head=lambda call: False)(mod), ConvertLayout(AVX2)(mod)):
        assert calls(old, "relax.nn.conv2d")[0].attr_dict["out_layout"] == "NCHW"
        assert len(_activation_permutes(old, (0, 2, 3, 1))) == 1


@pytest.mark.parametrize("batch", [1, 2, "n"])
def test_stem_head_results_hold(batch):
    n = 2 if batch == "n" else batch
    mod, ref = _stem_and_block(batch)
    xv = rand(n, 3, 34, 34)
    vm = relax.VirtualMachine(relax.build(mod, AVX512), targets.cpu(0))
    np.testing.assert_allclose(vm["main"](targets.array(xv)).numpy(), ref(xv), rtol=1e-4,
                               atol=1e-4)


def test_cvec_nhwc_output_takes_nchw_data_and_row_tiles_only():
    g = ConvGeometry(3, 16, 16, 32, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1)
    plan = strategy.head_conv_plan(g, 16, 32)
    assert plan is not None and not plan.across_rows
    assert strategy.head_conv_plan(g, 8, 16) is None
    x = te.placeholder((1, 3, 16, 16), "float32", "x")
    w = te.placeholder((32 // plan.width, 3, 3, 3, plan.width), "float32", "w")
    out = cvec.conv2d_nchw_cvec(x, w, plan, "float32", "NCHW", "NHWC")
    assert [d.value for d in out.shape] == [1, 8, 8, 32]
    with pytest.raises(ValueError, match="only NCHW data may write NHWC"):
        cvec.conv2d_nchw_cvec(x, w, plan, "float32", "NCHW", "NCWH")
