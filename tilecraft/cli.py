"""The ``tilecraft`` command line: compile, run, bench, tune, zoo, demo, rpc.

    tilecraft compile model.onnx --target llvm -o model.tcx [--tuning-db tune/]
    tilecraft run model.tcx --input x.npy [--rpc-tracker HOST:PORT --rpc-key KEY]
    tilecraft bench model.onnx [--target opencl] [--rpc-tracker HOST:PORT --rpc-key KEY]
    tilecraft tune model.onnx --target llvm --trials 500 --work-dir tune/
    tilecraft zoo [--models resnet18,bert_base] [--out DIR]
    tilecraft demo [--model resnet50]
    tilecraft rpc server|tracker ...

This module is the dispatcher only: it imports the standard library, and the one command
module (``tilecraft.commands.<name>``) that is run. So ``tilecraft --version``, ``--help`` and
``tilecraft rpc server`` work on a board where only numpy is installed.

Errors are one line on stderr (``tilecraft: error: ...``) and a non-zero exit status: 1 for a
problem with the model, the inputs, the board or a missing package, 2 for a bad command line,
130 when interrupted. ``--traceback`` shows the Python traceback too. See docs/cli.md.

Examples
--------
>>> from tilecraft.cli import main
>>> main(["--version"])                                                # doctest: +SKIP
tilecraft 0.2.0
0
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from . import __version__
from .errors import CLIError, missing_message

# name -> one line of help; each is the module tilecraft.commands.<name>
COMMANDS = {
    "compile": "import a model (ONNX, torch.export) and build it into one file",
    "run": "run a compiled model on .npy inputs, here (CPU, OpenCL, WebGPU) or on a board",
    "bench": "check a model against onnxruntime or PyTorch and time both",
    "tune": "tune a model's kernels (resumable; locally or on boards)",
    "zoo": "run the model zoo beside onnxruntime and PyTorch",
    "demo": "ResNet-50 (or another zoo model) for this CPU beside onnxruntime",
    "rpc": "the board side: an RPC server, or a tracker",
}

USAGE = "usage: tilecraft [-h] [--version] [-q] [--traceback] COMMAND [ARGS ...]"


def top_help() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = [USAGE, "", "Compile, run, tune and benchmark models with tilecraft.", "",
             "commands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, text in COMMANDS.items()]
    lines += ["", "options:",
              "  -h, --help     show this help and exit",
              "  --version      print the version and exit",
              "  -q, --quiet    no progress output",
              "  --traceback    show the Python traceback of an error",
              "", "Each command has its own --help. See docs/cli.md."]
    return "\n".join(lines)


def _usage_error(message: str) -> int:
    print(USAGE, file=sys.stderr)
    print(f"tilecraft: error: {message}", file=sys.stderr)
    return 2


def command_parser(name: str, module) -> argparse.ArgumentParser:
    """The argument parser of one command (its module adds its own arguments)."""
    parser = argparse.ArgumentParser(prog=f"tilecraft {name}", description=module.DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    parser.add_argument("--traceback", action="store_true",
                        help="show the Python traceback of an error")
    module.add_arguments(parser)
    return parser


def describe(err: BaseException) -> str:
    """An exception as the one line after ``tilecraft: error:``."""
    if isinstance(err, CLIError):
        return str(err)
    return f"{type(err).__name__}: {str(err) or repr(err)}"


def main(argv: Sequence[str] | None = None) -> int:
    """The ``tilecraft`` entry point; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet = traceback = False
    name, rest = None, []
    for i, arg in enumerate(argv):
        if arg in ("-h", "--help"):
            print(top_help())
            return 0
        if arg == "--version":
            print(f"tilecraft {__version__}")
            return 0
        if arg in ("-q", "--quiet"):
            quiet = True
        elif arg == "--traceback":
            traceback = True
        elif arg.startswith("-"):
            return _usage_error(f"unknown option {arg} (before the command: -h, --version, "
                                f"-q, --traceback)")
        else:
            name, rest = arg, argv[i + 1:]
            break
    if name is None:
        print(top_help(), file=sys.stderr)
        return 2
    if name not in COMMANDS:
        return _usage_error(f"unknown command {name!r} (commands: {', '.join(COMMANDS)})")
    try:
        module = importlib.import_module(f"{__package__}.commands.{name}")
    except ImportError as err:   # a dependency the install lacks (a board's numpy-only one)
        if traceback:
            raise
        what = err.name or str(err)
        print(f"tilecraft: error: {missing_message(what, f'tilecraft {name}')}", file=sys.stderr)
        return 1
    args = command_parser(name, module).parse_args(rest)   # exits 2 on a bad command line
    args.quiet = args.quiet or quiet
    args.traceback = args.traceback or traceback
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print("tilecraft: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # one line per error; the traceback on request
        if args.traceback:
            raise
        if isinstance(err, ImportError) and err.name and not isinstance(err, CLIError):
            print(f"tilecraft: error: {missing_message(err.name, f'tilecraft {name}')}",
                  file=sys.stderr)
        else:
            print(f"tilecraft: error: {describe(err)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
