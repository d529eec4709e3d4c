"""3xTF32 on NVIDIA OpenCL (``relax.backend.gpu.tensor_core_tf32``): float32 GEMMs on the TF32
tensor cores beside our SIMT float32 GEMM and PyTorch float32 (TF32 off: cuBLAS / cuDNN SIMT),
speed and accuracy against float64, in one process.

Rows: BERT-base's dense layers ``x @ W + bias`` with ``x`` of shape ``(n, 128, K)`` (a
symbolic batch, as the imported model has) at batch 1 and 16 (M = 128 and 2048) for (K, N) in
768 x 768, 768 x 3072 and 3072 x 768; and a ResNet-50 3 x 3 convolution (256 channels, 14 x 14,
stride 1, NCHW, batch 1 and 16) as an implicit GEMM. Kernels:

- ``simt``: the float32 kernel under the default GPU schedule for ``Target("opencl")``;
- ``tf32x3``: ``Target("opencl -device=nvidia -fp32-tensor-cores=3xtf32")``: 3xTF32;
- ``tf32x3s``: the same with the small terms in accumulators of their own
  (``TILECRAFT_TF32_SMALL_ACC=1``: fewer additions into the large sums, twice the registers);
- ``tf32x1``: the same kernel with one mma of the big parts (plain TF32; for the accuracy
  column: it is not float32-level);
- ``torch``: ``torch.addmm`` / ``conv2d`` in float32 on CUDA with TF32 off, CUDA events.

Accuracy (``*_err``): each kernel's output against float64 numpy on the same inputs, as
``max|got - ref| / max|ref|``; ``*_cerr`` componentwise, ``max(|got - ref| / (|x| @ |W|))``
(the bias's magnitude added), on standard-normal inputs; the ``spread`` rows (``K`` 768 and
3072, M = 128) scale every element by ``2^U(-16, 16)`` as well (values over 32 binades).
3xTF32 is meant to stay within a few times SIMT's error; TF32 is ~2^-11.

Times: ``time_evaluator`` best of 3 repeats of 20 calls; PyTorch CUDA events, best of 3.
``x3_vs_simt`` = simt time / tf32x3 time, ``x3_vs_torch`` = torch time / tf32x3 time (above
1: 3xTF32 faster). ``TILECRAFT_TC_TILE=BMxBNxWMxWN`` forces a tile.

Run on the GPU machine: ``python -m benchmarks.gpu_tf32`` (``benchmarks/tf32_device.sh``);
here (PoCL) a check of the script: ``TILECRAFT_TC_SMOKE=1 python -m benchmarks.gpu_tf32``
(small shapes, the emulated tensor cores, no timing worth reading, nothing written). Results:
``benchmarks/results/gpu_tf32/<gpu>.json``.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from .common import print_table, write_results
from .gpu_common import gpu_device, torch_cuda_seconds

SMOKE = os.environ.get("TILECRAFT_TC_SMOKE", "") not in ("", "0")
SEQ = 16 if SMOKE else 128
DENSE = ((64, 128), (128, 64)) if SMOKE else ((768, 768), (768, 3072), (3072, 768))
# (channels, image size) of the 3 x 3 stride-1 convolution
CONV = (16, 6) if SMOKE else (256, 14)
BATCHES = (1, 2) if SMOKE else (1, 16)
SPREAD_K = (64,) if SMOKE else (768, 3072)
DEVICE = "nvidia-emulated" if SMOKE else "nvidia"
TC_TARGET = f"opencl -device={DEVICE} -fp32-tensor-cores=3xtf32"


def dense_func(K: int, N: int):
    """``x[n, SEQ, K] @ W[K, N] + bias`` in float32."""
    from tilecraft.tensorir import te
    n = te.var("n")
    x = te.placeholder((n, SEQ, K), "float32", "x")
    w = te.placeholder((K, N), "float32", "w")
    b = te.placeholder((N,), "float32", "bias")
    k = te.reduce_axis((0, K), "k")
    mm = te.compute((n, SEQ, N), lambda i, s, j: te.sum(x[i, s, k] * w[k, j], axis=k),
                    "matmul")
    out = te.compute((n, SEQ, N), lambda i, s, j: mm[i, s, j] + b[j], "out")
    return te.create_prim_func([x, w, b, out])


def conv_func(C: int, H: int):
    """A 3 x 3, stride-1, padding-1 NCHW convolution ``(n, C, H, H)`` -> ``(n, C, H, H)``
    + bias, in float32 (``topi``-style: the padding its own stage, inlined)."""
    from tilecraft.tensorir import te
    n = te.var("n")
    x = te.placeholder((n, C, H, H), "float32", "x")
    w = te.placeholder((C, C, 3, 3), "float32", "w")
    b = te.placeholder((C,), "float32", "bias")
    pad = te.compute((n, C, H + 2, H + 2), lambda i, c, h, v: te.if_then_else(
        (h >= 1) & (h <= H) & (v >= 1) & (v <= H), x[i, c, h - 1, v - 1], 0.0), "pad")
    c = te.reduce_axis((0, C), "c")
    r = te.reduce_axis((0, 3), "r")
    q = te.reduce_axis((0, 3), "q")
    y = te.compute((n, C, H, H), lambda i, o, h, v: te.sum(
        w[o, c, r, q] * pad[i, c, h + r, v + q], axis=[c, r, q]), "conv")
    out = te.compute((n, C, H, H), lambda i, o, h, v: y[i, o, h, v] + b[o], "out")
    return te.create_prim_func([x, w, b, out])


def _modules(func):
    """The four builds of ``func``: simt, tf32x3, tf32x3s, tf32x1."""
    from tilecraft import targets
    from tilecraft.relax import gpu_schedules
    from tilecraft.relax.backend.gpu.tensor_core_tf32 import tf32_kernel
    from tilecraft.targets import Target
    simt = Target("opencl -device=cpu" if SMOKE else "opencl")
    tc = Target(TC_TARGET)
    return {"simt": targets.build(gpu_schedules.apply(func, simt), simt),
            "tf32x3": targets.build(tf32_kernel(func, tc, split="3xtf32", small_acc=False), tc),
            "tf32x3s": targets.build(tf32_kernel(func, tc, split="3xtf32", small_acc=True), tc),
            "tf32x1": targets.build(tf32_kernel(func, tc, split="1xtf32"), tc)}


def _conv_ref(x, w, b):
    """float64 3 x 3 stride-1 padding-1 convolution + bias (and the same of magnitudes)."""
    n, C, H, _ = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], H, H))
    for r in range(3):
        for q in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, r:r + H, q:q + H], w[:, :, r, q],
                             optimize=True)
    return out + b[None, :, None, None]


def _errors(got, ref, scale) -> tuple:
    diff = np.abs(np.asarray(got, np.float64) - ref)
    return float(diff.max() / np.abs(ref).max()), float((diff / scale).max())


def _measure(row, mods, args_np, out_shape, ref, scale, dev, time_it=True):
    from tilecraft import targets
    for name, mod in mods.items():
        args = [targets.array(a, dev) for a in args_np] + \
            [targets.empty(out_shape, "float32", dev)]
        mod["main"](*args)
        row[f"{name}_err"], row[f"{name}_cerr"] = _errors(args[-1].numpy(), ref, scale)
        if time_it:
            t = min(mod.time_evaluator("main", dev, number=20, repeat=3)(*args).results)
            row[f"{name}_ms"] = t * 1e3


def _ratios(row, flops):
    x3 = row.get("tf32x3_ms")
    if not x3:
        return
    row["tf32x3_tflops"] = flops / (x3 * 1e-3) / 1e12
    if row.get("simt_ms"):
        row["x3_vs_simt"] = row["simt_ms"] / x3
    if row.get("torch_ms"):
        row["x3_vs_torch"] = row["torch_ms"] / x3


def run() -> list[dict]:
    dev = gpu_device("opencl")
    rng = np.random.default_rng(0)
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        torch, cuda = None, False
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    rows = []

    def show(row):
        rows.append(row)
        print({k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in row.items()},
              flush=True)

    for K, N in DENSE:
        mods = _modules(dense_func(K, N))
        spreads = [0] + ([16] if K in SPREAD_K else [])
        for batch in BATCHES:
            for spread in spreads if batch == BATCHES[0] else [0]:
                x = rng.standard_normal((batch, SEQ, K))
                w = rng.standard_normal((K, N)) / np.sqrt(K)
                if spread:
                    x = x * np.exp2(rng.integers(-spread, spread + 1, x.shape))
                    w = w * np.exp2(rng.integers(-spread, spread + 1, w.shape))
                x, w = x.astype(np.float32), w.astype(np.float32)
                b = rng.standard_normal(N).astype(np.float32)
                xd, wd = x.astype(np.float64).reshape(-1, K), w.astype(np.float64)
                ref = (xd @ wd + b).reshape(batch, SEQ, N)
                scale = (np.abs(xd) @ np.abs(wd) + np.abs(b)).reshape(batch, SEQ, N)
                row = {"kernel": "dense", "K": K, "N": N, "batch": batch, "M": batch * SEQ,
                       "spread": spread}
                _measure(row, mods, [x, w, b], (batch, SEQ, N), ref, scale, dev,
                         time_it=not spread)
                if cuda:
                    xt = torch.from_numpy(x.reshape(-1, K)).cuda()
                    wt, bt = torch.from_numpy(w).cuda(), torch.from_numpy(b).cuda()
                    got = torch.addmm(bt, xt, wt).cpu().numpy().reshape(batch, SEQ, N)
                    row["torch_err"], row["torch_cerr"] = _errors(got, ref, scale)
                    if not spread:
                        row["torch_ms"] = torch_cuda_seconds(
                            torch, lambda: torch.addmm(bt, xt, wt), 20, 3, best=True) * 1e3
                _ratios(row, 2 * batch * SEQ * K * N)
                show(row)
    C, H = CONV
    mods = _modules(conv_func(C, H))
    for batch in BATCHES:
        x = rng.standard_normal((batch, C, H, H)).astype(np.float32)
        w = (rng.standard_normal((C, C, 3, 3)) / np.sqrt(9 * C)).astype(np.float32)
        b = rng.standard_normal(C).astype(np.float32)
        xd, wd = x.astype(np.float64), w.astype(np.float64)
        ref = _conv_ref(xd, wd, b)
        scale = _conv_ref(np.abs(xd), np.abs(wd), np.abs(b))
        row = {"kernel": f"conv3x3 {C}ch {H}x{H}", "K": 9 * C, "N": C, "batch": batch,
               "M": batch * H * H, "spread": 0}
        _measure(row, mods, [x, w, b], (batch, C, H, H), ref, scale, dev)
        if cuda:
            import torch.nn.functional as F
            xt, wt, bt = (torch.from_numpy(a).cuda() for a in (x, w, b))
            got = F.conv2d(xt, wt, bt, padding=1).cpu().numpy()
            row["torch_err"], row["torch_cerr"] = _errors(got, ref, scale)
            row["torch_ms"] = torch_cuda_seconds(
                torch, lambda: F.conv2d(xt, wt, bt, padding=1), 20, 3, best=True) * 1e3
        _ratios(row, 2 * batch * H * H * C * 9 * C)
        show(row)
    if SMOKE:
        print("(smoke run: no results written)")
        return rows
    gpu = torch.cuda.get_device_name(0) if cuda else None
    write_results("gpu_tf32", rows, {"torch_tf32": False}, gpu=gpu)
    return rows


def main(argv=None) -> int:
    rows = run()
    print_table(rows, ["kernel", "K", "N", "M", "spread", "simt_ms", "tf32x3_ms", "torch_ms",
                       "tf32x3s_ms", "x3_vs_simt", "x3_vs_torch", "simt_err", "tf32x3_err",
                       "tf32x3s_err", "tf32x1_err", "torch_err", "simt_cerr", "tf32x3_cerr",
                       "tf32x3s_cerr", "tf32x1_cerr", "torch_cerr"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
