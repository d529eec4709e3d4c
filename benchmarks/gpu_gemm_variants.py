"""GEMM 4096^3 under variants of the default GPU schedule's GEMM rule, beside cuBLAS: a quick
device run to choose the GPU GEMM family's constants (``relax.backend.gpu.gemm``: tile, k-step,
register fragments, vector fetch) before a tuning run.

``python -m benchmarks.gpu_gemm_variants [opencl] [webgpu] [webgpu-adapter[-trusted]]`` prints one JSON row per variant and
writes them to ``benchmarks/results/gpu_gemm_variants/<machine>.json`` (the machine: the GPU
measured), copied to ``$OUT/gpu_gemm_variants.json`` when ``OUT`` is set (a device run's
output folder). Every variant's result is checked against float64 numpy.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

import numpy as np

from tilecraft import targets
from tilecraft.targets.webgpu_backend import runtime
from benchmarks.common import write_results
from benchmarks.gpu_common import gemm_func, torch_cuda_seconds, webgpu_adapter_target
from tilecraft.relax import gpu_schedules
from tilecraft.relax.backend.gpu import gemm as G

N = int(os.environ.get("GEMM_VARIANTS_N", "4096"))
T16 = {"GEMM_TILE": (16, 8), "GEMM_TILE_J": (16, 8)}     # 16 x 16 threads of 8 x 8
OPENCL = [
    {"GEMM_FRAGMENTS": False},
    {"GEMM_REGISTER_PREFETCH": False},
    {},
    {**T16, "GEMM_REGISTER_PREFETCH": False},
    T16,
    {**T16, "GEMM_BK": 8},
    {**T16, "GEMM_BK": 32},
    {"GEMM_TILE": (8, 16), "GEMM_TILE_J": (32, 4)},
    {"GEMM_BK": 8},
]
WEBGPU = [{"GEMM_FRAGMENTS_WEBGPU": False}, {"GEMM_REGISTER_PREFETCH": False}, {},
          {"GEMM_BK": 8}]
# WebGPU with the adapter's limits (``webgpu-adapter``, ``webgpu-adapter-trusted``: no naga
# run-time checks): the default (the k-step 16 with the padded row tile its 48 KB of workgroup
# storage hold), the k-step 8 of the spec's limits (the rule before it read the target)
WEBGPU_ADAPTER = [{}, {"GEMM_BK_WEBGPU_WIDE": 8}, {"GEMM_REGISTER_PREFETCH": False}]


def _device(kind):
    """(device, Target, name, is_gpu) of the first OpenCL device / WebGPU adapter; for
    ``webgpu-adapter`` (``-trusted``) the target has the adapter's own limits (and
    ``trusted_shaders``)."""
    if kind == "opencl":
        from benchmarks.tune_gpu import _opencl
        return _opencl()
    from benchmarks.tune_gpu import _webgpu
    dev, target, name, gpu = _webgpu()
    if kind.startswith("webgpu-adapter"):
        target = webgpu_adapter_target(kind == "webgpu-adapter-trusted")
        # the device opens with these limits (run a webgpu-adapter kind before plain webgpu)
        runtime.note_target(target)
    return dev, target, name, gpu


def run(kinds) -> list[dict]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((N, N)).astype("float32")
    b = rng.standard_normal((N, N)).astype("float32")
    ref = a.astype(np.float64) @ b.astype(np.float64)
    flops = 2.0 * N ** 3
    peer_s = None
    try:
        import torch
        if torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = False
            ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            peer_s = torch_cuda_seconds(torch, lambda: ta @ tb, 20, 5)
    except ImportError:
        pass
    rows, gpu_name = [], None
    for kind in kinds:
        dev, target, name, gpu = _device(kind)
        if gpu and gpu_name is None:
            gpu_name = name
        A, B = targets.array(a, dev), targets.array(b, dev)
        C = targets.empty((N, N), "float32", dev)
        variants = OPENCL if kind == "opencl" else \
            WEBGPU_ADAPTER if kind.startswith("webgpu-adapter") else WEBGPU
        for variant in variants:
            saved = {k: getattr(G, k) for k in variant}
            row = {"target": kind, "variant": {k: v for k, v in variant.items()}}
            try:
                for k, v in variant.items():
                    setattr(G, k, v)
                t0 = time.time()
                mod = targets.build(gpu_schedules.apply(gemm_func(N), target), target)
                mod[mod.entry_name](A, B, C)
                row["build_s"] = time.time() - t0
                err = float(np.abs(C.numpy() - ref).max() / np.abs(ref).max())
                row["rel_err"] = err
                if err > 1e-4:
                    raise AssertionError(f"wrong result (rel {err:.2e})")
                t = min(mod.time_evaluator(mod.entry_name, dev, number=10, repeat=3)(
                    A, B, C).median for _ in range(2))
                row.update({"ms": t * 1e3, "tflops": flops / t / 1e12})
                if peer_s:
                    row["ratio"] = peer_s / t
            except Exception as err:      # a variant over a limit: report it, go on
                row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            finally:
                for k, v in saved.items():
                    setattr(G, k, v)
            rows.append(row)
            print(json.dumps(row), flush=True)
    peer = None
    if peer_s:
        peer = {"peer": "torch cuBLAS fp32 (TF32 off)", "ms": peer_s * 1e3,
                "tflops": flops / peer_s / 1e12}
        print(json.dumps(peer), flush=True)
    path = write_results("gpu_gemm_variants", rows, {"peer": peer, "size": N}, gpu=gpu_name)
    print(f"(written to {path})")
    if os.environ.get("OUT"):
        shutil.copy(path, os.path.join(os.environ["OUT"], "gpu_gemm_variants.json"))
    return rows


if __name__ == "__main__":
    run(sys.argv[1:] or ["opencl", "webgpu"])
