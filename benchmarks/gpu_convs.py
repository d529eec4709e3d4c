"""ResNet-50's convolution layers alone on the GPU, beside ``torch.nn.functional.conv2d`` on
CUDA in the same process (fp32, TF32 off): each kernel as the whole model runs it.

Each layer (torchvision's ResNet-50, input 224 x 224) is a Relax function ``relu(conv2d(x, W) +
b)`` on NCHW data with a symbolic batch (the bias and ReLU fused into the kernel, as after the
model's batch norm is folded), built once per target and variant, run at batch 1 and 16 with
the input on the device, checked against numpy (batch 1) and timed with
``vm.time_evaluator`` (best of 3 repeats of 20 calls). Variants: ``direct`` (the implicit-GEMM
convolution of the default GPU schedules) and, for the layers ``GPUWinograd`` takes (3x3,
stride 1, 64+ channels), ``winograd`` (``relax.backend.gpu.winograd``). PyTorch's time is
CUDA events around 20 calls of ``relu(conv2d(x, W, b))``, best of 3. ``vs_torch`` = PyTorch's
time / ours (above 1: we are faster); ``tflops`` counts the direct convolution's
multiply-adds (2 per) for every variant, so Winograd's rows show the effective rate.
``count`` is how many times the layer occurs in ResNet-50; the list leaves out 8 of its 53
convolutions (each stage's first 1x1 layer and its strided 1x1 downsampling), so
``count x ms`` summed is most, not all, of the model's convolution time.

Run: ``python -m benchmarks.gpu_convs`` (on the GPU machine: ~30-50 s for the default layers on
OpenCL). ``TILECRAFT_GPU_CONV_LAYERS`` (comma-separated names of ``LAYERS``, default all),
``TILECRAFT_GPU_CONV_TARGETS`` (``opencl``; ``opencl,webgpu`` for both),
``TILECRAFT_GPU_CONV_BATCHES`` (``1,16``), ``TILECRAFT_GPU_CONV_VARIANTS`` (``direct,winograd``),
``TILECRAFT_GPU_CONV_SECONDS`` (50: no new layer starts after this many seconds).
Results: ``benchmarks/results/gpu_convs/<machine>.json`` (the machine: the CUDA GPU PyTorch ran
on, else this CPU's name).
"""
from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

from .common import print_table, write_results
from .gpu_common import RESNET50_CONVS, gpu_device, torch_cuda_seconds

# ResNet-50's layers (``gpu_common.RESNET50_CONVS``: name, in channels, image side, out
# channels, kernel, stride, padding, count in ResNet-50) this benchmark times, the most telling first (the time budget may cut the list): the stride-1 3x3 layers (direct
# and Winograd), then the small-image 1x1 and strided layers, then the rest
_BY_NAME = {layer[0]: layer for layer in RESNET50_CONVS}
LAYERS = tuple(_BY_NAME[name] for name in (
    "s3_3x3", "s1_3x3", "s2_3x3", "s4_3x3", "s3_1x1_1024to256", "s3_1x1_256to1024",
    "s4_1x1_2048to512", "s4_1x1_512to2048", "s4_3x3s2", "s3_3x3s2", "s2_3x3s2",
    "s2_1x1_512to128", "s2_1x1_128to512", "s1_1x1_256to64", "s1_1x1_64to256", "stem_7x7s2"))
BATCHES = [int(b) for b in os.environ.get("TILECRAFT_GPU_CONV_BATCHES", "1,16").split(",")]

WRITES_RESULTS = True


def _module(cin, size, cout, k, stride, pad, rng):
    """``relu(conv2d(x, W) + b)`` with a symbolic batch, and its weight and bias."""
    from tilecraft import tensorir
    from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
    from tilecraft.relax.op import nn
    w = (rng.standard_normal((cout, cin, k, k)) / math.sqrt(cin * k * k)).astype("float32")
    b = rng.standard_normal((1, cout, 1, 1)).astype("float32")
    x = Var("x", TensorStructInfo((tensorir.var("n"), cin, size, size), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = nn.conv2d(x, const(w), strides=(stride, stride), padding=(pad, pad))
            out = bb.emit_output(bb.emit(nn.relu(op.add(bb.emit(y), const(b)))))
        bb.emit_func_output(out)
    return bb.get(), w, b


def _reference(x, w, b, stride, pad):
    n, c, h, _ = x.shape
    o, _, k, _ = w.shape
    p = np.pad(x.astype("float64"), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - k) // stride + 1
    out = np.zeros((n, o, oh, oh))
    for dy in range(k):
        for dx in range(k):
            win = p[:, :, dy:dy + stride * oh:stride, dx:dx + stride * oh:stride]
            out += np.einsum("nchw,oc->nohw", win, w[:, :, dy, dx].astype("float64"))
    return np.maximum(out + b, 0)


def _torch_seconds(torch, x, w, b, stride, pad, number=20, repeat=3):
    F = torch.nn.functional
    xt, wt, bt = (torch.from_numpy(a).cuda() for a in (x, w, b.reshape(-1)))

    def f():
        return F.relu(F.conv2d(xt, wt, bt, stride=stride, padding=pad))
    with torch.no_grad():
        return torch_cuda_seconds(torch, f, number, repeat, best=True)


def _build(mod, kind: str, variant: str):
    """``relax.build`` of ``mod`` with the GPU Winograd pass on (``winograd``) or off."""
    from tilecraft import relax
    from tilecraft.relax.transform import get_pipeline
    passes = get_pipeline(target=kind).passes
    if variant == "direct":
        passes = [p for p in passes if p.name != "GPUWinograd"]
    return relax.build(mod, kind, pipeline=passes)


def run() -> list[dict]:
    """The rows, also written to ``benchmarks/results/gpu_convs/<machine>.json``."""
    import torch
    from tilecraft import relax, targets
    from tilecraft.relax.backend.cpu.geometry import ConvGeometry
    from tilecraft.relax.backend.gpu import winograd
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cuda = torch.cuda.is_available()
    gpu_name = torch.cuda.get_device_name(0) if cuda else "no-cuda"
    pick = [s for s in os.environ.get("TILECRAFT_GPU_CONV_LAYERS", "").split(",") if s]
    kinds = os.environ.get("TILECRAFT_GPU_CONV_TARGETS", "opencl").split(",")
    variants = os.environ.get("TILECRAFT_GPU_CONV_VARIANTS", "direct,winograd").split(",")
    budget = float(os.environ.get("TILECRAFT_GPU_CONV_SECONDS", "50"))
    unknown = set(pick) - {layer[0] for layer in LAYERS}
    if unknown:
        raise SystemExit(f"unknown layers {sorted(unknown)}; known: {[l[0] for l in LAYERS]}")
    rng = np.random.default_rng(0)
    rows, start = [], time.perf_counter()
    for name, cin, size, cout, k, stride, pad, count in LAYERS:
        if pick and name not in pick:
            continue
        if time.perf_counter() - start > budget:
            rows.append({"layer": name, "error": f"skipped: past the {budget:.0f} s budget"})
            continue
        mod, w, b = _module(cin, size, cout, k, stride, pad, rng)
        g = ConvGeometry(cin, size, size, cout, (k, k), (stride, stride), (pad,) * 4, (1, 1), 1)
        out_size = (size + 2 * pad - k) // stride + 1
        for kind in kinds:
            for variant in variants:
                if variant == "winograd" and not winograd.winograd_applies(g):
                    continue
                try:
                    dev = gpu_device(kind)
                    vm = relax.VirtualMachine(_build(mod, kind, variant), dev)
                except Exception as err:  # a missing driver or a build failure is a row
                    rows.append({"layer": name, "target": kind, "variant": variant,
                                 "error": f"{type(err).__name__}: {str(err)[:300]}"})
                    print(f"{name} {kind} {variant}: {rows[-1]['error']}", file=sys.stderr)
                    continue
                for bsz in BATCHES:
                    x = rng.standard_normal((bsz, cin, size, size)).astype("float32")
                    try:
                        x_dev = targets.array(x, dev)
                        got = vm["main"](x_dev).numpy()
                        err = None
                        if bsz == 1:
                            ref = _reference(x, w, b, stride, pad)
                            err = float(np.max(np.abs(got - ref)) / (np.max(np.abs(ref)) + 1e-30))
                        ours = min(vm.time_evaluator("main", dev, number=20, repeat=3)(
                            x_dev).results)
                        peer = _torch_seconds(torch, x, w, b, stride, pad) if cuda else None
                    except Exception as e:  # keep the other rows
                        rows.append({"layer": name, "target": kind, "variant": variant,
                                     "batch": bsz, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                        print(f"{name} {kind} {variant} b{bsz}: {rows[-1]['error']}",
                              file=sys.stderr)
                        continue
                    flops = 2.0 * bsz * cout * out_size * out_size * cin * k * k
                    row = {"layer": name, "target": kind, "variant": variant, "batch": bsz,
                           "count": count, "tilecraft_ms": ours * 1e3,
                           "tflops": flops / ours * 1e-12, "max_rel_err": err}
                    if peer is not None:
                        row.update(torch_ms=peer * 1e3, torch_tflops=flops / peer * 1e-12,
                                   vs_torch=peer / ours)
                    rows.append(row)
                    print(f"{name} {kind} {variant} b{bsz}: ours {ours * 1e3:.3f} ms "
                          f"({row['tflops']:.1f} TFLOP/s)"
                          + (f", torch {peer * 1e3:.3f} ms, ratio {peer / ours:.2f}"
                             if peer is not None else "")
                          + (f", rel err {err:.1e}" if err is not None else ""), flush=True)
    path = write_results("gpu_convs", rows, {"gpu": gpu_name}, gpu=gpu_name if cuda else None)
    print(f"(written to {path})")
    return rows


def main(argv=None) -> int:
    rows = run()
    print_table([r for r in rows if "error" not in r],
                ["layer", "target", "variant", "batch", "count", "tilecraft_ms", "tflops",
                 "torch_ms", "vs_torch"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
