"""Run benchmarks: ``python -m benchmarks.run [NAME ...]`` (default: all registered).

Each benchmark returns rows; the runner prints a table and writes them to
``benchmarks/results/NAME/<machine>.json`` (``benchmarks.common.write_results``). A benchmark
module with ``WRITES_RESULTS = True`` writes its own files in ``run()`` (named after the GPU it
measured, or one file per part) and the runner leaves them be.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .common import ensure_clean_openblas_env, print_table, write_results

# name -> module with a run() -> list[dict] (under benchmarks/, or the package's demo)
REGISTRY = {
    "demo": "tilecraft.demo",
    "rpc_overhead": "benchmarks.rpc_overhead",
    "gemm_cpu": "benchmarks.gemm_cpu",
    "ops_cpu": "benchmarks.ops_cpu",
    "relax_cpu": "benchmarks.relax_cpu",
    "cnn_ops_cpu": "benchmarks.cnn_ops_cpu",
    "layer_profile": "benchmarks.layer_profile",
    "convert_layout": "benchmarks.convert_layout",
    "zoo": "benchmarks.zoo",
    "rpc_tune_throughput": "benchmarks.rpc_tune_throughput",
    "gpu_webgpu": "benchmarks.gpu_webgpu",
    "gpu": "benchmarks.gpu",
    "gpu_models": "benchmarks.gpu_models",
    "gpu_launch_overhead": "benchmarks.gpu_launch_overhead",
    "gpu_attention": "benchmarks.gpu_attention",
    "gpu_convs": "benchmarks.gpu_convs",
    "gpu_dense": "benchmarks.gpu_dense",
    "gpu_tensor_core": "benchmarks.gpu_tensor_core",
    "gpu_tf32": "benchmarks.gpu_tf32",
    "tune_cpu": "benchmarks.tune_cpu",
    "tune_gpu": "benchmarks.tune_gpu",
    "space_gemm": "benchmarks.space_gemm",
    "onnx_conformance": "benchmarks.onnx_conformance",
    "lowp": "benchmarks.lowp",
    "hf_models_cpu": "benchmarks.hf_models_cpu",
    "lowp_fp16": "benchmarks.lowp_fp16",
    "build_time": "benchmarks.build_time",
    "nhwc_cold_input": "benchmarks.nhwc_cold_input",
}


def main(argv=None) -> int:
    ensure_clean_openblas_env()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help=f"benchmarks to run ({', '.join(REGISTRY)})")
    args = parser.parse_args(argv)
    names = args.names or list(REGISTRY)
    for name in names:
        if name not in REGISTRY:
            parser.error(f"unknown benchmark {name!r}; known: {', '.join(REGISTRY)}")
    for name in names:
        module = importlib.import_module(REGISTRY[name])
        rows = module.run()
        print(f"\n== {name}")
        columns = list(dict.fromkeys(k for r in rows for k in r))
        print_table(rows, columns)
        if not getattr(module, "WRITES_RESULTS", False):
            print(f"(written to {write_results(name, rows)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
