"""Tuned float32 GEMM on the GPU through OpenCL and WebGPU, beside cuBLAS (issue #7).

For each target (``opencl`` on the first GPU platform, ``webgpu`` on the first adapter) it
tunes ``C = A @ B`` (``TUNE_GPU_SIZE``, 4096 on a GPU, 256 on a CPU driver) with
``metaschedule.tune_tasks``: ``TUNE_GPU_TRIALS`` trials (default 64), batches of
``TUNE_GPU_BATCH``, within ``TUNE_GPU_SECONDS`` per target if set; the default GPU schedule (``relax.gpu_schedules``, what ``relax.build``
gives the kernel untuned) is the task's ``baseline``, measured first, so the tuned result is
never worse than untuned. The builder has one worker per CPU core; the runner times each
candidate on the device with its own timer (OpenCL profiling events, WebGPU timestamp
queries) and checks its output against numpy (``Task.reference``: ``A @ B`` on the runner's
random inputs).

Then, in the same process, it builds the database's best for each target, checks it against
float64 numpy on fresh inputs and times it (``time_evaluator``) beside PyTorch's cuBLAS (CUDA
events, TF32 off) and beside the untuned default schedule. On a machine without CUDA the peer
is numpy (OpenBLAS).

Results: ``benchmarks/results/tune_gpu/<machine>.json`` (rows, per target the best-so-far
curve over trials, trials per minute); the database in ``TUNE_GPU_WORK_DIR`` (default
``.tune_gpu/``; a second run resumes it). ``python -m benchmarks.run tune_gpu`` or
``python -m benchmarks.tune_gpu [opencl] [webgpu]``. ``TUNE_GPU_SPACE``: ``knobs`` (default; the
default GEMM recipe's decisions, ``relax.gpu_space``, seeded with the default schedule) or
``generic`` (the generic GPU space, seeded with its points of the default and the hand tilings;
its database in ``<work dir>/<target>-generic``).

**Whole models** (issue 32): ``python -m benchmarks.tune_gpu models [opencl] [webgpu]`` tunes
each model of ``TUNE_GPU_MODELS`` (default ``bert_layer_s128,resnet50``: one BERT-base encoder
layer at sequence 128, ResNet-50; PyTorch modules with random weights exported to ONNX at the
static batch ``TUNE_GPU_MODEL_BATCH``, default 1) with ``relax.tune``: the GEMM-like kernels in
the knob space of the default GEMM recipe (``relax.gpu_space``), the others in the generic GPU
space, every kernel's default schedule measured first and re-measured against the best
records at the end (a record replaces the default only where it beats it by 3%).
``TUNE_GPU_MODEL_TRIALS`` is the trial budget per model (default
``TUNE_GPU_MODEL_TRIALS_PER_TASK`` (4) per task beyond the defaults' one each: 25 for the BERT
layer's 5 tasks; meant to fit about 4 minutes per model on the GPU machine, not yet measured
there). It prints per task the default's and the selected schedule's re-measured times and the
knobs that changed, and per model the untuned and the tuned build (each checked against
PyTorch, then timed in interleaved rounds) beside PyTorch eager (CUDA, TF32 off; on a machine
without CUDA, PyTorch on the CPU). Results: ``benchmarks/results/tune_gpu_models/<machine>.json``;
the databases in ``TUNE_GPU_WORK_DIR/models/<model>-<target>``.

**fp16 on the tensor cores** (issue 31): ``TUNE_GPU_FP16=1 python -m benchmarks.tune_gpu models
opencl`` tunes ``relax.quantize(model, "fp16")`` for ``opencl -device=nvidia`` (on an NVIDIA
device; ``-device=nvidia-emulated`` on another, to try it on PoCL): its fp16 GEMMs in the
tensor-core kernel's knob space (``relax.tensor_core_space``: tile, ldmatrix, split-K), the
rest as above; the builds are checked against PyTorch fp32 at a relative tolerance of
``FP16_TOL``. Results: ``benchmarks/results/tune_gpu_models_fp16/<machine>.json``; the
databases in ``TUNE_GPU_WORK_DIR/models/<model>-fp16-<target>``.
"""
from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

from tilecraft import targets
from benchmarks.common import print_table, write_results
from benchmarks.gpu_common import gemm_func, torch_cuda_seconds
from tilecraft.metaschedule import (Database, LocalBuilder, LocalRunner, Task, apply_best,
                          baseline_record, tune_tasks)
from tilecraft.metaschedule.plot import tuning_curve
from tilecraft.metaschedule.schedule_rule.base import ANN_SHARED_LAYOUT, SHARED_LAYOUTS
from tilecraft.relax import gpu_schedules
from tilecraft.relax.gpu_space import gpu_space
from tilecraft.relax.backend.gpu import gemm
from tilecraft.tensorir import Schedule

TRIALS = int(os.environ.get("TUNE_GPU_TRIALS", "64"))
BATCH = int(os.environ.get("TUNE_GPU_BATCH", "32"))
POPULATION = int(os.environ.get("TUNE_GPU_POPULATION", "64"))
SECONDS = float(os.environ.get("TUNE_GPU_SECONDS", "0"))    # per target; 0: no budget
WORK_DIR = os.environ.get("TUNE_GPU_WORK_DIR", ".tune_gpu")
SPACE = os.environ.get("TUNE_GPU_SPACE", "knobs")
FP16 = os.environ.get("TUNE_GPU_FP16", "") == "1"
FP16_TOL = 2e-2          # fp16 operands (float32 accumulation) against PyTorch fp32


# -- devices and targets --------------------------------------------------------------------
def _opencl():
    """(device, Target, description) of the first OpenCL GPU (else the first device)."""
    from tilecraft.targets.opencl_backend import list_devices
    devs = list_devices()
    if not devs:
        return None
    info = devs[0]                   # GPUs are listed first
    config = {"kind": "opencl", "max_threads_per_block": min(1024, info["max_work_group_size"]),
              "max_shared_memory_per_block": info["local_mem_size"]}
    gpu = "CPU" not in info["type"].upper()
    if FP16:         # the tensor cores (emulated elsewhere: the same kernels, on PoCL)
        config["device"] = "nvidia" if "NVIDIA" in f"{info['vendor']} {info['name']}".upper() \
            else "nvidia-emulated"
    elif not gpu:
        config["device"] = "cpu"
    return targets.opencl(info["index"]), targets.Target(config), info["name"], gpu


def _webgpu():
    from tilecraft.targets.webgpu_backend import list_adapters, num_adapters
    if num_adapters() == 0:
        return None
    info = list_adapters()[0]
    return targets.webgpu(0), targets.Target("webgpu"), info["name"], info["type"] != "CPU"


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


# -- the default schedule as a baseline -----------------------------------------------------


def default_tiling(target=None) -> tuple:
    """The default GEMM schedule's tiling for ``target`` (OpenCL when None): ((threads,
    registers) of rows, of columns, k-tile)."""
    if target is not None and target.kind == "webgpu":
        return gemm.GEMM_TILE_WEBGPU, gemm.GEMM_TILE_WEBGPU, gemm.webgpu_k_step(target)
    return gemm.GEMM_TILE, gemm.GEMM_TILE_J, gemm.GEMM_BK


# the hand WebGPU schedule's tiling (benchmarks/schedules/webgpu.py): 128 x 128 x 16, 8 x 8
HAND_TILING = ((16, 8), (16, 8), 16)


def space_point(func, target, tiling, space=None, b_layout: str = "row") -> Schedule | None:
    """The point of the GPU design space with a GEMM tiling ``((ty, ri), (tx, rj), bk)``:
    ``ty x tx`` threads of ``ri x rj`` accumulators, a k-tile of ``bk``; shared tiles as the
    operands (``B``'s in ``b_layout``), scalar cooperative fetch, the register tile unrolled. The default
    schedule's tiling (``default_tiling()``) is the search's first parent, so its mutations
    explore the neighbourhood of a schedule known to be good. None when the space has no such
    point (the extents do not divide, a limit of the target)."""
    from tilecraft.metaschedule import default_space
    space = space or default_space(target)
    n_i, n_j = (int(e.value) for e in func.buffers[2].shape)
    (ty, ri), (tx, rj), bk = tiling
    n_k = int(func.buffers[0].shape[1].value)
    if n_i % (ty * ri) or n_j % (tx * rj) or n_k % bk:
        return None
    tiles = [[n_i // (ty * ri), 1, ty, 1, ri], [n_j // (tx * rj), 1, tx, 1, rj],
             [n_k // bk, bk, 1]]
    trace = space.generate(func, target)[0].trace
    t = 0
    layouts = [i for i, inst in enumerate(trace.instructions) if inst.kind == "annotate" and
               inst.inputs[1] == ANN_SHARED_LAYOUT]
    b_lay = next((i for i, inst in enumerate(trace.instructions) if inst.kind ==
                  "sample_categorical" and layouts[1:] and
                  inst.outputs[0] in str(trace.instructions[layouts[1]].inputs[2])), None)
    for idx, inst in enumerate(trace.instructions):
        if inst.kind == "sample_tile":
            trace = trace.with_decision(idx, tiles[t])
            t += 1
        elif inst.kind == "sample_categorical":
            cands = list(inst.inputs[0])
            # layouts and vector lengths: the first candidate; the unroll depth: 1024 (the
            # register tile; a fully unrolled k-tile too makes shaders the Vulkan driver
            # compiles for over a minute)
            unroll = 0 in cands and max(cands) > 64
            pick = cands.index(1024) if unroll and 1024 in cands else \
                len(cands) - 1 if unroll else 0
            if idx == b_lay:
                pick = cands.index(SHARED_LAYOUTS.index(b_layout))
            trace = trace.with_decision(idx, pick)
    return space.finish(trace, func, target)


# -- timing ------------------------------------------------------------------------------------
def _device_secs(mod, dev, args, number=10, repeat=5) -> float:
    return mod.time_evaluator(mod.entry_name, dev, number=number, repeat=repeat)(*args).median


def _check(label, got, ref):
    err = float(np.max(np.abs(got - ref)) / (np.max(np.abs(ref)) + 1e-30))
    if err > 1e-4:
        raise AssertionError(f"{label}: result differs from float64 numpy (rel {err:.2e})")
    return err


def _curve(work_dir, target) -> list[float]:
    """Best-so-far milliseconds after each measured trial (inf before the first success)."""
    curves = tuning_curve(work_dir, target)
    if not curves:
        return []
    c = next(iter(curves.values()))
    return [float(x) * 1e3 if math.isfinite(x) else None for x in c.get("best_secs", [])]


def tune_one(kind: str, n: int, trials: int, work_dir: str, seed: int = 0):
    """Tune GEMM ``n``^3 on ``kind`` ("opencl" / "webgpu"); return (rows, extra)."""
    found = _opencl() if kind == "opencl" else _webgpu()
    if found is None:
        return [{"target": kind, "note": f"no {kind} device"}], {}
    dev, target, name, gpu = found
    func = gemm_func(n)
    flops = 2.0 * n ** 3
    ref = lambda a, b, c: [a @ b]                                 # noqa: E731
    name_t = f"gemm{n}"
    wd = os.path.join(work_dir, kind if SPACE == "knobs" else f"{kind}-{SPACE}")
    cores = os.cpu_count() or 1
    builder = LocalBuilder(max_workers=cores)
    # one timed run is a few ms at 4096^3 (a poor candidate: a quarter second): 2 x 2 calls
    # (a candidate whose pipeline takes the driver longer than 20 s to compile is no good)
    runner = LocalRunner(timeout_sec=20 if gpu else 30, number=2, repeat=2, min_repeat_ms=0,
                         enable_cpu_cache_flush=False)
    before = len(Database(wd).get_all_tuning_records()) if os.path.isdir(wd) else 0
    search = {"population_size": POPULATION, "genetic_num_iters": 2}
    # TUNE_GPU_SPACE=knobs (default): the default GEMM recipe's knobs (relax.gpu_space);
    # generic: the generic GPU space (multi-level tiling), seeded with its points of the
    # default and the hand tilings
    space = gpu_space(target) if SPACE == "knobs" else None
    t0 = time.time()
    try:
        # the untuned default schedule (relax.build's) is measured first: a record, so the
        # tuned best is never worse; then the space's points of the default and the hand
        # tilings (each measured once, as a task baseline) seed the search
        # (B's tile permuted as the WebGPU default and hand schedules do)
        b_layout = "permuted" if target.kind == "webgpu" else "row"
        if space is not None:
            # the knob space: its point at the defaults is the default schedule
            seeds = space.seeds(func, target)
        else:
            seeds = [gpu_schedules.default_schedule(func, target),
                     space_point(func, target, default_tiling(target), b_layout=b_layout),
                     space_point(func, target, HAND_TILING, b_layout="permuted")]
        for sch in seeds:
            if sch is None:
                continue
            seed_task = Task(name_t, func, baseline=sch, reference=ref)
            if os.path.isdir(wd) and baseline_record(Database(wd), seed_task, target):
                continue                          # measured by an earlier run
            # (no end-of-run re-measurement per seed: at 4096^3 it took 30-45 s a call on the
            # H200; the last batch re-measures the best records against the baseline)
            db = tune_tasks([seed_task], target, max_trials=1, work_dir=wd, builder=builder,
                            runner=runner, seed=seed, progress=False, search=search,
                            remeasure=0, space=space)
        # then batches while the trials and the time budget last (each call resumes the
        # database and the cost model)
        done, batch = 0, min(BATCH, trials)
        t_batches = time.time()
        while done < trials:
            left = SECONDS - (time.time() - t0) if SECONDS else math.inf
            per_batch = (time.time() - t_batches) / (done / batch) if done else 0.0
            if done and left < per_batch:
                break            # the first batch always runs; then while one more fits
            m = min(batch, trials - done)
            # re-measured (tune_tasks' remeasure) only at the last batch: the one after which
            # the trials or the time budget (one more batch would not fit) run out
            last = done + m >= trials or bool(done and left < 2 * per_batch)
            kw = {} if last else {"remeasure": 0}
            db = tune_tasks([Task(name_t, func, reference=ref)], target, max_trials=m,
                            work_dir=wd, num_trials_per_iter=m, builder=builder,
                            runner=runner, seed=seed + done, progress=False, search=search,
                            space=space, **kw)
            done += m
    finally:
        builder.close()
        runner.close()
    db = Database(wd)
    tune_s = time.time() - t0
    recs = db.get_all_tuning_records()
    measured = len(recs) - before
    ok = sum(r.ok for r in recs[before:])
    wrong = sum(bool(r.error and "wrong result" in r.error) for r in recs[before:])

    # -- the best, the default and the peer, side by side in this process
    rng = np.random.default_rng(1)
    a_np = rng.standard_normal((n, n)).astype("float32")
    b_np = rng.standard_normal((n, n)).astype("float32")
    ref = a_np.astype("float64") @ b_np.astype("float64")
    A, B = targets.array(a_np, dev), targets.array(b_np, dev)
    C = targets.empty((n, n), "float32", dev)
    torch = _torch_cuda() if gpu else None
    if torch is not None:
        ta, tb = torch.from_numpy(a_np).cuda(), torch.from_numpy(b_np).cuda()
        peer, peer_s = "torch cuBLAS fp32 (TF32 off)", torch_cuda_seconds(
            torch, lambda: ta @ tb, 20, 5)
    else:
        from benchmarks.common import side_by_side
        peer, peer_s = "numpy (OpenBLAS)", side_by_side(lambda: a_np @ b_np, lambda: None,
                                                        number=1, rounds=3)[0]
    rows = []
    best = apply_best(db, func, target)
    built = []
    for label, f in (("default schedule (untuned)", gpu_schedules.apply(func, target)),
                     (f"tuned ({len(recs)} trials)", best.mod["main"] if best else None)):
        if f is None:
            rows.append({"target": kind, "schedule": label, "note": "no valid record"})
            continue
        mod = targets.build(f, target)
        mod[mod.entry_name](A, B, C)
        built.append((label, mod, _check(f"{kind} {label}", C.numpy(), ref)))
    # interleaved rounds (the device's clocks and the other jobs drift): the best median each
    secs = {label: math.inf for label, _, _ in built}
    for _ in range(3):
        for label, mod, _ in built:
            secs[label] = min(secs[label], _device_secs(mod, dev, (A, B, C), repeat=3))
    for label, mod, err in built:
        t = secs[label]
        rows.append({"target": kind, "device": name, "bench": f"gemm {n}^3", "schedule": label,
                     "ms": t * 1e3, "tflops": flops / t / 1e12, "peer": peer,
                     "peer_ms": peer_s * 1e3, "peer_tflops": flops / peer_s / 1e12,
                     "ratio": peer_s / t, "rel_err": err})
        print("  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in rows[-1].items()), file=sys.stderr, flush=True)
    extra = {"target": str(target), "device": name, "trials_run": measured, "trials_ok": ok,
             "trials_wrong": wrong, "tune_seconds": tune_s,
             "trials_per_min": measured / tune_s * 60 if tune_s > 0 else 0.0,
             "builder_workers": cores, "curve_best_ms": _curve(wd, target),
             "best_trace": str(best.trace) if best else None}
    return rows, extra


# -- whole models (relax.tune) ------------------------------------------------------------------
MODELS = ("bert_layer_s128", "resnet50")
MODEL_BATCH = int(os.environ.get("TUNE_GPU_MODEL_BATCH", "1"))
TRIALS_PER_TASK = int(os.environ.get("TUNE_GPU_MODEL_TRIALS_PER_TASK", "4"))


def _model(name: str, batch: int):
    """(torch module, ONNX model, input) of a model at a static batch."""
    import torch
    from tilecraft.zoo.models import _export, _randomize_bn, _torch_modules
    from benchmarks.gpu_models import SEQ, _resnet50
    torch.manual_seed(0)
    rng = np.random.default_rng(batch)
    if name == "resnet50":
        module = _resnet50()
        _randomize_bn(module, 0)
        x = rng.standard_normal((batch, 3, 224, 224)).astype("float32")
    elif name == "bert_layer_s128":
        module = _torch_modules()["BertBase"](layers=1).layers[0]
        x = rng.standard_normal((batch, SEQ, 768)).astype("float32")
    else:
        raise ValueError(f"TUNE_GPU_MODELS: unknown model {name!r}; known: {', '.join(MODELS)}")
    module.eval()
    return module, _export(module, [torch.from_numpy(x)], ["input"]), x


def _knobs_of(space, task, target):
    """The knobs of the first knob space (``space`` or one of its fallbacks: the tensor-core
    kernel's, then the GEMM recipe's) that has some for the task; None for the generic one."""
    from tilecraft.metaschedule import KnobSpace
    while isinstance(space, KnobSpace):
        knobs = space.knobs_of(task.func, target, task.shape_hints)
        if knobs is not None:
            return knobs
        space = space.fallback
    return None


def _knob_change(space, task, target, trace) -> str:
    """The knobs of the selected record that differ from the defaults ('' for none)."""
    from tilecraft.metaschedule import knob_values
    knobs = _knobs_of(space, task, target)
    if knobs is None:
        return "(generic space)"
    values = knob_values(trace, knobs) or {}
    return ", ".join(f"{k.name}={values[k.name]}" for k in knobs
                     if k.name in values and values[k.name] != k.default)


def tune_model(name: str, kind: str, work_dir: str, seed: int = 0):
    """Tune model ``name`` on ``kind`` with ``relax.tune``; (rows, extra)."""
    from tilecraft import relax
    from tilecraft.relax.frontend import from_onnx
    from benchmarks.gpu_models import _torch_time
    found = _opencl() if kind == "opencl" else _webgpu()
    if found is None:
        return [{"model": name, "target": kind, "note": f"no {kind} device"}], {}
    dev, target, dev_name, gpu = found
    module, onnx_model, x = _model(name, MODEL_BATCH)
    mod = from_onnx(onnx_model)
    if FP16:
        mod = relax.quantize(mod, "fp16")
        name = f"{name}-fp16"
    tasks = relax.extract_tasks(mod, target)
    space = gpu_space(target)
    n_knob = sum(_knobs_of(space, t, target) is not None for t in tasks)
    n_tc = sum(space.knobs_of(t.func, target, t.shape_hints) is not None for t in tasks) \
        if target.tensor_cores else 0
    trials = int(os.environ.get("TUNE_GPU_MODEL_TRIALS", "0")) or \
        len(tasks) * (1 + TRIALS_PER_TASK)
    wd = os.path.join(work_dir, "models", f"{name}-{kind}")
    cores = os.cpu_count() or 1
    builder = LocalBuilder(max_workers=cores)
    runner = LocalRunner(timeout_sec=20 if gpu else 60, number=3, repeat=2, min_repeat_ms=0,
                         enable_cpu_cache_flush=False)
    print(f"{name} {kind}: {len(tasks)} tasks ({n_knob} in a knob space, {n_tc} of them the "
          f"tensor-core kernel's), {trials} trials", file=sys.stderr, flush=True)
    t0 = time.time()
    try:
        db = relax.tune(mod, target, max_trials=trials, work_dir=wd, builder=builder,
                        runner=runner, num_trials_per_iter=BATCH, seed=seed, progress=False,
                        search={"population_size": POPULATION, "genetic_num_iters": 2},
                        space=space)
    finally:
        builder.close()
        runner.close()
    tune_s = time.time() - t0
    rows = []
    for t in tasks:
        rem = db.get_remeasurements(t.func, target)
        if not rem:
            top = db.get_top_k(t.func, target, 1)
            rows.append({"model": name, "target": kind, "task": t.name, "weight": t.weight,
                         "default_ms": top[0].mean_secs * 1e3 if top else None,
                         "note": "no trials beyond the default: kept"})
            print("  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                   for k, v in rows[-1].items()), file=sys.stderr, flush=True)
            continue
        last = rem[-1]
        base = last.median_secs(last.baseline) if last.baseline is not None else math.nan
        sel = last.median_secs(last.selected)
        rows.append({"model": name, "target": kind, "task": t.name, "weight": t.weight,
                     "default_ms": base * 1e3, "tuned_ms": sel * 1e3,
                     "speedup": base / sel if math.isfinite(base) else None,
                     "knobs": _knob_change(space, t, target, last.traces[last.selected])})
        print("  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in rows[-1].items()), file=sys.stderr, flush=True)
    # the models: untuned and tuned builds, checked against PyTorch, timed in interleaved rounds
    cuda = _torch_cuda() if gpu else None
    ref, torch_s = _torch_time(module, x, "cuda" if cuda is not None else "cpu")
    x_dev = targets.array(x, dev)
    built = {}
    for label, kw in (("default", {}), ("tuned", {"database": db})):
        vm = relax.VirtualMachine(relax.build(mod, target, **kw), dev)
        out = vm["main"](x_dev)
        out = (out[0] if isinstance(out, tuple) else out).numpy()
        err = float(np.max(np.abs(out - ref)) / (np.max(np.abs(ref)) + 1e-30))
        if err > (FP16_TOL if FP16 else 1e-3):
            raise AssertionError(f"{name} {kind} {label}: differs from PyTorch (rel {err:.1e})")
        built[label] = (vm, err)
    secs = {label: math.inf for label in built}
    for _ in range(3):
        for label, (vm, _) in built.items():
            res = vm.time_evaluator("main", dev, number=10, repeat=3)(x_dev)
            secs[label] = min(secs[label], min(res.results))
    peer = "torch eager fp32 " + ("CUDA (TF32 off)" if cuda is not None else "CPU")
    for label in built:
        rows.append({"model": name, "target": kind, "device": dev_name, "batch": MODEL_BATCH,
                     "schedule": label if label == "default" else f"tuned ({trials} trials)",
                     "ms": secs[label] * 1e3, "peer": peer, "peer_ms": torch_s * 1e3,
                     "ratio": torch_s / secs[label], "rel_err": built[label][1]})
        print("  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in rows[-1].items()), file=sys.stderr, flush=True)
    extra = {"target": str(target), "device": dev_name, "tasks": len(tasks),
             "knob_tasks": n_knob, "tensor_core_tasks": n_tc, "trials": trials, "tune_seconds": tune_s,
             "tuned_vs_default": secs["default"] / secs["tuned"]}
    return rows, extra


def run_models(kinds=None) -> list[dict]:
    kinds = kinds or [k for k in os.environ.get(
        "TUNE_GPU_TARGETS", "opencl" if FP16 else "opencl,webgpu").split(",") if k]
    names = [m for m in os.environ.get("TUNE_GPU_MODELS", ",".join(MODELS)).split(",") if m]
    rows, extras, gpu_name = [], {}, None
    for kind in kinds:
        found = _opencl() if kind == "opencl" else _webgpu()
        if found is not None and found[3] and gpu_name is None:
            gpu_name = found[2]
        for name in names:
            r, extra = tune_model(name, kind, WORK_DIR)
            rows += r
            extras[f"{name} {kind}"] = extra
            # written after every model, so a run cut short keeps its rows
            path = write_results("tune_gpu_models_fp16" if FP16 else "tune_gpu_models", rows,
                                 {"tuning": extras}, gpu=gpu_name)
    print(f"(written to {path})")
    return rows


# run() writes the results itself, under the GPU's name (``benchmarks.run`` does not)
WRITES_RESULTS = True


def run(kinds=None) -> list[dict]:
    kinds = kinds or [k for k in os.environ.get("TUNE_GPU_TARGETS", "opencl,webgpu").split(",")
                      if k]
    rows, extras = [], {}
    gpu_name = None                    # the first GPU tuned on names the results file
    for kind in kinds:
        found = _opencl() if kind == "opencl" else _webgpu()
        gpu = bool(found and found[3])
        if gpu and gpu_name is None:
            gpu_name = found[2]
        n = int(os.environ.get("TUNE_GPU_SIZE", 4096 if gpu else 256))
        r, extra = tune_one(kind, n, TRIALS, WORK_DIR)
        rows += r
        extras[kind] = extra
        for row in r:
            row["trials_per_min"] = extra.get("trials_per_min")
    path = write_results("tune_gpu", rows, {"tuning": extras}, gpu=gpu_name)
    print(f"(written to {path})")
    return rows


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["models"]:
        result = run_models(args[1:] or None)
    else:
        result = run(args or None)
    print_table(result, list(dict.fromkeys(k for r in result for k in r)))
