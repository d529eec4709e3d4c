"""The NHWC tile's ragged last tile on AVX-512 (relax.backend.cpu.conv2d_nhwc.plan_conv2d_nhwc):
a row that holds RAGGED_MIN_TILES full tiles of 12 pixels takes them and a ragged last one
rather than a smaller tile that divides it, and a 1x1 unit-stride layer on a plane of short rows
takes full tiles across rows (flat) with a ragged last one; the layers against numpy on the
host's own tiles (whatever its vector width), batches 1 and 2."""
import numpy as np
import pytest

from nhwc_testutil import check_nhwc_layer, nhwc_conv_layer
from tilecraft.relax.backend.cpu import ConvGeometry
from tilecraft.relax.backend.cpu.conv2d_nhwc import plan_conv2d_nhwc

RNG = np.random.default_rng(31)


def _geometry(cin, hw, cout, k=3, stride=1):
    return ConvGeometry(cin, hw, hw, cout, (k, k), (stride, stride), (k // 2,) * 4, (1, 1), 1)


def test_avx512_rows_take_the_full_tile():
    # a KxK layer: up to 14 pixels (MAX_KXK_PIXELS)
    assert plan_conv2d_nhwc(_geometry(64, 56, 64), 16, 32).rows == 14      # 4 x 14
    assert plan_conv2d_nhwc(_geometry(64, 57, 64), 16, 32).rows == 14      # 4 x 14 + 1
    assert plan_conv2d_nhwc(_geometry(64, 50, 64), 16, 32).rows == 10      # too few: 5 x 10
    # a 1x1 layer: up to 12
    assert plan_conv2d_nhwc(_geometry(64, 56, 64, k=1), 16, 32).rows == 12  # 4 x 12 + 8
    assert plan_conv2d_nhwc(_geometry(64, 50, 64, k=1), 16, 32).rows == 12  # 4 x 12 + 2
    # ... a row of too few: 4 x 7, unless the layer reads pixel p for pixel p (1x1, unit
    # stride), which takes 12 across rows: 65 x 12 + 4 on 28 x 28, 4 x 12 + 1 on 7 x 7
    assert plan_conv2d_nhwc(_geometry(64, 56, 64, k=1, stride=2), 16, 32).rows == 7
    for hw in (28, 14, 7):
        p = plan_conv2d_nhwc(_geometry(64, hw, 64, k=1), 16, 32)
        assert (p.rows, p.flat) == (12, True)
    p = plan_conv2d_nhwc(_geometry(64, 6, 64, k=1), 16, 32)                # 36: too few
    assert (p.rows, p.flat) == (6, False)
    p = plan_conv2d_nhwc(_geometry(64, 7, 64, k=1), 8, 16)                 # AVX2: unchanged
    assert (p.rows, p.flat) == (6, True)
    assert plan_conv2d_nhwc(_geometry(64, 56, 64), 4, 32).rows == 8        # NEON: unchanged
    # a depthwise layer keeps its dividing tile
    dw = ConvGeometry(64, 56, 56, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 64)
    assert plan_conv2d_nhwc(dw, 16, 32).rows == 8


@pytest.mark.parametrize("cin,hw,cout,k,stride", [
    (16, 50, 64, 3, 1), (24, 56, 32, 3, 1), (8, 99, 32, 3, 2), (40, 49, 64, 1, 1),
    (40, 7, 64, 1, 1), (24, 13, 96, 1, 1), (160, 14, 32, 1, 1)])
def test_layers_match_numpy(cin, hw, cout, k, stride):
    exe, wt, b = nhwc_conv_layer(cin, hw, hw, cout, k, RNG, stride=stride)
    check_nhwc_layer(exe, wt, b, RNG, hw, hw, stride, batches=(1, 2))
