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
