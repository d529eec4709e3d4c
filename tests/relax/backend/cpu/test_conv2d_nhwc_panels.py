"""The NHWC tile's channel panels (relax.backend.cpu.conv2d_nhwc.plan_conv2d_nhwc) leave no
ragged last panel: one vector where two would, half a vector (AVX-512) where one would, three
half vectors in one panel for 24 channels (72, ...); the
convolutions with such channel counts against numpy, bias fused, batches 1 and 2."""
import numpy as np
import pytest

from nhwc_testutil import nhwc_conv_layer, nhwc_conv_reference
from tilecraft import relax
from tilecraft.relax.backend.cpu import ConvGeometry
from tilecraft.relax.backend.cpu.conv2d_nhwc import plan_conv2d_nhwc

RNG = np.random.default_rng(5)


def _one_by_one(cin, hw, cout):
    return ConvGeometry(cin, hw, hw, cout, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)


def test_panels_divide_the_channels():
    # 24 channels on 16 lanes: 3 half vectors in one panel, not a full and a half-empty one
    p = plan_conv2d_nhwc(_one_by_one(96, 56, 24), 16, 32)
    assert (p.width, p.lanes, p.rows) == (24, 8, 8)
    # 72 = 3 panels of 3 half vectors; a depthwise layer keeps one half vector
    assert plan_conv2d_nhwc(_one_by_one(96, 56, 72), 16, 32).width == 24
    dw24 = ConvGeometry(24, 56, 56, 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 24)
    assert plan_conv2d_nhwc(dw24, 16, 32).width == 8
    # 144 = 9 x 16: one vector, not 4.5 panels of 32
    assert plan_conv2d_nhwc(_one_by_one(24, 56, 144), 16, 32).width == 16
    dw = ConvGeometry(144, 56, 56, 144, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 144)
    assert plan_conv2d_nhwc(dw, 16, 32).width == 16
    # whole pairs keep two vectors; 16 registers (AVX2) never go below a full vector
    assert plan_conv2d_nhwc(_one_by_one(96, 56, 64), 16, 32).width == 32
    assert plan_conv2d_nhwc(_one_by_one(96, 56, 20), 8, 16).width == 8
    assert plan_conv2d_nhwc(_one_by_one(96, 56, 24), 8, 16).width == 8
    for g in (_one_by_one(96, 56, 24), _one_by_one(24, 56, 144), dw):
        p = plan_conv2d_nhwc(g, 16, 32)
        assert g.out_channels % p.width == 0, g


@pytest.mark.parametrize("cin,h,w,cout,k", [(40, 13, 11, 24, 1), (24, 9, 15, 48, 1),
                                            (16, 11, 7, 40, 3), (16, 9, 10, 24, 3),
                                            (33, 7, 13, 72, 1)])
def test_half_vector_panels_match_numpy(cin, h, w, cout, k):
    exe, wt, b = nhwc_conv_layer(cin, h, w, cout, k, RNG)
    vm = relax.VirtualMachine(exe)
    for n in (1, 2):
        xv = RNG.standard_normal((n, h, w, cin)).astype("float32")
        np.testing.assert_allclose(vm["main"](xv).numpy(), nhwc_conv_reference(xv, wt, b),
                                   rtol=1e-4, atol=1e-4)
