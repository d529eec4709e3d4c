"""Attention on the GPU: the fused attention kernel (``relax.transform.FuseAttention``) against
the unfused kernels (scores matmul, softmax, matmul: the default pipeline without the pass)
and PyTorch eager on the same GPU, at BERT-base's shapes (12 heads of 64, sequence 128).

Cases: ``bert`` (``softmax(Q Kᵀ / 8) V``, no mask), ``padding`` (plus an additive mask of shape
``(batch, 1, 1, L)``), ``causal`` (a bool ``(L, L)`` lower-triangular mask, ``where(mask, s,
-inf)``, as GPT-2 imports). One Relax function per case with a symbolic batch, built once per
target and variant, run at batch 1 and 16 with the inputs on the device, checked against
numpy, timed with ``vm.time_evaluator`` (best of 3 x 20 calls); PyTorch eager (matmul, softmax,
matmul, fp32, TF32 off) beside it in the same process.

Variants: ``unfused``; ``fused`` (the tiled kernel, ``attention.flash_kernel``); ``fused
rows`` (the former kernel, ``ATTENTION_KERNEL = "rows"``: the before / after in one run).
``TILECRAFT_ATTN_TARGETS`` (``opencl,webgpu``; ``webgpu-adapter``: WebGPU built for the
adapter's limits, ``targets.webgpu(0).target()``; ``webgpu-adapter-trusted``: the same with
``trusted_shaders``, no naga run-time checks), ``TILECRAFT_ATTN_BATCHES`` (``1,16``),
``TILECRAFT_ATTN_SEQ`` (128), ``TILECRAFT_ATTN_ROWS_KERNEL`` (1; 0 leaves the former kernel
out), ``TILECRAFT_ATTN_TILES``: tiled-kernel tiles to compare, ``BR x BC x TR x TC``
comma-separated (default: the module's ``FLASH_TILE`` / ``FLASH_TILE_WEBGPU`` only; where a
tile exceeds the target's shared memory ``flash_tiles`` halves its key step, then its rows).

Run: ``python -m benchmarks.gpu_attention``. Results: ``benchmarks/results/gpu_attention/
<machine>.json`` (the machine: the CUDA GPU PyTorch ran on, else this CPU's name).
"""
from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

from .common import print_table, write_results
from .gpu_common import webgpu_adapter_target

HEADS, HEAD = 12, 64
SEQ = int(os.environ.get("TILECRAFT_ATTN_SEQ", "128"))
BATCHES = [int(b) for b in os.environ.get("TILECRAFT_ATTN_BATCHES", "1,16").split(",")]
CASES = ("bert", "padding", "causal")

WRITES_RESULTS = True


def _module(case: str):
    from tilecraft import tensorir
    from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
    from tilecraft.relax.op import nn
    L = SEQ
    n = tensorir.var("n")    # one batch for every input (a string names a new dim each time)
    params = [Var("q", TensorStructInfo((n, HEADS, L, HEAD), "float32")),
              Var("kt", TensorStructInfo((n, HEADS, HEAD, L), "float32")),
              Var("v", TensorStructInfo((n, HEADS, L, HEAD), "float32"))]
    if case == "padding":
        params.append(Var("mask", TensorStructInfo((n, 1, 1, L), "float32")))
    if case == "causal":
        params.append(Var("mask", TensorStructInfo((L, L), "bool")))
    bb = BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            q, kt, v = params[:3]
            s = bb.emit(op.divide(bb.emit(op.matmul(q, kt)), const(np.float32(8.0))))
            if case == "padding":
                s = bb.emit(op.add(s, params[3]))
            if case == "causal":
                s = bb.emit(op.where(params[3], s, const(np.float32(-math.inf))))
            out = bb.emit_output(bb.emit(op.matmul(bb.emit(nn.softmax(s, axis=-1)), v)))
        bb.emit_func_output(out)
    return bb.get()


def _inputs(case: str, b: int, rng):
    L = SEQ
    x = [rng.standard_normal((b, HEADS, L, HEAD)).astype("float32"),
         rng.standard_normal((b, HEADS, HEAD, L)).astype("float32"),
         rng.standard_normal((b, HEADS, L, HEAD)).astype("float32")]
    if case == "padding":
        keep = np.arange(L)[None, :] < rng.integers(L // 2, L + 1, size=(b, 1))
        x.append(np.where(keep, 0.0, -10000.0).astype("float32").reshape(b, 1, 1, L))
    if case == "causal":
        x.append(np.tril(np.ones((L, L), dtype=bool)))
    return x


def _reference(case: str, x):
    s = x[0].astype("float64") @ x[1] / 8.0
    if case == "padding":
        s = s + x[3]
    if case == "causal":
        s = np.where(x[3], s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ x[2]


def _torch_time(case, x, device, number=20, repeat=3):
    import torch
    t = [torch.from_numpy(a).to(device) for a in x]

    def f():
        s = torch.matmul(t[0], t[1]) / 8.0
        if case == "padding":
            s = s + t[3]
        if case == "causal":
            s = torch.where(t[3], s, torch.tensor(-math.inf, device=device))
        return torch.matmul(torch.softmax(s, dim=-1), t[2])
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.no_grad():
        f()
        sync()
        best = math.inf
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                f()
            sync()
            best = min(best, (time.perf_counter() - start) / number)
    return best


def _variants(target):
    """(name, pipeline, kernel, tile) to build: unfused, the tiled kernel per tile, then the
    former kernel (``kernel``: ``attention.ATTENTION_KERNEL`` for the build)."""
    from tilecraft.relax.transform import get_pipeline
    passes = get_pipeline(target=target).passes
    out = [("unfused", [p for p in passes if p.name != "FuseAttention"], "tiled", None)]
    tiles = os.environ.get("TILECRAFT_ATTN_TILES", "")
    for t in [t for t in tiles.split(",") if t] or [None]:
        cfg = tuple(int(v) for v in t.split("x")) if t else None
        out.append((f"fused {t}" if t else "fused", None, "tiled", cfg))
    if os.environ.get("TILECRAFT_ATTN_ROWS_KERNEL", "1") != "0":
        out.append(("fused rows", None, "rows", None))
    return out


def run() -> list[dict]:
    import torch
    from tilecraft import relax, targets
    from tilecraft.relax.backend.gpu import attention
    from tilecraft.targets import Target
    torch.backends.cuda.matmul.allow_tf32 = False
    cuda = torch.cuda.is_available()
    gpu_name = torch.cuda.get_device_name(0) if cuda else "no-cuda"
    kinds = os.environ.get("TILECRAFT_ATTN_TARGETS", "opencl,webgpu").split(",")
    if any(k.startswith("webgpu-adapter") for k in kinds):
        # the device opened with the adapter target's limits before anything uses it: both
        # WebGPU builds then run on one device (as benchmarks/gpu_models.py does)
        from tilecraft.targets.webgpu_backend import runtime
        runtime.note_target(webgpu_adapter_target())
    defaults = (attention.FLASH_TILE, attention.FLASH_TILE_WEBGPU)
    rows = []
    for case in CASES:
        mod = _module(case)
        for kind in kinds:
            dev = targets.opencl(0) if kind.startswith("opencl") else targets.webgpu(0)
            # webgpu-adapter: the adapter's own limits (more workgroup storage: the tiled
            # kernel's Qᵀ-in-shared-memory tile where it fits)
            target = webgpu_adapter_target(kind == "webgpu-adapter-trusted") \
                if kind.startswith("webgpu-adapter") else Target(kind)
            for variant, pipeline, kernel, cfg in _variants(target):
                attention.FLASH_TILE, attention.FLASH_TILE_WEBGPU = \
                    (cfg, cfg) if cfg else defaults
                attention.ATTENTION_KERNEL = kernel
                try:
                    exe = relax.build(mod, target, pipeline=pipeline)
                    vm = relax.VirtualMachine(exe, dev)
                except Exception as err:  # a build failure is a row, not a crash
                    rows.append({"case": case, "target": kind, "variant": variant,
                                 "error": f"{type(err).__name__}: {str(err)[:300]}"})
                    print(rows[-1], file=sys.stderr)
                    continue
                for b in BATCHES:
                    x = _inputs(case, b, np.random.default_rng(b))
                    xd = [targets.array(a, dev) for a in x]
                    got = vm["main"](*xd).numpy()
                    ref = _reference(case, x)
                    err = float(np.max(np.abs(got - ref)))
                    ours = min(vm.time_evaluator("main", dev, number=20, repeat=3)(*xd).results)
                    theirs = _torch_time(case, x, "cuda" if cuda else "cpu")
                    rows.append({"case": case, "target": kind, "variant": variant, "batch": b,
                                 "kernels": len(exe.kernel_names), "tilecraft_ms": ours * 1e3,
                                 "torch_ms": theirs * 1e3, "vs_torch": theirs / ours,
                                 "max_abs_err": err, "match": err < 1e-3})
                    print(f"{case} {kind} {variant} b{b}: ours {ours * 1e3:.3f} ms, torch "
                          f"{theirs * 1e3:.3f} ms, ratio {theirs / ours:.2f}, err {err:.1e}",
                          flush=True)
    attention.FLASH_TILE, attention.FLASH_TILE_WEBGPU = defaults
    attention.ATTENTION_KERNEL = "tiled"
    path = write_results("gpu_attention", rows, {"gpu": gpu_name}, gpu=gpu_name if cuda else None)
    print(f"(written to {path})")
    return rows


def main(argv=None) -> int:
    rows = run()
    print_table([r for r in rows if "error" not in r],
                ["case", "target", "variant", "batch", "tilecraft_ms", "torch_ms", "vs_torch",
                 "match"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
