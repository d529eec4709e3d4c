"""Where a model's time goes, layer by layer, beside onnxruntime running the same model.

``python -m benchmarks.run layer_profile`` (``TILECRAFT_PROFILE_MODEL``: a zoo model, default
``resnet50``; ``TILECRAFT_PROFILE_RUNS``: runs per side per round, default 10;
``TILECRAFT_PROFILE_THREADS``: threads per side, default 2) builds the model untuned, runs
``VirtualMachine.profile`` and onnxruntime's own profiler in interleaved rounds (the same input,
the same threads), and groups both sides' kernel times by what they compute:
the operator kind (``conv``, ``max_pool``, ``avg_pool``, ``dense``, ...), the output shape
``(C, H, W)`` and, for a convolution, its input channels and kernel (``layer``: ``64 in 3x3``;
a grouped one's multiply-adds per output, ``64 in 9``). Writes
``benchmarks/results/layer_profile/<machine>.json`` and prints one row per group, slowest first:
``ours_ms`` / ``ort_ms`` (per model run, summed over the group's kernels), ``ratio``
(ort / ours: above 1 we are faster), and the kernel counts.

Why in the model and not layer by layer: a single layer run in onnxruntime pays for the copies
into and out of its NCHWc layout (``ReorderInput`` / ``ReorderOutput``) that a whole model
pays once, so ``cnn_ops_cpu`` flatters us by the price of those copies (ResNet-50's 1x1
64->256 layer: 1.5x faster alone, 0.7x in the model). onnxruntime's rows ``reorder`` and
ours ``vm`` (the time outside kernels) are listed on their own.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from collections import defaultdict

from tilecraft import targets
from tilecraft.relax import VirtualMachine, build, extract_tasks
from tilecraft.relax.backend.cpu.registry import block_rule
from tilecraft.relax.backend.cpu.expand_depthwise import RULE_EXPAND
from tilecraft.relax.backend.cpu.winograd import RULE_WINOGRAD_GEMM
from tilecraft.relax.frontend import from_onnx
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.stmt import Block
from tilecraft.zoo.models import light
from tilecraft.zoo.run import ort_session

ORT_KINDS = {"Conv": "conv", "FusedConv": "conv", "MaxPool": "max_pool",
             "AveragePool": "avg_pool", "GlobalAveragePool": "avg_pool", "Gemm": "dense",
             "FusedGemm": "dense", "MatMul": "dense", "ReorderInput": "reorder",
             "ReorderOutput": "reorder"}


def our_kind(name: str) -> str:
    """The operator kind of one of our fused kernels, from its name."""
    for key, kind in (("conv", "conv"), ("max_pool", "max_pool"), ("avg_pool", "avg_pool"),
                      ("dense", "dense"), ("matmul", "dense")):
        if key in name:
            return kind
    return name.removeprefix("fused_").split("_")[0]


def _chw(dims, nhwc: bool = False) -> tuple:
    dims = [int(d) for d in dims]
    if len(dims) == 5:                  # NCHWc: (N, C/c, H, W, c)
        dims = [dims[0], dims[1] * dims[4], dims[2], dims[3]]
    if nhwc and len(dims) == 4:         # (N, H, W, C), as onnxruntime names it: C x H x W
        dims = [dims[0], dims[3], dims[1], dims[2]]
    return tuple(dims[1:])


def _conv_layer(in_channels: int, macs: int) -> str:
    """A convolution's input channels and multiply-adds per output as a row label:
    ``64 in 3x3`` (576 = 64 x 3 x 3), ``64 in 9`` for a depthwise 3x3."""
    taps, rest = divmod(macs, in_channels)
    side = round(taps ** 0.5)
    if not rest and taps and side * side == taps:
        return f"{in_channels} in {side}x{side}"
    return f"{in_channels} in {macs}"


def _reduction_length(func) -> int:
    """The multiply-adds per output of ``func``'s longest reduction block (a convolution's
    input channels per group x kernel taps). A Winograd convolution's products reduce over
    the input channels alone: its length counts the 3 x 3 taps too, the direct
    convolution's multiply-adds (the layer's work, whatever the algorithm)."""
    lengths = [1]

    def visit(node):
        if isinstance(node, Block):
            extents = [int(iv.dom.extent.value) for iv in node.iter_vars if iv.kind == "reduce"]
            if extents:
                taps = 9 if block_rule(node) == RULE_WINOGRAD_GEMM else 1
                lengths.append(math.prod(extents) * taps)

    post_order_visit(func.body, visit)
    return max(lengths)


def _expansion_macs(func) -> int:
    """The multiply-adds of a fused expansion in ``func`` (``expand_depthwise``'s 1x1
    convolution computed under the depthwise one: its blocks' whole iteration domain), 0
    where there is none. The kernel's output and longest reduction count the depthwise
    layer's alone."""
    total = [0]

    def visit(node):
        if isinstance(node, Block) and block_rule(node) == RULE_EXPAND:
            total[0] += math.prod(int(iv.dom.extent.value) for iv in node.iter_vars)

    post_order_visit(func.body, visit)
    return total[0]


def _our_shapes(mod) -> dict[str, tuple]:
    """Kernel name -> (output shape without the batch, channels first whatever the kernel's
    layout; for a convolution its input channels and multiply-adds per output, else ""),
    from the kernels ``build`` schedules (the packed weights' shapes differ by kernel, the
    input's does not)."""
    shapes = {}
    for task in extract_tasks(mod, "llvm", baselines=False):
        out = task.func.buffer_map[-1][1]
        nhwc = "nhwc" in task.name
        layer = ""
        if our_kind(task.name) == "conv":
            data = task.func.buffer_map[0][1]
            cin = _chw((d.value for d in data.shape), nhwc)[0]
            layer = _conv_layer(cin, _reduction_length(task.func))
        shapes[task.name] = (_chw((d.value for d in out.shape), nhwc), layer)
    return shapes


def kernel_work(mod, byte_macs: float = 0.0) -> dict[str, int]:
    """Kernel name -> its multiply-adds per call (output elements x the longest reduction's
    length, plus a fused expansion's, ``_expansion_macs``; an elementwise kernel or a copy:
    its output elements), for the kernels ``build`` schedules for ``mod`` (static shapes).

    With ``byte_macs`` > 0, a kernel is charged at least ``byte_macs`` multiply-adds per byte
    of its parameters (every input and the output, once each): the roofline's memory side,
    the multiply-adds the machine could do in the time those bytes take to stream. A
    depthwise convolution does 9 multiply-adds per output, a 1x1 one hundreds: charged by
    its multiply-adds alone, a depthwise layer that runs at the memory's speed still takes
    several times its share (onnxruntime's as much as ours: docs/zoo.md)."""
    work = {}
    for task in extract_tasks(mod, "llvm", baselines=False):
        buffers = [b for _, b in task.func.buffer_map]
        macs = math.prod(int(d.value) for d in buffers[-1].shape) * \
            _reduction_length(task.func) + _expansion_macs(task.func)
        moved = sum(math.prod(int(d.value) for d in b.shape) * dt.bits(b.dtype) // 8
                    for b in buffers)
        work[task.name] = max(macs, int(byte_macs * moved))
    return work


def share_offenders(report, work: dict[str, int], slack: float = 2.0,
                    floor: float = 0.02, macs: dict[str, int] | None = None) -> list[dict]:
    """The kernels of a ``VirtualMachine.profile`` ``report`` that take more than their share:
    a share of the kernels' time above ``slack`` times their share of the work (``work``:
    ``kernel_work``) and at least ``floor`` of the time. Each: ``name``, ``time_share``,
    ``work_share``, ``gmacs`` (its rate of multiply-adds, ``macs`` where given, else of
    ``work``; the model's is the norm)."""
    rows = [r for r in report.rows if r["name"] != "(vm)"]
    names = sorted(work, key=len, reverse=True)     # call sites are the kernel name + a suffix
    macs = macs or work
    total_ms = sum(r["total_ms"] for r in rows) or 1.0
    per_row = []
    for r in rows:
        kernel = next((n for n in names if r["name"].startswith(n)), None)
        per_row.append((r, work.get(kernel, 0) * r["calls"], macs.get(kernel, 0) * r["calls"]))
    total_work = sum(w for _, w, _ in per_row) or 1
    out = []
    for r, w, m in per_row:
        t, f = r["total_ms"] / total_ms, w / total_work
        if t >= floor and t > slack * f:
            out.append({"name": r["name"], "time_share": t, "work_share": f,
                        "gmacs": m / max(r["total_ms"], 1e-9) / 1e6})
    return sorted(out, key=lambda o: -o["time_share"])


def profile_model(name: str = "resnet50", runs: int = 10, rounds: int = 5,
                  threads: int = 2) -> list[dict]:
    """Rows of (kind, shape) groups with both sides' milliseconds per model run, on
    ``threads`` threads each, for the zoo model ``name``."""
    z = light(name, seed=0)
    return profile_onnx(z.onnx_model, dict(z.inputs), runs, rounds, threads)


def profile_onnx(onnx_model, inputs: dict, runs: int = 10, rounds: int = 5,
                 threads: int = 2) -> list[dict]:
    """``profile_model`` for an ONNX model and its inputs (name -> array): rows of (kind,
    shape) groups with both sides' milliseconds per model run, on ``threads`` threads each."""
    mod = from_onnx(onnx_model)
    shapes = _our_shapes(mod)
    names = sorted(shapes, key=len, reverse=True)     # call sites are the kernel name + a suffix
    exe = build(mod, "llvm")
    exe.kernel_module.num_threads = threads
    vm = VirtualMachine(exe, targets.cpu(0))
    args = [targets.array(v) for v in inputs.values()]
    sess = ort_session(onnx_model, threads, profile_prefix=os.path.join(
        tempfile.gettempdir(), "tilecraft_layer_profile"))
    ours, theirs = defaultdict(float), defaultdict(float)
    counts = defaultdict(lambda: [0, 0])
    for _ in range(runs):                               # warm-up, not profiled below
        sess.run(None, inputs)
    for r in range(rounds):
        report = vm.profile(*args, number=runs)
        for row in report.rows:
            if row["name"] == "(vm)":
                key = ("vm", (), "")
            else:
                kernel = next((n for n in names if row["name"].startswith(n)), None)
                key = (our_kind(row["name"]), *shapes.get(kernel, ((), "")))
            ours[key] += row["total_ms"] / runs / rounds
            if r == 0:
                counts[key][0] += 1
        for _ in range(runs):
            sess.run(None, inputs)
    path = sess.end_profiling()
    try:
        with open(path) as f:
            events = json.load(f)
    finally:
        os.remove(path)
    model_runs = sum(1 for e in events if e.get("name") == "model_run")
    measured = rounds * runs
    skip = model_runs - measured                        # the warm-up runs come first
    seen_runs = 0
    for e in events:
        if e.get("name") == "model_run":
            seen_runs += 1
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        if seen_runs < skip:
            continue
        args_ = e.get("args", {})
        out = args_.get("output_type_shape") or [{}]
        dims = next(iter(out[0].values()), []) if out and out[0] else []
        op = args_.get("op_name", "")
        kind = ORT_KINDS.get(op, op.lower())
        layer = ""
        if kind == "conv":
            ins = [next(iter(t.values()), []) for t in args_.get("input_type_shape", [])]
            if len(ins) >= 2 and len(ins[1]) == 4:      # weight (O, I/groups, KH, KW)
                layer = _conv_layer(int(ins[0][1]),
                                    int(ins[1][1]) * int(ins[1][2]) * int(ins[1][3]))
        key = ("reorder", (), "") if kind == "reorder" else (kind, _chw(dims), layer)
        theirs[key] += e["dur"] / 1e3 / measured
        if seen_runs == skip:
            counts[key][1] += 1
    rows = []
    for key in sorted(set(ours) | set(theirs), key=lambda k: -max(ours[k], theirs[k])):
        kind, shape, layer = key
        row = {"kind": kind, "shape": "x".join(map(str, shape)), "layer": layer,
               "ours_ms": ours[key],
               "ort_ms": theirs[key], "ours_kernels": counts[key][0],
               "ort_kernels": counts[key][1]}
        if ours[key] and theirs[key]:
            row["ratio"] = theirs[key] / ours[key]
        rows.append(row)
    total = {"kind": "total", "shape": "", "ours_ms": sum(ours.values()),
             "ort_ms": sum(theirs.values())}
    total["ratio"] = total["ort_ms"] / total["ours_ms"]
    return rows + [total]


def run() -> list[dict]:
    name = os.environ.get("TILECRAFT_PROFILE_MODEL", "resnet50")
    threads = int(os.environ.get("TILECRAFT_PROFILE_THREADS", "2"))
    rows = profile_model(name, runs=int(os.environ.get("TILECRAFT_PROFILE_RUNS", "10")),
                         threads=threads)
    for r in rows:
        r["model"] = name
        r["threads"] = threads      # the results file is per machine, not per thread count
    return rows


if __name__ == "__main__":
    from .common import ensure_clean_openblas_env, print_table, write_results
    ensure_clean_openblas_env()
    result = run()
    write_results("layer_profile", result)
    print_table(result, ["kind", "shape", "layer", "ours_ms", "ort_ms", "ratio", "ours_kernels",
                         "ort_kernels"])
