"""The NHWC tile's software prefetch (relax.backend.cpu.conv2d_nhwc.prefetch_spec): the narrow
1x1 layers (one panel holds every output channel) prefetch the input of the tile two ahead
along their reduction loop; the others do not. Against numpy at several batches, the last
tiles' prefetches clamped to the input's end."""
import numpy as np
import pytest

from nhwc_testutil import nhwc_conv_layer, nhwc_conv_reference
from tilecraft import relax
from tilecraft.relax.backend.cpu import ConvGeometry
from tilecraft.relax.backend.cpu.conv2d_nhwc import PREFETCH_TILES_AHEAD, prefetch_spec

RNG = np.random.default_rng(11)


def _geometry(cin, hw, cout, k=1, stride=1, pad=0):
    return ConvGeometry(cin, hw, hw, cout, (k, k), (stride, stride), (pad,) * 4, (1, 1), 1)


def test_spec_only_for_one_panel_pixel_aligned_layers():
    ahead = PREFETCH_TILES_AHEAD
    assert prefetch_spec(_geometry(144, 56, 24), 8, 24, "x") == ["x", ahead * 8 * 144, 2]
    assert prefetch_spec(_geometry(192, 28, 32), 4, 32, "x") == ["x", ahead * 4 * 192, 4]
    assert prefetch_spec(_geometry(24, 56, 144), 8, 16, "x") is None     # 9 panels
    assert prefetch_spec(_geometry(16, 56, 24, k=3, pad=1), 8, 24, "x") is None
    assert prefetch_spec(_geometry(144, 56, 24, stride=2), 8, 24, "x") is None
    assert prefetch_spec(_geometry(144, 56, 24), 8, 24, "x", ahead=0) is None


@pytest.mark.parametrize("cin,h,w,cout,k,prefetches", [
    (144, 14, 14, 24, 1, True), (40, 13, 11, 24, 1, True), (96, 9, 8, 32, 1, True),
    (24, 9, 15, 48, 1, False), (16, 9, 10, 24, 3, False)])
def test_prefetching_layers_match_numpy(cin, h, w, cout, k, prefetches):
    exe, wt, b = nhwc_conv_layer(cin, h, w, cout, k, RNG)
    src = exe.kernel_module.get_source("ll-raw")
    assert ("call void @llvm.prefetch.p0" in src) == prefetches
    vm = relax.VirtualMachine(exe)
    for n in (1, 2, 3):
        xv = RNG.standard_normal((n, h, w, cin)).astype("float32")
        np.testing.assert_allclose(vm["main"](xv).numpy(), nhwc_conv_reference(xv, wt, b),
                                   rtol=1e-4, atol=1e-4)


def test_equal_layers_on_differently_named_inputs_share_one_kernel():
    """The prefetch annotation names the input by its position among the convolution's reads,
    not by its Relax variable's name: two equal 1x1 layers on inputs named apart are one
    kernel, made once by AlterLayout, which still prefetches from its input."""
    from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
    from tilecraft.relax.transform import AlterLayout, DecomposeOpsForInference
    from tilecraft.tensorir.function import PrimFunc

    cin, h, w, cout = 144, 14, 14, 24
    wt = (RNG.standard_normal((1, 1, cin, cout)) * 0.2).astype("float32")
    xs = [Var(name, TensorStructInfo((2, h, w, cin), "float32")) for name in ("x", "skip")]
    bb = BlockBuilder()
    with bb.function("main", xs):
        with bb.dataflow():
            ys = [bb.emit(op.nn.conv2d(x, const(wt), data_layout="NHWC", kernel_layout="HWIO"))
                  for x in xs]
            gv = bb.emit_output(relax.Tuple(ys))
        bb.emit_func_output(gv)
    mod = bb.get()
    altered = AlterLayout("llvm")(DecomposeOpsForInference()(mod))
    convs = [f for f in altered.functions.values()
             if isinstance(f, PrimFunc) and "prefetch_from" in f.script()]
    assert len(convs) == 1
    exe = relax.build(mod, "llvm")
    assert "call void @llvm.prefetch.p0" in exe.kernel_module.get_source("ll-raw")
    ins = [RNG.standard_normal((2, h, w, cin)).astype("float32") for _ in xs]
    out = relax.VirtualMachine(exe)["main"](*ins)
    for got, x in zip(out, ins):
        np.testing.assert_allclose(got.numpy(), nhwc_conv_reference(x, wt, np.zeros(cout)),
                                   rtol=1e-4, atol=1e-4)
