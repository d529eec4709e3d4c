"""Shared kernels (``relax.build(share=True)``): what they save in a cold build and what they
cost at run time, side by side.

``python -m benchmarks.shared_kernels [--models densenet121,inception_v1,resnet50]
[--rounds 7] [--threads 1] [--layers]``

For each zoo model, in one process: ``relax.build`` with ``share=False`` (every distinct
kernel at its own shapes) and with ``share=True`` (families of kernels that differ in one
dimension moving in even steps compiled as one kernel with that dimension symbolic), the kernel
cache off, alternating; the distinct kernels each compiles and the CPU seconds of each build
(workers included); the outputs compared; then both executables run interleaved round by round
on ``--threads`` threads (CPU-time clock, the median per run) and ``vm.profile``'s per-kernel
times, summed per shared kernel in each round (the median over the rounds): a shared kernel's time
against the time of the kernels it replaces (ratio above 1: the shared kernel is faster).

With ``--layers``, each shared kernel alone against its smallest and its largest member
instead (one thread, the same random inputs, interleaved rounds, medians).

The machine may be shared: the load average is recorded; only the side-by-side ratio means
anything.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

MODELS = ("densenet121", "inception_v1", "resnet50")


def _call_sequence(program) -> list[str]:
    """The kernels a VM program calls, in instruction order."""
    out = []

    def walk(x):
        if isinstance(x, (list, tuple)):
            if x and x[0] == "call_kernel":
                out.append(x[1])
            for v in x:
                walk(v)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
    walk(program["functions"])
    return out


def layer_times(name: str, rounds: int = 9) -> list[dict]:
    """Each shared kernel of ``name`` (cache off, one thread) against its smallest and its
    largest member alone, on the member's shapes and the same random inputs, interleaved
    ``rounds`` times (10 calls a round): the medians per call and their ratio (above 1: the
    shared kernel is faster)."""
    from tilecraft import targets
    from tilecraft.relax import default_schedules
    from tilecraft.relax.build import (_called_kernels, _layout_pipeline, _run_pipeline,
                                       dedupe_kernels, legalize)
    from tilecraft.relax.frontend import from_onnx
    from tilecraft.targets import Target, kernel_cache
    from tilecraft.tensorir.function import IRModule
    from tilecraft.tensorir.generalize import share_kernels
    from tilecraft.zoo import models
    target = Target("llvm")
    with kernel_cache.use(False):
        mod = legalize(_run_pipeline(from_onnx(models.ZOO[name]().onnx_model),
                                     _layout_pipeline(None, None, target), target))
    distinct = list(dict.fromkeys(dedupe_kernels(mod, _called_kernels(mod)).values()))
    rows = []
    for family in share_kernels([mod[n] for n in distinct]):
        for which, index in (("smallest", 0), ("largest", -1)):
            member = mod[distinct[family.members[index]]]
            rng = np.random.default_rng(0)
            args = [targets.array(rng.standard_normal([d.value for d in b.shape]).astype(b.dtype))
                    for b in member.buffers]
            fns = {}
            for label, f in (("own", member), ("shared", family.func)):
                sym = f.attr_dict["global_symbol"]
                m = targets.build(IRModule({sym: default_schedules.apply(f, target)}), target,
                                  cache=False)
                m.num_threads = 1
                fns[label] = m[sym]
            times = {label: [] for label in fns}
            for _ in range(rounds):
                for label, fn in fns.items():
                    fn(*args)
                    t0 = time.perf_counter()
                    for _ in range(10):
                        fn(*args)
                    times[label].append((time.perf_counter() - t0) / 10)
            own, shared = (statistics.median(times[k]) * 1e6 for k in ("own", "shared"))
            rows.append({"kernel": distinct[family.members[0]], "member": which,
                         "value": family.values[index], "own_us": round(own, 1),
                         "shared_us": round(shared, 1), "ratio": round(own / shared, 3)})
    return rows


def measure(name: str, rounds: int, threads: int) -> dict:
    """One model's row."""
    from tilecraft import relax, targets
    from tilecraft.relax.frontend import from_onnx
    from tilecraft.zoo import models

    from .llvm_pipeline import _cpu_seconds
    z = models.ZOO[name]()
    mod = from_onnx(z.onnx_model)
    inputs = list(z.inputs.values())
    builds = {}
    for share in (False, True):
        t0, c0 = time.perf_counter(), _cpu_seconds()
        exe = relax.build(mod, "llvm", upper_bounds=z.upper_bounds or None,
                          cache=os.environ.get("SHARED_KERNELS_CACHE", False), share=share)
        builds[share] = {"exe": exe, "wall_s": time.perf_counter() - t0,
                         "cpu_s": _cpu_seconds() - c0, "distinct": exe.build_stats.distinct}
    fns, outs = {}, {}
    for share, b in builds.items():
        b["exe"].kernel_module.num_threads = threads
        vm = relax.VirtualMachine(b["exe"], targets.cpu(0))
        args = [targets.array(a) for a in inputs]
        outs[share] = vm["main"](*args).numpy()
        fns[share] = (vm, args)
    vm0, args0 = fns[False]
    t0 = time.process_time()
    vm0["main"](*args0)
    number = max(1, int(0.3 / max(time.process_time() - t0, 1e-5)))
    times = {s: [] for s in fns}
    kernel_ms = {s: {} for s in fns}
    for _ in range(rounds):
        for share, (vm, args) in fns.items():
            f = vm["main"]
            f(*args)
            t0 = time.process_time()
            for _ in range(number):
                f(*args)
            times[share].append((time.process_time() - t0) / number)
            for row in vm.profile(*args, number=number).rows:
                kernel_ms[share].setdefault(row["name"], []).append(row["total_ms"] / number)
    # the kernels each shared kernel replaces: the two programs call in the same order
    family: dict[str, set] = {}
    for own, shared in zip(_call_sequence(builds[False]["exe"].program),
                           _call_sequence(builds[True]["exe"].program)):
        family.setdefault(shared, set()).add(own)
    shared_rows = []
    for shared, owns in family.items():
        if len(owns) < 2:
            continue
        # per round, the members' sum against the shared kernel's time (the median over the
        # rounds: the least of each member apart would favour the many small kernels)
        before = statistics.median(sum(kernel_ms[False][k][r] for k in owns)
                                   for r in range(rounds))
        after = statistics.median(kernel_ms[True][shared])
        shared_rows.append({"kernel": shared, "replaces": len(owns), "own_ms": round(before, 4),
                            "shared_ms": round(after, 4),
                            "ratio": round(before / after, 3) if after else None})
    own_ms, shared_ms = (statistics.median(times[s]) * 1e3 for s in (False, True))
    return {"model": name, "distinct_own": builds[False]["distinct"],
            "distinct_shared": builds[True]["distinct"],
            "build_cpu_own_s": round(builds[False]["cpu_s"], 2),
            "build_cpu_shared_s": round(builds[True]["cpu_s"], 2),
            "build_wall_own_s": round(builds[False]["wall_s"], 2),
            "build_wall_shared_s": round(builds[True]["wall_s"], 2),
            "max_abs_diff": float(np.max(np.abs(outs[True] - outs[False]))),
            "run_own_ms": round(own_ms, 3), "run_shared_ms": round(shared_ms, 3),
            "run_ratio": round(own_ms / shared_ms, 3), "threads": threads, "rounds": rounds,
            "shared_kernels": sorted(shared_rows, key=lambda r: -r["own_ms"]),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=1,
                   help="threads of the kernels' parallel loops (0: all cores)")
    p.add_argument("--layers", action="store_true",
                   help="each shared kernel alone against its smallest and largest member")
    p.add_argument("--write", action="store_true",
                   help="write benchmarks/results/shared_kernels/<machine>.json")
    a = p.parse_args(argv)
    rows = []
    load_before = [round(x, 2) for x in os.getloadavg()]
    if a.layers:
        for name in a.models.split(","):
            for r in layer_times(name, a.rounds):
                print(f"{name} {r['kernel'][:50]:<50} {r['member']:<8} ({r['value']:>4}): "
                      f"{r['own_us']:9.1f} us own, {r['shared_us']:9.1f} us shared, "
                      f"{r['ratio']:.3f}x", flush=True)
        print(f"load average {load_before} -> {[round(x, 2) for x in os.getloadavg()]}")
        return 0
    for name in a.models.split(","):
        r = measure(name, a.rounds, a.threads)
        rows.append(r)
        print(f"{name}: distinct kernels {r['distinct_own']} -> {r['distinct_shared']}; cold build "
              f"(cache off) {r['build_cpu_own_s']:.2f} -> {r['build_cpu_shared_s']:.2f} CPU s, "
              f"{r['build_wall_own_s']:.2f} -> {r['build_wall_shared_s']:.2f} s wall; outputs "
              f"max |diff| {r['max_abs_diff']:.3g}", flush=True)
        print(f"  run: {r['run_own_ms']:.3f} -> {r['run_shared_ms']:.3f} ms CPU/run "
              f"({r['run_ratio']:.3f}x), {a.threads} thread(s), load {r['load_average']}")
        for k in r["shared_kernels"]:
            print(f"    {k['kernel'][:60]:<60} x{k['replaces']:<3} {k['own_ms']:8.3f} -> "
                  f"{k['shared_ms']:8.3f} ms  {k['ratio']}x")
    if a.write:
        from .common import write_results
        print("written to", write_results("shared_kernels", rows, {
            "load_average_before": load_before,
            "load_average_after": [round(x, 2) for x in os.getloadavg()]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
