"""MobileNet-V2's narrow 1x1 projections (NHWC, bias) with their input in the caches and from
memory, beside onnxruntime: where their batch-8 time goes.

At batch 8 these layers took 11-16x their batch-1 time in the model (onnxruntime's 7.6-8.5x).
This benchmark separates the two causes that could explain it: the symbolic batch (the kernel
built for ``n <= 8`` against the one built for batch 8) and the memory (batch 1 on one input,
which stays in the caches from call to call, against batch 1 over ``COLD_BYTES`` of distinct
inputs, each of which has left the caches by the time it comes round again). Per image, one
thread, the thread's CPU time, medians of ``ROUNDS`` interleaved rounds (the columns in a new
order each round, each column's timed calls after an untimed one).

Rows: ``layer`` (``in -> out @ plane``), ``hot_ms`` (batch 1, one input), ``cold_ms`` (batch 1,
rotating inputs), ``batch8_ms`` (symbolic build at batch 8, per image), ``concrete8_ms`` (the
batch-8 build, per image), the same three for onnxruntime (``ort_hot_ms``, ``ort_cold_ms``,
``ort_batch8_ms``; its NCHW graph, which it runs NCHWc with a layout reorder before and after),
``noprefetch_cold_ms`` and ``noprefetch8_ms`` (the symbolic build without the NHWC tile's
software prefetch, ``conv2d_nhwc.PREFETCH_TILES_AHEAD = 0``), ``prefetch_gain`` (batch 8
without over with the prefetch: above 1 it pays),
``cold_over_hot`` (ours), ``ort_cold_over_hot``, ``vs_ort_cold`` and ``vs_ort_batch8``
(onnxruntime's time over ours: above 1 we are faster), ``max_abs_err`` (against numpy in
float64).

``python -m benchmarks.run nhwc_cold_input``.
"""
from __future__ import annotations

import statistics
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.backend.cpu import conv2d_nhwc
from tilecraft.zoo.run import ort_session

# MobileNet-V2's 1x1 projections on 56 x 56 and 28 x 28 planes: (in channels, plane side, out
# channels)
LAYERS = ((144, 56, 24), (96, 56, 24), (192, 28, 32), (144, 28, 32))
# the distinct inputs of the cold runs together: twice the 32 MB L3 of the machines measured
COLD_BYTES = 64 << 20
ROUNDS = 7


def layer_function(c: int, hw: int, o: int, batch, w: np.ndarray, b: np.ndarray,
                   upper_bounds: dict | None = None, prefetch: bool = True):
    """The layer ``NHWC conv2d 1x1 + bias`` built for ``batch`` (an int, or a name with
    ``upper_bounds``), one thread: the VM's ``main``. ``prefetch=False`` builds the NHWC tile
    without its software prefetch."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch, hw, hw, c), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.conv2d(x, const(w), data_layout="NHWC"))
            gv = bb.emit_output(bb.emit(op.add(y, const(b.reshape(1, 1, 1, o)))))
        bb.emit_func_output(gv)
    ahead = conv2d_nhwc.PREFETCH_TILES_AHEAD
    conv2d_nhwc.PREFETCH_TILES_AHEAD = ahead if prefetch else 0
    try:
        exe = relax.build(bb.get(), "llvm", upper_bounds=upper_bounds)
    finally:
        conv2d_nhwc.PREFETCH_TILES_AHEAD = ahead
    exe.kernel_module.num_threads = 1
    return relax.VirtualMachine(exe, targets.cpu(0))["main"]


def _ort_layer(c: int, hw: int, o: int, w: np.ndarray, b: np.ndarray):
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"])
    graph = helper.make_graph(
        [node], "projection",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", c, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", o, hw, hw])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return ort_session(model, threads=1)


def _cpu_ms(fn, calls: int) -> float:
    """Thread CPU milliseconds of one ``fn()``, the mean of ``calls`` calls."""
    t0 = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - t0) / calls * 1e3


def measure(c: int, hw: int, o: int, seed: int = 0, cold_bytes: int = COLD_BYTES) -> dict:
    """One row: the layer ``c -> o`` on an ``hw x hw`` plane, ours and onnxruntime's, hot, cold
    and at batch 8 (per image)."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(-0.05, 0.05, (o, c, 1, 1)).astype("float32")
    b = rng.uniform(-1, 1, (o,)).astype("float32")
    symbolic = layer_function(c, hw, o, "n", w, b, {"n": 8})
    concrete = layer_function(c, hw, o, 8, w, b)
    plain = layer_function(c, hw, o, "n", w, b, {"n": 8}, prefetch=False)
    sess = _ort_layer(c, hw, o, w, b)

    count = max(2, -(-cold_bytes // (hw * hw * c * 4)))
    xs = [rng.uniform(-1, 1, (1, hw, hw, c)).astype("float32") for _ in range(count)]
    x8 = rng.uniform(-1, 1, (8, hw, hw, c)).astype("float32")
    ours1 = [targets.array(x) for x in xs]
    ours8 = targets.array(x8)
    ort1 = [x.transpose(0, 3, 1, 2).copy() for x in xs]
    ort8 = x8.transpose(0, 3, 1, 2).copy()

    want = np.einsum("nhwc,oc->nhwo", x8.astype(np.float64), w[:, :, 0, 0]) + b
    err = max(float(np.abs(f(ours8).numpy() - want).max()) for f in (symbolic, concrete, plain))
    if err > 1e-3:
        raise AssertionError(f"{c} -> {o} @ {hw}: off numpy by {err}")

    def cold(fn, inputs):
        return lambda: [fn(x) for x in inputs]

    columns = {
        "hot_ms": (lambda: symbolic(ours1[0]), 5, 1),
        "ort_hot_ms": (lambda: sess.run(None, {"x": ort1[0]}), 5, 1),
        "cold_ms": (cold(symbolic, ours1), 1, count),
        "ort_cold_ms": (cold(lambda x: sess.run(None, {"x": x}), ort1), 1, count),
        "batch8_ms": (lambda: symbolic(ours8), 2, 8),
        "concrete8_ms": (lambda: concrete(ours8), 2, 8),
        "ort_batch8_ms": (lambda: sess.run(None, {"x": ort8}), 2, 8),
        "noprefetch_cold_ms": (cold(plain, ours1), 1, count),
        "noprefetch8_ms": (lambda: plain(ours8), 2, 8),
    }
    samples = {k: [] for k in columns}
    for _ in range(ROUNDS):
        # interleaved, in a new order each round: the machine's load, and what the column
        # before left in the caches and the allocator, fall on every column alike
        for k in rng.permutation(list(columns)):
            fn, calls, images = columns[k]
            # an untimed call first: each column starts from its own inputs as the caches hold
            # them after a call, not from what the column before it left there (the rotating
            # inputs of a cold column evict a batch-8 input)
            fn()
            samples[k].append(_cpu_ms(fn, calls) / images)
    row = {"layer": f"{c} -> {o} @ {hw}x{hw}"}
    row.update({k: statistics.median(v) for k, v in samples.items()})
    row["cold_over_hot"] = row["cold_ms"] / row["hot_ms"]
    row["ort_cold_over_hot"] = row["ort_cold_ms"] / row["ort_hot_ms"]
    row["vs_ort_cold"] = row["ort_cold_ms"] / row["cold_ms"]
    row["vs_ort_batch8"] = row["ort_batch8_ms"] / row["batch8_ms"]
    row["prefetch_gain"] = row["noprefetch8_ms"] / row["batch8_ms"]
    row["max_abs_err"] = err
    return row


def run() -> list[dict]:
    rows = []
    for c, hw, o in LAYERS:
        row = measure(c, hw, o)
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()},
              flush=True)
        rows.append(row)
    return rows
