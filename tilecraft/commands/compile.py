"""``tilecraft compile``: import a model and build it into one file."""
from __future__ import annotations

import dataclasses
import os

from tilecraft import relax
from tilecraft.relax.quantize import MODES as QUANTIZE_MODES

from ..errors import CLIError
from ..inputs import random_inputs
from ..progress import Steps
from ..tuning import NOT_TUNED, summary_line
from .common import (add_model_args, build_model, import_model, open_database, parse_target,
                     tuned_kernels)

DESCRIPTION = """\
Import an ONNX model or a torch.export program, build it with relax.build and write the
executable as one file (relax.load_executable reads it; `tilecraft run` runs it, here or on a
board). Without --tuning-db every kernel gets the default schedules; with it, the kernels
`tilecraft tune` tuned take their best records, and the build says how many did.

examples:
  tilecraft compile model.onnx -o model.tcx --upper-bound batch=64
  tilecraft compile model.onnx --target raspberry-pi/4b-aarch64 -o model-pi.tcx
  tilecraft compile model.onnx --tuning-db tune/ -o model.tcx
  tilecraft compile model.pt2 --target opencl -o model-cl.tcx
  tilecraft compile model.onnx --quantize fp16 --target opencl -o model-fp16.tcx
  tilecraft compile model.onnx --quantize fp16 --target "webgpu -supports-float16=1" -o m.tcx
  tilecraft compile model.onnx --quantize int8-dynamic -o model-int8.tcx
  tilecraft compile model.onnx --quantize int4-g128 -o model-q4.tcx
  tilecraft compile model.onnx --quantize int8 --calibration-samples 16 -o model-int8s.tcx"""


def add_arguments(p) -> None:
    add_model_args(p)
    p.add_argument("-o", "--output", required=True, help="the executable file to write")
    p.add_argument("--tuning-db", metavar="DIR",
                   help="a tuning work directory (tilecraft tune --work-dir): build with its "
                        "records")
    p.add_argument("--quantize", metavar="MODE", choices=sorted(QUANTIZE_MODES),
                   help="quantize before building (relax.quantize): "
                        + ", ".join(QUANTIZE_MODES))
    p.add_argument("--calibration-samples", type=int, default=8, metavar="N",
                   help="--quantize int8 (static): calibrate on N random inputs (normal "
                        "floats; default 8). Random data only approximates real inputs' ranges")


def run(args) -> int:
    target = parse_target(args.target)
    db = open_database(args.tuning_db) if args.tuning_db else None
    with Steps(4 if db else 3, "compile", quiet=args.quiet) as steps:
        model, bounds = import_model(args, steps)
        if args.quantize:
            model = quantize_model(model, args.quantize, args.calibration_samples)
        exe, build_s = build_model(model, str(target), bounds, steps, db)
        choices = None
        if db is not None:
            steps.step("counting the tuned kernels")
            choices = tuned_kernels(model, str(target), bounds, db)
        steps.step(f"writing {args.output}")
        exe.export_library(args.output)
    ins = ", ".join(f"{s.name}: {s.shape_text()} {s.dtype}" for s in model.inputs)
    print(f"compiled {args.model} for {target} in {build_s:.1f} s: "
          f"{len(exe.kernel_names)} kernels, inputs {ins}")
    if choices is not None:
        print(f"tuning records from {args.tuning_db}: {summary_line(choices)}")
        if all(c["uses"] == NOT_TUNED for c in choices):
            others = sorted({r.target for r in db.get_all_tuning_records()})
            print(f"note: {args.tuning_db} has no records of this model's kernels for {target}"
                  f" (its records are for: {'; '.join(others)})")
    print(f"wrote {args.output} ({os.path.getsize(args.output) / 1e6:.2f} MB)")
    return 0


def quantize_model(model, mode: str, samples: int):
    """``model`` with its module quantized in ``mode`` (static int8: calibrated on ``samples``
    random inputs, symbolic dims at 1)."""
    calibration = None
    if mode == "int8":
        if samples < 1:
            raise CLIError(f"--calibration-samples must be at least 1, got {samples}")
        calibration = [tuple(random_inputs(model.inputs, {}, seed=i)) for i in range(samples)]
    try:
        mod = relax.quantize(model.mod, mode, calibration=calibration)
    except ValueError as err:
        raise CLIError(f"--quantize {mode}: {err}") from None
    return dataclasses.replace(model, mod=mod)
