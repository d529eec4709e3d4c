"""``ToMixedPrecision``: run a float32 model in float16 where it is safe (TVM's
``relax.transform.ToMixedPrecision``, PyTorch's autocast).

Every float32 operator call falls in one of four classes (the tables below):

- **ALWAYS** (``matmul``, ``linear``, the convolutions): the data and weight operands are
  converted to float16 and the call accumulates in ``out_dtype`` (float32: fp16 inputs, fp32
  accumulation, as tensor cores do; float16 where the user asks for it);
- **EXACT** (data movement and selection: ``reshape``, ``permute_dims``, ``concat``,
  ``strided_slice``, ``relu``, ``max_pool2d``, ``where``, ...): the result is one of the inputs'
  elements, so float16 loses nothing; they run in float16 when their result is wanted in
  float16, and carry that wish back to their inputs;
- **FOLLOW** (element-wise arithmetic: ``add``, ``multiply``, ``divide``, ``sigmoid``,
  ``gelu``, ``avg_pool2d``, comparisons, ...): they run in float16 when all their inputs are
  float16 only, else in float32 (so the epilogue of an fp32-accumulating matmul or convolution
  stays in fp32 and is rounded once);
- everything else, among them the numerically sensitive **NEVER** ops (``softmax``,
  ``layer_norm``, ``rms_norm``, ``group_norm``, ``batch_norm``, the reductions ``sum`` /
  ``mean`` / ``variance``, ``exp``, ``log``, ``power``, ``sqrt``), runs in float32 on float32
  inputs, as before.

Where a value is stored: a value is converted to float16 right after it is computed when some
consumer takes it in float16 (an ALWAYS call, or an EXACT call whose result is wanted in
float16), so the cast joins the kernel that computes it (``FuseOps`` puts an element-wise
``astype`` into the producer's epilogue); a consumer that needs float32 reads the float32 value
where one exists, else converts the float16 one (a cast ``FuseOps`` puts into the consumer).
Float32 constants operands become ``astype(constant, "float16")``, which ``FoldConstant`` (the
first passes of ``relax.build``'s pipeline) turns into float16 constants at build time, or
``FoldConstantCasts`` (what ``relax.quantize(mod, "fp16")`` runs after this pass) right away, so
the module itself holds the weights in half the bytes. The function's signature does not
change: float32 in, float32 out.

Run it on the module as imported (operator calls, before ``LegalizeOps``); ``call_tir`` calls
and values of other dtypes are left alone.

Examples
--------
>>> from tilecraft.relax.transform import ToMixedPrecision
>>> # mod: lv = R.matmul(x, W) ; lv1 = R.add(lv, b) ; gv = R.nn.relu(lv1)
>>> # ToMixedPrecision()(mod):
>>> #   lv = R.matmul(R.astype(x, "float16"), R.astype(W, "float16"), out_dtype="float32")
>>> #   lv1 = R.add(lv, b)           (float32: the epilogue of an fp32 accumulation)
>>> #   gv = R.nn.relu(lv1)
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir.function import IRModule

from ..analysis import free_vars
from ..expr import (Binding, BindingBlock, Call, Constant, DataflowBlock, DataflowVar, Expr,
                    Function, MatchCast, RelaxError, SeqExpr, Tuple, Var, VarBinding)
from ..op import astype
from ..op.base import Op
from ..struct_info import TensorStructInfo
from .base import ExprMutator, Pass

__all__ = ["ToMixedPrecision", "FoldConstantCasts", "ALWAYS", "EXACT", "FOLLOW", "NEVER",
           "policy_of"]

HALF, FLOAT = "float16", "float32"

# operator -> the argument positions converted to float16 (others keep their dtype: a
# ``linear`` bias is added in the accumulation dtype)
ALWAYS = {
    "relax.matmul": (0, 1),
    "relax.linear": (0, 1),
    "relax.nn.conv1d": (0, 1),
    "relax.nn.conv2d": (0, 1),
    "relax.nn.conv3d": (0, 1),
    "relax.nn.conv1d_transpose": (0, 1),
    "relax.nn.conv2d_transpose": (0, 1),
}

# results are input elements (or constants): exact in float16
EXACT = frozenset({
    "relax.reshape", "relax.permute_dims", "relax.flatten", "relax.squeeze", "relax.expand_dims",
    "relax.concat", "relax.strided_slice", "relax.take", "relax.broadcast_to", "relax.tile",
    "relax.repeat", "relax.flip", "relax.gather_elements", "relax.gather_nd", "relax.pad",
    "relax.where", "relax.maximum", "relax.minimum", "relax.negative", "relax.abs",
    "relax.clip", "relax.nn.relu", "relax.nn.relu6", "relax.max", "relax.min",
    "relax.nn.max_pool1d", "relax.nn.max_pool2d", "relax.nn.max_pool3d",
    "relax.nn.adaptive_max_pool1d", "relax.nn.adaptive_max_pool2d",
    "relax.nn.adaptive_max_pool3d", "relax.tril", "relax.triu",
})

# element-wise arithmetic whose float16 form is accurate and cannot overflow on the values a
# network carries (the average pools accumulate float16 in float32)
FOLLOW = frozenset({
    "relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.square",
    "relax.sigmoid", "relax.tanh", "relax.erf", "relax.nn.gelu", "relax.nn.gelu_tanh",
    "relax.nn.silu", "relax.nn.leaky_relu", "relax.nn.hard_sigmoid", "relax.nn.hard_swish",
    "relax.floor", "relax.ceil", "relax.round", "relax.trunc", "relax.sign",
    "relax.equal", "relax.not_equal", "relax.less", "relax.less_equal", "relax.greater",
    "relax.greater_equal", "relax.image.resize2d",
    "relax.nn.avg_pool1d", "relax.nn.avg_pool2d", "relax.nn.avg_pool3d",
    "relax.nn.adaptive_avg_pool1d", "relax.nn.adaptive_avg_pool2d",
    "relax.nn.adaptive_avg_pool3d",
})

# kept in float32 (listed for the documentation and the tests: any operator in none of the
# tables above is kept in float32 too)
NEVER = frozenset({
    "relax.nn.softmax", "relax.nn.log_softmax", "relax.nn.layer_norm", "relax.nn.rms_norm",
    "relax.nn.group_norm", "relax.nn.batch_norm", "relax.sum", "relax.mean", "relax.variance",
    "relax.std", "relax.prod", "relax.cumsum", "relax.exp", "relax.log", "relax.power",
    "relax.sqrt", "relax.rsqrt", "relax.nn.softplus", "relax.nn.elu", "relax.nn.selu",
    "relax.einsum",
})


def policy_of(call: Expr) -> str:
    """``"always"``, ``"exact"``, ``"follow"`` or ``"keep"`` (float32, as before) for a binding's
    value: only operator calls on float32 tensors change."""
    if not isinstance(call, Call) or not isinstance(call.op, Op):
        return "keep"
    name = call.op.name
    if name in ALWAYS:
        pos = ALWAYS[name]
        if all(_is_float32(call.args[i]) for i in pos if i < len(call.args)):
            return "always"
        return "keep"
    if not isinstance(call.struct_info, TensorStructInfo):
        return "keep"
    if not any(_is_float32(a) for a in _tensor_leaves(call.args)):
        return "keep"
    if name in EXACT:
        return "exact"
    if name in FOLLOW:
        return "follow"
    return "keep"


class ToMixedPrecision(Pass):
    """Convert float32 matmul / dense / convolution inputs to float16, keep the sensitive ops
    in float32 and let what lies between follow (see the module's docstring).

    Parameters
    ----------
    out_dtype : {"float32", "float16"}
        The accumulation (and result) dtype of matmul, dense and convolution: ``"float32"``
        (the default) accumulates float16 products in float32; ``"float16"`` accumulates in
        float16 (faster where the hardware computes in half, less accurate for long sums).

    Examples
    --------
    >>> from tilecraft import relax
    >>> from tilecraft.relax.transform import ToMixedPrecision
    >>> mod16 = ToMixedPrecision(out_dtype="float32")(mod)        # doctest: +SKIP
    >>> exe = relax.build(mod16, "webgpu -supports-float16=1")    # doctest: +SKIP
    """

    name = "ToMixedPrecision"

    def __init__(self, out_dtype: str = "float32"):
        if out_dtype not in (FLOAT, HALF):
            raise ValueError(f"ToMixedPrecision: out_dtype must be 'float32' or 'float16', got "
                             f"{out_dtype!r}")
        self.out_dtype = out_dtype

    def transform_module(self, mod: IRModule) -> IRModule:
        return _Rewriter(mod, self.out_dtype).visit_module()

    def __repr__(self):
        return f"ToMixedPrecision(out_dtype={self.out_dtype!r})"


class FoldConstantCasts(Pass):
    """Replace ``astype(constant, dtype)`` between float dtypes by the converted constant (and a
    dataflow variable bound to one by the constant, where it is used).

    numpy's conversion rounds to nearest, ties to even, and overflows to infinity: what the
    cast kernel computes, so the result is the same as folding at build time, without compiling
    a kernel per weight (and without a compiler: this runs where only numpy is installed).
    Other calls, and casts to or from integer dtypes, are left alone.

    Examples
    --------
    >>> from tilecraft.relax.transform import FoldConstantCasts, ToMixedPrecision
    >>> mod16 = FoldConstantCasts()(ToMixedPrecision()(mod))     # doctest: +SKIP
    >>> # W_f16 = R.astype(metadata[0], "float16")  ->  W_f16 = metadata[1] (float16)
    """

    name = "FoldConstantCasts"

    def transform_module(self, mod: IRModule) -> IRModule:
        return _CastFolder(mod).visit_module()


class _CastFolder(ExprMutator):
    def visit_var_binding(self, b: VarBinding) -> None:
        value = self.visit_expr(b.value)
        if isinstance(value, Constant) and value is not b.value and \
                isinstance(b.var, DataflowVar):
            self.var_remap[id(b.var)] = value     # its uses read the constant; the binding goes
            return
        self.emit_binding(b, value)

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, Op) and call.op.name == "relax.astype"
                and isinstance(call.args[0], Constant)):
            return call
        src, dtype = call.args[0].data, call.attr_dict["dtype"]
        if src.dtype.kind != "f" or not dtype.startswith("float"):
            return call
        with np.errstate(over="ignore"):      # beyond float16's range: infinity, as the kernel
            return Constant(src.astype(np.dtype(dtype)))


# ---------------------------------------------------------------------------------------------
# helpers


def _is_float32(e: Expr) -> bool:
    si = e.struct_info
    return isinstance(si, TensorStructInfo) and si.dtype == FLOAT


def _tensor_leaves(args) -> list[Expr]:
    """The arguments, with the fields of Tuple arguments (``concat``'s list) in their place."""
    out = []
    for a in args:
        if isinstance(a, Tuple):
            out.extend(_tensor_leaves(a.fields))
        else:
            out.append(a)
    return out


def _top_bindings(func: Function) -> list[tuple[Binding, bool]]:
    """The bindings of ``func``'s body blocks, each with whether its block is a dataflow block."""
    body = func.body
    if not isinstance(body, SeqExpr):
        return []
    return [(b, isinstance(blk, DataflowBlock)) for blk in body.blocks for b in blk.bindings]


def wanted_in_half(func: Function) -> set[int]:
    """``id``s of the variables of ``func`` some consumer takes in float16: operands of ALWAYS
    calls, and the operands of EXACT calls whose own result is wanted in float16 (a backward
    walk, so every consumer is seen before its producer). Variables that leave a dataflow block
    keep their dtype."""
    want: set[int] = set()
    for b, in_dataflow in reversed(_top_bindings(func)):
        if not isinstance(b, VarBinding):
            continue
        if in_dataflow and not isinstance(b.var, DataflowVar):
            want.discard(id(b.var))       # leaves the block: keeps its dtype
            continue
        value, policy = b.value, policy_of(b.value)
        if policy == "always":
            ops = [value.args[i] for i in ALWAYS[value.op.name] if i < len(value.args)]
        elif policy == "exact" and id(b.var) in want:
            ops = _tensor_leaves(value.args)
        elif isinstance(value, Var) and id(b.var) in want:
            ops = [value]                 # an alias
        else:
            continue
        want.update(id(a) for a in ops if isinstance(a, Var) and _is_float32(a))
    return want


class _Rewriter(ExprMutator):
    """Rewrites each Relax function binding by binding. ``versions[id(var)]`` holds the
    expressions that carry a variable's value, by dtype (its float32 value and / or its float16
    one)."""

    def __init__(self, mod: IRModule, out_dtype: str):
        super().__init__(mod)
        self.out_dtype = out_dtype
        self.want: set[int] = set()
        self.versions: dict[int, dict[str, Expr]] = {}
        self.block_conversions: list[tuple[int, str]] = []   # dropped when the block ends
        self.nested = 0            # > 0 inside If branches / inner functions: left as they are

    # -- functions and blocks ---------------------------------------------------------------------
    def visit_function_root(self, name: str, func: Function) -> Function:
        if func.attr_dict.get("Primitive") or not isinstance(func.body, SeqExpr):
            return func           # a fused kernel group, or no bindings: nothing to convert
        self.builder.begin_names(func)
        self.want = wanted_in_half(func)
        self.versions = {}
        blocks = []
        for blk in func.body.blocks:
            new = self.visit_block(blk)
            if new.bindings:
                blocks.append(new)
        # the function returns what it returned: float32 values stay float32
        self.builder.begin_block(False)
        self.block_conversions = []
        try:
            body = self.keep(func.body.body)
        finally:
            tail = self.builder.end_block()
        if tail:
            blocks.append(BindingBlock(tail))
        return Function(func.params, SeqExpr(blocks, body), func.ret_struct_info, func.attrs)

    def visit_function(self, func: Function) -> Function:
        self.nested += 1           # a function bound inside: left as it is
        try:
            return super().visit_function(func)
        finally:
            self.nested -= 1

    def visit_if_(self, e):
        self.nested += 1           # branches: left as they are, on float32 values
        try:
            return super().visit_if_(e)
        finally:
            self.nested -= 1

    def visit_block(self, blk: BindingBlock) -> BindingBlock:
        if self.nested:
            return super().visit_block(blk)
        self.block_conversions = []
        try:
            return super().visit_block(blk)
        finally:
            # conversions made in a dataflow block are DataflowVars: not visible after it
            if isinstance(blk, DataflowBlock):
                for key, dtype in self.block_conversions:
                    self.versions.get(key, {}).pop(dtype, None)
            self.block_conversions = []

    # -- values in a dtype --------------------------------------------------------------------------
    def versions_of(self, v: Var | Constant) -> dict[str, Expr]:
        got = self.versions.get(id(v))
        if got is None:                  # a parameter, a constant, a variable left as it was
            mapped = self.var_remap.get(id(v), v) if isinstance(v, Var) else v
            got = self.versions[id(v)] = {mapped.struct_info.dtype: mapped} \
                if isinstance(mapped.struct_info, TensorStructInfo) else {"": mapped}
        return got

    def half_only(self, e: Expr) -> bool:
        """Is ``e`` (an original float32 operand) available in float16 only?"""
        return isinstance(e, Var) and FLOAT not in self.versions_of(e)

    def convert(self, e: Expr, dtype: str) -> Expr:
        """The value of operand ``e`` (of the original program) as ``dtype``; float32 operands
        only, others as they are (with their new variables)."""
        if isinstance(e, Tuple):
            fields = [self.convert(f, dtype) for f in e.fields]
            return e if all(a is b for a, b in zip(fields, e.fields)) else Tuple(fields)
        if not _is_float32(e):
            return self.visit_expr(e) if isinstance(e, Var) else e
        if not isinstance(e, (Var, Constant)) or dtype == FLOAT and isinstance(e, Constant):
            return e
        versions = self.versions_of(e)
        if dtype in versions:
            return versions[dtype]
        src = versions[FLOAT] if FLOAT in versions else versions[HALF]
        # (a constant's cast is folded into a float16 constant by FoldConstant, at build time)
        name = e.name_hint if isinstance(e, Var) else "const"
        var = self.builder.emit(astype(src, dtype), f"{name}_{_short(dtype)}")
        versions[dtype] = var
        self.block_conversions.append((id(e), dtype))
        return var

    def keep(self, e: Expr) -> Expr:
        """``e`` with every float32 variable it uses in float32 (as the original program)."""
        remap = {}
        for v in free_vars(e):
            new = self.convert(v, FLOAT)
            if new is not v:
                remap[id(v)] = new
        saved = self.var_remap
        self.var_remap = {**saved, **remap}
        try:
            return self.visit_expr(e)
        finally:
            self.var_remap = saved

    # -- bindings ---------------------------------------------------------------------------------
    def visit_match_cast(self, b: MatchCast) -> None:
        if self.nested:
            return super().visit_match_cast(b)
        value = self.keep(b.value)
        self.builder.append(b if value is b.value else MatchCast(b.var, value, b.struct_info))

    def visit_var_binding(self, b: VarBinding) -> None:
        if self.nested:
            return super().visit_var_binding(b)
        value, var = b.value, b.var
        leaves = isinstance(var, Var) and not isinstance(var, DataflowVar) and \
            self.builder.in_dataflow       # leaves the block: keeps its dtype
        policy = policy_of(value)
        if isinstance(value, Var) and _is_float32(value) and not leaves:
            versions = self.versions_of(value)   # an alias: bound to a version of the value
            dtype = HALF if id(var) in self.want or FLOAT not in versions else FLOAT
            new = self.emit_binding(b, self.convert(value, dtype))
            self.versions[id(var)] = {dtype: new}
            return
        if policy == "always":
            pos = ALWAYS[value.op.name]
            args = [self.convert(a, HALF if i in pos else FLOAT)
                    for i, a in enumerate(value.args)]
            attrs = {**value.attr_dict, "out_dtype": self.out_dtype}
            new_value = Call(value.op, args, attrs, value.sinfo_args)
        elif policy in ("exact", "follow"):
            floats = [a for a in _tensor_leaves(value.args)
                      if _is_float32(a) and not isinstance(a, Constant)]
            in_half = bool(floats) and all(self.half_only(a) for a in floats)
            if policy == "exact" and id(var) in self.want and not leaves:
                in_half = True
            dtype = HALF if in_half else FLOAT
            args = [self.convert(a, dtype) for a in value.args]
            new_value = value if all(x is y for x, y in zip(args, value.args)) else \
                Call(value.op, args, value.attrs, value.sinfo_args)
        else:
            new_value = self.keep(value)
        self.bind(b, new_value, leaves)

    def bind(self, b: VarBinding, value: Expr, leaves: bool) -> None:
        """Bind ``b.var`` to ``value`` (its dtype may differ from the original) and record the
        versions: float16 too right away when a consumer wants it, the original dtype when the
        variable leaves its block."""
        var = b.var
        si = value.struct_info
        if not isinstance(si, TensorStructInfo) or not _is_float32(var):
            self.emit_binding(b, value)
            return
        dtype = si.dtype
        if leaves and dtype != FLOAT:
            value = astype(self.builder.emit(value, f"{var.name_hint}_{_short(dtype)}"), FLOAT)
            dtype = FLOAT
        if id(var) in self.want and not leaves and dtype == FLOAT:
            r = self.builder.emit(value, f"{var.name_hint}_f32")
            h = self.emit_binding(b, astype(r, HALF))
            self.versions[id(var)] = {FLOAT: r, HALF: h}
            return
        new = self.emit_binding(b, value)
        self.versions[id(var)] = {dtype: new}


def _short(dtype: str) -> str:
    return {"float16": "f16", "float32": "f32"}.get(dtype, dtype)
