"""The CPU operator suite: hand-scheduled tilecraft kernels beside numpy, scipy and onnxruntime.

``python -m benchmarks.run ops_cpu`` prints one row per kernel and writes
``benchmarks/results/ops_cpu/<machine>.json``:

=================  =======================================================  ==========
kernel             peer                                                     target
=================  =======================================================  ==========
add 16M f32        numpy ``np.add(a, b, out=c)``                             >= 1.0x
exp 16M f32        numpy ``np.exp(a, out=c)``                                >= 1.5x
GELU-tanh 16M f32  numpy ``0.5*x*(1+np.tanh(0.7978845608*(x+0.044715*x^3)))``  >= 1.5x
GELU-erf 16M f32   numpy + ``scipy.special.erf`` (row skipped without scipy)  >= 1.5x
softmax 4096x1024  numpy ``e = np.exp(x - x.max(1)); e / e.sum(1)``          >= 1.5x
conv2d 3x3 56x56   onnxruntime ``Conv`` (2 threads, weight an initializer)   >= 0.7x
=================  =======================================================  ==========

plus the GEMM rows of ``benchmarks.gemm_cpu`` when that module exists. ``ratio`` is peer time /
tilecraft time, both measured in this process, interleaved round by round (``side_by_side``),
as medians. Every kernel is checked against its peer's result before it is timed.

tilecraft kernels run on every core (the thread pool's default); numpy's ufuncs run on one,
onnxruntime on ``intra_op_num_threads = 2``. ``ratio_1t`` repeats the pair with tilecraft on one
core (and onnxruntime on one thread): on a shared machine, where other processes take the
second core at random, it shows the generated code itself. The elementwise kernels have a symbolic length
``n`` (one compiled kernel for every size); softmax and conv2d are compiled for their shapes.
The conv2d kernel takes NCHW input and OIHW weights and writes NCHW output: padding, the flat
layout and the copy back happen inside the timed call, nothing is pre-packed (onnxruntime may
pre-pack its initializer weights and convert layouts once at session creation).

``TILECRAFT_BENCH_ROUNDS`` (default 7) sets the interleaved rounds per kernel.
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np

from tilecraft import targets
from tilecraft.tensorir import Schedule

from .common import side_by_side
from .schedules import conv2d as conv_sched
from .schedules import elementwise as ew
from .schedules import softmax as sm

N_ELEMENTWISE = 1 << 24
SOFTMAX_SHAPE = (4096, 1024)
CONV = dict(batch=1, in_channels=64, out_channels=64, height=56, width=56, kernel=3, padding=1)

GELU_C = np.float32(ew.GELU_TANH_C)
GELU_K = np.float32(ew.GELU_TANH_K)


def _target():
    return targets.Target("llvm")


def _build(func, schedule):
    sch = Schedule(func)
    schedule(sch)
    return targets.build(sch.mod, _target())


def _measure(mod, ours, peer, number: int, rounds: int, peer_1t=None) -> dict:
    """Side-by-side medians: ``ours`` on every core against ``peer``, then ``ours`` on one
    core against ``peer_1t`` (default ``peer``: numpy's ufuncs use one core anyway). The
    one-core pair shows the code itself where other processes compete for the second core."""
    cores = mod.num_threads
    ours_s, peer_s = side_by_side(ours, peer, number=number, rounds=rounds)
    mod.num_threads = 1
    try:
        ours_1t, peer_1t_s = side_by_side(ours, peer_1t or peer, number=number, rounds=rounds)
    finally:
        mod.num_threads = cores
    return {"tilecraft_ms": ours_s * 1e3, "peer_ms": peer_s * 1e3, "ratio": peer_s / ours_s,
            "tilecraft_1t_ms": ours_1t * 1e3, "peer_1t_ms": peer_1t_s * 1e3,
            "ratio_1t": peer_1t_s / ours_1t}


def _row(kernel: str, peer: str, timing: dict, target_ratio: float, checked: str,
         **extra) -> dict:
    row = {"kernel": kernel, "tilecraft_ms": timing["tilecraft_ms"], "peer": peer,
           "peer_ms": timing["peer_ms"], "ratio": timing["ratio"], "target_ratio": target_ratio,
           "checked": checked, "ratio_1t": timing["ratio_1t"],
           "tilecraft_1t_ms": timing["tilecraft_1t_ms"], "peer_1t_ms": timing["peer_1t_ms"]}
    row.update(extra)
    return row


# ----------------------------------------------------------------------------------------------
# elementwise


def _elementwise_rows(rounds: int) -> list[dict]:
    tgt = _target()
    rng = np.random.default_rng(0)
    a = rng.standard_normal(N_ELEMENTWISE, dtype=np.float32)
    b = rng.standard_normal(N_ELEMENTWISE, dtype=np.float32)
    out = np.empty_like(a)
    peer_out = np.empty_like(a)

    def sched(name):
        return lambda sch: ew.schedule_elementwise(sch, name, tgt)

    rows = []
    # add
    mod = _build(ew.add_func(), sched("T_add"))
    mod["main"](a, b, out)
    np.testing.assert_array_equal(out, a + b)
    t = _measure(mod, lambda: mod["main"](a, b, out), lambda: np.add(a, b, out=peer_out), 5,
                 rounds)
    rows.append(_row("add 16M f32", "numpy np.add(out=)", t, 1.0, "== numpy (exact)",
                     GBps=3 * 4 * N_ELEMENTWISE / t["tilecraft_ms"] / 1e6))
    # exp
    mod = _build(ew.exp_func(), sched("T_exp"))
    mod["main"](a, out)
    np.testing.assert_allclose(out, np.exp(a), rtol=3e-7, atol=0)
    t = _measure(mod, lambda: mod["main"](a, out), lambda: np.exp(a, out=peer_out), 5, rounds)
    rows.append(_row("exp 16M f32", "numpy np.exp(out=)", t, 1.5, "allclose numpy rtol 3e-7",
                     GBps=2 * 4 * N_ELEMENTWISE / t["tilecraft_ms"] / 1e6))
    # GELU, tanh form
    def gelu_tanh_np():
        return 0.5 * a * (1 + np.tanh(GELU_C * (a + GELU_K * a * a * a)))

    mod = _build(ew.gelu_tanh_func(), sched("T_gelu"))
    mod["main"](a, out)
    np.testing.assert_allclose(out, gelu_tanh_np(), rtol=1e-5, atol=1e-6)
    t = _measure(mod, lambda: mod["main"](a, out), gelu_tanh_np, 3, rounds)
    rows.append(_row("GELU-tanh 16M f32", "numpy (np.tanh)", t, 1.5, "allclose numpy rtol 1e-5"))
    # GELU, erf form
    if importlib.util.find_spec("scipy") is not None:
        from scipy.special import erf

        inv_sqrt2 = np.float32(ew.INV_SQRT2)

        def gelu_erf_np():
            return a * np.float32(0.5) * (1 + erf(a * inv_sqrt2))

        mod = _build(ew.gelu_erf_func(), sched("T_gelu"))
        mod["main"](a, out)
        np.testing.assert_allclose(out, gelu_erf_np(), rtol=1e-5, atol=1e-6)
        t = _measure(mod, lambda: mod["main"](a, out), gelu_erf_np, 3, rounds)
        rows.append(_row("GELU-erf 16M f32", "numpy + scipy.special.erf", t, 1.5,
                         "allclose numpy/scipy rtol 1e-5"))
    return rows


# ----------------------------------------------------------------------------------------------
# softmax


def _softmax_rows(rounds: int) -> list[dict]:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(SOFTMAX_SHAPE) * 3).astype(np.float32)
    out = np.empty_like(x)

    def peer():
        e = np.exp(x - x.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    mod = _build(sm.softmax_func(SOFTMAX_SHAPE),
                 lambda sch: sm.schedule_softmax(sch, _target()))
    mod["main"](x, out)
    np.testing.assert_allclose(out, peer(), rtol=1e-5, atol=1e-8)
    t = _measure(mod, lambda: mod["main"](x, out), peer, 5, rounds)
    return [_row("softmax 4096x1024 f32", "numpy", t, 1.5, "allclose numpy rtol 1e-5")]


# ----------------------------------------------------------------------------------------------
# conv2d


def onnx_conv_session(weight: np.ndarray, input_shape, padding: int, threads: int = 2):
    """An onnxruntime session of one ``Conv`` node (weight an initializer), built in memory."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    k, c, kh, kw = weight.shape
    n, _, h, w = input_shape
    oh, ow = h + 2 * padding - kh + 1, w + 2 * padding - kw + 1
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, k, oh, ow])
    init = helper.make_tensor("w", TensorProto.FLOAT, list(weight.shape),
                              weight.astype(np.float32).ravel().tolist())
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[kh, kw],
                            pads=[padding] * 4, strides=[1, 1])
    graph = helper.make_graph([node], "conv2d", [x], [y], initializer=[init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def _conv_rows(rounds: int) -> list[dict]:
    if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None:
        return []
    cfg = CONV
    rng = np.random.default_rng(2)
    x = rng.standard_normal((cfg["batch"], cfg["in_channels"], cfg["height"], cfg["width"]),
                            dtype=np.float32)
    w = rng.standard_normal((cfg["out_channels"], cfg["in_channels"], cfg["kernel"],
                             cfg["kernel"]), dtype=np.float32) * np.float32(0.1)
    mod = _build(conv_sched.conv2d_nchw_func(**cfg),
                 lambda sch: conv_sched.schedule_conv2d_nchw(sch, _target()))
    y = np.empty((cfg["batch"], cfg["out_channels"], cfg["height"], cfg["width"]), np.float32)
    sess = onnx_conv_session(w, x.shape, cfg["padding"])
    feeds = {"x": x}
    mod["main"](x, w, y)
    ref = sess.run(None, feeds)[0]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    sess_1t = onnx_conv_session(w, x.shape, cfg["padding"], threads=1)
    t = _measure(mod, lambda: mod["main"](x, w, y), lambda: sess.run(None, feeds), 10, rounds,
                 peer_1t=lambda: sess_1t.run(None, feeds))
    flops = 2 * cfg["batch"] * cfg["out_channels"] * cfg["in_channels"] * cfg["kernel"] ** 2 * \
        cfg["height"] * cfg["width"]
    return [_row("conv2d 3x3 s1 p1 56x56 64->64 f32", "onnxruntime Conv (2 threads)", t, 0.7,
                 "allclose onnxruntime rtol 1e-4", GFLOPs=flops / t["tilecraft_ms"] / 1e6,
                 layout="NCHW in/out, OIHW weight, not pre-packed")]


# ----------------------------------------------------------------------------------------------


def _gemm_rows() -> list[dict]:
    if importlib.util.find_spec("benchmarks.gemm_cpu") is None:
        return []
    from . import gemm_cpu
    return list(gemm_cpu.run())


def run(rounds: int | None = None) -> list[dict]:
    """All rows: elementwise, softmax, conv2d, then GEMM (from ``benchmarks.gemm_cpu``)."""
    rounds = rounds or int(os.environ.get("TILECRAFT_BENCH_ROUNDS", "7"))
    rows = _elementwise_rows(rounds) + _softmax_rows(rounds) + _conv_rows(rounds)
    return rows + _gemm_rows()
