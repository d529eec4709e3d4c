"""Which LLVM optimization level our kernels need: compile time, object identity and run time.

``python -m benchmarks.llvm_pipeline [--models resnet50,bert_layer,mobilenet_v2]
[--levels 3,2,1] [--rounds 9] [--no-run]``

Our TensorIR reaches LLVM already scheduled (tiled, vectorized, unrolled where the schedule
asked), so LLVM's ``-O3`` pipeline may do work that a shorter one would skip. For each model,
in one process:

1. **Compile time and identity**: each distinct kernel is scheduled, lowered and turned into
   LLVM IR once (``relax.build``'s own steps), then optimized (``targets.llvm.compiler.optimize``
   at each level in ``--levels``) and emitted to an object with a target machine of the same
   level, interleaved level by level; the CPU seconds of optimization and of code generation
   per level, and how many kernels' objects are byte-identical to the first level's.
2. **Run time** (unless ``--no-run``): the model built at each level
   (``Target("llvm -opt-level=N")``, kernel cache off; its CPU seconds, workers included),
   the outputs compared with the first level's, then the executables run interleaved round by
   round on ``--threads`` threads (default 1), CPU-time clock; the median per run, its ratio
   to the first level's (above 1: faster), and ``vm.profile``'s per-kernel times (the least
   of ``--rounds`` profiles; the three kernels that lost most against the first level, among
   those of 1% of its time or more), so a kernel that got slower shows even when the
   model's total does not.

The machine may be shared: the load average is printed with each table, and only a
side-by-side ratio in one run means anything.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

import numpy as np

MODELS = ("resnet50", "bert_layer", "mobilenet_v2")


def load_model(name: str):
    """``(relax IRModule, inputs)`` of ``name``: a zoo model, or one BERT-base encoder layer at
    batch 1 x 128 tokens."""
    if name == "bert_layer":
        from tilecraft.models import bert_encoder_layer
        m = bert_encoder_layer(batch=1, seq_len=128)
        return m.mod, m.make_inputs(np.random.default_rng(0), batch=1, seq_len=128)
    from tilecraft.relax.frontend import from_onnx
    from tilecraft.zoo import models
    z = models.light(name) if name in models.light_models() else models.ZOO[name]()
    return from_onnx(z.onnx_model), list(z.inputs.values())


def kernel_ir(mod, target) -> list[tuple[str, str]]:
    """``(name, LLVM IR text)`` of each distinct kernel ``relax.build`` would compile for
    ``target`` (shared kernels included), as given to the optimizer (the tagged multiply-adds
    fused)."""
    from tilecraft.relax.build import (StaticPlanBlockMemory, _called_kernels, _layout_pipeline,
                                       _run_pipeline, dedupe_kernels, kernel_specs, legalize,
                                       share_shaped_kernels, vm_codegen)
    from tilecraft.targets import kernel_cache
    from tilecraft.targets.build_module import is_lowered
    from tilecraft.targets.llvm import compiler
    from tilecraft.tensorir.transform import lower
    with kernel_cache.use(False):
        mod = legalize(_run_pipeline(mod, _layout_pipeline(None, None, target), target))
    mod = StaticPlanBlockMemory(None, target=target)(mod)
    mod, aliases = share_shaped_kernels(mod, dedupe_kernels(mod, _called_kernels(mod)), target)
    program, _ = vm_codegen(mod, aliases)
    config = compiler.MachineConfig(target)
    data_layout = str(config.machine().target_data)
    out = []
    for spec in kernel_specs(mod, target, None, program["kernels"]):
        func = spec.schedule(spec.func) if spec.schedule is not None else spec.func
        func = func if is_lowered(func) else lower(func, target)
        cg = compiler._KernelCodeGen(config.codegen_options(data_layout))
        cg.add_function(spec.name, func)
        text = str(cg.module)
        out.append((spec.name, compiler.fuse_tagged_fma(text) if config.has_fma else text))
    return out


def compile_times(texts: list[tuple[str, str]], levels: list[int], rounds: int = 1) -> dict:
    """Per level: CPU seconds of optimization and code generation over ``texts`` (summed over
    ``rounds``, levels interleaved), and the kernels whose object equals the first level's."""
    import llvmlite.binding as llvm
    from tilecraft.targets import Target
    from tilecraft.targets.llvm import compiler
    out = {lv: {"optimize": 0.0, "emit": 0.0, "identical": 0} for lv in levels}
    first: list[bytes] = []
    for r in range(rounds):
        for lv in levels:
            config = compiler.MachineConfig(Target(f"llvm -opt-level={lv}"))
            tm = config.machine()
            objs = []
            for _, text in texts:
                mod = llvm.parse_assembly(text)
                t0 = time.process_time()
                compiler.optimize(mod, tm, lv)
                t1 = time.process_time()
                objs.append(tm.emit_object(mod))
                out[lv]["optimize"] += t1 - t0
                out[lv]["emit"] += time.process_time() - t1
            if not first:
                first = objs
            if r == 0:
                out[lv]["identical"] = sum(a == b for a, b in zip(objs, first))
    return out


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its finished children (the compiler workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_times(mod, inputs, levels: list[int], rounds: int, threads: int = 1) -> dict:
    """Per level: the build's CPU seconds (workers included), the largest difference of the output from the
    first level's, the median CPU seconds per run (interleaved rounds), and per-kernel ms."""
    from tilecraft import relax, targets
    fns, outs, res = {}, {}, {}
    for lv in levels:
        t0 = _cpu_seconds()
        exe = relax.build(mod, f"llvm -opt-level={lv}", cache=False)
        res[lv] = {"build_cpu_s": _cpu_seconds() - t0}
        exe.kernel_module.num_threads = threads
        vm = relax.VirtualMachine(exe, targets.cpu(0))
        args = [targets.array(a) for a in inputs]
        outs[lv] = vm["main"](*args).numpy()
        fns[lv] = (vm, args)
    for lv in levels:
        res[lv]["max_abs_diff"] = float(np.max(np.abs(outs[lv] - outs[levels[0]])))
    vm0, args0 = fns[levels[0]]
    t0 = time.process_time()
    vm0["main"](*args0)
    number = max(1, int(0.3 / max(time.process_time() - t0, 1e-5)))
    times = {lv: [] for lv in levels}
    for _ in range(rounds):
        for lv in levels:
            vm, args = fns[lv]
            f = vm["main"]
            f(*args)
            t0 = time.process_time()
            for _ in range(number):
                f(*args)
            times[lv].append((time.process_time() - t0) / number)
    kernel_ms = {lv: {} for lv in levels}
    for _ in range(rounds):
        for lv in levels:
            vm, args = fns[lv]
            for row in vm.profile(*args, number=number).rows:
                kernel_ms[lv].setdefault(row["name"], []).append(row["total_ms"] / number)
    for lv in levels:
        res[lv]["median_ms"] = statistics.median(times[lv]) * 1e3
        res[lv]["kernel_ms"] = {k: min(v) for k, v in kernel_ms[lv].items()}
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--levels", default="3,2,1", help="optimization levels; the first is the base")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--no-run", action="store_true", help="compile times and identity only")
    p.add_argument("--threads", type=int, default=1,
                   help="threads of the kernels' parallel loops when timing (0: all cores); "
                        "one thread keeps a kernel's time from depending on another process "
                        "taking one of its cores")
    args = p.parse_args(argv)
    from tilecraft.targets import Target
    levels = [int(x) for x in args.levels.split(",")]
    for name in args.models.split(","):
        mod, inputs = load_model(name)
        texts = kernel_ir(mod, Target("llvm"))
        ct = compile_times(texts, levels, rounds=2)
        print(f"{name}: {len(texts)} distinct kernels; CPU s over 2 rounds, levels interleaved "
              f"(load {os.getloadavg()[0]:.1f})")
        for lv in levels:
            c = ct[lv]
            print(f"  O{lv}: optimize {c['optimize']:.2f}  code generation {c['emit']:.2f}  "
                  f"objects identical to O{levels[0]}: {c['identical']}/{len(texts)}")
        if args.no_run:
            continue
        rt = run_times(mod, inputs, levels, args.rounds, args.threads)
        base = rt[levels[0]]
        print(f"  run time, {args.rounds} interleaved rounds, {args.threads or 'all'} thread(s) "
              f"(load {os.getloadavg()[0]:.1f}):")
        for lv in levels:
            r = rt[lv]
            print(f"  O{lv}: {r['median_ms']:.3f} ms CPU/run, {base['median_ms'] / r['median_ms']:.3f}x "
                  f"O{levels[0]}; max |diff| {r['max_abs_diff']:.3g}; build {r['build_cpu_s']:.2f} CPU s")
            if lv != levels[0]:
                share = 0.01 * sum(base["kernel_ms"].values())   # kernels of 1% or more
                worst = sorted(((r["kernel_ms"][k] / v, k) for k, v in base["kernel_ms"].items()
                                 if k in r["kernel_ms"] and k != "(vm)" and v > share),
                               reverse=True)[:3]
                print("      slowest kernels vs O%d: %s" % (levels[0], ", ".join(
                    f"{k} {q:.2f}x time" for q, k in worst)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
