"""The PyTorch model zoo through each import path: does it import, does it match PyTorch, how
long does it take to import and build.

``python -m benchmarks.hf_import`` runs every model of ``tilecraft.models.hf_zoo`` (tiny
random-weight ``transformers`` configs and a torchvision-style segmentation network) through
every path of ``hf_zoo.PATHS``: export with a dynamic batch (and sequence length), import,
``relax.build(..., strict=True)`` for ``llvm``, run at two sizes against PyTorch eager. It
prints a table and writes ``benchmarks/results/hf_import/<machine>.json`` (the table in
docs/frontends.md comes from it). Times are wall seconds and this process's CPU seconds (the
machine is shared: CPU seconds say more about the work than wall seconds under load).

``--models bert,gpt2`` runs some models; ``--target`` another LLVM target string.
"""
from __future__ import annotations

import argparse
import time
import traceback
import warnings

from benchmarks.common import print_table, write_results

RTOL = 1e-4


def _timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def run_one(name: str, path: str, target: str) -> dict:
    from tilecraft import relax, targets
    from tilecraft.models import hf_zoo
    entry = hf_zoo.ZOO[name]
    row = {"model": name, "path": path, "imports": False, "matches": False}
    model = entry.build()
    try:
        mod, row["import_s"], row["import_cpu_s"] = _timed(
            lambda: hf_zoo.PATHS[path](model, entry.inputs(0), entry.dynamic_shapes))
        row["imports"] = True
        exe, row["build_s"], row["build_cpu_s"] = _timed(
            lambda: relax.build(mod, target, strict=True))
        vm = relax.VirtualMachine(exe, targets.cpu(0))
        err = 0.0
        for size in (0, 1):
            args = entry.inputs(size)
            out = vm["main"](*[a.numpy() for a in args])
            outs = [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]
            refs = hf_zoo.reference(model, args)
            if len(outs) != len(refs) or any(o.shape != r.shape for o, r in zip(outs, refs)):
                raise AssertionError(f"outputs {[o.shape for o in outs]}, PyTorch's "
                                     f"{[r.shape for r in refs]}")
            err = max(err, hf_zoo.max_relative_error(outs, refs))
        row["max_rel_err"] = err
        row["matches"] = err < RTOL
    except Exception as e:   # a row per failure: the table says where each model stops
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        traceback.print_exc()
    return row


def main(argv=None) -> None:
    from tilecraft.models import hf_zoo
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    ap.add_argument("--target", default="llvm")
    args = ap.parse_args(argv)
    names = [n for n in args.models.split(",") if n] or list(hf_zoo.ZOO)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path in hf_zoo.PATHS:
            for name in names:
                rows.append(run_one(name, path, args.target))
                print({k: v for k, v in rows[-1].items() if k != "error"}, flush=True)
    print_table(rows, ["model", "path", "imports", "matches", "max_rel_err", "import_s",
                       "build_s", "build_cpu_s"])
    import torch
    import transformers
    print(write_results("hf_import", rows, {"target": args.target, "torch": torch.__version__,
                                            "transformers": transformers.__version__}))


if __name__ == "__main__":
    main()
