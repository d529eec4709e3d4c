"""``AlterLayout``: give convolutions and dense layers the packed weight layouts their fast CPU
kernels read, packing the weights once at build time (TVM's ``AlterOpLayout``, onnxruntime's
weight pre-packing).

Runs on operator calls, before ``LegalizeOps``. For a CPU (``llvm``) target:

- ``relax.nn.conv2d`` (2-D, float32 or float16 operands with a float32 or float16 result
  (``ToMixedPrecision``'s convolutions), static channels and image size; any batch, stride,
  padding, dilation and groups; NCHW or NHWC data with the output in the same layout; any
  kernel layout) becomes two kernel calls: ``pack_conv2d_*_weight`` on the weight and
  ``conv2d_nchw`` / ``conv2d_nhwc`` on the data and the packed weight (the kernel library
  ``relax.backend.cpu``: for NCHW the flat direct convolution with the weight as
  ``[O/R, I, KH, KW, R]`` or the channel-vector tile, ``conv2d_strategy.nchw_kernel_plan``; for
  NHWC a pixels x channels tile with ``[O/NR, KH, KW, I, NR]``); a strided depthwise NCHW
  convolution on x86 becomes ``conv2d_nchw`` alone, the row kernel
  ``depthwise_conv2d_nchw_rows`` on the unpacked weight (each output row from its window's
  padded input rows: no padded or phase-plane copy of the image); a padded depthwise NHWC
  convolution takes the NHWC tile's packed weight and ``depthwise_nhwc.depthwise_conv2d_nhwc_rows``
  (channels in lanes, each block of output rows from a local copy of its padded input
  rows); an NHWC 3x3 stride-1
  convolution with 16 or more input and output channels where it pays
  (``winograd.winograd_pays``: on AVX-512 not on large planes) becomes Winograd F(2x2, 3x3)
  (``backend.cpu.winograd``: ``pack_winograd_weight`` and ``conv2d_nhwc``; float32 only: its
  transforms compute in the operands' dtype);
- ``relax.matmul(x, W)`` and ``relax.linear(x, W, b)`` with a constant 2-D ``W`` (float32, or
  float16 operands accumulating in float32 or float16) become ``pack_dense_weight`` on ``W``
  (panels ``[N/NR, K, NR]``, in ``W``'s dtype: float16 weights stay half the bytes) and
  ``dense`` (plus ``add`` of the bias for ``linear``);
- ``relax.matmul(x, W, out_dtype="int32")`` of uint8 ``x`` and a constant int8 ``W`` (what
  ``relax.quantize`` makes of dense layers, and QDQ / MatMulInteger ONNX models) becomes
  ``pack_u8_words`` on ``x``, ``pack_dense_int8_weight`` on ``W`` and ``dense_u8i8``
  (``backend.cpu.dense_int8``: ``vpdpbusd`` / ``sdot`` on 8-bit words, int32 accumulators);
  an NCHW ``relax.nn.conv2d(x, W, out_dtype="int32")`` of uint8 ``x`` and a constant int8
  ``W`` becomes ``pack_conv2d_int8_weight`` on ``W``, ``pack_conv2d_u8_words`` on ``x`` and
  ``conv2d_nchw_u8i8`` (``backend.cpu.conv2d_int8``: the flat NCHW tile on words of four
  channels, ``vpdpbusd`` / ``sdot``); a depthwise one (no four channels to a word) becomes
  ``pack_conv2d_nchw_weight`` (int8) and ``depthwise_conv2d_nchw_u8i8``
  (``backend.cpu.depthwise_int8``: the flat NCHW tile on bytes widened to int32);
  ``relax.dense_q4`` with constant codes becomes ``pack_q4_panels`` and ``dense_q4_packed``
  (``backend.cpu.dense_int4``: 4-bit codes dequantized in registers);
- NCHW ``relax.nn.max_pool2d`` (float32, float64, float16) / ``avg_pool2d`` (float32, float64;
  the average with a constant divisor) become,
  on x86, ``pool2d_nchw_separable``: the window's rows reduced first into one padded row (unit
  stride), then its columns read from that row (a strided vector load there is a wide load and
  a shuffle); elsewhere, when strided, ``pool2d_nchw_phased``: the input split into its stride
  phase planes, so each window tap is a contiguous vector load. There is no weight.

The packed kernels carry ``"op_pattern"`` ``OUT_EWISE_FUSABLE``, so ``FuseOps`` still fuses
their elementwise epilogues (bias, scale, activations, residual adds); the packing kernels are
``INJECTIVE``. When the weight is a constant, ``FoldConstant`` runs its packing kernel at build
time and the executable holds the packed weight: no packing runs per inference. (A
convolution whose weight is computed at run time packs it on every call, which costs little
next to the convolution.)

Other targets, dtypes and shapes are left as they are (their operators are legalized as
usual).

Examples
--------
>>> # lv = R.nn.conv2d(x, metadata[0], padding=[1, 1, 1, 1])
>>> # becomes
>>> # lv1 = R.call_tir(pack_conv2d_nchw_weight, (metadata[0],), out_sinfo=R.Tensor((16, 64, 3, 3, 4)))
>>> # lv = R.call_tir(conv2d_nchw, (x, lv1), out_sinfo=R.Tensor((n, 64, 56, 56)))
>>> # new_mod = AlterLayout("llvm")(mod)
"""
from __future__ import annotations

from tilecraft.targets import Target
from tilecraft.tensorir.expr import IntImm
from tilecraft.tensorir.function import IRModule

from ..backend.cpu import (ConvGeometry, conv2d_geometry, conv2d_int8, conv2d_nchw,
                           conv2d_nchw_cvec, conv2d_nhwc, conv2d_strategy, cpu_tile_params, dense,
                           dense_amx, dense_int4, dense_int8, depthwise, depthwise_int8, depthwise_nhwc,
                           pool2d, winograd)
from ..backend.cpu.geometry import CPU_KERNEL_DTYPES, static_ints, static_shape
from ..expr import Call, Constant, Expr, Var
from ..op import add
from ..op.base import Op, OpPattern
from ..struct_info import TensorStructInfo
from .base import ExprMutator, Pass

__all__ = ["AlterLayout"]


class AlterLayout(Pass):
    """Rewrite conv2d / matmul / linear into kernels on packed weights, and strided NCHW
    pooling onto phase planes (see the module docstring).

    Parameters
    ----------
    target : Target | str | None
        The target the kernels are for (it sets the vector lanes and register tile); None
        means this machine (``"llvm"``). Targets other than ``llvm`` leave the module as it is.
    ops : iterable of str, optional
        Which operators to rewrite (default all of ``AlterLayout.OPS``: ``"relax.nn.conv2d"``,
        ``"relax.matmul"``, ``"relax.linear"``, ``"relax.nn.max_pool2d"``,
        ``"relax.nn.avg_pool2d"``).
    conv_plans : callable, optional
        ``conv_plans(geometry, plan) -> plan``: the NCHW convolution kernel to use, given its
        ``backend.cpu.ConvGeometry`` and the plan ``conv2d_strategy.nchw_kernel_plan`` chose
        (return it to keep it). ``relax.build`` passes the measured choices of
        ``relax.tune_layouts`` here when its database has them.
    winograd : bool
        Whether NHWC 3x3 stride-1 convolutions run as Winograd F(2x2, 3x3)
        (``backend.cpu.winograd``; default True). False keeps the direct kernels, whose float32
        results round differently.

    Examples
    --------
    >>> new_mod = AlterLayout("llvm")(mod)   # doctest: +SKIP
    """

    name = "AlterLayout"
    OPS = ("relax.nn.conv2d", "relax.matmul", "relax.linear", "relax.nn.max_pool2d",
           "relax.nn.avg_pool2d", "relax.dense_q4")

    def __init__(self, target: "Target | str | None" = None, ops=None, conv_plans=None,
                 winograd: bool = True):
        self.target = target if isinstance(target, Target) else Target(target or "llvm")
        self.winograd = bool(winograd)
        self.ops = frozenset(ops if ops is not None else self.OPS)
        if conv_plans is not None and not callable(conv_plans):
            raise TypeError(f"AlterLayout: conv_plans must be callable (geometry, plan) -> "
                            f"plan, got {type(conv_plans).__name__}")
        self.conv_plans = conv_plans
        unknown = self.ops - set(self.OPS)
        if unknown:
            raise ValueError(f"AlterLayout: cannot rewrite {sorted(unknown)}; known: "
                             f"{list(self.OPS)}")

    def transform_module(self, mod: IRModule) -> IRModule:
        if self.target.kind != "llvm":
            return mod
        return _Alter(mod, self.target, self.ops, self.conv_plans,
                      self.winograd).visit_module()


class _Alter(ExprMutator):
    def __init__(self, mod: IRModule, target: Target, ops, conv_plans=None,
                 winograd: bool = True):
        super().__init__(mod)
        self.target = target
        self.ops = ops
        self.conv_plans = conv_plans
        self.winograd = winograd
        self.lanes, self.registers = cpu_tile_params(target)
        self._words: dict = {}              # (x, k_words) -> its pack_u8_words (u8_words)

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, Op) or call.op.name not in self.ops or \
                not self.builder.building:
            return call
        if call.op.name == "relax.nn.conv2d":
            return self.conv2d(call) or self.conv2d_int8(call) or call
        if call.op.name.endswith("_pool2d"):
            return self.pool2d(call) or call
        if call.op.name == "relax.dense_q4":
            return self.dense_q4(call) or call
        return self.dense(call) or self.dense_int8(call) or call

    # -- pooling -------------------------------------------------------------------------------
    def pool2d(self, call: Call) -> Expr | None:
        """NCHW max / average pooling as its own kernel, the one ``pool2d.plan_pool2d``
        chooses: separable on x86 (``pool2d_nchw_separable``), elsewhere, with a stride above
        1, on phase planes (``pool2d_nchw_phased``)."""
        a = call.attr_dict
        data = call.args[0]
        avg = call.op.name == "relax.nn.avg_pool2d"
        kind = pool2d.plan_pool2d(self.target, a["strides"])
        if a["layout"] != "NCHW" or a["out_layout"] != "NCHW" or a["dilation"] != (1, 1) or \
                kind is None:
            return None
        if avg and (a["ceil_mode"] or (any(a["padding"]) and not a["count_include_pad"])):
            return None   # the divisor varies by window: left to the operator's kernel
        si, out_si = data.struct_info, call.struct_info
        if not isinstance(si, TensorStructInfo) or si.shape is None or out_si.shape is None or \
                si.dtype not in ("float32", "float64") and not (si.dtype == "float16" and not avg):
            return None   # (a float16 average would sum in float16: left to the operator's)
        hw = static_ints(si.shape[2:])
        ohw = static_ints(out_si.shape[2:])
        if hw is None or ohw is None:
            return None
        te_func = pool2d.pool2d_nchw_separable if kind == "separable" else \
            pool2d.pool2d_nchw_phased
        return self.kernel(te_func, data, "avg" if avg else "max",
                           tuple(a["pool_size"]), tuple(a["strides"]), tuple(a["padding"]),
                           ohw[0], ohw[1], name="avg_pool2d" if avg else "max_pool2d",
                           pattern=OpPattern.OUT_EWISE_FUSABLE)

    # -- helpers ------------------------------------------------------------------------------
    def kernel(self, te_func, *args, name: str, pattern: int, **kwargs) -> Call:
        """``call_te`` of ``te_func`` with the kernel's ``"op_pattern"`` set."""
        return self.builder.call_te_kernel(te_func, *args, name=name, pattern=pattern, **kwargs)

    # -- conv2d -------------------------------------------------------------------------------
    def depthwise_rows(self, g: ConvGeometry) -> bool:
        """Whether the NCHW convolution ``g`` runs as ``depthwise_conv2d_nchw_rows``
        (``depthwise.depthwise_rows_applies``: a strided depthwise one on x86)."""
        return depthwise.depthwise_rows_applies(g, self.target)

    def conv2d(self, call: Call) -> Expr | None:
        g = conv2d_geometry(call)
        if g is None:
            return self.conv2d_head(call)
        data, weight = call.args
        a = call.attr_dict
        layout, klayout = a["data_layout"], a["kernel_layout"]
        out_dtype = call.struct_info.dtype
        if layout == "NCHW" and self.depthwise_rows(g):
            # no packing: a tap's weight is one broadcast scalar per channel
            return self.kernel(depthwise.depthwise_conv2d_nchw_rows, data, weight, klayout, g,
                               out_dtype, name="conv2d_nchw",
                               pattern=OpPattern.OUT_EWISE_FUSABLE)
        if layout == "NCHW":
            plan = conv2d_strategy.nchw_kernel_plan(g, self.lanes, self.registers)
            if self.conv_plans is not None:
                plan = self.conv_plans(g, plan)
            cvec = isinstance(plan, conv2d_nchw_cvec.ChannelVectorPlan)
            packed = self.builder.emit(self.kernel(
                conv2d_nchw.pack_conv2d_nchw_weight, weight, klayout,
                plan.width if cvec else plan.oc_block,
                name="pack_conv2d_nchw_weight", pattern=OpPattern.INJECTIVE))
            compute = conv2d_nchw_cvec.conv2d_nchw_cvec if cvec else \
                conv2d_nchw.conv2d_nchw_packed
            return self.kernel(compute, data, packed, plan, out_dtype, name="conv2d_nchw",
                               pattern=OpPattern.OUT_EWISE_FUSABLE)
        if self.winograd and winograd.winograd_pays(g, self.lanes, self.registers) and \
                data.struct_info.dtype == "float32":
            rows, width = winograd.gemm_tile(g, self.lanes, self.registers)
            packed = self.builder.emit(self.kernel(
                winograd.pack_winograd_weight, weight, klayout, width,
                name="pack_winograd_weight", pattern=OpPattern.INJECTIVE))
            return self.kernel(winograd.conv2d_nhwc_winograd, data, packed, g, rows, "float32",
                               name="conv2d_nhwc", pattern=OpPattern.OUT_EWISE_FUSABLE)
        plan = conv2d_strategy.nhwc_kernel_plan(g, self.lanes, self.registers)
        if plan is None:
            return None
        if isinstance(plan, conv2d_nchw_cvec.ChannelVectorPlan):
            packed = self.builder.emit(self.kernel(
                conv2d_nchw.pack_conv2d_nchw_weight, weight, klayout, plan.width,
                name="pack_conv2d_nchw_weight", pattern=OpPattern.INJECTIVE))
            return self.kernel(conv2d_nchw_cvec.conv2d_nchw_cvec, data, packed, plan, out_dtype,
                               "NHWC", name="conv2d_nhwc", pattern=OpPattern.OUT_EWISE_FUSABLE)
        packed = self.builder.emit(self.kernel(
            conv2d_nhwc.pack_conv2d_nhwc_weight, weight, klayout, plan.width,
            name="pack_conv2d_nhwc_weight", pattern=OpPattern.INJECTIVE))
        compute = depthwise_nhwc.depthwise_conv2d_nhwc_rows if \
            depthwise_nhwc.depthwise_nhwc_applies(plan) else conv2d_nhwc.conv2d_nhwc_packed
        return self.kernel(compute, data, packed, plan, out_dtype, name="conv2d_nhwc",
                           pattern=OpPattern.OUT_EWISE_FUSABLE)

    def conv2d_head(self, call: Call) -> Expr | None:
        """NCHW data with an NHWC output (``ConvertLayout``'s head of an NHWC chain): the
        channel-vector row tiles writing each position's channels straight into NHWC
        (``conv2d_nchw_cvec(..., out_layout="NHWC")``), where ``head_conv_plan`` gives one."""
        g = conv2d_geometry(call, mixed=True)
        if g is None or call.attr_dict["data_layout"] != "NCHW":
            return None
        plan = conv2d_strategy.head_conv_plan(g, self.lanes, self.registers)
        if plan is None:
            return None
        data, weight = call.args
        packed = self.builder.emit(self.kernel(
            conv2d_nchw.pack_conv2d_nchw_weight, weight, call.attr_dict["kernel_layout"],
            plan.width, name="pack_conv2d_nchw_weight", pattern=OpPattern.INJECTIVE))
        return self.kernel(conv2d_nchw_cvec.conv2d_nchw_cvec, data, packed, plan,
                           call.struct_info.dtype, "NCHW", "NHWC", name="conv2d_nhwc",
                           pattern=OpPattern.OUT_EWISE_FUSABLE)

    # -- matmul / linear ----------------------------------------------------------------------
    def dense(self, call: Call) -> Expr | None:
        linear = call.op.name == "relax.linear"
        x, weight = call.args[0], call.args[1]
        bias = call.args[2] if linear and len(call.args) > 2 else None
        if not isinstance(weight, Constant):
            return None
        xsi, wsi, out_si = x.struct_info, weight.struct_info, call.struct_info
        if not all(isinstance(s, TensorStructInfo) for s in (xsi, wsi, out_si)) or \
                not xsi.dtype == wsi.dtype or (xsi.dtype, out_si.dtype) not in CPU_KERNEL_DTYPES:
            return None
        xshape = static_shape(x)
        if xshape is None or len(xshape) < 2 or len(wsi.shape) != 2:
            return None
        k_dim = xshape[-1]
        kn = static_ints(wsi.shape)
        if not isinstance(k_dim, IntImm) or kn is None:
            return None
        k, n = (kn[1], kn[0]) if linear else kn
        if k != k_dim.value:
            return None
        width = dense.dense_panel_width(n, self.lanes, self.registers)
        packed = self.builder.emit(self.kernel(
            dense.pack_dense_weight, weight, width, linear, name="pack_dense_weight",
            pattern=OpPattern.INJECTIVE))
        out = self.kernel(dense.dense_packed, x, packed, n, out_si.dtype, name="dense",
                          pattern=OpPattern.OUT_EWISE_FUSABLE)
        if bias is None:
            return out
        return add(self.builder.emit(out), bias)

    # -- low precision ------------------------------------------------------------------------
    def dense_int8(self, call: Call) -> Expr | None:
        """``matmul(x, W)`` / ``linear(x, W)`` of uint8 ``x`` and a constant int8 ``W`` with
        int32 results (what ``relax.quantize`` makes of a dense layer) -> ``pack_u8_words`` on
        ``x``, ``pack_dense_int8_weight`` on ``W`` and ``dense_u8i8``."""
        linear = call.op.name == "relax.linear"
        if linear and len(call.args) > 2:
            return None
        x, weight = call.args[0], call.args[1]
        xsi, wsi, out_si = x.struct_info, weight.struct_info, call.struct_info
        if not isinstance(weight, Constant) or \
                not all(isinstance(s, TensorStructInfo) for s in (xsi, wsi, out_si)) or \
                (xsi.dtype, wsi.dtype, out_si.dtype) != ("uint8", "int8", "int32"):
            return None
        xshape = static_shape(x)
        kn = static_ints(wsi.shape) if wsi.shape is not None and len(wsi.shape) == 2 else None
        if xshape is None or len(xshape) < 2 or kn is None or \
                not isinstance(xshape[-1], IntImm):
            return None
        k, n = (kn[1], kn[0]) if linear else kn
        if k != xshape[-1].value:
            return None
        width = dense.dense_panel_width(n, self.lanes, self.registers)
        # AMX reads K in whole tiles of 64 bytes: both operands zero-padded to them
        k_words = dense_amx.amx_words(k) if dense_amx.amx_applies(self.target, width) else None
        packed = self.builder.emit(self.kernel(
            dense_int8.pack_dense_int8_weight, weight, width, linear, k_words,
            name="pack_dense_int8_weight", pattern=OpPattern.INJECTIVE))
        words = self.u8_words(x, k_words)
        return self.kernel(dense_int8.dense_u8i8, words, packed, n, name="dense_u8i8",
                           pattern=OpPattern.OUT_EWISE_FUSABLE)

    def u8_words(self, x: Expr, k_words: int | None) -> Expr:
        """``pack_u8_words(x)``, once per input variable and padding (while visible): the
        layers reading one quantized input (BERT's q, k and v) share its words, and the
        quantization then fuses with the one packing kernel instead of being written out
        for three."""
        key = (x, k_words) if isinstance(x, Var) else None
        hit = self._words.get(key) if key is not None else None
        if hit is not None and self.builder.visible(hit):
            return hit
        words = self.builder.emit(self.kernel(dense_int8.pack_u8_words, x, k_words,
                                              name="u8_words", pattern=OpPattern.INJECTIVE))
        if key is not None:
            self._words[key] = words
        return words

    def conv2d_int8(self, call: Call) -> Expr | None:
        """NCHW ``conv2d(x, W, out_dtype="int32")`` of uint8 ``x`` and a constant int8 ``W``
        (what ``relax.quantize`` makes of a convolution, and QDQ ONNX models) ->
        ``pack_conv2d_int8_weight`` on ``W``, ``pack_conv2d_u8_words`` on ``x`` and
        ``conv2d_nchw_u8i8`` (``backend.cpu.conv2d_int8``: ``vpdpbusd`` / ``sdot`` on words of
        four channels, int32 accumulators)."""
        data, weight = call.args
        if not isinstance(weight, Constant) or call.attr_dict["data_layout"] != "NCHW":
            return None
        g = conv2d_geometry(call, ("uint8", "int8", "int32"))
        plan = conv2d_int8.plan_conv2d_u8i8(g, self.lanes, self.registers) if g else None
        if plan is None:
            return self.depthwise_int8(call, g)
        packed = self.builder.emit(self.kernel(
            conv2d_int8.pack_conv2d_int8_weight, weight, call.attr_dict["kernel_layout"],
            plan.oc_block, name="pack_conv2d_int8_weight", pattern=OpPattern.INJECTIVE))
        words = self.builder.emit(self.kernel(
            conv2d_int8.pack_conv2d_u8_words, data, plan, name="conv2d_u8_words",
            pattern=OpPattern.INJECTIVE))
        return self.kernel(conv2d_int8.conv2d_nchw_u8i8, words, packed, plan, g.out_channels,
                           name="conv2d_nchw_u8i8", pattern=OpPattern.OUT_EWISE_FUSABLE)

    def depthwise_int8(self, call: Call, g: ConvGeometry | None) -> Expr | None:
        """A depthwise NCHW ``conv2d(x, W, out_dtype="int32")`` of uint8 ``x`` and a constant
        int8 ``W`` -> ``pack_conv2d_nchw_weight`` on ``W`` (int8) and
        ``depthwise_conv2d_nchw_u8i8`` (``backend.cpu.depthwise_int8``: the flat NCHW tile on
        the bytes widened to int32)."""
        plan = depthwise_int8.plan_depthwise_u8i8(g, self.lanes, self.registers) if g else None
        if plan is None:
            return None
        packed = self.builder.emit(self.kernel(
            conv2d_nchw.pack_conv2d_nchw_weight, call.args[1], call.attr_dict["kernel_layout"],
            plan.oc_block, name="pack_conv2d_nchw_weight", pattern=OpPattern.INJECTIVE))
        return self.kernel(depthwise_int8.depthwise_conv2d_nchw_u8i8, call.args[0], packed,
                           plan, name="depthwise_conv2d_nchw_u8i8",
                           pattern=OpPattern.OUT_EWISE_FUSABLE)

    def dense_q4(self, call: Call) -> Expr | None:
        """``relax.dense_q4`` with constant codes, scales and offsets -> ``pack_q4_panels`` on
        each and ``dense_q4_packed`` (the codes dequantized in registers)."""
        x, codes, scale, offset = call.args
        if not all(isinstance(a, Constant) for a in (codes, scale, offset)):
            return None
        xshape = static_shape(x)
        if xshape is None or len(xshape) < 2 or not isinstance(xshape[-1], IntImm):
            return None
        n = static_ints(codes.struct_info.shape)[1]
        width = dense.dense_panel_width(n, self.lanes, self.registers)
        # the codes as words where a panel row's words fill one vector register (4 vectors
        # of columns: AVX-512's 64, NEON's 16): a shift unpacks each vector of codes
        pack_codes = dense_int4.pack_q4_words if width == 4 * self.lanes else \
            dense_int4.pack_q4_panels
        panels = [self.builder.emit(self.kernel(pack, t, width, name=pack.__name__,
                                                pattern=OpPattern.INJECTIVE))
                  for pack, t in ((pack_codes, codes), (dense_int4.pack_q4_panels, scale),
                                  (dense_int4.pack_q4_panels, offset))]
        return self.kernel(dense_int4.dense_q4_packed, x, *panels,
                           int(call.attr_dict["group_size"]), n, name="dense_q4",
                           pattern=OpPattern.OUT_EWISE_FUSABLE)
