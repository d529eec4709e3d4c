"""One dense layer with each fused epilogue (none, ReLU, GELU erf form, GELU tanh form): what the
epilogue costs in the tile's write-back, beside PyTorch eager running the same layer.

The layer is BERT's FFN input at 8 x 128 tokens of the ``hf_models_cpu`` config:
``act(x @ W + b)``, ``x`` ``(batch, seq, K)`` with ``batch`` and ``seq`` symbolic (built once,
upper bounds 8 and 128, as ``hf_models_cpu``'s symbolic build), ``K`` = 256, ``N`` = 1024 (env
``TILECRAFT_DENSE_K`` / ``TILECRAFT_DENSE_N``; BERT-base is 768 / 3072). One thread, each
call's thread CPU time, medians over ``TILECRAFT_BENCH_ROUNDS`` (default 15) rounds in which
every variant runs in a random order.

Rows: ``epilogue``, ``ms`` (ours), ``extra_ms`` (over the layer without an epilogue),
``ns_per_output`` (``extra_ms`` per output value), ``torch_ms`` (``F.linear`` then the
activation, as eager runs it: two passes), ``max_abs_err`` (against float64 numpy / scipy on
the same inputs).

``python -m benchmarks.dense_epilogue_cpu`` (prints its table; no results file).
"""
from __future__ import annotations

import math
import os
import statistics
import time

import numpy as np

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op

EPILOGUES = ("none", "relu", "gelu", "gelu_tanh")
SHAPE = (8, 128)


def layer_function(w: np.ndarray, b: np.ndarray, epilogue: str):
    """``epilogue(x @ w + b)`` on ``x`` ``(batch, seq, K)``, symbolic ``batch`` and ``seq``,
    one thread: the VM's ``main``."""
    k = w.shape[0]
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("batch", "seq", k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.add(bb.emit(op.matmul(x, const(w))), const(b)))
            if epilogue != "none":
                y = bb.emit(getattr(op.nn, epilogue)(y))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    exe = relax.build(bb.get(), "llvm", upper_bounds={"batch": SHAPE[0], "seq": SHAPE[1]})
    exe.kernel_module.num_threads = 1
    return relax.VirtualMachine(exe, targets.cpu(0))["main"]


def reference(y: np.ndarray, epilogue: str) -> np.ndarray:
    """The epilogue in float64 on the pre-activation ``y``."""
    from scipy.special import erf
    y = y.astype(np.float64)
    if epilogue == "relu":
        return np.maximum(y, 0)
    if epilogue == "gelu":
        return 0.5 * y * (1 + erf(y / math.sqrt(2)))
    if epilogue == "gelu_tanh":
        return 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
    return y


def _torch_layer(w: np.ndarray, b: np.ndarray, epilogue: str):
    import torch
    import torch.nn.functional as F
    wt, bt = torch.from_numpy(w.T.copy()), torch.from_numpy(b)
    act = {"none": lambda t: t, "relu": F.relu, "gelu": F.gelu,
           "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[epilogue]

    def run(x):
        with torch.no_grad():
            return act(F.linear(x, wt, bt))
    return run


def measure(k: int = 256, n: int = 1024, rounds: int = 15, seed: int = 0,
            epilogues=EPILOGUES, shape=SHAPE, peer: bool = True) -> list[dict]:
    """One row per epilogue of the layer ``k -> n`` at ``shape`` tokens."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / math.sqrt(k)).astype("float32")
    b = (0.1 * rng.standard_normal(n)).astype("float32")
    x = rng.standard_normal(tuple(shape) + (k,)).astype("float32")
    y = x.astype(np.float64) @ w + b
    arg = targets.array(x)
    fns, errs = {}, {}
    for e in epilogues:
        f = layer_function(w, b, e)
        errs[e] = float(np.abs(f(arg).numpy() - reference(y, e)).max())
        fns[e] = lambda f=f: f(arg)
        if peer:
            import torch
            t = _torch_layer(w, b, e)
            xt = torch.from_numpy(x)
            torch.set_num_threads(1)
            fns["torch " + e] = lambda t=t: t(xt)
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name in rng.permutation(list(fns)):
            fn = fns[name]
            fn()
            t0 = time.thread_time()
            for _ in range(5):
                fn()
            samples[name].append((time.thread_time() - t0) / 5 * 1e3)
    med = {name: statistics.median(s) for name, s in samples.items()}
    outputs = int(np.prod(shape)) * n
    rows = []
    for e in epilogues:
        extra = med[e] - med["none"] if "none" in med else None
        rows.append({"epilogue": e, "ms": med[e], "extra_ms": extra,
                     "ns_per_output": None if extra is None else extra * 1e6 / outputs,
                     "torch_ms": med.get("torch " + e), "max_abs_err": errs[e]})
    return rows


def run() -> list[dict]:
    rounds = int(os.environ.get("TILECRAFT_BENCH_ROUNDS", "15"))
    k = int(os.environ.get("TILECRAFT_DENSE_K", "256"))
    n = int(os.environ.get("TILECRAFT_DENSE_N", "1024"))
    rows = measure(k, n, rounds=rounds)
    print(f"load average {os.getloadavg()[0]:.2f}")
    return rows


if __name__ == "__main__":
    from .common import print_table
    result = run()
    print_table(result, list(dict.fromkeys(k for r in result for k in r)))
