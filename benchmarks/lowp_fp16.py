"""fp16 models against our fp32 models: ResNet-50, one BERT-base encoder layer (sequence 128) and
a 4096-wide three-layer perceptron (matrix-vector products at batch 1, bound by the weights'
memory traffic) built twice for each target, as imported (float32) and through
``relax.quantize(mod, "fp16")`` (``ToMixedPrecision``: float16 inputs to matmul / dense /
convolution, float32 accumulation, float16 weights; the float16 half of the low-precision
benchmarks, beside ``benchmarks/lowp.py``'s int8 / int4 rows).

Targets (``TILECRAFT_LOWP_TARGETS``, comma-separated, default all):

- ``opencl``: ``Target("opencl")``, float16 as a storage format (``vload_half`` /
  ``vstore_half``: every OpenCL device, NVIDIA's driver included, which does not report
  ``cl_khr_fp16``), float arithmetic;
- ``opencl-half``: ``Target("opencl -supports-float16=1")``, half arithmetic under
  ``cl_khr_fp16`` (a device without it gives an error row saying so);
- ``opencl-tc``: ``Target("opencl -device=nvidia")``, float16 storage and float arithmetic
  as ``opencl``, with the fp16 GEMMs on the tensor cores (inline PTX ``mma.sync``; an NVIDIA GPU
  of compute capability 8.0 or more, else an error row); its fp32 model is ``opencl``'s;
- ``webgpu``: ``Target("webgpu -supports-float16=1")``, ``f16`` with ``shader-f16``;
- ``llvm``: this CPU (x86: F16C conversions, float16 weights and activations in memory,
  float32 arithmetic; AArch64 with ``+fullfp16``: half arithmetic).

Each row: the median time of the fp32 and the fp16 executables, timed interleaved round by
round in one process (``vm.time_evaluator``, which synchronizes the device), ``speedup`` = fp32
time / fp16 time (above 1: fp16 is faster), and the fp16 model's error against the fp32 model on
the same input. Two fp16 executables (``TILECRAFT_LOWP_ACCUMULATE``, default ``float32,float16``):
float32 accumulation (``fp16_ms``, ``speedup``, the error columns) and float16 accumulation
(``relax.quantize(mod, "fp16", out_dtype="float16")``: ``fp16acc16_ms``, ``speedup_acc16``,
``acc16_max_rel_err`` ...). The errors: the fp16 model's against the fp32 model on the
same real-shaped random input: largest absolute error, largest error over the output's largest
magnitude, top-1 agreement for the classifier, cosine similarity of the hidden states for the
transformer layer. The fp32 output is checked against the model's own reference first.

The models are PyTorch modules with random weights exported to ONNX (``benchmarks.gpu_models``:
torchvision's ResNet-50 structure, the zoo's BERT layer), so torch is needed. With
``TILECRAFT_LOWP_SMOKE=1`` it runs tiny versions instead (a ResNet bottleneck and a narrow BERT
layer from ``tilecraft.models``, numpy references, no torch), for a quick check on PoCL /
lavapipe.

Run: ``python -m benchmarks.lowp_fp16`` or ``python -m benchmarks.run lowp_fp16`` (writes
``benchmarks/results/lowp_fp16/<machine>.json``, the machine named after the GPU measured, or
this CPU's name when only ``llvm`` ran); ``TILECRAFT_LOWP_BATCHES`` (default ``1,16``),
``TILECRAFT_LOWP_MODELS`` (``resnet50``, ``bert_layer_s128``, ``mlp_4096x3``; default all).
A run of some targets or models replaces only their rows in the file (the others are kept),
so the targets can be measured one command at a time; the file is written after each (model,
target) once a GPU row names it, so a run stopped part-way keeps what it measured.
``TILECRAFT_LOWP_PROFILE=1`` adds each row's kernels, slowest first, in microseconds a call
(``kernels_us_fp32`` and ``kernels_us_fp16``: ``benchmarks.gpu_models``' per-kernel profile).
``opencl-half`` on a device without ``cl_khr_fp16`` (NVIDIA's driver, PoCL) gives its error row
at once, without building the models.
On the GPU machine: ``python -m benchmarks.lowp_fp16`` (all targets); here, the CPU row:
``TILECRAFT_LOWP_TARGETS=llvm python -m benchmarks.lowp_fp16``; the smoke check:
``TILECRAFT_LOWP_SMOKE=1 python -m benchmarks.lowp_fp16``.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np

from .common import machine_name, print_table, results_path, write_results
from .gpu_common import kernel_profile

SMOKE = os.environ.get("TILECRAFT_LOWP_SMOKE", "") not in ("", "0")
BATCHES = [int(b) for b in os.environ.get("TILECRAFT_LOWP_BATCHES",
                                          "1,2" if SMOKE else "1,16").split(",")]
TARGETS = os.environ.get("TILECRAFT_LOWP_TARGETS",
                         "opencl,opencl-tc,opencl-half,webgpu,llvm").split(",")
MODELS = [m for m in os.environ.get("TILECRAFT_LOWP_MODELS", "").split(",") if m]
TARGET_STRINGS = {"opencl": "opencl", "opencl-tc": "opencl -device=nvidia",
                  "opencl-half": "opencl -supports-float16=1",
                  "webgpu": "webgpu -supports-float16=1", "llvm": "llvm"}
# the float16 executables' accumulation dtypes (ToMixedPrecision's out_dtype): float32 (the
# ``fp16_*`` / ``speedup`` columns) and float16 (``fp16acc16_*``, ``speedup_acc16``, the
# ``acc16_*`` errors). By default float16 accumulation only where the target computes in half
# (``webgpu``, ``opencl-half``): float16 storage (``opencl``) and x86 round each float16 result
# in float arithmetic, which emulates the numerics and is slower by design.
# TILECRAFT_LOWP_ACCUMULATE (e.g. ``float32`` or ``float32,float16``) sets it for every target.
ACCUMULATE = [a for a in os.environ.get("TILECRAFT_LOWP_ACCUMULATE", "").split(",") if a]
HALF_ARITHMETIC = ("webgpu", "opencl-half")
PROFILE = os.environ.get("TILECRAFT_LOWP_PROFILE", "") not in ("", "0")


def accumulations(kind: str) -> list[str]:
    """The accumulation dtypes measured on target ``kind``.

    >>> "float32" in accumulations("webgpu")
    True
    """
    if ACCUMULATE:
        return ACCUMULATE
    return ["float32", "float16"] if kind in HALF_ARITHMETIC else ["float32"]
ROUNDS = 3 if SMOKE else 5
WRITES_RESULTS = True   # run() writes the file, named after the GPU it measured


class Case:
    """One model: its Relax module, a classifier or not, inputs and reference by batch."""

    def __init__(self, name, mod, classifier, make_input, reference, bounds):
        self.name, self.mod, self.classifier = name, mod, classifier
        self.make_input, self.reference, self.bounds = make_input, reference, bounds


def _mlp_case() -> Case:
    """A 4096-wide perceptron at batch 1: matrix-vector products, bound by the weights' memory
    traffic (the case float16 weights halve)."""
    from tilecraft.models import mlp
    m = mlp(in_features=4096, hidden=(4096, 4096), out_features=1000, seed=5)
    return Case("mlp_4096x3", m.mod, True,
                lambda b: m.make_inputs(np.random.default_rng(b), batch=b)[0], m.reference,
                {"batch": max(BATCHES)})


def _full_cases() -> list[Case]:
    import torch
    from tilecraft.relax.frontend import from_onnx
    from .gpu_models import MODELS as GPU_MODELS, _models
    out = [_mlp_case()]
    # export only the models asked for: exporting all five (BERT-base, GPT-2) takes minutes
    wanted = [m for m in MODELS if m in GPU_MODELS] if MODELS else list(GPU_MODELS)
    for name, module, onnx_model, make_input, _ in _models(wanted):
        def reference(x, module=module):
            with torch.no_grad():
                return module(torch.from_numpy(x)).numpy()
        # the batch bound is this benchmark's (TILECRAFT_LOWP_BATCHES), not gpu_models'
        out.append(Case(name, from_onnx(onnx_model), name.startswith("resnet"), make_input,
                        reference, {"batch": max(BATCHES)}))
    return out


def _smoke_cases() -> list[Case]:
    from tilecraft.models import bert_encoder_layer, resnet_bottleneck
    res = resnet_bottleneck(channels=32, width=8, height=8, seed=1)
    bert = bert_encoder_layer(hidden=64, heads=2, ffn=128, seed=2)
    return [
        Case("resnet_bottleneck_tiny", res.mod, False,
             lambda b: res.make_inputs(np.random.default_rng(b), batch=b)[0], res.reference,
             {"batch": max(BATCHES)}),
        Case("bert_layer_tiny_s16", bert.mod, False,
             lambda b: bert.make_inputs(np.random.default_rng(b), batch=b, seq_len=16)[0],
             bert.reference, {"batch": max(BATCHES), "seq_len": 16}),
    ]


def _device(kind: str):
    from tilecraft import targets
    if kind.startswith("opencl"):
        try:
            return targets.opencl("NVIDIA")
        except Exception:
            return targets.opencl(0)
    if kind == "webgpu":
        from tilecraft.targets.webgpu_backend import runtime
        runtime.close_device(0)      # reopened asking for shader-f16
        return targets.webgpu(0)
    return targets.cpu(0)


def _device_name(dev) -> str:
    """The device's name as its driver gives it (the CPU's model name for the CPU)."""
    if dev.kind == "opencl":
        from tilecraft.targets.opencl_backend import list_devices
        return list_devices()[dev.index]["name"]
    if dev.kind == "webgpu":
        from tilecraft.targets.webgpu_backend.runtime import list_adapters
        return list_adapters()[dev.index]["name"]
    from .common import machine_info
    return str(machine_info().get("cpu", "cpu"))


def accuracy(got: np.ndarray, ref: np.ndarray, classifier: bool) -> dict:
    """The error of ``got`` (fp16 model) against ``ref`` (fp32 model).

    Examples
    --------
    >>> r = np.array([[1.0, 2.0], [3.0, 1.0]])
    >>> accuracy(r + 0.01, r, True)["top1_agreement"]
    1.0
    """
    got, ref = got.astype("float64"), ref.astype("float64")
    diff = np.abs(got - ref)
    out = {"max_abs_err": float(diff.max()),
           "max_rel_err": float(diff.max() / (np.abs(ref).max() + 1e-30))}
    if classifier:
        out["top1_agreement"] = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
    else:
        a, b = got.reshape(got.shape[0], -1), ref.reshape(ref.shape[0], -1)
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)
        out["cosine_min"] = float(cos.min())
    return out


def _interleaved(vms: list, dev, x, number: int) -> list[float]:
    """Median seconds per call of each executable of ``vms``, timed round by round."""
    times = [[] for _ in vms]
    evals = [vm.time_evaluator("main", dev, number=number, repeat=1) for vm in vms]
    for _ in range(ROUNDS):
        for t, e in zip(times, evals):
            t.append(min(e(x).results))
    return [statistics.median(t) for t in times]


def _output(out) -> np.ndarray:
    out = out[0] if isinstance(out, tuple) else out
    return out.numpy()


def run() -> list[dict]:
    """One row per model, target and batch (an ``error`` row where a target cannot run); the
    rows are written to ``benchmarks/results/lowp_fp16/`` unless this is a smoke run: after
    each (model, target), so a run stopped part-way leaves what it measured."""
    rows = measure(on_rows=None if SMOKE else _save)
    if SMOKE:
        print("(smoke run: no results written)")
    return rows


def _save(rows: list[dict], final: bool = True) -> None:
    """Write ``rows`` (so far) with the file's rows of the (model, target) pairs not measured.
    Before the end, only once a GPU row names the file (not under the CPU's name)."""
    gpu = _gpu_name(rows)
    if not final and gpu is None and any(k != "llvm" for k in TARGETS):
        return
    kept = previous_rows(results_path("lowp_fp16", machine_name(gpu)), rows)
    path = write_results("lowp_fp16", kept + rows, {"settings": {"batches": BATCHES,
                                                                 "targets": TARGETS}},
                         gpu=gpu)
    print(f"(written to {path}{f'; {len(kept)} rows kept from the previous run' if kept else ''})",
          flush=True)


def _half_refusal(kind: str, dev) -> str | None:
    """Why ``kind`` cannot run half arithmetic on ``dev`` (known before building), or None."""
    if kind != "opencl-half":
        return None
    from tilecraft.targets.opencl_backend import list_devices
    info = list_devices()[dev.index]
    if info.get("fp16"):
        return None
    return (f"{info['name']} does not report cl_khr_fp16: OpenCL half arithmetic cannot run "
            f"there (the 'opencl' row is float16 storage with float arithmetic)")


def previous_rows(path: str, rows: list[dict]) -> list[dict]:
    """The rows of the results file at ``path`` for the (model, target) pairs ``rows`` did not
    measure, so runs of a few targets or models at a time (``TILECRAFT_LOWP_TARGETS``,
    ``TILECRAFT_LOWP_MODELS``) add up to one file.

    Examples
    --------
    >>> previous_rows("/nonexistent.json", [])
    []
    """
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        old = json.load(f).get("rows", [])
    done = {(r["model"], r["target"]) for r in rows}
    return [r for r in old if (r.get("model"), r.get("target")) not in done]


def measure(on_rows=None) -> list[dict]:
    """The rows of ``run()``, measured; ``on_rows(rows)`` is called after each (model,
    target) with the rows so far."""
    from tilecraft import relax, targets

    cases = _smoke_cases() if SMOKE else _full_cases()
    cases = [c for c in cases if not MODELS or c.name in MODELS]
    rows = []
    for case in cases:
        accs = sorted({a for kind in TARGETS for a in accumulations(kind)}, reverse=True)
        mods16 = {acc: relax.quantize(case.mod, "fp16", out_dtype=acc) for acc in accs}
        fp32_builds = {}      # the float32 executable of a target string, shared by its rows
        for kind in TARGETS:
            if on_rows is not None and rows:
                on_rows(rows, final=False)
            target = TARGET_STRINGS[kind]
            base = {"model": case.name, "target": target}
            try:
                dev = _device(kind)
                refusal = _half_refusal(kind, dev)
                if refusal is not None:   # known now: no build of a module that cannot run
                    raise RuntimeError(refusal)
                t0 = time.perf_counter()
                # the fp32 model of a float16 variant is the plain target's (no fp16 GEMMs)
                target32 = target.replace(" -supports-float16=1", "").replace(
                    " -device=nvidia", "")
                if target32 not in fp32_builds:
                    fp32_builds[target32] = relax.build(case.mod, target32,
                                                        upper_bounds=case.bounds)
                exe32 = fp32_builds[target32]
                exes16 = {acc: relax.build(mods16[acc], target, upper_bounds=case.bounds)
                          for acc in accumulations(kind)}
                build_s = time.perf_counter() - t0
                # (the VMs after every build: a WebGPU device opened by a first array asks for
                # the features of the modules built by then, shader-f16 among them)
                vm32 = relax.VirtualMachine(exe32, dev)
                vms16 = {acc: relax.VirtualMachine(e, dev) for acc, e in exes16.items()}
            except Exception as err:  # a missing driver, a refused feature: a row, not a crash
                rows.append({**base, "error": f"{type(err).__name__}: {str(err)[:300]}"})
                print(f"{case.name} {target}: {rows[-1]['error']}", file=sys.stderr)
                continue
            for b in BATCHES:
                if kind == "llvm" and b > 1 and not SMOKE:
                    continue         # the CPU row: batch 1 (memory traffic matters most there)
                x = case.make_input(b)
                row = {**base, "batch": b, "device": _device_name(dev),
                       "build_s": round(build_s, 1)}
                try:
                    ref32 = _output(vm32["main"](x))
                    ref = case.reference(x)
                    row["fp32_vs_reference"] = float(np.abs(ref32 - ref).max() /
                                                     (np.abs(ref).max() + 1e-30))
                    for acc, vm16 in vms16.items():
                        err16 = accuracy(_output(vm16["main"](x)), ref32, case.classifier)
                        row.update(err16 if acc == "float32" else
                                   {f"acc16_{k}": v for k, v in err16.items()})
                    xd = targets.array(x, dev)
                    number = 1 if SMOKE or kind == "llvm" else 3
                    t32, *t16 = _interleaved([vm32, *vms16.values()], dev, xd, number)
                    if PROFILE and kind != "llvm":
                        row["kernels_us_fp32"] = kernel_profile(kind, vm32, dev, xd)
                        row["kernels_us_fp16"] = kernel_profile(kind, next(iter(
                            vms16.values())), dev, xd)
                        for which in ("fp32", "fp16"):
                            top = list(row[f"kernels_us_{which}"].items())[:10]
                            print(f"  {which}: " + ", ".join(f"{k} {v:.0f}" for k, v in top)
                                  + " (us)", flush=True)
                except Exception as err:  # keep the other rows
                    row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
                    rows.append(row)
                    print(f"{case.name} {target} b{b}: {row['error']}", file=sys.stderr)
                    continue
                row["fp32_ms"] = t32 * 1e3
                line = f"{case.name} {target} b{b}: fp32 {t32 * 1e3:.2f} ms"
                for acc, t in zip(vms16, t16):
                    if acc == "float32":
                        row.update(fp16_ms=t * 1e3, speedup=t32 / t)
                        line += (f", fp16 {t * 1e3:.2f} ms, speedup {t32 / t:.2f}, rel err "
                                 f"{row['max_rel_err']:.1e}")
                    else:
                        row.update(fp16acc16_ms=t * 1e3, speedup_acc16=t32 / t)
                        line += (f", fp16 (f16 accumulation) {t * 1e3:.2f} ms, speedup "
                                 f"{t32 / t:.2f}, rel err {row['acc16_max_rel_err']:.1e}")
                rows.append(row)
                print(line, flush=True)
    if on_rows is not None and rows:
        on_rows(rows)
    return rows


def _gpu_name(rows: list[dict]) -> str | None:
    """The GPU the rows measured (the results file is named after it), if any."""
    for r in rows:
        if "device" in r and not r["target"].startswith("llvm"):
            return r["device"]
    return None


def main(argv=None) -> int:
    rows = run()
    measured = [r for r in rows if "error" not in r]
    if measured:        # (print_table needs a row)
        print_table(measured, ["model", "target", "batch", "fp32_ms", "fp16_ms", "speedup",
                               "max_rel_err", "top1_agreement", "cosine_min", "fp16acc16_ms",
                               "speedup_acc16", "acc16_max_rel_err"])
    for r in rows:
        if "error" in r:
            print(f"{r['model']} {r['target']} {r.get('batch', '')}: {r['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
