"""Dump every kernel of a set of models after scheduling (and lowered), so that a refactoring of
the kernel library or the default schedules can be checked to change no kernel: run it before
and after, and ``diff -r`` the two folders.

For each model and target the module goes through the default pipeline (``relax.get_pipeline``:
``ConvertLayout`` and ``AlterLayout`` on CPU targets) and ``relax.build``'s legalization; each
kernel the VM calls is scheduled as ``relax.build`` schedules it without a database
(``relax.schedule_kernels``: ``default_schedules`` on CPU targets, ``gpu_schedules`` on GPU ones)
and written to ``<out>/<target>/<model>.txt`` as its ``script()``, then lowered for the target
(``tensorir.transform.lower``; for GPU targets the host / device split of ``lower_device``). A
kernel whose unscheduled text was already seen for the target is scheduled once (the schedules
are deterministic).

Models: the onnx package's light ResNet-50, Inception-v1, DenseNet-121, SqueezeNet and
ShuffleNet (random weights, ``benchmarks.zoo.models``), one BERT-base encoder layer (symbolic
batch and sequence length), and ``nhwc_block``: channels-last convolutions written in NHWC (3x3
stride 1: Winograd; 1x1; 3x3 stride 2; grouped; depthwise), pooling and a dense classifier, so
that the NHWC and Winograd kernels are built on every target, not only where ``ConvertLayout``
converts.

Usage::

    python -m benchmarks.kernel_fingerprint --out /tmp/fp_before
    (change the code)
    python -m benchmarks.kernel_fingerprint --out /tmp/fp_after
    diff -r /tmp/fp_before /tmp/fp_after && echo identical

``--models`` and ``--targets`` take comma-separated subsets (names as in ``MODELS`` /
``TARGETS``); ``--no-lower`` skips the lowered forms. ``--asm`` also writes, for the CPU
targets, ``<out>/<target>/<model>.s``: each distinct kernel compiled as ``relax.build``
compiles it (LLVM IR generation, the LLVM pipeline at the target's level) and printed as
assembly, so that a change of the code generator can be shown to change no machine code (the
IR text may differ in its value names).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

# The targets the default schedules specialize on: AVX2 (16 vector registers: ConvertLayout
# converts, Winograd runs), AVX-512 (32 registers), AArch64 NEON (32 registers of 4 lanes) and
# 32-bit Arm (pooling on phase planes), each with an explicit core count (parallel splits
# depend on it); and the GPU targets.
TARGETS = {
    "avx2": "llvm -mtriple=x86_64-linux-gnu -mcpu=haswell -num-cores=2",
    "avx2_16": "llvm -mtriple=x86_64-linux-gnu -mcpu=znver3 -num-cores=16",
    "avx512": "llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512 -num-cores=8",
    "neon": "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -mattr=+neon -num-cores=4",
    "armv7": "llvm -mtriple=armv7a-linux-gnueabihf -mcpu=cortex-a72 -mattr=+neon,+vfp4 "
             "-num-cores=4",
    "opencl": "opencl",
    "opencl_cpu": "opencl -device=cpu",
    "webgpu": "webgpu",
}
CPU_TARGETS = ("avx2", "avx2_16", "avx512", "neon", "armv7")
LIGHT = ("resnet50", "inception_v1", "densenet121", "squeezenet", "shufflenet")
MODELS = LIGHT + ("bert_layer", "nhwc_block")


def nhwc_block(seed: int = 0):
    """A channels-last block: NHWC convolutions of each kind the NHWC kernels take (Winograd's
    3x3 stride 1, 1x1, 3x3 stride 2, grouped, depthwise) with bias, residual and relu, a max
    pooling, a global average pooling and a dense classifier; symbolic batch."""
    from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
    rng = np.random.default_rng(seed)

    def w(*shape):
        return const((rng.standard_normal(shape) * 0.1).astype("float32"))

    def conv(bb, x, cin, cout, k, stride=1, pad=None, groups=1):
        pad = k // 2 if pad is None else pad
        y = bb.emit(op.nn.conv2d(x, w(k, k, cin // groups, cout), strides=stride,
                                 padding=pad, groups=groups, data_layout="NHWC",
                                 kernel_layout="HWIO"))
        return bb.emit(op.add(y, w(1, 1, 1, cout)))

    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 28, 28, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.nn.relu(conv(bb, x, 32, 64, 3)))                  # Winograd
            b = bb.emit(op.nn.relu(conv(bb, a, 64, 64, 3)))                  # Winograd
            s = conv(bb, x, 32, 64, 1)                                       # 1x1
            c = bb.emit(op.nn.relu(bb.emit(op.add(b, s))))                   # residual
            d = bb.emit(op.nn.relu(conv(bb, c, 64, 128, 3, stride=2)))       # 3x3 stride 2
            e = bb.emit(op.nn.relu(conv(bb, d, 128, 128, 3, groups=4)))      # grouped
            f = bb.emit(op.nn.relu(conv(bb, e, 128, 128, 3, groups=128)))    # depthwise
            g = bb.emit(op.nn.max_pool2d(f, pool_size=3, strides=2, padding=1, layout="NHWC"))
            h = bb.emit(op.mean(g, axis=[1, 2]))
            out = bb.emit(op.linear(h, w(10, 128), w(10)))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def load_model(name: str):
    """The Relax module of model ``name``."""
    if name == "nhwc_block":
        return nhwc_block()
    from tilecraft.relax.frontend import from_onnx
    from tilecraft.zoo import models
    z = models.light(name) if name in LIGHT else models.ZOO[name]()
    return from_onnx(z.onnx_model)


def kernel_assembly(name: str, lowered, target) -> str:
    """The assembly of lowered kernel ``lowered`` compiled for CPU ``target`` as
    ``targets.llvm.compiler.compile_kernel`` compiles it."""
    from tilecraft.targets.llvm import compiler
    config = compiler.MachineConfig(target)
    tm = config.machine(jit=False, pic=True)
    cg = compiler._KernelCodeGen(config.codegen_options(str(tm.target_data)))
    cg.add_function(name, lowered)
    mod = compiler._parse(str(cg.module), config.has_fma)
    compiler.optimize(mod, tm, config.opt_level)
    return tm.emit_assembly(mod)


def kernel_texts(mod, target, lower: bool, cache: dict, asm: dict | None = None,
                 asm_cache: dict | None = None) -> list[tuple[str, str]]:
    """``(kernel name, text)`` for each kernel of ``mod`` after the default pipeline: the
    scheduled ``script()`` and, with ``lower``, the lowered form. With ``asm`` (a dict, CPU
    targets), ``asm[name]`` is each kernel's assembly (``kernel_assembly``; ``asm_cache``
    keeps it per distinct kernel, as ``cache`` keeps the texts)."""
    asm_cache = {} if asm_cache is None else asm_cache
    from tilecraft import relax, targets
    from tilecraft.relax.build import legalize, schedule_kernels
    from tilecraft.tensorir.transform import lower as lower_func, lower_device

    target = targets.Target(target)
    mod = relax.get_pipeline(target=target)(mod)
    mod = legalize(mod)
    scheduled = schedule_kernels(mod, target)
    gpu = target.kind != "llvm"
    out = []
    for name, func in scheduled.items():
        key = mod[name].script()
        if key not in cache:
            text = func.script()
            if lower:
                if gpu:
                    text += "\n# --- lowered ---\n" + lower_device(func, target).script()
                else:
                    text += "\n# --- lowered ---\n" + lower_func(func, target).script()
            cache[key] = text
        if asm is not None and not gpu:
            if key not in asm_cache:
                # the kernel's own name goes into its symbols: compile it as "kernel"
                asm_cache[key] = kernel_assembly("kernel", lower_func(func, target), target)
            asm[name] = asm_cache[key]
        out.append((name, cache[key]))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for <target>/<model>.txt")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--targets", default=",".join(CPU_TARGETS))
    p.add_argument("--no-lower", action="store_true")
    p.add_argument("--asm", action="store_true", help="also <target>/<model>.s (CPU targets)")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    names = [t for t in args.targets.split(",") if t]
    for m in models:
        if m not in MODELS:
            p.error(f"unknown model {m!r}; known: {', '.join(MODELS)}")
    for t in names:
        if t not in TARGETS:
            p.error(f"unknown target {t!r}; known: {', '.join(TARGETS)}")
    loaded = {}
    total = 0
    for t in names:
        os.makedirs(os.path.join(args.out, t), exist_ok=True)
        cache: dict[str, str] = {}
        asm_cache: dict[str, str] = {}
        for m in models:
            start = time.perf_counter()
            if m not in loaded:
                loaded[m] = load_model(m)
            asm = {} if args.asm else None
            texts = kernel_texts(loaded[m], TARGETS[t], not args.no_lower, cache, asm, asm_cache)
            with open(os.path.join(args.out, t, f"{m}.txt"), "w") as f:
                for name, text in texts:
                    f.write(f"### {name}\n{text}\n")
            if asm:
                with open(os.path.join(args.out, t, f"{m}.s"), "w") as f:
                    for name, text in asm.items():
                        f.write(f"### {name}\n{text}\n")
            total += len(texts)
            print(f"{t} {m}: {len(texts)} kernels ({len(cache)} distinct on {t} so far), "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
    print(f"{total} kernels in all", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
