"""The NHWC tile of several image rows on AVX-512 (relax.backend.cpu.conv2d_nhwc.plan_conv2d_nhwc,
``NhwcPlan.image_rows``): a KxK layer whose whole row is at most half of MAX_KXK_PIXELS takes
tiles of two (or more) rows, with a ragged last tile on an odd plane; the layers against numpy
on the host's own tiles (whatever its vector width), batches 1 and 2."""
import numpy as np
import pytest

from nhwc_testutil import check_nhwc_layer, nhwc_conv_layer
from tilecraft.relax.backend.cpu import ConvGeometry
from tilecraft.relax.backend.cpu.conv2d_nhwc import plan_conv2d_nhwc

RNG = np.random.default_rng(47)


def _geometry(cin, hw, cout, k=3, stride=1, groups=1):
    return ConvGeometry(cin, hw, hw, cout, (k, k), (stride, stride), (k // 2,) * 4, (1, 1),
                        groups)


def _tile(g, lanes=16, registers=32):
    p = plan_conv2d_nhwc(g, lanes, registers)
    return p.rows, p.image_rows


def test_avx512_narrow_rows_take_several_rows():
    assert _tile(_geometry(512, 7, 512)) == (7, 2)                 # ResNet's 7 x 7: 14 pixels
    assert _tile(_geometry(256, 14, 512, stride=2)) == (7, 2)      # 7 x 7 output, strided
    assert _tile(_geometry(64, 5, 64)) == (5, 2)
    assert _tile(_geometry(64, 4, 64)) == (4, 3)
    assert _tile(_geometry(256, 14, 256)) == (14, 1)               # a whole tile a row
    # unchanged: a 1x1 layer (tiles across rows), AVX2, depthwise, a plane of one row
    assert _tile(_geometry(512, 7, 512, k=1))[1] == 1
    assert _tile(_geometry(512, 7, 512), 8, 16)[1] == 1
    assert _tile(_geometry(64, 7, 64, groups=64))[1] == 1
    one_row = ConvGeometry(64, 1, 7, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert _tile(one_row)[1] == 1


@pytest.mark.parametrize("cin,hw,cout,stride", [
    (32, 7, 64, 1),        # 7 rows: three tiles of two rows and a ragged one
    (16, 5, 32, 1),        # 5-wide rows
    (24, 4, 32, 1),        # three rows of 4
    (32, 13, 32, 2),       # strided, 7 x 7 output
    (48, 6, 64, 1),        # an even plane: no ragged tile
])
def test_layers_match_numpy(cin, hw, cout, stride):
    exe, wt, b = nhwc_conv_layer(cin, hw, hw, cout, 3, RNG, stride=stride)
    check_nhwc_layer(exe, wt, b, RNG, hw, hw, stride, batches=(1, 2))
