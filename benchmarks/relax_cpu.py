"""Whole models on the CPU: an untuned ``relax.build`` beside onnxruntime running the same graph.

``python -m benchmarks.run relax_cpu`` (run it as
``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m benchmarks.run relax_cpu``;
the runner re-executes itself without those variables anyway) prints one row per case and writes
``benchmarks/results/relax_cpu/<machine>.json``:

==========================  =====================================================  ======
case                        model (``tilecraft.models``)                          target
==========================  =====================================================  ======
mlp b1, mlp b64             4-layer MLP 784-1024-1024-1024-10, relu; batch 1 / 64  >= 0.5x
bert_layer b1 s128          one BERT-base encoder layer (768, 12 heads, FFN 3072)  >= 0.5x
resnet_bottleneck b1        ResNet-50 bottleneck 256-64-64-256 at 56x56, NCHW      >= 0.5x
==========================  =====================================================  ======

Both sides run the same graph with the same weights: the Relax module from the model builder,
built with ``relax.build(mod, "llvm", upper_bounds=...)`` and no tuning database (every kernel
gets ``relax.default_schedules``), and the builder's ONNX model in an onnxruntime session with
``intra_op_num_threads = 2`` and all graph optimizations. The batch and sequence dims stay
symbolic: the two MLP rows share one executable. Before timing, the VM's result is checked
against onnxruntime's (``rtol 1e-3``).

Columns: ``tilecraft_ms`` and ``onnxruntime_ms`` (medians of interleaved rounds, in one process:
``benchmarks.common.side_by_side``), ``ratio`` = onnxruntime / tilecraft (above 1: we are
faster), ``kernels_before`` (``call_tir`` after ``LegalizeOps``: one kernel per operator) and
``kernels_after`` (kernel calls per run of the built program, after fusion),
``vm_us_per_kernel`` (``vm.profile``'s ``(vm)`` row, the time outside kernels, per kernel
call), ``top_kernel`` (the kernel that takes the largest share of the time, from ``vm.profile``),
and ``static_ms`` / ``static_ratio``: the same model built with its dims fixed at the case's
sizes, timed against onnxruntime the same way -- what the symbolic dims cost.

``TILECRAFT_BENCH_ROUNDS`` (default 7) sets the interleaved rounds per case.
"""
from __future__ import annotations

import os
import time

import numpy as np

from tilecraft import targets
from tilecraft.models import Model, bert_encoder_layer, mlp, onnx_session, resnet_bottleneck
from tilecraft.relax import Function, build, VirtualMachine
from tilecraft.relax.transform import LegalizeOps
from tilecraft.tensorir.function import IRModule
from tilecraft.tensorir.functor import post_order_visit

from .common import side_by_side

TARGET_RATIO = 0.5     # untuned: within 2x of onnxruntime


def count_call_tir(mod: IRModule) -> int:
    """The number of ``call_tir`` / ``call_tir_dps`` calls in the module's Relax functions."""
    count = 0

    def visit(n):
        nonlocal count
        op = getattr(n, "op", None)
        if getattr(op, "name", None) in ("relax.call_tir", "relax.call_tir_dps"):
            count += 1
    for f in mod.functions.values():
        if isinstance(f, Function):
            post_order_visit(f, visit)
    return count


def _number_for(fn, budget_s: float = 0.15) -> int:
    """Calls per timed round so that a round takes about ``budget_s``."""
    t0 = time.perf_counter()
    fn()
    dt = max(time.perf_counter() - t0, 1e-6)
    return max(1, min(200, int(budget_s / dt)))


def _cases():
    """(label, model, sizes of its dims, upper bounds for the build, a builder of the same model
    with those dims static); cases that share a model object share one executable."""
    m = mlp()
    return [("mlp b1", m, {"batch": 1}, {"batch": 64}, lambda: mlp(batch=1)),
            ("mlp b64", m, {"batch": 64}, {"batch": 64}, lambda: mlp(batch=64)),
            ("bert_layer b1 s128", bert_encoder_layer(), {"batch": 1, "seq_len": 128},
             {"batch": 1, "seq_len": 128}, lambda: bert_encoder_layer(batch=1, seq_len=128)),
            ("resnet_bottleneck b1", resnet_bottleneck(), {"batch": 1}, {"batch": 1},
             lambda: resnet_bottleneck(batch=1))]


def measure(label: str, model: Model, sizes: dict, vm: VirtualMachine, sess, rounds: int,
            kernels_before: int, static_vm: VirtualMachine | None = None) -> tuple[dict, object]:
    """Check the VM against onnxruntime on random inputs of ``sizes``, then time both (and
    ``static_vm``, the model built with those sizes static, against onnxruntime again); return
    the row and the ``vm.profile`` report."""
    rng = np.random.default_rng(1)
    inputs = model.make_inputs(rng, **sizes)
    feed = dict(zip(model.input_names, inputs))
    ours_out = vm["main"](*inputs).numpy()
    peer_out = sess.run(None, feed)[0]
    np.testing.assert_allclose(ours_out, peer_out, rtol=1e-3, atol=1e-4,
                               err_msg=f"{label}: tilecraft and onnxruntime disagree")
    args = [targets.array(a) for a in inputs]
    fn = vm["main"]

    def ours():
        return fn(*args)

    def peer():
        return sess.run(None, feed)

    number = _number_for(ours)
    ours_s, peer_s = side_by_side(ours, peer, number=number, rounds=rounds)
    static = {}
    if static_vm is not None:
        static_fn = static_vm["main"]
        np.testing.assert_allclose(static_fn(*args).numpy(), peer_out, rtol=1e-3, atol=1e-4,
                                   err_msg=f"{label} (static): tilecraft and onnxruntime "
                                           f"disagree")
        static_s, peer2_s = side_by_side(lambda: static_fn(*args), peer, number=number,
                                         rounds=rounds)
        static = {"static_ms": static_s * 1e3, "static_ratio": peer2_s / static_s}
    prof = vm.profile(*args, number=max(3, number))
    kernel_rows = [r for r in prof.rows if r["name"] != "(vm)"]
    vm_row = next(r for r in prof.rows if r["name"] == "(vm)")
    calls = sum(r["calls"] for r in kernel_rows)
    top = max(kernel_rows, key=lambda r: r["total_ms"]) if kernel_rows else None
    return {"model": label, "tilecraft_ms": ours_s * 1e3, "onnxruntime_ms": peer_s * 1e3,
            "ratio": peer_s / ours_s, "target_ratio": TARGET_RATIO,
            "kernels_before": kernels_before, "kernels_after": calls // prof.runs,
            "vm_us_per_kernel": vm_row["total_ms"] * 1e3 / calls if calls else 0.0,
            "top_kernel": f"{top['name']} {top['percent']:.0f}%" if top else "",
            **static, "checked": "allclose onnxruntime rtol 1e-3"}, prof


def run(profiles: dict | None = None) -> list[dict]:
    """One row per case (see the module docstring); ``profiles``, when given, receives each
    case's ``vm.profile`` report by label."""
    rounds = int(os.environ.get("TILECRAFT_BENCH_ROUNDS", "7"))
    built: dict[int, tuple] = {}
    rows = []
    for label, model, sizes, bounds, make_static in _cases():
        if id(model) not in built:
            t0 = time.perf_counter()
            exe = build(model.mod, "llvm", upper_bounds=bounds)
            build_s = time.perf_counter() - t0
            built[id(model)] = (VirtualMachine(exe), onnx_session(model, threads=2),
                                count_call_tir(LegalizeOps()(model.mod)), build_s)
        vm, sess, before, build_s = built[id(model)]
        static_vm = VirtualMachine(build(make_static().mod, "llvm"))
        row, prof = measure(label, model, sizes, vm, sess, rounds, before, static_vm)
        row["build_s"] = build_s
        if profiles is not None:
            profiles[label] = prof
        rows.append(row)
    return rows


if __name__ == "__main__":   # python -m benchmarks.relax_cpu: the table without the JSON file
    from .common import ensure_clean_openblas_env, print_table
    ensure_clean_openblas_env()
    reports: dict = {}
    result = run(reports)
    print_table(result, list(result[0]))
    for label, report in reports.items():
        print(f"\n{label}:\n{report}")
