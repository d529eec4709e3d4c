"""``ConvertLayout`` measured: each ResNet-50 convolution alone in NCHW and in NHWC (with its
bias, relu and, for the expanding 1x1 layers, the residual add), and ResNet-50 built with and
without the pass beside onnxruntime, interleaved in one process.

``python -m benchmarks.run convert_layout`` (``TILECRAFT_LAYOUT_THREADS``: threads, default all
cores; ``TILECRAFT_LAYOUT_PARTS=layers`` or ``model`` for one half).
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np

from tilecraft import relax
from tilecraft import targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.transform import Sequential, get_pipeline
from tilecraft.relax.transform.convert_layout import nhwc_pays
from tilecraft.relax.backend.cpu import ConvGeometry

from .common import side_by_side

# (in channels, input size, out channels, kernel, stride, padding): count in ResNet-50
RESNET50 = {
    (64, 56, 64, 1, 1, 0): 1, (64, 56, 64, 3, 1, 1): 3, (64, 56, 256, 1, 1, 0): 4,
    (256, 56, 64, 1, 1, 0): 2, (256, 56, 128, 1, 1, 0): 1, (128, 56, 128, 3, 2, 1): 1,
    (256, 56, 512, 1, 2, 0): 1, (128, 28, 128, 3, 1, 1): 3, (128, 28, 512, 1, 1, 0): 4,
    (512, 28, 128, 1, 1, 0): 3, (512, 28, 256, 1, 1, 0): 1, (256, 28, 256, 3, 2, 1): 1,
    (512, 28, 1024, 1, 2, 0): 1, (256, 14, 256, 3, 1, 1): 5, (256, 14, 1024, 1, 1, 0): 6,
    (1024, 14, 256, 1, 1, 0): 5, (1024, 14, 512, 1, 1, 0): 1, (512, 14, 512, 3, 2, 1): 1,
    (1024, 14, 2048, 1, 2, 0): 1, (512, 7, 512, 3, 1, 1): 2, (512, 7, 2048, 1, 1, 0): 3,
    (2048, 7, 512, 1, 1, 0): 2,
}
RESIDUAL = {(64, 56, 256, 1, 1, 0), (128, 28, 512, 1, 1, 0), (256, 14, 1024, 1, 1, 0),
            (512, 7, 2048, 1, 1, 0)}


def _threads() -> int:
    return int(os.environ.get("TILECRAFT_LAYOUT_THREADS", "0")) or (os.cpu_count() or 1)


def _layer(geo, nhwc: bool, w, b):
    c, hw, o, k, s, p = geo
    oh = (hw + 2 * p - k) // s + 1
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, hw, hw, c) if nhwc else (1, c, hw, hw), "float32"))
    r = Var("r", TensorStructInfo((1, oh, oh, o) if nhwc else (1, o, oh, oh), "float32"))
    with bb.function("main", [x, r]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(w), strides=s, padding=p,
                                     data_layout="NHWC" if nhwc else "NCHW"))
            y = bb.emit(op.add(y, const(b.reshape((1, 1, 1, o)) if nhwc else
                                        b.reshape((1, o, 1, 1)))))
            if geo in RESIDUAL:
                y = bb.emit(op.add(y, r))
            gv = bb.emit_output(bb.emit(op.nn.relu(y)))
        bb.emit_func_output(gv)
    exe = relax.build(bb.get(), "llvm")
    exe.kernel_module.num_threads = _threads()
    return relax.VirtualMachine(exe, targets.cpu(0))["main"]


def _layers(rounds: int) -> list[dict]:
    rng = np.random.default_rng(0)
    target = targets.Target("llvm")
    rows = []
    for geo, count in RESNET50.items():
        c, hw, o, k, s, p = geo
        oh = (hw + 2 * p - k) // s + 1
        w = rng.uniform(-0.05, 0.05, (o, c, k, k)).astype("float32")
        b = rng.uniform(-1, 1, (o,)).astype("float32")
        xv = rng.uniform(-1, 1, (1, c, hw, hw)).astype("float32")
        rv = rng.uniform(-1, 1, (1, o, oh, oh)).astype("float32")
        f_nchw, f_nhwc = _layer(geo, False, w, b), _layer(geo, True, w, b)
        a_nchw = (targets.array(xv), targets.array(rv))
        a_nhwc = (targets.array(xv.transpose(0, 2, 3, 1).copy()),
                  targets.array(rv.transpose(0, 2, 3, 1).copy()))
        got = f_nhwc(*a_nhwc).numpy().transpose(0, 3, 1, 2)
        np.testing.assert_allclose(got, f_nchw(*a_nchw).numpy(), rtol=1e-3, atol=1e-3)
        inner = max(3, int(0.03 / max(1e-5, 2 * c * o * k * k * oh * oh / 60e9)))
        t_nchw, t_nhwc = side_by_side(lambda: f_nchw(*a_nchw), lambda: f_nhwc(*a_nhwc),
                                      number=inner, rounds=rounds)
        g = ConvGeometry(c, hw, hw, o, (k, k), (s, s), (p,) * 4, (1, 1), 1)
        rows.append({"layer": f"{c}->{o} {k}x{k}/{s} @{hw}", "count": count,
                     "residual": geo in RESIDUAL, "nhwc_pays": nhwc_pays(g, target),
                     "nchw_ms": t_nchw * 1e3, "nhwc_ms": t_nhwc * 1e3,
                     "nhwc_speedup": t_nchw / t_nhwc})
    return rows


def _model(rounds: int) -> list[dict]:
    import onnxruntime as ort
    from tilecraft.relax.frontend.onnx import from_onnx
    from tilecraft.zoo.models import light
    z = light("resnet50", seed=0)
    name, x = next(iter(z.inputs.items()))
    mod = from_onnx(z.onnx_model)
    without = Sequential([p for p in get_pipeline(target="llvm").passes
                          if p.name != "ConvertLayout"], name="default_nchw")
    fs = []
    for pipeline in (None, without):
        exe = relax.build(mod, "llvm", pipeline=pipeline)
        exe.kernel_module.num_threads = _threads()
        fs.append(relax.VirtualMachine(exe, targets.cpu(0))["main"])
    outs = [f(x).numpy() for f in fs]
    so = ort.SessionOptions()
    so.intra_op_num_threads = _threads()
    sess = ort.InferenceSession(z.onnx_model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    ref = sess.run(None, {name: x})[0]
    for o in outs:
        np.testing.assert_allclose(o, ref, rtol=1e-3, atol=1e-4)
    ratios, times = {"with": [], "without": []}, {"with": [], "without": [], "ort": []}
    for _ in range(rounds):
        for key, f in (("with", fs[0]), ("without", fs[1])):
            ours, peer = side_by_side(lambda: f(x), lambda: sess.run(None, {name: x}),
                                      number=3, rounds=1)
            ratios[key].append(peer / ours)
            times[key].append(ours)
            times["ort"].append(peer)
    return [{"layer": f"ResNet-50 end to end, {key} ConvertLayout",
             "ours_ms": statistics.median(times[key]) * 1e3,
             "onnxruntime_ms": statistics.median(times["ort"]) * 1e3,
             "vs_onnxruntime": statistics.median(ratios[key])} for key in ("with", "without")]


def run() -> list[dict]:
    parts = os.environ.get("TILECRAFT_LAYOUT_PARTS", "layers,model").split(",")
    rows = []
    if "layers" in parts:
        rows += _layers(int(os.environ.get("TILECRAFT_LAYOUT_ROUNDS", "7")))
        nchw = sum(r["nchw_ms"] * r["count"] for r in rows)
        chosen = sum((r["nhwc_ms"] if r["nhwc_pays"] else r["nchw_ms"]) * r["count"]
                     for r in rows)
        rows.append({"layer": "ResNet-50 convolutions, weighted sum", "count": 53,
                     "nchw_ms": nchw, "nhwc_ms": chosen, "nhwc_speedup": nchw / chosen,
                     "nhwc_pays": "as chosen"})
    if "model" in parts:
        rows += _model(int(os.environ.get("TILECRAFT_LAYOUT_MODEL_ROUNDS", "15")))
    return rows
