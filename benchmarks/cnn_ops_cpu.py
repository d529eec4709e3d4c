"""The common layers of the model zoo's CNNs, one at a time: an untuned ``relax.build`` beside
onnxruntime running the same layer.

``python -m benchmarks.run cnn_ops_cpu`` (``TILECRAFT_CNN_LAYERS=<regex>`` picks layers by
label) prints one row per layer of ``tilecraft.models.cnn_ops.CNN_LAYERS`` -- convolutions
``relu(conv2d(x, W) + b)`` of ResNet-18/50 (the 7x7 stem, 1x1, 3x3, strided), MobileNet-V2
(depthwise, expand / project 1x1), DenseNet-121, Inception-v3 (1x7, 3x3 stride 2 without
padding, 5x5) and a ResNeXt grouped conv, the max / average pooling and the global average
pooling -- and writes ``benchmarks/results/cnn_ops_cpu/<machine>.json``.

Both sides run batch 1, NCHW, float32 on 2 threads: the layer built with
``relax.build(mod, "llvm", upper_bounds={"batch": 1})`` (batch symbolic, default schedules, the
weights packed at build time by ``AlterLayout``), and the ONNX layer in onnxruntime with all
graph optimizations (which pre-packs the weights and runs its NCHWc kernels). The result is
checked against onnxruntime's first. Columns: ``tilecraft_ms`` / ``onnxruntime_ms``
(medians of interleaved rounds), ``ratio`` (onnxruntime / tilecraft: above 1 we are faster),
``gflops`` (ours, for convolutions) and ``kernels`` (kernel calls per run; 1 = the bias and
relu fused into the convolution).
"""
from __future__ import annotations

import os
import re

import numpy as np

from tilecraft import targets
from tilecraft.models import onnx_session
from tilecraft.models.cnn_ops import CNN_LAYERS, cnn_layer
from tilecraft.relax import VirtualMachine, build

from .common import side_by_side
from .relax_cpu import _number_for


def run() -> list[dict]:
    rounds = int(os.environ.get("TILECRAFT_BENCH_ROUNDS", "7"))
    pick = re.compile(os.environ.get("TILECRAFT_CNN_LAYERS", ".*"))
    rows = []
    for label, spec in CNN_LAYERS:
        if not pick.search(label):
            continue
        model = cnn_layer(label, spec)
        exe = build(model.mod, "llvm", upper_bounds={"batch": 1})
        vm = VirtualMachine(exe)
        sess = onnx_session(model, threads=2)
        (x,) = model.make_inputs(np.random.default_rng(0), batch=1)
        ours_out = vm["main"](x).numpy()
        peer_out = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(ours_out, peer_out, rtol=1e-3, atol=1e-4,
                                   err_msg=f"{label}: tilecraft and onnxruntime disagree")
        arg = targets.array(x)
        fn = vm["main"]

        def ours():
            return fn(arg)

        def peer():
            return sess.run(None, {"x": x})

        number = _number_for(ours)
        ours_s, peer_s = side_by_side(ours, peer, number=number, rounds=rounds)
        row = {"layer": label, "tilecraft_ms": ours_s * 1e3, "onnxruntime_ms": peer_s * 1e3,
               "ratio": peer_s / ours_s}
        if "conv" in spec:
            w = model.params["W"]
            macs = w.size * ours_out.shape[2] * ours_out.shape[3]
            row["gflops"] = 2 * macs / ours_s / 1e9
        row["kernels"] = exe.stats()["main"]["kernel_calls"]
        rows.append(row)
    return rows


if __name__ == "__main__":
    from .common import ensure_clean_openblas_env, print_table
    ensure_clean_openblas_env()
    result = run()
    print_table(result, list(dict.fromkeys(k for r in result for k in r)))
