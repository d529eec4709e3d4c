"""Static int8 MobileNet-V2 (the zoo's: torchvision's architecture, random weights) on the CPU:
every convolution, the depthwise ones included, runs an int8 kernel, both through
``relax.quantize(mod, "int8")`` and through onnxruntime's QDQ export of the same model; the
outputs are checked against float32 and against onnxruntime running the QDQ model."""
from __future__ import annotations

import os

import numpy as np
import pytest

from capabilities import import_or_require

onnx = import_or_require("onnx", "pip install 'tilecraft[onnx]'")
ort = import_or_require("onnxruntime", "pip install onnxruntime")
import_or_require("torch", "pip install 'tilecraft[torch]'")

from tilecraft import relax, targets  # noqa: E402
from tilecraft.relax.frontend.onnx import from_onnx  # noqa: E402
from tilecraft.zoo.models import ZOO  # noqa: E402

CPU = targets.cpu(0)
# three builds of the whole model (minutes on 2 cores): the depthwise-separable block of
# tests/relax/backend/cpu/test_depthwise_int8.py is the quick check
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model():
    z = ZOO["mobilenet_v2"]()
    (name, x0), = z.inputs.items()
    rng = np.random.default_rng(5)
    cal = [rng.standard_normal(x0.shape).astype(np.float32) for _ in range(4)]
    return z, name, cal


def conv_kernels(exe) -> list[str]:
    return [k for k in exe.kernel_names if "conv2d" in k and "words" not in k]


def assert_all_int8(exe, convs: int):
    names = conv_kernels(exe)
    assert names and all("u8i8" in k for k in names), [k for k in names if "u8i8" not in k]
    # depthwise layers included (17 in MobileNet-V2); structurally equal kernels are merged
    assert sum("depthwise_conv2d_nchw_u8i8" in k for k in names) >= 1
    assert len(names) <= convs


def num_convs(onnx_model) -> int:
    return sum(n.op_type == "Conv" for n in onnx_model.graph.node)


def test_relax_quantize_int8(model):
    z, name, cal = model
    mod = from_onnx(z.onnx_model)
    exe = relax.build(relax.quantize(mod, "int8", calibration=[(x,) for x in cal]), "llvm",
                      strict=True)
    assert_all_int8(exe, num_convs(z.onnx_model))
    ref = relax.VirtualMachine(relax.build(mod, "llvm", strict=True), CPU)
    vm = relax.VirtualMachine(exe, CPU)
    x = np.random.default_rng(9).standard_normal(cal[0].shape).astype(np.float32)
    got, want = vm["main"](x).numpy(), ref["main"](x).numpy()
    cos = float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want))
    assert cos > 0.995 and np.argmax(got) == np.argmax(want)


def test_onnxruntime_qdq_model(model, tmp_path):
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process
    z, name, cal = model

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{name: x} for x in cal])

        def get_next(self):
            return next(self.it, None)
    src, fp, qp = (os.path.join(tmp_path, f) for f in ("src.onnx", "f.onnx", "q.onnx"))
    onnx.save(z.onnx_model, src)
    quant_pre_process(src, fp, skip_symbolic_shape=True)
    quantize_static(fp, qp, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    exe = relax.build(from_onnx(onnx.load(qp)), "llvm", strict=True)
    assert_all_int8(exe, num_convs(z.onnx_model))
    vm = relax.VirtualMachine(exe, CPU)
    sess = ort.InferenceSession(qp, providers=["CPUExecutionProvider"])
    fsess = ort.InferenceSession(fp, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(10).standard_normal(cal[0].shape).astype(np.float32)
    got = vm["main"](x).numpy()
    peer = sess.run(None, {name: x})[0]
    ref = fsess.run(None, {name: x})[0]
    # the same quantized arithmetic: close to onnxruntime's (requantization rounding may
    # differ by a step in a few activations), and as close to float32 as onnxruntime is
    scale = np.abs(ref).max()
    assert np.abs(got - peer).max() < 0.05 * scale
    assert np.abs(got - ref).max() < 2 * np.abs(peer - ref).max() + 1e-3 * scale
