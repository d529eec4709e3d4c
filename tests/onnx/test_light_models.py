"""The nine "light" model-zoo graphs in the onnx package: their reference outputs, and seeded
random weights against onnxruntime.

Their input is ``arange(n).reshape(shape) / n``; their own weights are all 0.02, so the
references are nearly constant vectors: the random-weight variant compares the logits (the input
of the final Softmax) with onnxruntime's. Building the larger CNNs takes minutes on two cores
(their convolutions' default schedules): those are marked slow; SqueezeNet and AlexNet stay in
CI.
"""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft import relax
import tilecraft.relax.frontend
from tilecraft import targets
import light_models
from onnx_testutil import run_onnxruntime

FAST = {"light_bvlc_alexnet", "light_zfnet512"}
PARAMS = [pytest.param(n, marks=[] if n in FAST else [pytest.mark.slow])
          for n in light_models.NAMES]


def _run(model, feeds):
    mod = relax.frontend.from_onnx(model)
    vm = relax.VirtualMachine(relax.build(mod, "llvm"), targets.cpu(0))
    out = vm["main"](*feeds)
    return [o.numpy() for o in (out if isinstance(out, tuple) else [out])]


@pytest.mark.parametrize("name", PARAMS)
def test_light_model_matches_its_reference(name):
    model = light_models.load(name)
    _, x = light_models.data_input(model)
    (out,) = _run(model, [x])
    ref = light_models.reference_output(name)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", PARAMS)
def test_light_model_with_random_weights_matches_onnxruntime(name):
    model = light_models.with_random_weights(light_models.load(name), seed=7)
    _, x = light_models.data_input(model)
    rng = np.random.default_rng(3)
    x = (x + 0.1 * rng.standard_normal(x.shape)).astype(np.float32)
    ours = _run(model, [x])
    ref = run_onnxruntime(model, [x])
    assert len(ours) == len(ref)
    logits, ref_logits = ours[-1], ref[-1]
    assert np.std(ref_logits) > 1e-3, "the random weights should give varied logits"
    scale = np.abs(ref_logits).max()
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-3, atol=1e-4 * scale)
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-3, atol=1e-5)
