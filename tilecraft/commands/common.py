"""What the model commands share (compile, bench, tune): the model's options, importing it and
building it."""
from __future__ import annotations

import argparse
import os
import time

from tilecraft import metaschedule, relax, targets

from ..errors import CLIError
from ..inputs import parse_ints, parse_shapes
from ..loader import LoadedModel, load_model
from ..progress import Steps
from ..tuning import kernel_choices


def add_model_args(p: argparse.ArgumentParser, target_help: str | None = None) -> None:
    """The model file, ``--shape``, ``--upper-bound`` and ``--target``."""
    p.add_argument("model", help="an ONNX file (.onnx) or a torch.export program saved with "
                                 "torch.export.save (.pt2)")
    p.add_argument("--shape", action="append", metavar="INPUT=D0,D1,...",
                   help="the shape of an ONNX input; names make symbolic dims "
                        "(--shape input=batch,3,224,224); repeat for several inputs")
    p.add_argument("--upper-bound", action="append", metavar="DIM=N",
                   help="an upper bound of a symbolic dim, for static memory planning "
                        "(--upper-bound batch=64); repeat for several dims")
    p.add_argument("--target", default="llvm",
                   help=target_help or "the target (default: llvm, this CPU; any LLVM target "
                                       "or tag such as raspberry-pi/4b-aarch64, opencl, webgpu)")


def parse_target(text: str) -> targets.Target:
    """``--target``, checked before any work is done."""
    try:
        return targets.Target(text)
    except ValueError as err:          # targets.TargetError is a ValueError
        raise CLIError(f"--target {text}: {err}") from None


def symbolic_dims(model: LoadedModel) -> set[str]:
    return {str(d) for spec in model.inputs for d in spec.shape if not isinstance(d, int)}


def check_dims(model: LoadedModel, dims: dict, option: str) -> None:
    """Every name in ``dims`` (from ``option``) must be a symbolic dim of the model."""
    known = symbolic_dims(model)
    for name in dims:
        if name not in known:
            raise CLIError(f"{option} {name}: the model has no symbolic dim {name!r} "
                           f"(symbolic dims: {', '.join(sorted(known)) or 'none'})")


def import_model(args, steps: Steps) -> tuple[LoadedModel, dict[str, int]]:
    """The model of ``args.model`` with ``--shape``, and the ``--upper-bound``s checked."""
    shapes = parse_shapes(args.shape)
    bounds = parse_ints(args.upper_bound, "--upper-bound")
    steps.step(f"importing {os.path.basename(args.model)}")
    model = load_model(args.model, shapes)
    check_dims(model, bounds, "--upper-bound")
    return model, bounds


def open_database(work_dir: str, option: str = "--tuning-db") -> metaschedule.Database:
    """The tuning database in ``work_dir``, which must hold records."""
    if not os.path.isdir(work_dir):
        raise CLIError(f"{option} {work_dir}: no such directory (tilecraft tune ... "
                       f"--work-dir {work_dir} makes one)")
    db = metaschedule.Database(work_dir)
    if len(db) == 0:
        raise CLIError(f"{option} {work_dir}: no tuning records there (tilecraft tune ... "
                       f"--work-dir {work_dir})")
    return db


def build_model(model: LoadedModel, target: str, bounds: dict[str, int], steps: Steps,
                database=None):
    """``relax.build`` of the model; returns the executable and the seconds it took."""
    steps.step(f"building for {target}" + (" with the tuning records" if database else ""))
    t0 = time.perf_counter()
    exe = relax.build(model.mod, target, upper_bounds=bounds or None, database=database)
    return exe, time.perf_counter() - t0


def tuned_kernels(model: LoadedModel, target: str, bounds: dict[str, int], db) -> list[dict]:
    """What each kernel of the build took from ``db`` (``tuning.kernel_choices``)."""
    tasks = relax.extract_tasks(model.mod, target, upper_bounds=bounds or None, database=db)
    return kernel_choices(tasks, db, target)
