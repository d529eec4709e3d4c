"""MobileNet-V2's depthwise layers (NHWC, 3x3, bias and ReLU6) one at a time, with the input in
the caches and from memory, beside onnxruntime running the same layer.

In the model a depthwise layer reads the 1x1 expansion's output: from the caches, or from memory
where that output was large enough to be written non-temporally (``params.nontemporal_output``:
32 MB of the whole output, MobileNet-V2's 16 -> 96 expansion from batch 7). This benchmark times
both cases: ``hot_ms`` (one input, called again and again) and ``cold_ms``
(each call after the caches were flushed by writing ``FLUSH_BYTES`` elsewhere). Batch 1, one
thread, the thread's CPU time of each call, medians over ``TILECRAFT_BENCH_ROUNDS`` (default 7)
interleaved rounds. onnxruntime runs the NCHW layer (``Conv`` with ``group = C`` and ``Clip``;
it pays its NCHWc reorders here, which the model pays once: its rows are a reference, not the
model's per-layer time, for which see ``layer_profile``).

Rows: ``layer`` (``C x H x W / stride``), ``hot_ms``, ``cold_ms``, ``ort_hot_ms``,
``ort_cold_ms``, ``gbs_cold`` (the input and output bytes over ``cold_ms``), ``max_abs_err``
(against numpy in float64). ``TILECRAFT_DW_LAYERS=<regex>`` picks layers by label.

``python -m benchmarks.depthwise_cpu`` (prints its table; no results file).
"""
from __future__ import annotations

import os
import re
import statistics
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.zoo.run import ort_session

# MobileNet-V2's depthwise layers at 224 x 224: (channels, input side, stride); the strided
# ones pad as the HF export does (TensorFlow's "same": nothing before, one after)
LAYERS = ((32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2),
          (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1))
FLUSH_BYTES = 64 << 20


def padding_of(stride: int) -> tuple[int, int, int, int]:
    """The layer's (top, left, bottom, right) padding: TF "same" when strided, 1 otherwise."""
    return (0, 0, 1, 1) if stride == 2 else (1, 1, 1, 1)


def layer_function(c: int, hw: int, stride: int, w: np.ndarray, b: np.ndarray, batch=1,
                   upper_bounds: dict | None = None):
    """The layer ``clip(depthwise_conv2d(x, w) + b, 0, 6)`` in NHWC, built for ``batch``, one
    thread: the VM's ``main``."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch, hw, hw, c), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(w), strides=stride, padding=padding_of(stride),
                                     groups=c, data_layout="NHWC"))
            y = bb.emit(op.add(y, const(b.reshape(1, 1, 1, c))))
            gv = bb.emit_output(bb.emit(op.clip(y, 0.0, 6.0)))
        bb.emit_func_output(gv)
    exe = relax.build(bb.get(), "llvm", upper_bounds=upper_bounds)
    exe.kernel_module.num_threads = 1
    return relax.VirtualMachine(exe, targets.cpu(0))["main"]


def reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    """numpy (float64) of the layer on NHWC ``x``."""
    pt, pl, pb, pr = padding_of(stride)
    xp = np.pad(x.astype(np.float64), ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    oh = (xp.shape[1] - 3) // stride + 1
    ow = (xp.shape[2] - 3) // stride + 1
    out = np.zeros((x.shape[0], oh, ow, x.shape[3]))
    for ry in range(3):
        for rx in range(3):
            win = xp[:, ry:ry + (oh - 1) * stride + 1:stride, rx:rx + (ow - 1) * stride + 1:stride]
            out += win * w[:, 0, ry, rx]
    return np.clip(out + b, 0, 6)


def _ort_layer(c: int, hw: int, stride: int, w: np.ndarray, b: np.ndarray):
    pt, pl, pb, pr = padding_of(stride)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=c, strides=[stride, stride],
                            pads=[pt, pl, pb, pr], kernel_shape=[3, 3])
    clip = helper.make_node("Clip", ["y", "lo", "hi"], ["z"])
    graph = helper.make_graph(
        [conv, clip], "depthwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
         numpy_helper.from_array(np.array(0, "float32"), "lo"),
         numpy_helper.from_array(np.array(6, "float32"), "hi")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return ort_session(model, threads=1)


class _Flusher:
    """Evicts the caches by writing ``FLUSH_BYTES`` (untimed, between timed calls)."""

    def __init__(self) -> None:
        self.buf = np.zeros(FLUSH_BYTES // 4, "float32")

    def __call__(self) -> None:
        self.buf += 1.0


def _cpu_ms(fn, calls: int, before=None) -> float:
    """Thread CPU milliseconds of one ``fn()``, the median of ``calls`` calls, each after an
    untimed ``before()`` where given."""
    times = []
    for _ in range(calls):
        if before is not None:
            before()
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return statistics.median(times) * 1e3


def measure(c: int, hw: int, stride: int, variants: dict | None = None, seed: int = 0,
            rounds: int = 7) -> dict:
    """One row: the layer ``c x hw x hw / stride``, ours (each of ``variants``: name -> the
    VM function, default the build as it stands) and onnxruntime's, hot and cold."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(-0.5, 0.5, (c, 1, 3, 3)).astype("float32")
    b = rng.uniform(-1, 1, (c,)).astype("float32")
    x = rng.uniform(-1, 3, (1, hw, hw, c)).astype("float32")
    fns = variants or {"": layer_function(c, hw, stride, w, b)}
    sess = _ort_layer(c, hw, stride, w, b)
    arg = targets.array(x)
    x_nchw = x.transpose(0, 3, 1, 2).copy()
    want = reference(x, w, b, stride)
    err = max(float(np.abs(f(arg).numpy() - want).max()) for f in fns.values())
    got_ort = sess.run(None, {"x": x_nchw})[0].transpose(0, 2, 3, 1)
    if err > 1e-4 or float(np.abs(got_ort - want).max()) > 1e-4:
        raise AssertionError(f"{c} x {hw} / {stride}: off numpy by {err}")
    flush = _Flusher()
    columns = {}
    for name, fn in fns.items():
        sep = "_" if name else ""
        columns[f"{name}{sep}hot_ms"] = (lambda fn=fn: fn(arg), None)
        columns[f"{name}{sep}cold_ms"] = (lambda fn=fn: fn(arg), flush)
    columns["ort_hot_ms"] = (lambda: sess.run(None, {"x": x_nchw}), None)
    columns["ort_cold_ms"] = (lambda: sess.run(None, {"x": x_nchw}), flush)
    samples = {k: [] for k in columns}
    for _ in range(rounds):
        for k in rng.permutation(list(columns)):
            fn, before = columns[k]
            fn()
            samples[k].append(_cpu_ms(fn, 5, before))
    row = {"layer": f"{c} x {hw} x {hw} / {stride}"}
    row.update({k: statistics.median(v) for k, v in samples.items()})
    out_hw = hw // stride
    moved = 4 * c * (hw * hw + out_hw * out_hw)
    cold = [k for k in row if k.endswith("cold_ms") and not k.startswith("ort")][0]
    row["gbs_cold"] = moved / row[cold] / 1e6
    row["max_abs_err"] = err
    return row


def run() -> list[dict]:
    pick = re.compile(os.environ.get("TILECRAFT_DW_LAYERS", ".*"))
    rounds = int(os.environ.get("TILECRAFT_BENCH_ROUNDS", "7"))
    rows = []
    for c, hw, stride in LAYERS:
        label = f"{c} x {hw} x {hw} / {stride}"
        if not pick.search(label):
            continue
        row = measure(c, hw, stride, rounds=rounds)
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()},
              flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    from .common import print_table
    result = run()
    print_table(result, list(dict.fromkeys(k for r in result for k in r)))
