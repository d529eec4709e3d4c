"""The model zoo for the project's results: ``python -m benchmarks.run zoo`` (every model) or
``python -m benchmarks.zoo [--models a,b] [--target llvm] [--tune-trials N]``.

The zoo itself is the package's (``tilecraft.zoo``, what ``tilecraft zoo`` runs); this wrapper
writes its rows through ``benchmarks.common.write_results`` as ``zoo-<target>.json`` after
each model, with the markdown table (``.md``) and the chart (``.png``) beside it. A run writes
the rows it measured (``tilecraft zoo --out DIR`` merges partial runs instead). See
docs/zoo.md.
"""
from __future__ import annotations

import argparse
import os
import sys

from tilecraft.zoo import run as zoo_run

from .common import ensure_clean_openblas_env, write_results

WRITES_RESULTS = True   # benchmarks.run: save() writes zoo-<target>/<machine>.json after each model


def save(rows: list[dict], target: str) -> dict[str, str]:
    """Write ``rows`` through ``write_results``, the table and the chart beside the JSON."""
    path = write_results(f"zoo-{zoo_run.target_tag(target)}", rows,
                         {"target": target, "note": zoo_run.note()})
    base = os.path.splitext(path)[0]
    with open(base + ".md.tmp", "w", encoding="utf-8") as f:
        f.write(zoo_run.markdown_table(rows, target, zoo_run.note()))
    os.replace(base + ".md.tmp", base + ".md")
    out = {"json": path, "md": base + ".md"}
    if zoo_run.bar_chart(rows, base + ".png", target) is not None:
        out["png"] = base + ".png"
    return out


def run(names=None, target: str = "llvm", tune_trials: int = 0,
        quiet: bool = False) -> list[dict]:
    """The zoo's rows (``benchmarks.run``'s interface), saved after each model."""
    return zoo_run.run(names, target, quiet=quiet, tune_trials=tune_trials,
                       on_rows=lambda rows: save(rows, target))


def main(argv=None) -> int:
    ensure_clean_openblas_env()
    parser = argparse.ArgumentParser(prog="python -m benchmarks.zoo",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--tune-trials", type=int, default=0,
                        help="also tune each model with relax.tune (that many trials) and "
                             "time the tuned build")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",")] if args.models else None
    rows = run(names, args.target, args.tune_trials, args.quiet)
    print(zoo_run.markdown_table(rows, args.target, zoo_run.note()))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
