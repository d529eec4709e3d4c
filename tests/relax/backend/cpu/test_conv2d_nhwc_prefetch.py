"""The NHWC tile's software prefetch (relax.backend.cpu.conv2d_nhwc.prefetch_spec): the narrow
1x1 layers (one panel holds every output channel) prefetch the input of the tile two ahead
along their reduction loop; the others do not. Against numpy at several batches, the last
tiles' prefetches clamped to the input's end."""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
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


def _layer(cin, h, w, cout, k):
    wt = (RNG.standard_normal((k, k, cin, cout)) * 0.2).astype("float32")
    b = RNG.standard_normal(cout).astype("float32")
    x = Var("x", TensorStructInfo(("n", h, w, cin), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(wt), padding=k // 2, data_layout="NHWC",
                                     kernel_layout="HWIO"))
            gv = bb.emit_output(bb.emit(op.add(y, const(b))))
        bb.emit_func_output(gv)
    return relax.build(bb.get(), "llvm"), wt, b


@pytest.mark.parametrize("cin,h,w,cout,k,prefetches", [
    (144, 14, 14, 24, 1, True), (40, 13, 11, 24, 1, True), (96, 9, 8, 32, 1, True),
    (24, 9, 15, 48, 1, False), (16, 9, 10, 24, 3, False)])
def test_prefetching_layers_match_numpy(cin, h, w, cout, k, prefetches):
    exe, wt, b = _layer(cin, h, w, cout, k)
    src = exe.kernel_module.get_source("ll-raw")
    assert ("call void @llvm.prefetch.p0" in src) == prefetches
    vm = relax.VirtualMachine(exe)
    for n in (1, 2, 3):
        xv = RNG.standard_normal((n, h, w, cin)).astype("float32")
        xp = np.pad(xv.astype(np.float64), ((0, 0), (k // 2,) * 2, (k // 2,) * 2, (0, 0)))
        want = sum(np.einsum("nhwc,co->nhwo", xp[:, a:a + h, c:c + w], wt[a, c])
                   for a in range(k) for c in range(k)) + b
        got = vm["main"](xv).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
