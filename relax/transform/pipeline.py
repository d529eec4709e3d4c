"""``get_pipeline``: the default sequence of graph passes that ``relax.build`` runs.

Examples
--------
>>> from tilecraft.relax.transform import get_pipeline
>>> seq = get_pipeline()
>>> [p.name for p in seq.passes][:5]
['DecomposeOpsForInference', 'FoldConstant', 'FoldScaleAxis', 'FoldPad', 'ConvertLayout']
"""
from __future__ import annotations

from tilecraft.targets import Target

from .alter_layout import AlterLayout
from .convert_layout import ConvertLayout
from .base import Sequential
from .canonicalize_bindings import CanonicalizeBindings
from .dead_code_elimination import DeadCodeElimination
from .decompose_ops import DecomposeOpsForInference
from .fold_cast_into_gemm import FoldCastIntoGEMM
from .fold_constant import FoldConstant
from .fold_pad import FoldPad
from .fuse_expand_depthwise import FuseExpandDepthwise
from .fold_scale_axis import FoldScaleAxis
from .fuse_attention import FuseAttention
from .fuse_ops import FuseOps
from .fuse_tir import FuseTIR
from .rewrite_reshape_view import RewriteReshapeView
from .gpu_winograd import GPUWinograd
from .conv_weight_ohwi import ConvWeightOHWI
from .legalize_ops import LegalizeOps
from .sink_reshape import SinkReshape
from .lower_dense_q4_gemv import LowerDenseQ4GEMV

__all__ = ["get_pipeline", "PIPELINES"]


def _default(check: bool = False, target: "Target | str | None" = None,
             conv_plans=None) -> Sequential:
    target = target if isinstance(target, Target) else Target(target or "llvm")
    passes = [
        DecomposeOpsForInference(),  # inference batch_norm -> per-channel scale and shift
        FoldConstant(),              # ... computed now from constant statistics
        FoldScaleAxis(),             # constant per-channel scales -> into conv / dense weights
        FoldPad(),                   # explicit zero pads -> into the conv / pooling reading them
    ]
    if target.kind == "llvm":
        # NCHW convolutions whose NHWC tiles run faster -> NHWC (with what lies between them)
        passes.append(ConvertLayout(target))
        # ... whose reshapes and transposes of constants (the biases: ResNet-50 has 107)
        # are folded with numpy now, not legalized into kernels to be run by the FoldConstant
        # after LegalizeOps
        passes.append(FoldConstant())
        # 1x1 expansion (bias, clip) + the depthwise layer reading it -> one kernel
        passes.append(FuseExpandDepthwise(target))
        # conv / dense -> kernels on packed weights
        passes.append(AlterLayout(target, conv_plans=conv_plans))
    if target.kind in ("opencl", "webgpu"):
        # softmax(Q K^T * scale + mask) V -> one fused attention kernel
        passes.append(FuseAttention(target))
        # float16 GEMM operands whose cast would be a kernel of its own -> read as float32
        # (not where tensor cores take the GEMMs: their operands must be float16)
        if target.tensor_cores is None:
            passes.append(FoldCastIntoGEMM())
        # 3x3 stride-1 convolutions with 64+ channels -> Winograd F(2x2, 3x3)
        passes.append(GPUWinograd(target))
        # float16 convolutions' constant weights the tensor cores take -> OHWI (16-byte rows)
        passes.append(ConvWeightOHWI(target))
        # int4 weight-only dense layers of few rows -> the GPU int4 GEMV kernel (bias fused)
        passes.append(LowerDenseQ4GEMV(target))
    passes += [
        # element-wise ops read a dense layer's output before a reshape of its leading dims
        # (GPT-2's view around each Conv1D), so FuseOps can take them as its epilogue
        SinkReshape(),
        LegalizeOps(),            # operators -> call_tir of TensorIR kernels (+ "op_pattern")
        FoldConstant(),           # kernels on constants run now (the weight packing too)
        DeadCodeElimination(),    # ... and what they replaced goes away
        CanonicalizeBindings(),   # copies and no-op match_casts
        FuseOps(),                # groups -> Primitive functions
        FuseTIR(),                # each Primitive function -> one PrimFunc
        RewriteReshapeView(),     # a reshape kernel no fusion took -> a view of its input
        DeadCodeElimination(),
        # Memory planning (StaticPlanBlockMemory) runs in relax.build, after fusion, so that it
        # sees the final kernels.
    ]
    return Sequential(passes, name="default", check=check)


PIPELINES = {"default": _default, "default_build": _default}


def get_pipeline(name: str = "default", check: bool = False,
                 target: "Target | str | None" = None, conv_plans=None) -> Sequential:
    """The named pass pipeline (``"default"``), as a ``Sequential``.

    Parameters
    ----------
    name : str
        ``"default"``: DecomposeOpsForInference, FoldConstant, FoldScaleAxis, FoldPad,
        ConvertLayout, FoldConstant, FuseExpandDepthwise and AlterLayout (CPU targets only), FuseAttention,
        FoldCastIntoGEMM, GPUWinograd, ConvWeightOHWI (tensor-core targets) and LowerDenseQ4GEMV
        (GPU targets only), SinkReshape, LegalizeOps, FoldConstant,
        DeadCodeElimination, CanonicalizeBindings, FuseOps, FuseTIR, DeadCodeElimination.
    check : bool
        Check well-formedness after every pass (slower; for debugging and tests).
    target : Target | str | None
        The target the module is built for; None means this machine (``"llvm"``). It decides
        whether ``AlterLayout`` runs (CPU targets) and the tiles of its kernels.
    conv_plans : callable, optional
        ``AlterLayout``'s ``conv_plans``: the convolution kernels chosen by measurement
        (``relax.tune_layouts``).

    Examples
    --------
    >>> mod2 = get_pipeline(target="llvm")(mod)   # doctest: +SKIP
    """
    try:
        make = PIPELINES[name]
    except KeyError:
        raise ValueError(f"unknown pipeline {name!r}; known: {sorted(PIPELINES)}") from None
    if conv_plans is None:     # a pipeline registered in PIPELINES need not take it
        return make(check=check, target=target)
    return make(check=check, target=target, conv_plans=conv_plans)
