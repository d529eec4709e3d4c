"""Relax graph passes: each is a callable ``IRModule -> IRModule`` that leaves its input alone.

- ``LegalizeOps()``: operator calls -> ``call_tir`` of TensorIR kernels.
- ``FoldConstant()``: calls on constants are evaluated at compile time.
- ``DeadCodeElimination(entry_functions=None)``: unused bindings and functions go.
- ``CanonicalizeBindings()``: copies and trivial ``match_cast``s are replaced by their source.
- ``FuseOps(fuse_opt_level=2, max_fuse_depth=256)``: TVM's operator fusion into ``Primitive``
  functions.
- ``FuseTIR()``: each ``Primitive`` function becomes one PrimFunc.
- ``RewriteReshapeView()``: a reshape kernel no fusion took becomes a view of its input
  (``vm.builtin.reshape``).
- ``DecomposeOpsForInference()``: inference ``batch_norm`` becomes a per-channel scale and shift.
- ``FoldScaleAxis()``: constant per-channel scales fold into conv2d / matmul / linear weights.
- ``FoldPad()``: an explicit constant ``pad`` folds into the padding of the conv2d / pooling
  that reads it (where that keeps the result).
- ``FuseAttention(target)``: ``softmax(Q Kᵀ * scale + mask) V`` -> one fused attention kernel
  (GPU targets).
- ``FoldCastIntoGEMM()``: a GEMM-like call reads a float32 value itself where its float16
  cast would be a kernel of its own (GPU targets).
- ``GPUWinograd(target)``: NCHW 3x3 stride-1 convolutions of 64+ channels -> Winograd F(2x2,
  3x3) kernels (GPU targets).
- ``ConvWeightOHWI(target)``: the constant float16 weights of NCHW 3x3 (and larger)
  convolutions stored OHWI at build time, read by the tensor-core GEMM in 16-byte rows
  (targets with tensor cores; ``TILECRAFT_TC_CONV_OHWI=0``: OIHW).
- ``ConvertLayout(target)``: NCHW convolutions whose NHWC tiles run faster (and the pooling and
  elementwise operators between them) run in NHWC, with one permutation at each end.
- ``FuseExpandDepthwise(target)``: an inverted-residual block's 1x1 expansion (bias, clip) and
  the depthwise convolution reading it -> one kernel that never writes the expanded tensor
  (CPU targets).
- ``AlterLayout(target)``: conv2d / matmul / linear run on weights packed at build time.
- ``ToMixedPrecision(out_dtype="float32")``: matmul, dense and convolution on float16 inputs
  (accumulating in ``out_dtype``), the sensitive ops in float32, what lies between following;
  ``FoldConstantCasts()``: float casts of constants become converted constants now.
- ``QuantizeInt8Dynamic()``, ``QuantizeInt8Static(ranges)``: dense layers (and, static,
  convolutions) on uint8 x int8 with int32 accumulation (``relax.quantize``'s int8 modes).
- ``QuantizeInt4Weight(group_size)``: dense layers on 4-bit weight groups (``relax.dense_q4``).
- ``LowerDenseQ4GEMV(target)``: ``relax.dense_q4`` of few rows (and its bias add) -> the GPU int4
  GEMV kernel (``relax.backend.gpu.dense_int4``; GPU targets).
- ``get_pipeline(name="default")``: the default sequence; ``Sequential(passes, check=False)``.

``ExprMutator`` is the base for writing more passes.
"""
from .base import ExprMutator, Pass, RewriteBuilder, Sequential
from .legalize_ops import LegalizeOps
from .fold_constant import FoldConstant
from .dead_code_elimination import DeadCodeElimination
from .canonicalize_bindings import CanonicalizeBindings
from .fuse_ops import FuseOps
from .fuse_tir import FuseTIR
from .rewrite_reshape_view import RewriteReshapeView
from .decompose_ops import DecomposeOpsForInference
from .fold_scale_axis import FoldScaleAxis
from .fold_pad import FoldPad
from .fuse_expand_depthwise import FuseExpandDepthwise
from .sink_reshape import SinkReshape
from .fold_cast_into_gemm import FoldCastIntoGEMM
from .fuse_attention import FuseAttention
from .gpu_winograd import GPUWinograd
from .conv_weight_ohwi import ConvWeightOHWI
from .alter_layout import AlterLayout
from .convert_layout import ConvertLayout
from .to_mixed_precision import FoldConstantCasts, ToMixedPrecision
from .pipeline import get_pipeline
from .quantize_int4 import QuantizeInt4Weight
from .lower_dense_q4_gemv import LowerDenseQ4GEMV
from .quantize_int8 import QuantizeInt8Dynamic, QuantizeInt8Static
from .static_plan_block_memory import StaticPlanBlockMemory, plan_summary

__all__ = ["ExprMutator", "Pass", "RewriteBuilder", "Sequential", "LegalizeOps", "FoldConstant",
           "StaticPlanBlockMemory", "plan_summary",
           "DeadCodeElimination", "CanonicalizeBindings", "FuseOps", "FuseTIR", "RewriteReshapeView", "get_pipeline",
           "DecomposeOpsForInference", "FoldScaleAxis", "FoldPad", "FuseExpandDepthwise", "SinkReshape", "FuseAttention", "FoldCastIntoGEMM", "GPUWinograd", "ConvWeightOHWI", "AlterLayout", "ConvertLayout",
           "ToMixedPrecision", "FoldConstantCasts", "QuantizeInt8Dynamic", "QuantizeInt8Static",
           "QuantizeInt4Weight", "LowerDenseQ4GEMV"]
