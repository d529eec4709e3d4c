"""The NHWC tile's non-temporal output (relax.backend.cpu.conv2d_nhwc.streams_output, the rule
of params.nontemporal_output): a layer writes its output with non-temporal stores when the whole
output (every image of the call) is at least NONTEMPORAL_MIN_BYTES, tested at run time for a
symbolic batch; against numpy with a symbolic batch on both sides of the threshold, on odd
planes and channel counts."""
import numpy as np
import pytest

from nhwc_testutil import nhwc_conv_layer, nhwc_conv_reference
from tilecraft import relax
from tilecraft.relax.backend.cpu import ConvGeometry
from tilecraft.relax.backend.cpu.conv2d_nhwc import streams_output
from tilecraft.relax.backend.cpu.params import (NONTEMPORAL_MIN_BYTES,
                                                NONTEMPORAL_MIN_IMAGE_BYTES)
from tilecraft.tensorir import te

RNG = np.random.default_rng(12)


def _geometry(cin, h, w, cout, k=1):
    return ConvGeometry(cin, h, w, cout, (k, k), (1, 1), (k // 2,) * 4, (1, 1), 1)


def test_rule_is_the_whole_output():
    expansion = _geometry(16, 112, 112, 96)                       # MobileNet-V2's, 4.8 MB an image
    images = -(-NONTEMPORAL_MIN_BYTES // (112 * 112 * 96 * 4))   # 7 images reach 32 MB
    assert not streams_output(expansion, 1)                       # in the caches for the next layer
    assert not streams_output(expansion, images - 1)
    assert streams_output(expansion, images)
    assert not streams_output(expansion, images, itemsize=2)
    assert streams_output(expansion, te.var("n"))                 # tested at run time
    side = int((NONTEMPORAL_MIN_IMAGE_BYTES // (4 * 64)) ** 0.5)  # 64 channels, a square plane
    assert streams_output(_geometry(8, side, side, 64), te.var("n"))
    assert not streams_output(_geometry(8, side - 1, side - 1, 64), te.var("n"))


# (cin, h, w, cout, k, annotated for a symbolic batch, a batch whose output streams)
@pytest.mark.parametrize("cin,h,w,cout,k,streams,big", [
    (13, 65, 64, 256, 1, True, 8), (13, 65, 64, 256, 3, True, 8), (16, 64, 64, 256, 1, True, 8),
    (13, 23, 21, 256, 1, False, None)])
def test_layers_match_numpy(cin, h, w, cout, k, streams, big):
    assert streams_output(_geometry(cin, h, w, cout, k), te.var("n")) == streams
    exe, wt, b = nhwc_conv_layer(cin, h, w, cout, k, RNG)
    assert ("!nontemporal" in exe.kernel_module.get_source("ll-raw")) == streams
    vm = relax.VirtualMachine(exe)
    for n in (1, 3) + ((big,) if big else ()):
        assert (n * h * w * cout * 4 >= NONTEMPORAL_MIN_BYTES) == (n == big)
        xv = RNG.standard_normal((n, h, w, cin)).astype("float32")
        np.testing.assert_allclose(vm["main"](xv).numpy(), nhwc_conv_reference(xv, wt, b),
                                   rtol=1e-4, atol=1e-4)
