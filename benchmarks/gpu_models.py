"""Whole models on the GPU: ResNet-50 and one BERT-base encoder layer, untuned (the GPU default
schedules), through OpenCL and WebGPU, beside PyTorch eager on the same GPU.

Both models are PyTorch modules with random weights (torchvision's ResNet-50 structure; the zoo's
Hugging Face-style ``BertLayer``), exported to ONNX with a symbolic batch, imported with
``relax.frontend.from_onnx`` and built once per target: the same executable runs batch 1 and 16.
Every output is checked against PyTorch (fp32, TF32 off) before it is timed. Times are wall
clock around ``vm.time_evaluator`` (which synchronizes the device) and CUDA-synchronized PyTorch
calls; ``vs_torch`` = PyTorch's time / ours (above 1: we are faster).

Run: ``python -m benchmarks.run gpu_models`` (needs torch; PyTorch's column needs CUDA).
Results: ``benchmarks/results/gpu_models/<machine>.json`` (the machine: the CUDA GPU PyTorch
ran on, else this CPU's name).
"""
from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

from .common import print_table, write_results

BATCHES = [int(b) for b in os.environ.get("TILECRAFT_GPU_MODEL_BATCHES", "1,16").split(",")]


def _resnet50():
    import torch.nn as nn
    import torch.nn.functional as F

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)))
            out = F.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return F.relu(out + (x if self.down is None else self.down(x)))

    class ResNet50(nn.Module):
        """torchvision's ResNet-50 (v1.5: stride in the 3x3 conv)."""

        def __init__(self, classes=1000):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], 64
            for width, n, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
                for i in range(n):
                    blocks.append(Bottleneck(cin, width, stride if i == 0 else 1))
                    cin = width * 4
            self.layers = nn.Sequential(*blocks)
            self.fc = nn.Linear(2048, classes)

        def forward(self, x):
            import torch
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    return ResNet50()


def _models():
    import torch
    from tilecraft.zoo.models import _export, _randomize_bn, _torch_modules

    torch.manual_seed(0)
    resnet = _resnet50()
    _randomize_bn(resnet, 0)
    resnet.eval()
    # the zoo's BertLayer class is local to _torch_modules: reach it through BertBase's layers
    bert = _torch_modules()["BertBase"](layers=1).layers[0].eval()
    x_img = torch.randn(1, 3, 224, 224)
    x_txt = torch.randn(1, 128, 768)
    return [
        ("resnet50", resnet, _export(resnet, [x_img], ["input"],
                                     dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}}),
         lambda b: np.random.default_rng(b).standard_normal((b, 3, 224, 224)).astype("float32"),
         {"batch": max(BATCHES)}),
        ("bert_layer_s128", bert, _export(bert, [x_txt], ["input"],
                                          dynamic_axes={"input": {0: "batch"},
                                                        "output": {0: "batch"}}),
         lambda b: np.random.default_rng(b).standard_normal((b, 128, 768)).astype("float32"),
         {"batch": max(BATCHES)}),
    ]


def _torch_time(module, x: np.ndarray, device: str, number: int = 10, repeat: int = 5):
    import torch
    with torch.no_grad():
        t = torch.from_numpy(x).to(device)
        m = module.to(device)
        out = m(t)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        sync()
        best = math.inf
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                m(t)
            sync()
            best = min(best, (time.perf_counter() - start) / number)
        return out.cpu().numpy(), best


def _device(target: str):
    """The NVIDIA GPU for OpenCL when there is one (else the first device); WebGPU's
    high-performance adapter."""
    from tilecraft import targets
    if target.startswith("opencl"):
        try:
            return targets.opencl("NVIDIA")
        except Exception:
            return targets.opencl(0)
    return targets.webgpu(0)


# run() writes the results itself, under the GPU's name (``benchmarks.run`` does not)
WRITES_RESULTS = True


def run() -> list[dict]:
    """The rows, also written to ``benchmarks/results/gpu_models/<machine>.json``."""
    import torch
    from tilecraft import relax
    from tilecraft import targets
    from tilecraft.relax.frontend import from_onnx

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cuda = torch.cuda.is_available()
    kinds = os.environ.get("TILECRAFT_GPU_MODEL_TARGETS", "opencl,webgpu").split(",")
    gpu_name = torch.cuda.get_device_name(0) if cuda else "no-cuda"
    rows = []
    for name, module, onnx_model, make_input, bounds in _models():
        mod = from_onnx(onnx_model)
        for kind in kinds:
            try:
                dev = _device(kind)
                t0 = time.perf_counter()
                exe = relax.build(mod, kind, upper_bounds=bounds)
                build_s = time.perf_counter() - t0
                vm = relax.VirtualMachine(exe, dev)
            except Exception as err:  # a missing driver or a build failure is a row, not a crash
                rows.append({"model": name, "target": kind, "error": f"{type(err).__name__}: "
                             f"{str(err)[:300]}"})
                print(f"{name} {kind}: {rows[-1]['error']}", file=sys.stderr)
                continue
            for b in BATCHES:
                x = make_input(b)
                try:
                    ref, torch_s = _torch_time(module, x, "cuda" if cuda else "cpu")
                    out = vm["main"](x)
                    out = out[0] if isinstance(out, tuple) else out
                    got = out.numpy()
                    err = float(np.max(np.abs(got - ref)) / (np.max(np.abs(ref)) + 1e-30))
                    ours = vm.time_evaluator("main", dev, number=3, repeat=3)(x)
                    ours_s = min(ours.results)
                except Exception as e:  # keep the other rows
                    rows.append({"model": name, "target": kind, "batch": b,
                                 "error": f"{type(e).__name__}: {str(e)[:300]}"})
                    print(f"{name} {kind} b{b}: {rows[-1]['error']}", file=sys.stderr)
                    continue
                rows.append({"model": name, "target": kind, "batch": b,
                             "build_s": round(build_s, 1),
                             "tilecraft_ms": ours_s * 1e3,
                             "torch_ms": torch_s * 1e3,
                             "torch_device": "cuda" if cuda else "cpu",
                             "vs_torch": torch_s / ours_s,
                             "max_rel_err_vs_torch": err, "match": err < 1e-3})
                print(f"{name} {kind} b{b}: ours {ours_s * 1e3:.2f} ms, torch {torch_s * 1e3:.2f}"
                      f" ms, ratio {torch_s / ours_s:.2f}, rel err {err:.1e}", flush=True)
    path = write_results("gpu_models", rows, {"gpu": gpu_name}, gpu=gpu_name if cuda else None)
    print(f"(written to {path})")
    return rows


def main(argv=None) -> int:
    rows = run()
    print_table([r for r in rows if "error" not in r],
                ["model", "target", "batch", "tilecraft_ms", "torch_ms", "vs_torch", "match"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
