"""``tilecraft compile``: import a model and build it into one file."""
from __future__ import annotations

import os

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
  tilecraft compile model.pt2 --target opencl -o model-cl.tcx"""


def add_arguments(p) -> None:
    add_model_args(p)
    p.add_argument("-o", "--output", required=True, help="the executable file to write")
    p.add_argument("--tuning-db", metavar="DIR",
                   help="a tuning work directory (tilecraft tune --work-dir): build with its "
                        "records")


def run(args) -> int:
    target = parse_target(args.target)
    db = open_database(args.tuning_db) if args.tuning_db else None
    with Steps(4 if db else 3, "compile", quiet=args.quiet) as steps:
        model, bounds = import_model(args, steps)
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
