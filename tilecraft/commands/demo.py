"""``tilecraft demo``: ResNet-50 (or another zoo model) for this CPU beside onnxruntime."""
from __future__ import annotations

from .. import demo

DESCRIPTION = """\
Compile a zoo model for this CPU (default: the ResNet-50 shipped with the onnx package, with
seeded random weights), run it, check it against onnxruntime and print both latencies.
Needs onnxruntime: pip install 'tilecraft[bench]'.

examples:
  tilecraft demo
  tilecraft demo --model mlp          # the zoo's small model: seconds, not minutes"""


def add_arguments(p) -> None:
    p.add_argument("--model", default=demo.DEFAULT_MODEL,
                   help=f"a zoo model (tilecraft zoo --list; default {demo.DEFAULT_MODEL})")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")


def run(args) -> int:
    (row,) = demo.run(args.model, rounds=args.rounds, quiet=args.quiet)
    print(demo.report(row))
    return 0
