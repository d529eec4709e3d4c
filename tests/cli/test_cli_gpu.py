"""``tilecraft compile / run / bench`` on the GPU targets: OpenCL (PoCL in CI) and WebGPU
(lavapipe), skipped with the reason where the device is absent."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from cliutil import last_error, tilecraft, tiny_onnx

pytest.importorskip("onnx", reason="onnx is not installed")

# the device checks of the targets tests (they skip naming why there is no device)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "targets"))
from opencl_testutil import opencl_device_and_target  # noqa: E402
from webgpu_testutil import webgpu_device  # noqa: E402


def _opencl():
    return opencl_device_and_target()[1]


def _webgpu():
    webgpu_device()
    return "webgpu"


@pytest.fixture(params=["opencl", "webgpu"])
def gpu_target(request):
    """The target string of a present device (a CPU OpenCL driver gets its CPU variant)."""
    return {"opencl": _opencl, "webgpu": _webgpu}[request.param]()


def test_compile_run_and_bench_on_the_device(gpu_target, tmp_path):
    w, b = tiny_onnx(tmp_path / "tiny.onnx")
    kind = gpu_target.split()[0]
    tilecraft("compile", "tiny.onnx", "--target", gpu_target, "-o", "gpu.tcx", cwd=tmp_path)
    x = np.random.default_rng(1).standard_normal((7, 8)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    proc = tilecraft("run", "gpu.tcx", "-i", "x.npy", "-o", "y.npy", "--time", "2",
                     cwd=tmp_path)
    assert f"ran on {kind}(0)" in proc.stdout
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), np.maximum(x @ w + b, 0),
                               rtol=1e-4, atol=1e-4)
    proc = tilecraft("run", "gpu.tcx", "-i", "x.npy", "--device", "99", check=False,
                     cwd=tmp_path)
    assert proc.returncode == 1
    assert "--device 99: there are" in last_error(proc) and kind in last_error(proc)

    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    proc = tilecraft("bench", "tiny.onnx", "--target", gpu_target, "--dim", "batch=3",
                     "--rounds", "1", cwd=tmp_path)
    assert "matches onnxruntime" in proc.stdout
    assert f"on {kind}(0)" in proc.stdout and "on this CPU" in proc.stdout
    assert "the peer on this CPU" in proc.stdout
