"""The NHWC tile's channel panels outermost (relax.backend.cpu.conv2d_nhwc.panels_outer): a layer
whose packed weight is at least PANELS_OUTER_MIN_BYTES and larger than one image's input runs
each panel over the whole plane before the next; against numpy with a symbolic batch at 1 and
3, strided and not, on odd planes and channel counts."""
import numpy as np
import pytest

from nhwc_testutil import check_nhwc_layer, nhwc_conv_layer
from tilecraft.relax.backend.cpu import ConvGeometry, conv2d_nhwc
from tilecraft.relax.backend.cpu.conv2d_nhwc import panels_outer

RNG = np.random.default_rng(30)


def _geometry(cin, hw, cout, k=3, stride=1):
    return ConvGeometry(cin, hw, hw, cout, (k, k), (stride, stride), (k // 2,) * 4, (1, 1), 1)


def test_rule_is_the_weight_against_the_cache_and_the_input():
    assert panels_outer(_geometry(256, 14, 512, stride=2), 32)     # ResNet-18: 4.7 MB, 200 KB
    assert panels_outer(_geometry(512, 7, 512), 32)                # 9.4 MB against 100 KB
    assert panels_outer(_geometry(320, 7, 1280, k=1), 32)          # MobileNet-V2: 1.6 MB
    assert not panels_outer(_geometry(64, 56, 64), 32)             # 147 KB of weights
    assert not panels_outer(_geometry(160, 7, 960, k=1), 32)       # 614 KB: stays in L2
    # a weight over the limit but smaller than the image keeps the rows outermost
    assert not panels_outer(_geometry(512, 64, 512, k=1), 32)


@pytest.mark.parametrize("cin,hw,cout,k,stride", [
    (24, 13, 96, 3, 2), (17, 9, 64, 3, 1), (40, 7, 160, 1, 1), (16, 11, 48, 3, 2)])
@pytest.mark.parametrize("outer", [True, False])
def test_layers_match_numpy(monkeypatch, cin, hw, cout, k, stride, outer):
    # the limit moved so that small layers take (or do not take) the order: the same code
    # runs at ResNet's sizes
    monkeypatch.setattr(conv2d_nhwc, "PANELS_OUTER_MIN_BYTES", 0 if outer else 1 << 40)
    width = 32 if cout % 32 == 0 else 16
    assert panels_outer(_geometry(cin, hw, cout, k, stride), width) == outer
    exe, wt, b = nhwc_conv_layer(cin, hw, hw, cout, k, RNG, stride=stride)
    check_nhwc_layer(exe, wt, b, RNG, hw, hw, stride, batches=(1, 3))
