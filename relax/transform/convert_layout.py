"""``ConvertLayout``: run a model's 2-D convolutions, pooling and the elementwise operators
between them in NHWC instead of NCHW (TVM's ``ConvertLayout({"relax.nn.conv2d": ["NHWC",
"default"]})``; onnxruntime's NCHWc transformer does the same with blocked channels).

ONNX and PyTorch models are NCHW. An NCHW convolution's fast CPU kernels keep either positions
or output channels in the vector lanes, and a channels-in-lanes tile has to transpose its
result back to NCHW (and read its residual across channels) on the way out. In NHWC a
convolution is a GEMM over pixels x channels whose tile writes whole channel vectors and whose
fused epilogue (bias, residual add, relu) reads them, one contiguous run per pixel.

The pass rewrites, on operator calls before ``LegalizeOps``:

- ``relax.nn.conv2d`` with NCHW data and output that ``nhwc_pays`` for the target (or the
  given ``convertible`` accepts) and that reaches another such convolution through
  elementwise operators and pooling, into ``conv2d`` with ``data_layout="NHWC"``,
  ``out_layout="NHWC"`` and the kernel layout unchanged (a lone convolution would pay a
  permutation on each side for what its NHWC tile saves, and stays NCHW);
- a convolution that feeds such a chain but does not pay in NHWC itself (a stem on the
  image's 3 channels) and that ``backend.cpu.conv2d_strategy.head_conv_plan`` runs with an
  NHWC output, into the chain's *head*: NCHW data, ``out_layout="NHWC"``, so neither the
  image nor its output is permuted;
- ``max_pool2d`` / ``avg_pool2d`` / ``adaptive_*_pool2d`` on NCHW into their NHWC form;
- elementwise and broadcast operators (``relax.add``, ``multiply``, ``nn.relu``, ``clip``, ...)
  whose 4-D operand is already NHWC: the other operands that broadcast against it
  (a per-channel bias ``[1, C, 1, 1]`` or ``[C, 1, 1]``, a scalar) are permuted the same way,
  a constant one at build time by ``FoldConstant``.

A tensor is permuted into NHWC where an NCHW one first meets a converted operator, and back
(``permute_dims(x, [0, 3, 1, 2])``) where a consumer needs NCHW (a reshape, a flatten, the
function's result); the NCHW forms nothing reads are removed (``DeadCodeElimination``), so a
chain of layers pays for one permutation at each end. Everything else is left as it is.

Examples
--------
>>> # lv = R.nn.conv2d(x, w, padding=[1, 1, 1, 1]); lv1 = R.add(lv, b); lv2 = R.nn.relu(lv1)
>>> # becomes
>>> # t = R.permute_dims(x, [0, 2, 3, 1])
>>> # lv = R.nn.conv2d(t, w, padding=[1, 1, 1, 1], data_layout="NHWC", out_layout="NHWC")
>>> # lv1 = R.add(lv, R.permute_dims(b, [0, 2, 3, 1])); lv2 = R.nn.relu(lv1)
>>> # out = R.permute_dims(lv2, [0, 3, 1, 2])
>>> # new_mod = ConvertLayout()(mod)
"""
from __future__ import annotations

from tilecraft.targets import Target
from tilecraft.tensorir.function import IRModule

from ..backend.cpu import ConvGeometry, conv2d_geometry, conv2d_strategy, cpu_tile_params
from ..backend.cpu.conv2d_nchw_cvec import ChannelVectorPlan
from ..backend.cpu.conv2d_nhwc import nhwc_tile_fills
from ..backend.cpu.winograd import winograd_pays
from ..expr import Call, Expr, Function, SeqExpr, Var, VarBinding
from ..op import permute_dims, reshape
from ..op.base import Op, OpPattern
from ..struct_info import PrimStructInfo, TensorStructInfo
from .base import ExprMutator, Pass
from .dead_code_elimination import DeadCodeElimination

__all__ = ["ConvertLayout", "nhwc_pays", "depthwise_anchors", "TO_NHWC", "TO_NCHW"]

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)

_POOLS = ("relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d",
          "relax.nn.adaptive_max_pool2d")


class ConvertLayout(Pass):
    """Run NCHW 2-D convolutions, pooling and the elementwise operators between them in NHWC
    (see the module docstring).

    Parameters
    ----------
    target : Target | str | None
        The CPU target the kernels are for (it sets the NHWC tile, ``nhwc_pays``); None means
        this machine (``"llvm"``).
    convertible : callable, optional
        ``convertible(call) -> bool``: whether this NCHW ``conv2d`` call may run in NHWC; the
        default is ``nhwc_pays`` on the call's geometry for ``target``.
    anchor : callable, optional
        ``anchor(call) -> bool``: whether this convertible call makes its chain worth
        converting (default ``default_anchor``: a depthwise layer or one Winograd computes
        faster than the direct kernels; with 16 vector registers also a 1x1 kernel: the
        layers NHWC runs faster rather than on par).
        A chain of convolutions joined by elementwise operators and pooling converts when it
        holds two or more convertible ones and an anchor. ``convertible=lambda call: True,
        anchor=lambda call: True`` converts every chain the NHWC kernel runs.
    head : callable, optional
        ``head(call) -> bool``: whether this NCHW ``conv2d`` call that is not convertible may
        head a converted chain it feeds, reading NCHW and writing NHWC (default
        ``default_head``: ``head_conv_plan`` has a kernel for it). ``head=lambda call:
        False`` keeps such convolutions NCHW with a permutation after them.

    Examples
    --------
    >>> new_mod = ConvertLayout("llvm")(mod)   # doctest: +SKIP
    """

    name = "ConvertLayout"

    def __init__(self, target: "Target | str | None" = None, convertible=None, anchor=None,
                 head=None):
        self.target = target if isinstance(target, Target) else Target(target or "llvm")
        for what, f in (("convertible", convertible), ("anchor", anchor), ("head", head)):
            if f is not None and not callable(f):
                raise TypeError(f"ConvertLayout: {what} must be callable (call) -> bool, got "
                                f"{type(f).__name__}")
        self.convertible = convertible or self.default_convertible
        self.anchor = anchor or self.default_anchor
        self.head = head or self.default_head

    def default_convertible(self, call: Call) -> bool:
        g = conv2d_geometry(call)
        return g is not None and nhwc_pays(g, self.target)

    def default_anchor(self, call: Call) -> bool:
        """A depthwise layer (``depthwise_anchors``) or one Winograd computes faster than the
        direct kernels (``backend.cpu.winograd.winograd_pays``); with 16 vector registers
        also a 1x1 layer. With 32 (AVX-512) the 1x1 and direct 3x3 layers only run on par
        in NHWC: a chain of them alone would pay permutations for nothing."""
        if depthwise_anchors(call):
            return True
        lanes, registers = cpu_tile_params(self.target)
        g = conv2d_geometry(call)
        if g is not None and winograd_pays(g, lanes, registers):
            return True
        return registers < 32 and _one_by_one(call)

    def default_head(self, call: Call) -> bool:
        """Whether ``head_conv_plan`` runs this NCHW convolution with an NHWC output."""
        g = conv2d_geometry(call)
        if g is None or self.target.kind != "llvm":
            return False
        lanes, registers = cpu_tile_params(self.target)
        return conv2d_strategy.head_conv_plan(g, lanes, registers) is not None

    def transform_module(self, mod: IRModule) -> IRModule:
        new = _Converter(mod, self.convertible, self.anchor, self.head).visit_module()
        return new if new is mod else DeadCodeElimination()(new)


def nhwc_pays(g: ConvGeometry, target: "Target | str") -> bool:
    """Whether the NCHW convolution ``g`` runs faster converted to NHWC on ``target``: at
    least 16 input channels (a stem on the image's 3 channels fills no vector of a pixel's
    channels), and a depthwise layer (``depthwise_anchors``), or, not grouped, a 3x3
    stride-1 layer that Winograd F(2x2, 3x3) computes faster than the direct kernels
    (``backend.cpu.winograd.winograd_pays``; NHWC only), or an NHWC kernel
    (``backend.cpu.conv2d_strategy.nhwc_kernel_plan``) that is a pixel tile filling the row
    (or the plane) with 8 or more accumulators (``conv2d_nhwc.nhwc_tile_fills``) or, with 16
    registers, the channel-vector tiles across rows. On NEON (32 registers, 4 lanes) only
    the 1x1 layers.

    Measured on Zen 3 (AVX2, 16 vector registers;
    ``benchmarks/results/convert_layout/zen3-avx2.json``), one layer in each layout:
    ResNet-50's 1x1 layers ran 1.0-1.3x faster in NHWC (their residual and output written a
    pixel's channels at a time), its 3x3 ones 0.87-1.15x; in the model, converting every
    layer after the stem ran 1-5% faster than keeping the 3x3 ones on the tiles NCHW with
    permutations around them. On Zen 4 (AVX-512, 32 registers), one thread, ResNet-18's
    layers at batch 1 and 8: the NHWC pixel tile ran its strided 3x3 and 1x1 layers and its
    56 x 56 3x3 layers 1.0-1.1x as fast as the NCHW kernels (1x1 128 -> 256 stride 2 at
    batch 8: 1.5x), and Winograd its other 3x3 layers 1.4-1.8x (``winograd_pays``); the
    1x1 layers between depthwise ones (MobileNet-V2's expand / project) 50-56 GMAC/s against
    44-55.

    Examples
    --------
    >>> from tilecraft.relax.backend.cpu import ConvGeometry
    >>> g = ConvGeometry(64, 56, 56, 256, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    >>> avx2 = "llvm -mtriple=x86_64-linux-gnu -mattr=+avx2,+fma"
    >>> nhwc_pays(g, avx2)
    True
    >>> nhwc_pays(ConvGeometry(3, 224, 224, 64, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1), avx2)
    False
    """
    target = target if isinstance(target, Target) else Target(target)
    if target.kind != "llvm" or g.in_channels < 16:
        return False
    if g.is_depthwise:
        return True     # channels in lanes (see depthwise_anchors)
    if g.groups != 1:
        return False
    lanes, registers = cpu_tile_params(target)
    if registers >= 32 and lanes < 16:
        return g.kernel == (1, 1)     # NEON: its NHWC 3x3 kernels are unmeasured
    if winograd_pays(g, lanes, registers):
        return True     # Winograd F(2x2, 3x3), NHWC only: 1.4-1.9x the direct kernels
    if registers >= 32 and g.kernel == (1, 1):
        return True
    plan = conv2d_strategy.nhwc_kernel_plan(g, lanes, registers)
    if isinstance(plan, ChannelVectorPlan):
        return True
    return plan is not None and nhwc_tile_fills(plan)


def depthwise_anchors(call: Call) -> bool:
    """Whether ``call`` is a depthwise convolution: the NHWC kernel keeps its channels in the
    lanes (one tap is a vector FMA of a pixel's channels), where the NCHW kernels keep
    positions there and waste them on small planes (a 7 x 7 row fills 7 of 16) and copy the
    image into a padded plane per channel. MobileNet-V2 (Zen 4, one thread, batch 1): its
    14 x 14 and 7 x 7 depthwise layers ran 1.5-3.6x faster in NHWC, the model 1.07x with
    every depthwise and 1x1 layer converted."""
    g = conv2d_geometry(call)
    return g is not None and g.is_depthwise


def _one_by_one(call: Call) -> bool:
    """Whether ``call`` is a convolution with a 1x1 kernel (any layout)."""
    si = call.args[1].struct_info
    if not isinstance(si, TensorStructInfo) or si.shape is None or si.ndim != 4:
        return False
    k = call.attr_dict["kernel_layout"]
    return all(getattr(si.shape[k.index(ch)], "value", None) == 1 for ch in "HW")


def _tensor4(e: Expr) -> TensorStructInfo | None:
    si = e.struct_info
    if isinstance(si, TensorStructInfo) and si.ndim == 4:
        return si
    return None


def _op_name(e) -> str | None:
    return e.op.name if isinstance(e, Call) and isinstance(e.op, Op) else None


def _carries_layout(value) -> bool:
    """Whether the converted form of ``value`` stays NHWC: elementwise / broadcast operators,
    pooling, copies."""
    if isinstance(value, Var):
        return True
    name = _op_name(value)
    return name in _POOLS or (name is not None and
                              value.op.pattern in (OpPattern.ELEMWISE, OpPattern.BROADCAST))


def _chained_convs(func: Function, convertible, anchor, head=None) -> tuple[set[int], set[int]]:
    """The ids of the binding vars of the convolutions in ``func`` to convert, and of those
    among them that head their chain: the convertible ones in chains (joined through
    elementwise operators, pooling and copies, both ways: a residual add joins its branches)
    of two or more that hold an ``anchor``, and the ``head`` ones whose output (not input)
    joins such a chain. A convolution alone would pay a permutation on each side for a tile
    10-20% faster, and a chain of layers NHWC only runs on par (VGG-19's 3x3 layers: 0.96x
    in all) gains nothing for its two."""
    body = func.body
    if not isinstance(body, SeqExpr):
        return set()
    inputs_of: dict[int, list[Var]] = {}  # the convolutions and layout carriers: their inputs
    users: dict[int, list[Var]] = {}
    convs: dict[int, Var] = {}          # id -> var of the convertible convolutions
    blocked: set[int] = set()           # the other convolutions
    anchors: set[int] = set()
    heads: set[int] = set()             # convolutions that may head a chain (output side only)
    for blk in body.blocks:
        for b in blk.bindings:
            if not isinstance(b, VarBinding):
                continue
            if _op_name(b.value) == "relax.nn.conv2d":
                args = [b.value.args[0]]
                if convertible(b.value):
                    convs[id(b.var)] = b.var
                    if anchor(b.value):
                        anchors.add(id(b.var))
                elif head is not None and _nchw(b.value) and head(b.value):
                    convs[id(b.var)] = b.var
                    heads.add(id(b.var))
                    args = []       # its input stays NCHW: it joins no chain that way
                else:
                    blocked.add(id(b.var))
            elif _carries_layout(b.value):
                args = [b.value] if isinstance(b.value, Var) else list(b.value.args)
            else:
                continue
            inputs_of[id(b.var)] = [a for a in args if isinstance(a, Var)]
            for a in inputs_of[id(b.var)]:
                users.setdefault(id(a), []).append(b.var)

    def neighbours(start: Var) -> list[int]:
        # the convertible convolutions whose tensors would be NHWC with ``start``'s
        found, seen = [], {id(start)}
        todo = inputs_of[id(start)] + users.get(id(start), [])
        while todo:
            v = todo.pop()
            if id(v) in seen:
                continue
            seen.add(id(v))
            if id(v) in convs:
                found.append(id(v))
                continue
            if id(v) in blocked or id(v) not in inputs_of:
                continue    # an unconverted convolution, a parameter, another operator
            todo.extend(inputs_of[id(v)] + users.get(id(v), []))
        return found

    parent = {k: k for k in convs}

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k
    for k, v in convs.items():
        for other in neighbours(v):
            parent[root(other)] = root(k)
    members: dict[int, list[int]] = {}
    for k in convs:
        members.setdefault(root(k), []).append(k)
    out = set()
    for group in members.values():
        body_convs = [k for k in group if k not in heads]
        if len(body_convs) >= 2 and any(k in anchors for k in body_convs):
            out.update(group)
    return out, out & heads


def _nchw(call: Call) -> bool:
    a = call.attr_dict
    return a["data_layout"] == "NCHW" and a["out_layout"] == "NCHW"


class _Converter(ExprMutator):
    def __init__(self, mod, convertible, anchor, head=None):
        super().__init__(mod)
        self.convertible = convertible
        self.anchor = anchor
        self.head = head
        self.nhwc: set[int] = set()     # ids of the vars this pass bound to NHWC tensors
        self.permuted: dict[int, Var] = {}   # id(NCHW var) -> its permutation to NHWC
        self.chained: set[int] = set()       # ids of the convolutions to convert
        self.heads: set[int] = set()         # ... of those that keep their NCHW input
        self.binding: Var | None = None      # the var of the binding being rewritten

    def visit_function_root(self, name, func):
        self.chained, self.heads = _chained_convs(func, self.convertible, self.anchor,
                                                  self.head)
        return super().visit_function_root(name, func)

    def visit_var_binding(self, b) -> None:
        self.binding = b.var
        super().visit_var_binding(b)

    # -- the NHWC form of an NCHW operand -------------------------------------------------------
    def nhwc_source(self, e: Expr) -> Var | None:
        """The NHWC var that ``e`` is the permutation back to NCHW of, or None."""
        value = e
        while isinstance(value, Var):     # through copies (``r1 = lv78``)
            value = self.builder.lookup_binding(value)
        if _op_name(value) == "relax.permute_dims" and \
                tuple(value.attr_dict["axes"] or ()) == TO_NCHW and \
                id(value.args[0]) in self.nhwc:
            return value.args[0]
        return None

    def to_nhwc(self, e: Expr) -> Expr:
        """``e`` (4-D NCHW) in NHWC: its source when this pass made it, else a permutation."""
        src = self.nhwc_source(e)
        if src is not None:
            return src
        if not isinstance(e, Var):
            return self.builder.emit(permute_dims(e, TO_NHWC))
        if id(e) not in self.permuted:      # one permutation however many layers read it
            self.permuted[id(e)] = self.builder.emit(permute_dims(e, TO_NHWC))
        return self.permuted[id(e)]

    def converted(self, call: Call) -> Expr:
        """Bind the NHWC ``call``, remember it, and return its permutation back to NCHW."""
        v = self.builder.emit(call)
        self.nhwc.add(id(v))
        return permute_dims(v, TO_NCHW)

    # -- operators --------------------------------------------------------------------------------
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        name = _op_name(call)
        if name is None or not self.builder.building:
            return call
        if name == "relax.nn.conv2d":
            return self.conv2d(call) or call
        if name in _POOLS:
            return self.pool(call) or call
        if call.op.pattern in (OpPattern.ELEMWISE, OpPattern.BROADCAST):
            return self.elementwise(call) or call
        return call

    def conv2d(self, call: Call) -> Expr | None:
        a = call.attr_dict
        if a["data_layout"] != "NCHW" or a["out_layout"] != "NCHW" or \
                _tensor4(call) is None or self.binding is None or \
                id(self.binding) not in self.chained:
            return None
        if id(self.binding) in self.heads:
            a.update(out_layout="NHWC")     # the image stays NCHW: no permutation of it
            return self.converted(Call(call.op, list(call.args), a))
        a.update(data_layout="NHWC", out_layout="NHWC")
        return self.converted(Call(call.op, [self.to_nhwc(call.args[0]), call.args[1]], a))

    def pool(self, call: Call) -> Expr | None:
        a = call.attr_dict
        # only where the input is NHWC already: a pooling alone is as fast in NCHW
        src = self.nhwc_source(call.args[0])
        if a["layout"] != "NCHW" or a["out_layout"] != "NCHW" or src is None:
            return None
        a.update(layout="NHWC", out_layout="NHWC")
        return self.converted(Call(call.op, [src], a))

    def elementwise(self, call: Call) -> Expr | None:
        out = call.struct_info
        if not isinstance(out, TensorStructInfo) or out.ndim != 4 or out.shape is None:
            return None
        sources = [self.nhwc_source(x) for x in call.args]
        if not any(s is not None for s in sources):
            return None
        args = []
        for x, src in zip(call.args, sources):
            if src is not None:
                args.append(src)
                continue
            si = x.struct_info
            if isinstance(si, PrimStructInfo) or \
                    (isinstance(si, TensorStructInfo) and si.ndim == 0):
                args.append(x)      # scalars: not laid out
                continue
            if not isinstance(si, TensorStructInfo) or not 0 < si.ndim <= 4 or si.shape is None:
                # a target shape (broadcast_to), a tensor of unknown rank or shape: left NCHW
                return None
            if si.ndim == 4:
                args.append(self.to_nhwc(x))
                continue
            # the broadcast against a 4-D NCHW result: pad to 4-D with leading ones, permute
            y = self.builder.emit(reshape(x, (1,) * (4 - si.ndim) + tuple(si.shape)))
            args.append(self.builder.emit(permute_dims(y, TO_NHWC)))
        new = Call(call.op, args, call.attrs, call.sinfo_args)
        if _tensor4(new) is None:
            return None
        return self.converted(new)
