"""Whole models on the GPU: ResNet-50, MobileNet-V2, one BERT-base encoder layer, BERT-base and
GPT-2 small (sequence 128), untuned (the GPU default schedules), through OpenCL and WebGPU,
beside PyTorch eager on the same GPU.

The models are PyTorch modules with random weights (torchvision's ResNet-50 structure; the zoo's
MobileNet-V2, Hugging Face-style ``BertLayer``, ``BertBase`` and ``GPT2Small``), exported to
ONNX with a symbolic batch, imported with
``relax.frontend.from_onnx`` and built once per target: the same executable runs batch 1 and 16.
Every output is checked against PyTorch (fp32, TF32 off) before it is timed. Both sides take
their input already on the device. Times are wall clock around ``vm.time_evaluator`` (which
synchronizes the device; best of 3 repeats of 10 calls) and CUDA-synchronized PyTorch calls
(best of 5 repeats of 10); ``vs_torch`` = PyTorch's time / ours (above 1: we are faster).

Run: ``python -m benchmarks.run gpu_models`` (needs torch; PyTorch's column needs CUDA).
``TILECRAFT_GPU_MODELS`` picks models (comma-separated names of ``MODELS``),
``TILECRAFT_GPU_MODEL_TARGETS`` targets (``opencl,webgpu,webgpu-adapter``: WebGPU built for the
spec's default limits — what any browser grants — and for the adapter's own,
``targets.webgpu(0).target()``, whose workgroup storage gives the GEMM family the k-step 16
(``relax.backend.gpu.gemm.webgpu_k_step``); ``webgpu-adapter-k8`` too, not by default: the
adapter's limits with the GEMM k-step of 8 the rule gave before (patched in while building:
the A/B of the k-step in one call); ``webgpu-adapter-trusted`` and
``webgpu-adapter-k8-trusted``, not by default: the same with the target's ``trusted_shaders``
on, shader modules without naga's run-time checks; the word ``noreuse`` after
``webgpu-adapter`` (``webgpu-adapter-noreuse``, ``webgpu-adapter-noreuse-trusted``) builds
with ``wgsl.WORKGROUP_READ_REUSE`` off: every workgroup read its own access, as before),
``TILECRAFT_GPU_MODEL_BATCHES``
batches (``1,16``), ``TILECRAFT_GPU_MODEL_PROFILE=1`` a per-kernel profile in every row
(``kernels_us``: WebGPU's from GPU timestamps, OpenCL's from ``vm.profile``), ``TILECRAFT_GPU_MODEL_NOMINAL_BATCH`` the batch the GEMM tiles are sized
for from batch 4 on (``relax.backend.gpu.gemm.GEMM_NOMINAL_BATCH``, default 8; 1: one tile
sized for batch 1 at every batch, as before), ``TILECRAFT_GPU_MODEL_LARGE_BATCH`` the batch
from which the third tile, sized for ``GEMM_LARGE_NOMINAL_BATCH`` (16), runs (default 12; 0:
no third tile). ``TILECRAFT_GPU_WINOGRAD=0`` builds the 3x3
stride-1 convolutions as direct implicit GEMMs instead of Winograd F(2x2, 3x3)
(``relax.transform.GPUWinograd``), for an A/B of the whole model in one device call;
``TILECRAFT_GPU_SPLITK=0`` builds without split-K (``relax.backend.gpu.split_k``: BERT's and
GPT-2's 768-wide dense layers at batch 1 and 2, ResNet-50's late convolutions), each row's
``split_k`` says which.
Results: ``benchmarks/results/gpu_models/<machine>.json`` (the machine: the CUDA GPU PyTorch
ran on, else this CPU's name). A run of some models, targets or batches replaces only their rows
in the file (the others are kept; every row carries its ``measured`` time), so the device's
short calls add up to one table.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time

import numpy as np

from .common import machine_name, print_table, results_path, write_results
from .gpu_common import gpu_device, kernel_profile, webgpu_adapter_target

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


MODELS = ("resnet50", "mobilenet_v2", "bert_layer_s128", "bert_base_s128", "gpt2_small_s128")
SEQ = 128


def _image(b):
    return np.random.default_rng(b).standard_normal((b, 3, 224, 224)).astype("float32")


def _ids(vocab):
    return lambda b: np.random.default_rng(b).integers(0, vocab, (b, SEQ)).astype("int64")


def _models(names=None):
    """(name, torch module, ONNX model, input maker, upper bounds) of the models named by
    ``names`` (default: ``TILECRAFT_GPU_MODELS``, else all of ``MODELS``), each exported with
    a symbolic batch (the text models at a fixed sequence of 128)."""
    import torch
    from tilecraft.zoo.models import _export, _randomize_bn, _torch_modules

    wanted = (list(names) if names is not None
              else os.environ.get("TILECRAFT_GPU_MODELS", ",".join(MODELS)).split(","))
    unknown = set(wanted) - set(MODELS)
    if unknown:
        raise ValueError(f"TILECRAFT_GPU_MODELS: unknown models {sorted(unknown)}; "
                         f"known: {', '.join(MODELS)}")
    bounds = {"batch": max(BATCHES)}
    image_axes = {"input": {0: "batch"}, "output": {0: "batch"}}
    out = []
    for name in [m for m in MODELS if m in wanted]:
        torch.manual_seed(0)
        if name in ("resnet50", "mobilenet_v2"):
            module = _resnet50() if name == "resnet50" else _torch_modules()["MobileNetV2"]()
            _randomize_bn(module, 0)
            module.eval()
            onnx_model = _export(module, [torch.randn(1, 3, 224, 224)], ["input"],
                                 dynamic_axes=image_axes)
            out.append((name, module, onnx_model, _image, bounds))
        elif name == "bert_layer_s128":
            # the zoo's BertLayer class is local to _torch_modules: reach it through BertBase
            module = _torch_modules()["BertBase"](layers=1).layers[0].eval()
            onnx_model = _export(module, [torch.randn(1, SEQ, 768)], ["input"],
                                 dynamic_axes=image_axes)
            out.append((name, module, onnx_model,
                        lambda b: np.random.default_rng(b).standard_normal((b, SEQ, 768))
                        .astype("float32"), bounds))
        else:
            cls, vocab = (("BertBase", 30522) if name == "bert_base_s128" else
                          ("GPT2Small", 50257))
            module = _torch_modules()[cls]().eval()
            ids = torch.from_numpy(_ids(vocab)(1))
            onnx_model = _export(module, [ids], ["input_ids"],
                                 dynamic_axes={"input_ids": {0: "batch"},
                                               "output": {0: "batch"}})
            out.append((name, module, onnx_model, _ids(vocab), bounds))
    return out


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


def _options(kind: str) -> tuple[str, set, int | None]:
    """A name of ``TILECRAFT_GPU_MODEL_TARGETS`` as (base, options, submit_every): the words
    ``k8``, ``noreuse`` and ``trusted`` after ``webgpu-adapter``, and ``submitN`` after any WebGPU kind
    (``webgpu-adapter-trusted-submit512``: the WebGPU runtime submits every 512 commands
    while this kind is timed)."""
    words = kind.split("-")
    submit = None
    if kind.startswith("webgpu") and words[-1].startswith("submit") and words[-1][6:].isdigit():
        submit = int(words.pop()[6:])
    if words[:2] == ["webgpu", "adapter"]:
        return "webgpu-adapter", set(words[2:]), submit
    return "-".join(words), set(), submit


def _target(kind: str):
    """What ``relax.build`` gets for a name of ``TILECRAFT_GPU_MODEL_TARGETS``:
    ``webgpu-adapter`` (and ``webgpu-adapter-k8``) is WebGPU with the adapter's own limits,
    ``webgpu-adapter-trusted`` (``webgpu-adapter-k8-trusted``) the same with
    ``trusted_shaders`` (no naga run-time checks), the others are target strings."""
    base, options, _ = _options(kind)
    if base == "webgpu-adapter":
        return webgpu_adapter_target("trusted" in options)
    return base


@contextlib.contextmanager
def _submit_every(kind: str, dev):
    """For a ``...-submitN`` kind: the WebGPU device submits every N commands while it runs."""
    n = _options(kind)[2]
    if n is None:
        yield
        return
    from tilecraft.targets.webgpu_backend import runtime
    ctx = runtime.context(dev.index)
    saved, ctx.submit_every = ctx.submit_every, n
    try:
        yield
    finally:
        ctx.submit_every = saved


@contextlib.contextmanager
def _gemm_kstep(kind: str):
    """For ``webgpu-adapter-k8``: the GEMM family's WebGPU k-step held at 8 while the model
    builds (the rule before it read the target's workgroup storage: ``gemm.GEMM_BK_WEBGPU_WIDE``
    set to ``GEMM_BK_WEBGPU``; restored after)."""
    from tilecraft.relax.backend.gpu import gemm
    if "k8" not in _options(kind)[1]:
        yield
        return
    saved = gemm.GEMM_BK_WEBGPU_WIDE
    gemm.GEMM_BK_WEBGPU_WIDE = gemm.GEMM_BK_WEBGPU
    try:
        yield
    finally:
        gemm.GEMM_BK_WEBGPU_WIDE = saved


@contextlib.contextmanager
def _wgsl_reuse(kind: str):
    """For a ``...-noreuse`` kind: ``wgsl.WORKGROUP_READ_REUSE`` off while the model builds."""
    from tilecraft.targets.webgpu_backend import wgsl
    if "noreuse" not in _options(kind)[1]:
        yield
        return
    saved, wgsl.WORKGROUP_READ_REUSE = wgsl.WORKGROUP_READ_REUSE, False
    try:
        yield
    finally:
        wgsl.WORKGROUP_READ_REUSE = saved


def _open_webgpu_for(kinds) -> None:
    """With ``webgpu-adapter`` among ``kinds``, open the WebGPU device with the adapter
    target's limits before anything uses it: both WebGPU builds then run on one device."""
    if any(k.startswith("webgpu-adapter") for k in kinds):
        from tilecraft.targets.webgpu_backend import runtime
        runtime.note_target(_target("webgpu-adapter"))


PROFILE = os.environ.get("TILECRAFT_GPU_MODEL_PROFILE", "") not in ("", "0")


# run() writes the results itself, under the GPU's name (``benchmarks.run`` does not)
WRITES_RESULTS = True


def run() -> list[dict]:
    """The rows, also written to ``benchmarks/results/gpu_models/<machine>.json``."""
    import torch
    from tilecraft import relax
    from tilecraft import targets
    from tilecraft.relax.frontend import from_onnx

    from tilecraft.relax.backend.gpu import gemm, split_k
    nominal = os.environ.get("TILECRAFT_GPU_MODEL_NOMINAL_BATCH")
    if nominal:    # the GEMM tile's sizing batch (gemm.GEMM_NOMINAL_BATCH), for a sweep
        gemm.GEMM_NOMINAL_BATCH = int(nominal)
    large = os.environ.get("TILECRAFT_GPU_MODEL_LARGE_BATCH")
    if large:      # the batch from which the third tile runs (gemm.GEMM_LARGE_BATCH; 0: off)
        gemm.GEMM_LARGE_BATCH = int(large)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cuda = torch.cuda.is_available()
    kinds = os.environ.get("TILECRAFT_GPU_MODEL_TARGETS",
                           "opencl,webgpu,webgpu-adapter").split(",")
    try:
        _open_webgpu_for(kinds)
    except Exception as err:  # no adapter: the WebGPU rows say so below
        print(f"webgpu-adapter: {type(err).__name__}: {err}", file=sys.stderr)
    gpu_name = torch.cuda.get_device_name(0) if cuda else "no-cuda"
    rows = []
    for name, module, onnx_model, make_input, bounds in _models():
        mod = from_onnx(onnx_model)
        built = {}   # kinds that differ only in how they run share one build
        for kind in kinds:
            try:
                dev = gpu_device(kind)
                t0 = time.perf_counter()
                target = _target(kind)
                key = (str(target), "k8" in _options(kind)[1], "noreuse" in _options(kind)[1])
                if key not in built:
                    with _gemm_kstep(kind), _wgsl_reuse(kind):
                        built[key] = relax.build(mod, target, upper_bounds=bounds)
                exe = built[key]
                build_s = time.perf_counter() - t0
                vm = relax.VirtualMachine(exe, dev)
            except Exception as err:  # a missing driver or a build failure is a row, not a crash
                rows.append({"model": name, "target": kind, "error": f"{type(err).__name__}: "
                             f"{str(err)[:300]}"})
                print(f"{name} {kind}: {rows[-1]['error']}", file=sys.stderr)
                continue
            with _submit_every(kind, dev):
                for b in BATCHES:
                    x = make_input(b)
                    try:
                        ref, torch_s = _torch_time(module, x, "cuda" if cuda else "cpu")
                        # the input already on the device, as PyTorch's is: the timings compare
                        # the models, not a host-to-device copy
                        x_dev = targets.array(x, dev)
                        out = vm["main"](x_dev)
                        out = out[0] if isinstance(out, tuple) else out
                        got = out.numpy()
                        err = float(np.max(np.abs(got - ref)) / (np.max(np.abs(ref)) + 1e-30))
                        ours = vm.time_evaluator("main", dev, number=10, repeat=3)(x_dev)
                        ours_s = min(ours.results)
                        kernels = kernel_profile(kind, vm, dev, x_dev) if PROFILE else None
                    except Exception as e:  # keep the other rows
                        rows.append({"model": name, "target": kind, "batch": b,
                                     "error": f"{type(e).__name__}: {str(e)[:300]}"})
                        print(f"{name} {kind} b{b}: {rows[-1]['error']}", file=sys.stderr)
                        continue
                    rows.append({"model": name, "target": kind, "batch": b,
                                 "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                 "target_string": str(target),
                                 "nominal_batch": gemm.GEMM_NOMINAL_BATCH,
                                 "large_batch": gemm.GEMM_LARGE_BATCH,
                                 "split_k": split_k.splitk_enabled(),
                                 "build_s": round(build_s, 1),
                                 "tilecraft_ms": ours_s * 1e3,
                                 "torch_ms": torch_s * 1e3,
                                 "torch_device": "cuda" if cuda else "cpu",
                                 "vs_torch": torch_s / ours_s,
                                 "max_rel_err_vs_torch": err, "match": err < 1e-3})
                    if kernels is not None:
                        rows[-1]["kernels_us"] = kernels
                        print("  " + ", ".join(f"{k} {v:.0f}" for k, v in
                                               list(kernels.items())[:8]) + " (us)", flush=True)
                    print(f"{name} {kind} b{b}: ours {ours_s * 1e3:.2f} ms, torch "
                          f"{torch_s * 1e3:.2f} ms, ratio {torch_s / ours_s:.2f}, rel err "
                          f"{err:.1e}", flush=True)
            # written after every model and target, so a run cut short keeps its rows
            path = _save(rows, gpu_name if cuda else None)
    path = _save(rows, gpu_name if cuda else None)
    print(f"(written to {path})")
    return rows


def _key(row: dict) -> tuple:
    return row.get("model"), row.get("target"), row.get("batch")


def kept_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """The rows of ``old`` whose (model, target, batch) ``new`` did not measure.

    Examples
    --------
    >>> kept_rows([{"model": "m", "target": "opencl", "batch": 1},
    ...            {"model": "m", "target": "opencl", "batch": 16}],
    ...           [{"model": "m", "target": "opencl", "batch": 16}])
    [{'model': 'm', 'target': 'opencl', 'batch': 1}]
    """
    measured = {_key(r) for r in new}
    return [r for r in old if _key(r) not in measured]


def _save(rows: list[dict], gpu: str | None) -> str:
    """Write ``rows`` with the file's rows this run did not measure (``kept_rows``)."""
    path = results_path("gpu_models", machine_name(gpu))
    try:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)["rows"]
    except (OSError, ValueError, KeyError):
        old = []
    return write_results("gpu_models", kept_rows(old, rows) + rows, {"gpu": gpu or "no-cuda"},
                         gpu=gpu)


def main(argv=None) -> int:
    rows = run()
    print_table([r for r in rows if "error" not in r],
                ["model", "target", "batch", "tilecraft_ms", "torch_ms", "vs_torch", "match"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
