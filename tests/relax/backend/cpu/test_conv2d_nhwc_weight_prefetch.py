"""The NHWC tile's weight prefetch (relax.backend.cpu.conv2d_nhwc.prefetch_weight_spec): a layer
whose channel panels run outermost prefetches the next panel's weights along its reduction
loop; and the 14-pixel tile of a KxK layer with 32 registers (plan_conv2d_nhwc). Against numpy
with a symbolic batch at 1 and 3, on odd planes and channel counts, strided and not (fewer
than 16 input channels where stride 1, so that Winograd does not take the layer)."""
import numpy as np
import pytest

from nhwc_testutil import check_nhwc_layer, nhwc_conv_layer
from tilecraft.relax.backend.cpu import ConvGeometry, conv2d_nhwc
from tilecraft.relax.backend.cpu.conv2d_nhwc import plan_conv2d_nhwc, prefetch_weight_spec

RNG = np.random.default_rng(18)


def _geometry(cin, hw, cout, k=3, stride=1):
    return ConvGeometry(cin, hw, hw, cout, (k, k), (stride, stride), (k // 2,) * 4, (1, 1), 1)


def test_spec_is_one_panel_ahead_for_panels_outer_layers_only():
    # two lines a step (the whole next panel) in a KxK layer of unit stride, else one
    assert prefetch_weight_spec(_geometry(512, 7, 512), 32) == [3 * 3 * 512 * 32, 1, 2]
    assert prefetch_weight_spec(_geometry(256, 14, 512, stride=2), 32) == \
        [3 * 3 * 256 * 32, 1, 1]
    assert prefetch_weight_spec(_geometry(320, 7, 1280, k=1), 32) == [320 * 32, 1, 1]
    assert prefetch_weight_spec(_geometry(64, 56, 64), 32) is None          # 147 KB
    assert prefetch_weight_spec(_geometry(160, 7, 960, k=1), 32) is None    # stays in L2


def test_kxk_tiles_take_14_pixels_with_32_registers():
    # ResNet's rows: 56 = 4 x 14, 28 = 2 x 14, 14; a 7-wide row keeps 7
    for hw, stride, rows in ((56, 1, 14), (56, 2, 14), (28, 2, 14), (14, 1, 14), (7, 1, 7)):
        assert plan_conv2d_nhwc(_geometry(64, hw, 64, stride=stride), 16, 32).rows == rows
    assert plan_conv2d_nhwc(_geometry(16, 57, 64), 16, 32).rows == 14       # 4 x 14 + 1
    assert plan_conv2d_nhwc(_geometry(64, 56, 64, k=1), 16, 32).rows == 12  # 1x1: unchanged
    assert plan_conv2d_nhwc(_geometry(64, 56, 64), 8, 16).rows == 6         # 16 registers


@pytest.mark.parametrize("cin,hw,cout,k,stride", [
    (24, 13, 96, 3, 2), (13, 9, 64, 3, 1), (40, 7, 160, 1, 1), (16, 13, 64, 3, 2)])
@pytest.mark.parametrize("prefetch", [True, False])
def test_prefetching_layers_match_numpy(monkeypatch, cin, hw, cout, k, stride, prefetch):
    # every layer runs its panels outermost (the limit moved so that small layers take it),
    # with and without the weight prefetch
    monkeypatch.setattr(conv2d_nhwc, "PANELS_OUTER_MIN_BYTES", 0)
    monkeypatch.setattr(conv2d_nhwc, "PREFETCH_WEIGHT_EVERY", 1 if prefetch else 0)
    exe, wt, b = nhwc_conv_layer(cin, hw, hw, cout, k, RNG, stride=stride)
    src = exe.kernel_module.get_source("ll-raw")
    assert ("call void @llvm.prefetch.p0" in src) == prefetch
    check_nhwc_layer(exe, wt, b, RNG, hw, hw, stride, batches=(1, 3))


@pytest.mark.parametrize("cin,h,w,cout,stride", [
    (15, 9, 57, 64, 1), (24, 11, 56, 32, 2), (8, 6, 28, 96, 1), (12, 5, 14, 64, 1)])
def test_14_pixel_tiles_match_numpy(cin, h, w, cout, stride):
    exe, wt, b = nhwc_conv_layer(cin, h, w, cout, 3, RNG, stride=stride)
    check_nhwc_layer(exe, wt, b, RNG, h, w, stride, batches=(1, 3))
