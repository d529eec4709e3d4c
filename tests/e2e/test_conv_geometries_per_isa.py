"""ResNet-50's convolution geometries through ``relax.build`` (``AlterLayout``'s packed NCHW
kernels and their default schedules), for each x86 vector width this host can run, against
onnxruntime.

The packed kernels' plans (channel block, vectors per tile, whether a tile stays inside one
image row) depend on the target's lanes and registers, so a geometry right with AVX-512 can be
wrong with AVX2: the 56x56 1x1 convolutions were, through an over-wide ``reverse_compute_at``
region, and only the AVX2 host's ResNet-50 showed it. Building for ``-mcpu=x86-64`` (SSE, 4
lanes) and ``-mcpu=haswell`` (AVX2, 8 lanes) besides the host covers every width on one machine.
"""
from __future__ import annotations

import numpy as np
import pytest

from tilecraft import relax
from tilecraft import targets

from capabilities import import_or_require

ort = import_or_require("onnxruntime", "pip install 'tilecraft[bench]'")   # the oracle
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from tilecraft.relax.frontend import from_onnx  # noqa: E402

# (in channels, out channels, image size, kernel, stride, padding): ResNet-50's distinct kinds
# at each image size (the stem, 1x1 and 3x3 at stride 1 and 2, the projection shortcuts)
GEOMETRIES = [
    (3, 64, 224, 7, 2, 3),
    (64, 64, 56, 1, 1, 0), (64, 64, 56, 3, 1, 1), (64, 256, 56, 1, 1, 0),
    (256, 128, 56, 1, 2, 0), (128, 128, 56, 3, 2, 1),
    (128, 128, 28, 3, 1, 1), (128, 512, 28, 1, 1, 0), (512, 256, 28, 1, 2, 0),
    (256, 256, 14, 3, 1, 1), (256, 1024, 14, 1, 1, 0),
    (512, 512, 7, 3, 1, 1), (512, 2048, 7, 1, 1, 0),
    # the long reductions AVX2 runs as tiles across rows in reduction chunks
    (2048, 512, 7, 1, 1, 0), (1024, 2048, 14, 1, 2, 0),
]


def _host_isas() -> list[str]:
    host = targets.Target("llvm")
    out = ["llvm -mcpu=x86-64"]
    if host.vector_width >= 256:
        out.append("llvm -mcpu=haswell")
    if host.vector_width >= 512:
        out.append("llvm")
    return out


def _conv_model(ci, co, size, k, s, pad, rng):
    w = (rng.standard_normal((co, ci, k, k)) / np.sqrt(ci * k * k)).astype("float32")
    bias = rng.standard_normal(co).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4, strides=[s, s]),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                      (1, ci, size, size))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.skipif(targets.Target("llvm").arch != "x86_64", reason="x86 vector widths only")
@pytest.mark.parametrize("target", _host_isas())
def test_resnet50_conv_geometries(target):
    rng = np.random.default_rng(11)
    for ci, co, size, k, s, pad in GEOMETRIES:
        model = _conv_model(ci, co, size, k, s, pad, rng)
        x = rng.standard_normal((1, ci, size, size)).astype("float32")
        want = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        exe = relax.build(from_onnx(model), target)
        got = relax.VirtualMachine(exe, targets.cpu(0))["main"](x).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4,
                                   err_msg=f"{target}: conv {ci}->{co} {size}x{size} "
                                           f"k{k} s{s} p{pad}")
