"""The README's main job (``make demo``, ``tilecraft demo``): ResNet-50 for this CPU.

The ResNet-50 graph shipped inside the onnx package (``onnx/backend/test/data/light/
light_resnet50.onnx``) is imported with ``relax.frontend.from_onnx``, compiled for this CPU with
``relax.build`` (untuned: the default schedules), run on a random image and checked against
onnxruntime; then both are timed, interleaved in this process, and both latencies printed.

The shipped model's weights are all the constant 0.02 (its output is the same for every input),
so seeded random weights are swapped in first (``tilecraft.zoo.models.randomize_light``): a
wrong kernel then shows in the comparison.

Any zoo model can take ResNet-50's place (``tilecraft demo --model mlp``: the small one, built
in seconds). onnxruntime (the ``[bench]`` extra) is required; the models written in PyTorch
need the ``[torch]`` extra as well.

Examples
--------
>>> from tilecraft import demo
>>> (row,) = demo.run("mlp", rounds=3, quiet=True)                    # doctest: +SKIP
>>> row["ratio_vs_onnxruntime"] > 0                                   # doctest: +SKIP
True
"""
from __future__ import annotations

import os
import time

import numpy as np

from tilecraft import relax, targets
from tilecraft.relax.frontend import from_onnx

from .errors import CLIError, missing_message, require
from .progress import Steps
from .timing import calls_per_round, interleaved
from .zoo.models import ZOO
from .zoo.run import ort_session, skipped_row

DEFAULT_MODEL = "resnet50"


def run(model: str = DEFAULT_MODEL, rounds: int = 5, quiet: bool = False) -> list[dict]:
    """Compile, check and time one zoo model on this CPU; one row (for ``benchmarks.run``).

    Raises ``CLIError`` for an unknown model or when tilecraft and onnxruntime disagree,
    ``MissingExtraError`` without onnxruntime (or without PyTorch for a model written in it).
    """
    require("onnxruntime", "tilecraft demo")
    if rounds < 1:
        raise CLIError(f"--rounds {rounds}: must be >= 1")
    if model not in ZOO:
        raise CLIError(f"--model {model}: not a zoo model (tilecraft zoo --list): "
                       f"{', '.join(ZOO)}")
    if skipped_row(model) is not None:
        raise CLIError(missing_message("torch", f"zoo model {model}"))
    with Steps(5, "demo", quiet=quiet) as steps:
        steps.step(f"making {model} (random weights)")
        z = ZOO[model](seed=0)
        steps.step("importing with relax.frontend.from_onnx")
        mod = from_onnx(z.onnx_model)
        steps.step("compiling for this CPU (relax.build, untuned"
                   + ("; a few minutes on 2 cores)" if z.family in ("light", "cnn") else ")"))
        t0 = time.perf_counter()
        exe = relax.build(mod, "llvm", upper_bounds=z.upper_bounds or None)
        build_s = time.perf_counter() - t0
        steps.step("running and checking against onnxruntime")
        vm = relax.VirtualMachine(exe, targets.cpu(0))
        sess = ort_session(z.onnx_model, os.cpu_count() or 1)
        inputs = list(z.inputs.values())
        out = vm["main"](*inputs)
        ours = (out[0] if isinstance(out, tuple) else out).numpy()
        ref = sess.run(None, z.inputs)[0]
        if ours.shape != ref.shape:
            raise CLIError(f"{model}: tilecraft's output has shape {ours.shape}, "
                           f"onnxruntime's {ref.shape}")
        diff = float(np.max(np.abs(ours.astype(np.float64) - ref))) if ours.size else 0.0
        if not np.allclose(ours, ref, rtol=1e-3, atol=1e-5):
            raise CLIError(f"tilecraft and onnxruntime disagree on {model} (max abs "
                           f"difference {diff:.3g}, rtol 1e-3, atol 1e-5)")
        steps.step("timing both")
        args = [targets.array(a) for a in inputs]
        fn = vm["main"]

        def tilecraft_run():
            return fn(*args)

        def ort_run():
            return sess.run(None, z.inputs)
        number = calls_per_round(tilecraft_run, 0.5)
        ours_s, ort_s = interleaved([tilecraft_run, ort_run], number, rounds)
    shapes = ", ".join("x".join(str(d) for d in a.shape) for a in inputs)
    return [{"model": z.description, "name": model, "inputs": shapes,
             "tilecraft_ms": ours_s * 1e3, "onnxruntime_ms": ort_s * 1e3,
             "ratio_vs_onnxruntime": ort_s / ours_s, "build_s": build_s,
             "kernels": len(exe.kernel_names), "output_shape": list(ours.shape),
             "top1_class": int(np.argmax(ours[0])) if ours.ndim == 2 else None,
             "checked": f"allclose onnxruntime rtol 1e-3 (max abs diff {diff:.1e})"}]


def report(row: dict) -> str:
    """What ``tilecraft demo`` prints: a few lines from ``run``'s row."""
    top1 = f", top-1 class {row['top1_class']}" if row.get("top1_class") is not None else ""
    r = row["ratio_vs_onnxruntime"]
    return "\n".join([
        f"{row['name']} ({row['inputs']}) compiled for this CPU in {row['build_s']:.1f} s "
        f"({row['kernels']} kernels); output matches onnxruntime "
        f"({row['checked'].split('(')[1].rstrip(')')}){top1}",
        f"  tilecraft    {row['tilecraft_ms']:9.2f} ms",
        f"  onnxruntime  {row['onnxruntime_ms']:9.2f} ms",
        f"  ratio {r:.2f}x ({'tilecraft is faster' if r > 1 else 'onnxruntime is faster'}; "
        f"onnxruntime time / tilecraft time; untuned; batch 1; {os.cpu_count()} cores)"])
