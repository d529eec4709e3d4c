"""Hand-written schedules for common kernels, reusable by benchmarks, tests and default schedules.

- ``gemm``: float32 GEMM for CPUs (packed B panels, a register-blocked micro-kernel, parallel
  outer loop) and GEMM with a fused elementwise epilogue (bias + GELU).
"""
from .gemm import (GemmConfig, GemmSchedule, default_config, matmul_bias_gelu_func, matmul_func,
                   schedule_gemm, schedule_gemm_bias_gelu, schedule_gemm_epilogue)

__all__ = ["GemmConfig", "GemmSchedule", "default_config", "matmul_func", "matmul_bias_gelu_func",
           "schedule_gemm", "schedule_gemm_bias_gelu", "schedule_gemm_epilogue"]
