"""``tilecraft compile --quantize``: the fp16, int8 and int4 modes of ``relax.quantize`` from
the command line, on the tiny ONNX model (a 8 -> 4 dense layer with relu)."""
from __future__ import annotations

import numpy as np
import pytest

from cliutil import last_error, tilecraft, tiny_onnx

pytest.importorskip("onnx", reason="onnx is not installed")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("cliq")
    w, b = tiny_onnx(d / "tiny.onnx")
    return d, w, b


@pytest.mark.parametrize("mode", ["fp16", "int8-dynamic", "int8", "int4-g32"])
def test_compile_quantized_and_run(work, mode, tmp_path):
    d, w, b = work
    out = f"tiny-{mode}.tcx"
    proc = tilecraft("compile", "tiny.onnx", "--target", "llvm", "--quantize", mode, "-o", out,
                     "--calibration-samples", "4", cwd=d)
    assert "compiled" in proc.stdout
    x = np.random.default_rng(1).standard_normal((3, 8)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    tilecraft("run", d / out, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy",
              cwd=tmp_path)
    y = np.load(tmp_path / "y.npy")
    assert y.dtype == np.float32                      # the signature stays float32
    ref = np.maximum(x @ w + b, 0)
    # fp16: inputs and weights rounded to 11 bits, float32 accumulation; int8: a step of 1/127
    # of the weights' and 1/255 of the row's range; int4: 1/7 of a group's
    tol = {"fp16": 3e-3, "int8-dynamic": 0.05, "int8": 0.05}.get(mode, 0.35)
    assert np.abs(y - ref).max() <= tol * np.abs(ref).max() + 1e-3


def test_unknown_quantize_mode(work):
    d, _, _ = work
    proc = tilecraft("compile", "tiny.onnx", "--quantize", "int3", "-o", "x.tcx", cwd=d,
                     check=False)
    assert proc.returncode != 0
    assert "int8-dynamic" in proc.stderr and "fp16" in proc.stderr and "int3" in proc.stderr


def test_fp16_for_webgpu_without_shader_f16_names_the_fix(work):
    pytest.importorskip("wgpu", reason="wgpu is not installed")
    d, _, _ = work
    proc = tilecraft("compile", "tiny.onnx", "--target", "webgpu", "--quantize", "fp16",
                     "-o", "x.tcx", cwd=d, check=False)
    assert proc.returncode != 0
    assert "shader-f16" in proc.stderr and "webgpu -supports-float16=1" in proc.stderr
    assert "Traceback" not in proc.stderr
