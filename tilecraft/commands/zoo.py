"""``tilecraft zoo``: run the model zoo beside onnxruntime and PyTorch."""
from __future__ import annotations

import os

from ..devices import open_device
from ..errors import CLIError
from ..zoo import run as zoo_run
from ..zoo.models import NEEDS_TORCH, ZOO
from .common import parse_target

DESCRIPTION = """\
Run the zoo's models (docs/zoo.md) through tilecraft, onnxruntime and PyTorch: each is built
untuned, checked against onnxruntime and timed interleaved with its peers. Writes
zoo-<target>.json, the markdown table zoo-<target>.md and a chart zoo-<target>.png into --out
(merged with the rows of earlier runs there) and prints the table.

Needs onnxruntime (pip install 'tilecraft[bench]'; matplotlib from the same extra draws the
chart); the models written in PyTorch need pip install 'tilecraft[torch]' and are skipped
without it.

examples:
  tilecraft zoo --list
  tilecraft zoo --models mlp,resnet18 --out results/
  tilecraft zoo --models bert_layer --tune-trials 200
  tilecraft zoo --show"""


def add_arguments(p) -> None:
    p.add_argument("--models", help="comma-separated model names (default: all; --list)")
    p.add_argument("--target", default="llvm", help="the target (default llvm: this CPU)")
    p.add_argument("--device", type=int, default=0, metavar="N",
                   help="which device of the target's kind (default 0)")
    p.add_argument("--out", default="tilecraft-zoo", metavar="DIR",
                   help="where the results go (default: ./tilecraft-zoo)")
    p.add_argument("--show", action="store_true",
                   help="print the table of the results in --out instead of running")
    p.add_argument("--list", action="store_true", help="list the models and exit")
    p.add_argument("--tune-trials", type=int, default=0, metavar="N",
                   help="also tune each model with relax.tune (N trials in all, kept in "
                        "--out/tune/<target>/<model>: a second run resumes) and time the "
                        "tuned build")


def run(args) -> int:
    if args.list:
        for name in ZOO:
            print(f"{name}  (needs PyTorch)" if name in NEEDS_TORCH else name)
        return 0
    p = zoo_run.paths(args.target, args.out)
    if args.show:
        if not os.path.exists(p["md"]):
            raise CLIError(f"no zoo results for {args.target} in {args.out} yet: run "
                           f"`tilecraft zoo --out {args.out}`")
        with open(p["md"], encoding="utf-8") as f:
            print(f.read())
        return 0
    if args.tune_trials < 0:
        raise CLIError(f"--tune-trials {args.tune_trials}: must be >= 0")
    names = [n.strip() for n in args.models.split(",") if n.strip()] if args.models else None
    for n in names or []:
        if n not in ZOO:
            raise CLIError(f"--models: unknown zoo model {n!r} (known: {', '.join(ZOO)})")
    parse_target(args.target)
    open_device(args.target, args.device)     # before the first model: a clear error, once
    tune_root = os.path.join(args.out, "tune", zoo_run.target_tag(args.target))
    rows = zoo_run.run(names, args.target, args.quiet, args.tune_trials, out_dir=args.out,
                       tune_root=tune_root, device=args.device)
    with open(p["md"], encoding="utf-8") as f:
        print(f.read())
    written = [p["json"], p["md"]] + ([p["png"]] if os.path.exists(p["png"]) else [])
    print(f"(written to {', '.join(written)})")
    if not os.path.exists(p["png"]):
        print("(no chart: matplotlib is not installed: pip install 'tilecraft[bench]')")
    failed = [r["model"] for r in rows if "error" in r]
    if failed:
        raise CLIError(f"{len(failed)} zoo model(s) failed: {', '.join(failed)} (see the "
                       f"table; the JSON has the tracebacks)")
    return 0
