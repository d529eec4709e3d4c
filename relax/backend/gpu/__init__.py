"""The GPU kernel families of the default OpenCL / WebGPU schedules (``relax.gpu_schedules``).

On GPU targets most families are found by the structure of a block, not by a rule annotation
(``AlterLayout`` is CPU-only); three passes rewrite operators into kernels of their own first
(``FuseAttention``, ``GPUWinograd``, ``LowerDenseQ4GEMV``). The families:

- ``gemm.py``: GEMM-like reductions (matmul, batch matmul, dense, convolution as an implicit
  GEMM): ``gemm.is_gemm_like`` picks the blocks, ``gemm.schedule_gemm`` tiles them for
  work-groups, threads, shared memory and registers; its ``GEMM_*`` constants are the tiles.
- ``split_k.py``: split-K for GEMM-like kernels whose output tiles fill the GPU poorly and
  whose reduction is long (a BERT dense layer at batch 1): the GEMM tile over (parts, tiles)
  writing float32 partials (``rfactor``), then a kernel summing them with the epilogue;
  ``split_k.split_factor`` is the rule, ``split_k.schedule_split_k`` the schedule.
- ``depthwise.py``: depthwise convolutions (``is_depthwise``, ``schedule_depthwise``): a tile
  of one channel's image per work-group with its input window in shared memory.
- ``attention.py``: the fused attention kernel (``relax.transform.FuseAttention``): a
  FlashAttention-style tile per work-group, 4 x 4 scores per thread in registers.
- ``winograd.py``: Winograd F(2x2, 3x3) computes (``relax.transform.GPUWinograd`` rewrites 3x3
  stride-1 convolutions into them; their GEMM stage is scheduled by ``gemm.py``).

- ``gemv.py``: the float32 GEMV of dense layers / matmuls of 1 to ``GEMV_MAX_ROWS`` rows
  (``gemv.gemv_layout`` picks the blocks, ``gemv.schedule_gemv`` schedules them): many
  work-groups of few columns, the reduction split among threads (``rfactor``) with float4
  weight loads, the partials met in a shared-memory tree, the epilogue in the write-back.
- ``dense_int4.py``: the int4 weight-only GEMV (``relax.dense_q4`` of few rows, bias fused):
  the codes in 16-byte runs of 32 a column, a warp's lanes on consecutive columns (one
  ``uint4`` each), the reduction split among threads and met in shared memory; built directly
  as a scheduled kernel by ``relax.transform.LowerDenseQ4GEMV``.

- ``tensor_core.py``: the fp16 GEMM on NVIDIA's tensor cores (``mma.sync`` through inline
  PTX) for ``Target("opencl -device=nvidia")``: float16 x float16 -> float32 dense / matmul /
  batch matmul with the fused epilogue applied to the accumulators; tried first by
  ``relax.gpu_schedules.apply`` on such a target.
- ``tensor_core_tf32.py``: the 3xTF32 float32 GEMM on the TF32 tensor cores (each float32
  operand split into two tf32 parts, three ``mma.sync.m16n8k8``: float32-level accuracy) for
  ``Target("opencl -device=nvidia -fp32-tensor-cores=3xtf32")``; tried first on such a target.

``batch_dispatch.py`` puts two schedules of one kernel (its tile sized for batch 1 and for
``gemm.GEMM_NOMINAL_BATCH``) into one function chosen per call by the symbolic batch.

``schedule_utils.py`` holds the helpers the families share with ``relax.gpu_schedules``. A new
GPU family is a module beside ``gemm.py`` with its own block test and schedule, tried by
``gpu_schedules._schedule_best`` before the generic rules.

Examples
--------
>>> from tilecraft.relax.backend.gpu import gemm
>>> gemm.GEMM_TILE, gemm.GEMM_BK
((16, 8), 16)
"""
from . import (batch_dispatch, dense_int4, depthwise, gemm, gemv, schedule_utils, split_k,
               tensor_core, tensor_core_tf32, winograd)

__all__ = ["batch_dispatch", "dense_int4", "depthwise", "gemm", "gemv", "schedule_utils",
           "split_k", "tensor_core", "tensor_core_tf32", "winograd"]
