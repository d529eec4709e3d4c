"""Workloads the GPU benchmarks share (``benchmarks.gpu`` for OpenCL, ``benchmarks.gpu_webgpu``).

Examples
--------
>>> from benchmarks.gpu_common import gemm_func
>>> gemm_func(64).params[0].name                                 # doctest: +SKIP
'A'
"""
from __future__ import annotations

import os
import statistics

from tilecraft.tensorir import te


# ResNet-50's 23 distinct convolution shapes, in the model's order (53 layers in all):
# (name, in channels, image side, out channels, kernel, stride, padding, count in ResNet-50)
RESNET50_CONVS = (
    ("stem_7x7s2", 3, 224, 64, 7, 2, 3, 1),
    ("s1_1x1_64to64", 64, 56, 64, 1, 1, 0, 1),
    ("s1_3x3", 64, 56, 64, 3, 1, 1, 3),
    ("s1_1x1_64to256", 64, 56, 256, 1, 1, 0, 4),
    ("s1_1x1_256to64", 256, 56, 64, 1, 1, 0, 2),
    ("s2_1x1_256to128", 256, 56, 128, 1, 1, 0, 1),
    ("s2_3x3s2", 128, 56, 128, 3, 2, 1, 1),
    ("s2_1x1s2_256to512", 256, 56, 512, 1, 2, 0, 1),
    ("s2_3x3", 128, 28, 128, 3, 1, 1, 3),
    ("s2_1x1_128to512", 128, 28, 512, 1, 1, 0, 4),
    ("s2_1x1_512to128", 512, 28, 128, 1, 1, 0, 3),
    ("s3_1x1_512to256", 512, 28, 256, 1, 1, 0, 1),
    ("s3_3x3s2", 256, 28, 256, 3, 2, 1, 1),
    ("s3_1x1s2_512to1024", 512, 28, 1024, 1, 2, 0, 1),
    ("s3_3x3", 256, 14, 256, 3, 1, 1, 5),
    ("s3_1x1_256to1024", 256, 14, 1024, 1, 1, 0, 6),
    ("s3_1x1_1024to256", 1024, 14, 256, 1, 1, 0, 5),
    ("s4_1x1_1024to512", 1024, 14, 512, 1, 1, 0, 1),
    ("s4_3x3s2", 512, 14, 512, 3, 2, 1, 1),
    ("s4_1x1s2_1024to2048", 1024, 14, 2048, 1, 2, 0, 1),
    ("s4_3x3", 512, 7, 512, 3, 1, 1, 2),
    ("s4_1x1_512to2048", 512, 7, 2048, 1, 1, 0, 3),
    ("s4_1x1_2048to512", 2048, 7, 512, 1, 1, 0, 2),
)


def gemm_func(n: int):
    """The unscheduled ``C = A @ B`` PrimFunc on ``n x n`` float32 matrices."""
    A = te.placeholder((n, n), "float32", "A")
    B = te.placeholder((n, n), "float32", "B")
    k = te.reduce_axis((0, n), "k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    return te.create_prim_func([A, B, C])


def relax_kernel(make, shape):
    """The (legalized, unscheduled) PrimFunc of one Relax operator ``make(x)`` on a float32
    tensor ``x`` of ``shape``."""
    from tilecraft.relax import BlockBuilder, TensorStructInfo, Var
    from tilecraft.relax.transform import LegalizeOps
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(make(x)))
        bb.emit_func_output(out)
    mod = LegalizeOps()(bb.get())
    return mod[[name for name in mod.functions if name != "main"][0]]


def gpu_device(target: str):
    """The NVIDIA GPU for OpenCL when there is one (else the first device); WebGPU's
    high-performance adapter."""
    from tilecraft import targets
    if target.startswith("opencl"):
        try:
            return targets.opencl("NVIDIA")
        except Exception:
            return targets.opencl(0)
    return targets.webgpu(0)


def webgpu_adapter_target(trusted: bool = False):
    """The first WebGPU adapter's own limits as a target (``targets.webgpu(0).target()``:
    more workgroup storage and larger buffers than the spec's defaults), with
    ``trusted_shaders`` (no naga run-time checks) when ``trusted``: the benchmarks'
    ``webgpu-adapter`` and ``webgpu-adapter-trusted`` kinds."""
    from tilecraft.targets import Target
    adapter = gpu_device("webgpu").target()
    return Target(dict(adapter.export(), trusted_shaders=True)) if trusted else adapter


def kernel_profile(kind: str, vm, dev, x_dev, calls: int = 3) -> dict:
    """Microseconds per model call of each kernel, slowest first: on WebGPU the GPU's own
    time (``timing_kernels``: each dispatch between two timestamps), on OpenCL
    ``vm.profile`` (the wall clock around each kernel and a ``clFinish``)."""
    if kind.startswith("webgpu"):
        from tilecraft.targets.webgpu_backend import runtime
        with runtime.context(dev.index).timing_kernels() as times:
            for _ in range(calls):
                vm["main"](x_dev)
        per_call = {k: secs * 1e6 / calls for k, (_, secs) in times.items()}
    else:
        report = vm.profile(x_dev, number=calls)
        per_call = {r["name"]: r["total_ms"] * 1e3 / calls for r in report.rows
                    if r["name"] != "(vm)"}
    return dict(sorted(per_call.items(), key=lambda kv: -kv[1]))


def with_env(env: dict, build):
    """``build()`` with ``env`` set in the environment (kernels that read switches at build
    time: the tensor-core options, tiles), the previous values restored after."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return build()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def torch_cuda_seconds(torch, fn, number: int, repeat: int, best: bool = False) -> float:
    """Median (``best``: smallest) seconds per call of ``fn`` (a PyTorch CUDA op) from CUDA
    events: one warm-up call, then ``repeat`` measurements of ``number`` calls each."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / number)
    return min(times) if best else statistics.median(times)
