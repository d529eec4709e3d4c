"""``build_module(mod, target)``: TensorIR -> an ``OpenCLModule`` (``targets.build`` with an
``opencl`` target)."""
from __future__ import annotations

from tilecraft.tensorir.function import IRModule

from ..gpu_build import split_module
from ..gpu_codegen import nonneg_scalars
from ..target import Target
from .codegen import opencl_source
from .module import OpenCLModule


def build_module(mod: IRModule, target: Target) -> OpenCLModule:
    """Lower every PrimFunc for the GPU, generate one OpenCL C program for all kernels.

    The kernels are checked against ``target``'s limits (threads per block, shared memory);
    compiling for a device happens when a function first runs on it.
    """
    funcs = split_module(mod, target)
    kernels = [k for f in funcs for k in f.split.kernels]
    sizes = {k.name: nonneg_scalars(k, f.split.host) for f in funcs for k in f.split.kernels}
    source, extensions = opencl_source(kernels, sizes, native_half=target.supports_float16,
                                        tensor_cores=target.tensor_cores)
    programs = {f.name: f.program for f in funcs}
    metadata = {"target": str(target), "entry": "main" if "main" in programs else funcs[0].name,
                "functions": [{"name": f.name, "symbol": f.name, "params": f.program["params"],
                               "shape_vars": f.program["shape_vars"]} for f in funcs]}
    return OpenCLModule(metadata, programs, source, sorted(extensions),
                        [k.name for k in kernels])


__all__ = ["build_module"]
