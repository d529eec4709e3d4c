"""The README's main job (``make demo``, ``tilecraft demo``): ResNet-50 for this CPU.

The ResNet-50 graph shipped inside the onnx package (``onnx/backend/test/data/light/
light_resnet50.onnx``) is imported with ``relax.frontend.from_onnx``, compiled for this CPU with
``relax.build`` (untuned: the default schedules), run on a random image and checked against
onnxruntime; then both are timed, interleaved in this process, and both latencies printed.

The shipped model's weights are all the constant 0.02 (its output is the same for every input),
so seeded random weights are swapped in first (``benchmarks.zoo.models.randomize_light``): a
wrong kernel then shows in the comparison.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np


def run(rounds: int = 5, quiet: bool = False) -> list[dict]:
    """Compile, check and time ResNet-50; one row for ``benchmarks.run``."""
    from tilecraft import relax
    from tilecraft import targets
    from tilecraft.relax.frontend import from_onnx
    from tilecraft.progress import Steps
    from tilecraft.timing import calls_per_round, interleaved
    from .zoo.models import light
    from .zoo.run import _ort_session

    with Steps(5, "demo", quiet=quiet) as steps:
        steps.step("loading light_resnet50.onnx (random weights)")
        z = light("resnet50", seed=0)
        (name, x), = z.inputs.items()
        steps.step("importing with relax.frontend.from_onnx")
        mod = from_onnx(z.onnx_model)
        steps.step("compiling for this CPU (relax.build, untuned; a few minutes on 2 cores)")
        t0 = time.perf_counter()
        exe = relax.build(mod, "llvm")
        build_s = time.perf_counter() - t0
        steps.step("running and checking against onnxruntime")
        vm = relax.VirtualMachine(exe, targets.cpu(0))
        sess = _ort_session(z.onnx_model, os.cpu_count() or 1)
        ours = vm["main"](x).numpy()
        ref = sess.run(None, {name: x})[0]
        np.testing.assert_allclose(ours, ref, rtol=1e-3, atol=1e-5,
                                   err_msg="tilecraft and onnxruntime disagree on ResNet-50")
        diff = float(np.max(np.abs(ours - ref)))
        steps.step("timing both")
        xa = targets.array(x)
        fn = vm["main"]

        def tilecraft_run():
            return fn(xa)

        def ort_run():
            return sess.run(None, {name: x})
        number = calls_per_round(tilecraft_run, 0.5)
        ours_s, ort_s = interleaved([tilecraft_run, ort_run], number, rounds)
    top1 = int(np.argmax(ours))
    return [{"model": "ResNet-50 (onnx light model, random weights), 1x3x224x224",
             "tilecraft_ms": ours_s * 1e3, "onnxruntime_ms": ort_s * 1e3,
             "ratio_vs_onnxruntime": ort_s / ours_s, "build_s": build_s,
             "kernels": len(exe.kernel_names), "top1_class": top1,
             "checked": f"allclose onnxruntime rtol 1e-3 (max abs diff {diff:.1e})"}]


def main(rounds: int = 5, quiet: bool = False) -> None:
    """``tilecraft demo``: print what ``run`` measured in a few lines."""
    (row,) = run(rounds, quiet)
    print(f"ResNet-50 compiled for this CPU in {row['build_s']:.0f} s "
          f"({row['kernels']} kernels); output matches onnxruntime "
          f"({row['checked'].split('(')[1].rstrip(')')}), top-1 class {row['top1_class']}")
    print(f"  tilecraft    {row['tilecraft_ms']:9.2f} ms")
    print(f"  onnxruntime  {row['onnxruntime_ms']:9.2f} ms")
    r = row["ratio_vs_onnxruntime"]
    print(f"  ratio {r:.2f}x ({'tilecraft is faster' if r > 1 else 'onnxruntime is faster'}; "
          f"untuned; batch 1; {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
    sys.exit(0)
