"""The NHWC tile's non-temporal output (relax.backend.cpu.conv2d_nhwc.streams_output): a layer
whose output is at least NONTEMPORAL_MIN_BYTES an image writes it with non-temporal stores,
the others plainly; against numpy with a symbolic batch at 1 and 3, on odd planes and channel
counts."""
import numpy as np
import pytest

from nhwc_testutil import nhwc_conv_layer, nhwc_conv_reference
from tilecraft import relax
from tilecraft.relax.backend.cpu import ConvGeometry
from tilecraft.relax.backend.cpu.conv2d_nhwc import NONTEMPORAL_MIN_BYTES, streams_output

RNG = np.random.default_rng(12)


def _geometry(cin, h, w, cout, k=1):
    return ConvGeometry(cin, h, w, cout, (k, k), (1, 1), (k // 2,) * 4, (1, 1), 1)


def test_rule_is_the_output_bytes_of_one_image():
    assert streams_output(_geometry(16, 112, 112, 96))            # MobileNet-V2's 4.8 MB
    assert not streams_output(_geometry(24, 56, 56, 144))         # 1.8 MB
    side = int((NONTEMPORAL_MIN_BYTES // (4 * 64)) ** 0.5)        # 64 channels, a square plane
    assert streams_output(_geometry(8, side, side, 64))
    assert not streams_output(_geometry(8, side - 1, side - 1, 64))
    assert not streams_output(_geometry(8, side, side, 64), itemsize=2)


@pytest.mark.parametrize("cin,h,w,cout,k,streams", [
    (13, 65, 64, 256, 1, True), (13, 65, 64, 256, 3, True), (16, 64, 64, 256, 1, True),
    (13, 31, 33, 256, 1, False)])
def test_layers_match_numpy(cin, h, w, cout, k, streams):
    assert streams_output(_geometry(cin, h, w, cout, k)) == streams
    exe, wt, b = nhwc_conv_layer(cin, h, w, cout, k, RNG)
    assert ("!nontemporal" in exe.kernel_module.get_source("ll-raw")) == streams
    vm = relax.VirtualMachine(exe)
    for n in (1, 3):
        xv = RNG.standard_normal((n, h, w, cin)).astype("float32")
        np.testing.assert_allclose(vm["main"](xv).numpy(), nhwc_conv_reference(xv, wt, b),
                                   rtol=1e-4, atol=1e-4)
