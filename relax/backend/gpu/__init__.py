"""The GPU kernel families of the default OpenCL / WebGPU schedules (``relax.gpu_schedules``).

On GPU targets no pass rewrites operators into kernels of their own (``AlterLayout`` is
CPU-only): the families are found by the structure of a block, not by a rule annotation.
The families:

- ``gemm.py``: GEMM-like reductions (matmul, batch matmul, dense, convolution as an implicit
  GEMM): ``gemm.is_gemm_like`` picks the blocks, ``gemm.schedule_gemm`` tiles them for
  work-groups, threads, shared memory and registers; its ``GEMM_*`` constants are the tiles.

- ``dense_int4.py``: the int4 weight-only GEMV (``relax.dense_q4`` of few rows, bias fused):
  work-groups of output columns, the reduction over packed 32-bit words of codes shared by
  threads; built directly as a scheduled kernel by ``relax.transform.LowerDenseQ4GEMV``.

``batch_dispatch.py`` puts two schedules of one kernel (its tile sized for batch 1 and for
``gemm.GEMM_NOMINAL_BATCH``) into one function chosen per call by the symbolic batch.

``schedule_utils.py`` holds the helpers the families share with ``relax.gpu_schedules``. A new
GPU family (Winograd, attention) is a module beside ``gemm.py`` with its own block test and
schedule, tried by ``gpu_schedules._schedule_best`` before the generic rules.

Examples
--------
>>> from tilecraft.relax.backend.gpu import gemm
>>> gemm.GEMM_TILE, gemm.GEMM_BK
((16, 8), 16)
"""
from . import batch_dispatch, dense_int4, gemm, schedule_utils

__all__ = ["batch_dispatch", "dense_int4", "gemm", "schedule_utils"]
