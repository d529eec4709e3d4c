"""Apache TVM's MetaSchedule on the same GEMM: the peer column of ``benchmarks/tune_cpu.py``.

Runs in a separate virtual environment that has ``apache-tvm`` (not tilecraft's):

    /work/tvm-venv/bin/python benchmarks/tvm_tune_peer.py --size 1024 --trials 64 --out r.json

and writes one JSON object: trials, seconds, trials per minute, the best time and GFLOP/s of the
tuned kernel (re-measured with TVM's ``time_evaluator``) and the best-so-far curve from TVM's
database. It imports nothing from this repository.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def _import_intrinsics() -> None:
    """Builder worker initializer: TVM's default build imports its tensor intrinsics, which
    parses a few hundred TVMScript functions (tens of seconds on a loaded machine); doing it
    once per worker keeps it out of the per-candidate build timeout."""
    import tvm.s_tir.tensor_intrin  # noqa: F401


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--per-iter", type=int, default=32)
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    p.add_argument("--work-dir", default=None)
    p.add_argument("--database", default="json", choices=("json", "memory"),
                   help="TVM's database kind ('memory' where its JSON writer fails)")
    p.add_argument("--build-timeout", type=float, default=300.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import numpy as np
    import tvm
    from tvm import te
    try:
        from tvm.s_tir import meta_schedule as ms          # TVM >= 0.22
    except ImportError:  # pragma: no cover - older TVM
        from tvm import meta_schedule as ms

    n = args.size
    A = te.placeholder((n, n), "float32", name="A")
    B = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    func = te.create_prim_func([A, B, C])
    mod = tvm.IRModule({"main": func})
    target = tvm.target.Target({"kind": "llvm", "num-cores": args.cores})
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="tvm-ms-")
    t0 = time.time()
    db = ms.tune_tir(mod, target, work_dir, max_trials_global=args.trials,
                     num_trials_per_iter=args.per_iter, num_tuning_cores=args.cores,
                     database=args.database,
                     builder=ms.builder.LocalBuilder(timeout_sec=args.build_timeout,
                                                     initializer=_import_intrinsics))
    elapsed = time.time() - t0
    records = db.get_all_tuning_records()
    secs = []
    for r in records:
        rs = [float(x) for x in (r.run_secs or [])]
        secs.append(sum(rs) / len(rs) if rs and all(x < 1e9 for x in rs) else float("inf"))
    best, curve = float("inf"), []
    for s in secs:
        best = min(best, s)
        curve.append(best)
    flop = 2.0 * n ** 3
    out = {"tvm": tvm.__version__, "size": n, "trials": len(records), "seconds": elapsed,
           "trials_per_min": len(records) / elapsed * 60 if elapsed else 0.0,
           "best_secs_db": best, "curve_best_secs": curve, "work_dir": work_dir}
    sch = ms.tir_integration.compile_tir(db, mod, target)
    if sch is not None:
        lib = tvm.compile(sch.mod, target=target) if hasattr(tvm, "compile") else \
            tvm.build(sch.mod, target=target)
        dev = tvm.cpu(0)
        make = tvm.runtime.tensor if hasattr(tvm.runtime, "tensor") else tvm.nd.array
        rng = np.random.default_rng(0)
        a = make(rng.standard_normal((n, n), dtype=np.float32), dev)
        b = make(rng.standard_normal((n, n), dtype=np.float32), dev)
        c = make(np.zeros((n, n), np.float32), dev)
        if hasattr(lib, "jit"):               # tvm.compile's Executable (TVM >= 0.20)
            lib = lib.jit()
        lib["main"](a, b, c)
        np.testing.assert_allclose(c.numpy(), a.numpy() @ b.numpy(), rtol=1e-3, atol=1e-2)
        ev = lib.time_evaluator("main", dev, number=5, repeat=5)
        t = float(np.median(ev(a, b, c).results))
        out.update({"best_secs": t, "gflops": flop / t / 1e9})
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k != "curve_best_secs"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
