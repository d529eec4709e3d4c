"""Postprocessors: verify and finish a schedule sampled from a design space (``Postproc``
subclasses, run in order after ``sch.enter_postproc()``)."""
from .base import Postproc
from .disallow_dynamic_loop import DisallowDynamicLoop
from .rewrite_cooperative_fetch import RewriteCooperativeFetch
from .rewrite_packed_layout import RewritePackedLayout
from .rewrite_parallel_vectorize_unroll import RewriteParallelVectorizeUnroll
from .rewrite_reduction_block import RewriteReductionBlock
from .rewrite_tensorize import RewriteTensorize
from .rewrite_unbound_block import RewriteUnboundBlock
from .verify_gpu_code import VerifyGPUCode

__all__ = ["Postproc", "DisallowDynamicLoop", "RewriteCooperativeFetch", "RewritePackedLayout",
           "RewriteParallelVectorizeUnroll", "RewriteReductionBlock", "RewriteTensorize",
           "RewriteUnboundBlock", "VerifyGPUCode"]
