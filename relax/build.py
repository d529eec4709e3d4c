"""``relax.build``: optimize a Relax module, schedule and compile its kernels, and produce the VM
program — an ``Executable``.

Steps:

1. the graph pipeline: ``relax.get_pipeline()`` (``relax.transform``) by default, or the
   ``pipeline`` given; then ``LegalizeOps`` again, so that no operator is left without a kernel;
2. ``StaticPlanBlockMemory`` (with ``upper_bounds`` for symbolic dims);
3. a schedule for every PrimFunc the program calls: the database's (``database.query_schedule``)
   when it has one, else the default schedules of ``relax.default_schedules``;
4. all kernels compiled into one ``targets.build`` module (one shared library when exported);
5. each Relax function translated into a VM instruction list (``relax.vm``).

Examples
--------
>>> exe = relax.build(mod, "llvm")                            # doctest: +SKIP
>>> vm = relax.VirtualMachine(exe, targets.cpu(0))            # doctest: +SKIP
>>> vm["main"](x)                                             # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import functools
import gc
import warnings
from typing import Callable, Mapping, Sequence

import numpy as np

from tilecraft import targets
from tilecraft.targets import BuildStats, KernelSpec, Target, kernel_cache
from tilecraft.targets.build_module import machine_key
from tilecraft.tensorir.expr import (Add, And, Cast, Div, EQ, FloatImm, FloorDiv, FloorMod, GE, GT,
                           IntImm, LE, LT, Max, Min, Mod, Mul, NE, Not, Or, PrimExpr, Select, Sub,
                           Var as TirVar)
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.generalize import loop_structure, share_kernels

from .block_builder import PrimFuncIndex
from .executable import PROGRAM_VERSION, Executable
from .expr import (Call, Constant, Expr, ExternFunc, Function, GlobalVar, If, MatchCast,
                   PrimValue, RelaxError, SeqExpr, ShapeExpr, Tuple, TupleGetItem, Var, VarBinding)
from .op.base import Op
from .struct_info import (PrimStructInfo, ShapeStructInfo, StructInfo, TensorStructInfo,
                          TupleStructInfo)
from .transform import LegalizeOps, get_pipeline
from .transform.static_plan_block_memory import StaticPlanBlockMemory
from .vm_builtins import BUILTINS, OP_BUILTINS
from .tune_layouts import conv_plans_from
from . import boundary_dtypes, build_cache, default_schedules, gpu_schedules

# ---------------------------------------------------------------------------------------------
# the graph pipeline


def default_pipeline(target: "Target | str | None" = None) -> Callable[[IRModule], IRModule]:
    """``relax.get_pipeline(target=target)``: inference decompositions, constant folding,
    weight packing (CPU), legalization, fusion."""
    return get_pipeline(target=target)


def legalize(mod: IRModule) -> IRModule:
    """``LegalizeOps()``: after a custom pipeline too, so no operator is left without a kernel."""
    return LegalizeOps()(mod)


def _layout_pipeline(pipeline, database, target):
    """The default pipeline with ``database``'s layout decisions (``relax.tune_layouts``)
    when it has some for ``target`` and no other pipeline was asked for; else ``pipeline``."""
    if database is None or not (pipeline is None or pipeline == "default"):
        return pipeline
    hook = conv_plans_from(database, target)
    return pipeline if hook is None else get_pipeline(target=target, conv_plans=hook)


def _run_pipeline(mod: IRModule, pipeline, target=None) -> IRModule:
    if pipeline is None or pipeline == "default":
        pipeline = default_pipeline(target)
    if callable(pipeline):
        return pipeline(mod)
    if isinstance(pipeline, (list, tuple)):
        for p in pipeline:
            mod = p(mod)
        return mod
    raise TypeError(f"relax.build: pipeline must be a callable IRModule -> IRModule, a list of "
                    f"them or None, got {pipeline!r}")


# ---------------------------------------------------------------------------------------------
# scheduling


def _called_kernels(mod: IRModule) -> list[str]:
    names: list[str] = []

    def visit(n):
        if isinstance(n, Call) and isinstance(n.op, Op) and \
                n.op.name in ("relax.call_tir", "relax.call_tir_dps"):
            g = n.args[0]
            if g.name_hint not in names:
                names.append(g.name_hint)
    for f in mod.functions.values():
        if isinstance(f, Function):
            post_order_visit(f, visit)
    return names


def _as_prim_func(result, name: str) -> PrimFunc:
    if isinstance(result, Schedule):
        return result.mod[result._func_name]
    if isinstance(result, IRModule):
        funcs = [f for f in result.functions.values() if isinstance(f, PrimFunc)]
        if len(funcs) != 1:
            raise ValueError(f"relax.build: the database returned a module of {len(funcs)} "
                             f"functions for kernel {name}")
        return funcs[0]
    if isinstance(result, PrimFunc):
        return result
    raise TypeError(f"relax.build: database.query_schedule returned {type(result).__name__} for "
                    f"kernel {name}; expected a Schedule, PrimFunc, IRModule or None")


def _query(database, func: PrimFunc, target: Target, name: str) -> PrimFunc | None:
    """The database's schedule of ``func`` (a scheduled PrimFunc), or None."""
    if database is None:
        return None
    query = getattr(database, "query_schedule", None)
    if query is None:
        raise TypeError("relax.build: database must have query_schedule(func, target) "
                        "returning a Schedule, PrimFunc or None")
    result = query(func, target)
    return None if result is None else _as_prim_func(result, name)


def schedule_kernels(mod: IRModule, target: Target, database=None,
                     kernels: Sequence[str] | None = None,
                     strict: bool = False) -> dict[str, PrimFunc]:
    """Schedule each kernel: ``database.query_schedule(func, target)`` (a Schedule, PrimFunc or
    None) first, else ``default_schedules.apply(func, target)``. ``strict``: a kernel the
    default rules leave unscheduled (a ``DefaultScheduleWarning``) is a ``RelaxError``."""
    out = {}
    for name in kernels if kernels is not None else _called_kernels(mod):
        func = mod[name]
        if not isinstance(func, PrimFunc):
            raise RelaxError(f"relax.build: call_tir of {name}, which is not a PrimFunc")
        scheduled = _query(database, func, target, name)
        if scheduled is None:
            scheduled = _default_schedule(func, target, name, strict)
        out[name] = scheduled
    return out


def dedupe_kernels(mod: IRModule, kernels: Sequence[str]) -> dict[str, str]:
    """Map each kernel name to the first kernel structurally equal to it (itself when none
    comes before it): fusion makes one PrimFunc per call site, and a network repeats its
    blocks, so that ResNet-50's 58 kernels are 29 distinct ones. Kernels are compared up to
    the names of their variables and buffers and their ``global_symbol``.

    Examples
    --------
    >>> dedupe_kernels(mod, ["fused_conv1", "fused_conv2"])     # doctest: +SKIP
    {'fused_conv1': 'fused_conv1', 'fused_conv2': 'fused_conv1'}
    """
    rep: dict[str, str] = {}
    index = PrimFuncIndex()     # hashes only kernels of the same parameter shapes
    for name in kernels:
        func = mod[name]
        if not isinstance(func, PrimFunc):
            raise RelaxError(f"relax.build: call_tir of {name}, which is not a PrimFunc")
        same = index.find(func)
        if same is None:
            index.add(name, func)
        rep[name] = same or name
    return rep


def share_shaped_kernels(mod: IRModule, aliases: Mapping[str, str], target: Target,
                         min_members: int = 3,
                         cache: "kernel_cache.KernelCache | None" = None
                         ) -> tuple[IRModule, dict[str, str]]:
    """Write each family of distinct kernels that differ only in one moving dimension (the
    input channels of DenseNet's convolutions, ...) as one kernel with that dimension
    symbolic (``tensorir.generalize.share_kernels``): the family's first kernel becomes the
    shared one, and ``aliases`` (from ``dedupe_kernels``) map every member to it. A family is
    shared only where the default schedules give the shared kernel the loop structure they
    give its first member (``tensorir.generalize.loop_structure``): a symbolic dimension can
    change their decisions (an injective kernel's symbolic channel loop is not fused into its
    parallel loop, which made DenseNet's concatenations up to 6x slower). ``cache`` (a
    ``KernelCache``) keeps that comparison's answer (``same_loop_structure``).

    Examples
    --------
    >>> mod, aliases = share_shaped_kernels(mod, dedupe_kernels(mod, called), target)  # doctest: +SKIP
    """
    distinct = list(dict.fromkeys(aliases.values()))
    families = share_kernels([mod[n] for n in distinct], min_members=min_members)
    merged = {}
    for family in families:
        first = distinct[family.members[0]]
        if not same_loop_structure(family.func, mod[first], target, cache):
            continue
        mod = mod.with_function(first, family.func)
        merged.update({distinct[i]: first for i in family.members})
    return mod, {n: merged.get(rep, rep) for n, rep in aliases.items()}


_SHARE_PROBE_FORMAT = 1


def same_loop_structure(shared: PrimFunc, member: PrimFunc, target: Target,
                        cache: "kernel_cache.KernelCache | None" = None) -> bool:
    """Whether the default schedules give ``shared`` the loop structure they give ``member``
    (``share_shaped_kernels``' test of a family). Scheduling both was most of a warm build's
    kernel sharing (DenseNet-121: 0.6 of 2.2 CPU s); with ``cache``, the answer is kept in it
    under the two kernels' TensorIR text, the target and ``machine_key`` (which holds the
    fingerprint of tilecraft's code, so a change to the schedules asks again).

    Examples
    --------
    >>> same_loop_structure(family.func, mod[first], Target("llvm"))   # doctest: +SKIP
    True
    """
    key = None
    if cache is not None and target.kind == "llvm":
        try:
            texts = (shared.script(), member.script())
        except Exception:  # noqa: BLE001 - IR the printer does not know: ask, do not keep
            texts = None
        if texts is not None:
            key = kernel_cache.cache_key("relax-share-probe", _SHARE_PROBE_FORMAT,
                                         machine_key(target), str(target), *texts)
            found = cache.get(key)
            if found in (b"0", b"1"):
                return found == b"1"
    with warnings.catch_warnings():
        # a kernel the rules leave unscheduled warns when it is compiled, not here
        warnings.simplefilter("ignore", default_schedules.DefaultScheduleWarning)
        alike = loop_structure(default_schedules.apply(shared, target)) == \
            loop_structure(default_schedules.apply(member, target))
    if key is not None:
        cache.put(key, b"1" if alike else b"0")
    return alike


def _default_schedule(func: PrimFunc, target: Target, name: str, strict: bool) -> PrimFunc:
    rules = gpu_schedules if target.kind in gpu_schedules.GPU_KINDS else default_schedules
    if not strict:
        return rules.apply(func, target)
    with warnings.catch_warnings():
        warnings.simplefilter("error", default_schedules.DefaultScheduleWarning)
        try:
            return rules.apply(func, target)
        except default_schedules.DefaultScheduleWarning as err:
            raise RelaxError(f"relax.build(strict=True): kernel {name} cannot be scheduled by "
                             f"the default rules: {err}") from None


DEFAULT_SCHEDULE_ID = "relax.default_schedules"


def kernel_specs(mod: IRModule, target: Target, database=None,
                 kernels: Sequence[str] | None = None,
                 strict: bool = False) -> list[KernelSpec]:
    """What ``relax.build`` compiles for an LLVM target: each kernel with the database's
    schedule (queried here), or with the default schedules to apply where it is compiled (only
    when the kernel cache does not have it; ``strict`` as in ``schedule_kernels``)."""
    specs = []
    for name in kernels if kernels is not None else _called_kernels(mod):
        func = mod[name]
        if not isinstance(func, PrimFunc):
            raise RelaxError(f"relax.build: call_tir of {name}, which is not a PrimFunc")
        scheduled = _query(database, func, target, name)
        if scheduled is not None:
            specs.append(KernelSpec(name, scheduled))
        else:
            specs.append(KernelSpec(name, func, functools.partial(_default_schedule,
                                                                  target=target, name=name,
                                                                  strict=strict),
                                    DEFAULT_SCHEDULE_ID))
    return specs


# ---------------------------------------------------------------------------------------------
# VM code generation

_EXPR_OPS = [(Add, "add"), (Sub, "sub"), (Mul, "mul"), (FloorDiv, "floordiv"),
             (FloorMod, "floormod"), (Div, "div"), (Mod, "mod"), (Min, "min"), (Max, "max"),
             (LT, "lt"), (LE, "le"), (EQ, "eq"), (NE, "ne"), (GT, "gt"), (GE, "ge"),
             (And, "and"), (Or, "or")]


def _text(e: PrimExpr) -> str:
    if isinstance(e, IntImm):
        return str(e.value)
    if isinstance(e, TirVar):
        return e.name
    return repr(e)


def _shape_text(shape) -> str:
    return "(" + ", ".join(_text(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


class _FunctionCodegen:
    """One Relax function -> its VM program entry."""

    def __init__(self, name: str, func: Function, mod: IRModule, program: "_ProgramCodegen"):
        self.name, self.func, self.mod, self.prog = name, func, mod, program
        self.num_regs = 1          # register 0: the frame's pool list
        self.var_reg: dict[int, int] = {}
        self.tir_reg: dict = {}    # symbolic tir Var -> register
        self.code: list = []

    def new_reg(self) -> int:
        r = self.num_regs
        self.num_regs += 1
        return r

    def emit(self, *ins):
        self.code.append(list(ins))

    # -- shape expressions ------------------------------------------------------------------
    def expr(self, e: PrimExpr, where: str = ""):
        if isinstance(e, IntImm):
            return bool(e.value) if e.dtype == "bool" else int(e.value)
        if isinstance(e, FloatImm):
            return float(e.value)
        if isinstance(e, TirVar):
            reg = self.tir_reg.get(e)
            if reg is None:
                raise RelaxError(f"relax.build: function {self.name}: the symbolic variable "
                                 f"{e.name}{' in ' + where if where else ''} is used before it "
                                 f"is defined; bind it through a parameter's shape or "
                                 f"match_cast", e)
            return ["r", reg]
        for cls, op in _EXPR_OPS:
            if type(e) is cls:
                return [op, self.expr(e.a, where), self.expr(e.b, where)]
        if isinstance(e, Not):
            return ["not", self.expr(e.a, where)]
        if isinstance(e, Select):
            return ["select", self.expr(e.condition, where), self.expr(e.true_value, where),
                    self.expr(e.false_value, where)]
        if isinstance(e, Cast):
            return ["cast", e.dtype, self.expr(e.value, where)]
        raise RelaxError(f"relax.build: function {self.name}: the shape expression {e!r} "
                         f"cannot be evaluated by the VM", e)

    def shape(self, dims, where: str = "") -> list:
        return [self.expr(d, where) for d in dims]

    # -- match specs ------------------------------------------------------------------------
    def spec(self, sinfo: StructInfo, what: str, define: bool) -> dict:
        """The match spec of ``sinfo``; plain symbolic dims not bound yet become binds when
        ``define`` (else it is an error to use them)."""
        if isinstance(sinfo, TensorStructInfo):
            spec = {"kind": "tensor", "ndim": sinfo.ndim, "dtype": sinfo.dtype}
            if sinfo.shape is not None:
                spec["dims"] = self._dims(sinfo.shape, what, define)
                spec["shape_text"] = _shape_text(sinfo.shape)
            return spec
        if isinstance(sinfo, ShapeStructInfo):
            spec = {"kind": "shape", "ndim": sinfo.ndim}
            if sinfo.values is not None:
                spec["dims"] = self._dims(sinfo.values, what, define)
            return spec
        if isinstance(sinfo, TupleStructInfo):
            return {"kind": "tuple", "fields": [self.spec(f, f"{what}[{i}]", define)
                                                for i, f in enumerate(sinfo.fields)]}
        if isinstance(sinfo, PrimStructInfo):
            spec = {"kind": "prim", "dtype": sinfo.dtype}
            if sinfo.value is not None:
                spec["value"] = self._dims([sinfo.value], what, define)[0]
            return spec
        return {"kind": "object"}

    def _dims(self, dims, what: str, define: bool) -> list:
        out = []
        for d in dims:
            if isinstance(d, TirVar) and d not in self.tir_reg and define:
                reg = self.new_reg()
                self.tir_reg[d] = reg
                out.append(["bind", reg])
            else:
                out.append(("check", d))
        return out

    def resolve_checks(self, spec: dict, what: str):
        """Turn the pending ("check", expr) entries into program form, once every bind is known."""
        for key in ("dims",):
            if key in spec:
                spec[key] = [self._check_entry(a, what) for a in spec[key]]
        if "value" in spec:
            spec["value"] = self._check_entry(spec["value"], what)
        for f in spec.get("fields", []):
            self.resolve_checks(f, what)

    def _check_entry(self, a, what: str):
        if isinstance(a, tuple) and a[0] == "check":
            d = a[1]
            return ["check", self.expr(d, what), _text(d)]
        return a

    # -- functions --------------------------------------------------------------------------
    def generate(self) -> dict:
        func = self.func
        param_regs, specs, names = [], [], []
        for p in func.params:
            reg = self.new_reg()
            self.var_reg[id(p)] = reg
            param_regs.append(reg)
            names.append(p.name_hint)
            specs.append(self.spec(p.struct_info, f"argument {p.name_hint}", define=True))
        for p, spec in zip(func.params, specs):
            self.resolve_checks(spec, f"argument {p.name_hint}")
        # binds (and rank / dtype checks) of every parameter first, then the dependent checks
        for p, reg, spec in zip(func.params, param_regs, specs):
            self.emit("match", reg, f"argument {p.name_hint}", spec, "bind")
        for p, reg, spec in zip(func.params, param_regs, specs):
            if _has_checks(spec):
                self.emit("match", reg, f"argument {p.name_hint}", spec, "check")
        ret = self.value(func.body)
        out = {"params": names, "param_regs": param_regs, "param_specs": specs,
               "num_regs": self.num_regs, "code": self.code, "ret": ret}
        boundary = func.attr_dict.get(boundary_dtypes.ATTR)
        if boundary:   # ml_dtypes types at the VM boundary (relax.boundary_dtypes)
            out[boundary_dtypes.ATTR] = {k: _json_attr(v, "the function", boundary_dtypes.ATTR)
                                         for k, v in dict(boundary).items()}
        return out

    # -- expressions ------------------------------------------------------------------------
    def value(self, e: Expr) -> int:
        """Compile ``e``; the register that holds its value."""
        if isinstance(e, Var):
            reg = self.var_reg.get(id(e))
            if reg is None:
                raise RelaxError(f"relax.build: function {self.name}: variable {e.name_hint} is "
                                 f"used before it is defined", e)
            return reg
        if isinstance(e, SeqExpr):
            for blk in e.blocks:
                for b in blk.bindings:
                    self.binding(b)
            return self.value(e.body)
        if isinstance(e, Constant):
            r = self.new_reg()
            self.emit("const", r, self.prog.constant(e))
            return r
        if isinstance(e, ShapeExpr):
            r = self.new_reg()
            self.emit("shape", r, self.shape(e.values, "a shape"))
            return r
        if isinstance(e, PrimValue):
            r = self.new_reg()
            self.emit("prim", r, self.expr(e.value, "a scalar"))
            return r
        if isinstance(e, Tuple):
            fields = [self.value(f) for f in e.fields]
            r = self.new_reg()
            self.emit("tuple", r, fields)
            return r
        if isinstance(e, TupleGetItem):
            src = self.value(e.tuple_value)
            index = e.index
            si = e.tuple_value.struct_info
            if index < 0 and isinstance(si, TupleStructInfo):
                index += len(si.fields)
            r = self.new_reg()
            self.emit("get_item", r, src, index)
            return r
        if isinstance(e, If):
            return self.if_(e)
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, (GlobalVar, ExternFunc, Function)):
            raise RelaxError(f"relax.build: function {self.name}: a function value "
                             f"({type(e).__name__}) can only be called, not stored", e)
        raise RelaxError(f"relax.build: function {self.name}: cannot compile "
                         f"{type(e).__name__} for the VM", e)

    def binding(self, b):
        if isinstance(b, MatchCast):
            src = self.value(b.value)
            what = f"match_cast {b.var.name_hint}"
            spec = self.spec(b.struct_info, what, define=True)
            self.resolve_checks(spec, what)
            self.emit("match", src, what, spec, "both")
            self.var_reg[id(b.var)] = src
        elif isinstance(b, VarBinding):
            self.var_reg[id(b.var)] = self.value(b.value)
        else:
            raise RelaxError(f"relax.build: unknown binding {type(b).__name__}", b)

    def if_(self, e: If) -> int:
        cond = self.value(e.cond)
        saved = self.code
        self.code = []
        then_ret = self.value(e.true_branch)
        then_code, self.code = self.code, []
        else_ret = self.value(e.false_branch)
        else_code = self.code
        self.code = saved
        r = self.new_reg()
        self.emit("if", r, cond, then_code, then_ret, else_code, else_ret)
        return r

    def call(self, e: Call) -> int:
        op = e.op
        if isinstance(op, Op):
            name = op.name
            if name == "relax.call_tir":
                return self.call_tir(e)
            if name == "relax.call_tir_dps":
                return self.call_tir_dps(e)
            if name == "relax.memory.alloc_storage":
                size = e.args[0].values[0]
                r = self.new_reg()
                static = isinstance(size, IntImm)
                self.emit("alloc_storage", r, self.expr(size, "a storage size"), static)
                return r
            if name == "relax.memory.alloc_tensor":
                storage = self.value(e.args[0])
                offset = e.args[1].value if isinstance(e.args[1], PrimValue) else IntImm(0, "int64")
                r = self.new_reg()
                self.emit("alloc_tensor", r, storage, self.expr(offset), self.shape(
                    e.args[2].values, "an allocation"), e.attr_dict["dtype"])
                return r
            if name == "relax.builtin.alloc_tensor":
                r = self.new_reg()
                self.emit("alloc", r, self.shape(e.args[0].values, "an allocation"),
                          e.attr_dict["dtype"])
                return r
            builtin = OP_BUILTINS.get(name)
            if builtin is not None and op.legalize is None:
                return self.builtin(builtin, e)
            if op.legalize is not None:
                raise RelaxError(f"relax.build: function {self.name}: operator {name} reached "
                                 f"code generation unlegalized; the pipeline must run "
                                 f"LegalizeOps", e)
            raise RelaxError(f"relax.build: function {self.name}: operator {name} has no "
                             f"legalization and is not a VM builtin, so it cannot be "
                             f"compiled", e)
        if isinstance(op, ExternFunc):
            if op.global_symbol not in BUILTINS:
                raise RelaxError(f"relax.build: function {self.name}: unknown VM builtin "
                                 f"{op.global_symbol!r}; known: {sorted(BUILTINS)}", e)
            return self.builtin(op.global_symbol, e)
        if isinstance(op, GlobalVar):
            callee = self.mod.functions.get(op.name_hint)
            if isinstance(callee, Function):
                args = [self.value(a) for a in e.args]
                r = self.new_reg()
                self.emit("call_func", r, op.name_hint, args)
                return r
            if isinstance(callee, PrimFunc):
                raise RelaxError(f"relax.build: function {self.name}: call the PrimFunc "
                                 f"{op.name_hint} through relax.call_tir", e)
            raise RelaxError(f"relax.build: function {self.name}: no function "
                             f"{op.name_hint} in the module", e)
        raise RelaxError(f"relax.build: function {self.name}: calls of {type(op).__name__} "
                         f"values (closures) are not supported by the VM", e)

    def builtin(self, name: str, e: Call) -> int:
        args = [self.value(a) for a in e.args]
        attrs = {}
        for k, v in e.attrs:
            attrs[k] = _json_attr(v, name, k)
        r = self.new_reg()
        self.emit("builtin", r, name, args, attrs)
        return r

    def _kernel_args(self, e: Call, gvar: GlobalVar, args: Sequence[Expr], outs_si,
                     tir_vars) -> tuple[list, list]:
        kname = gvar.name_hint
        func = self.mod.functions.get(kname)
        if not isinstance(func, PrimFunc):
            raise RelaxError(f"relax.build: function {self.name}: call_tir of {kname}, which is "
                             f"not a PrimFunc of the module", e)
        buffers = func.buffers
        scalars = func.scalar_params
        if len(buffers) != len(args) + len(outs_si):
            raise RelaxError(f"relax.build: function {self.name}: call_tir of {kname} passes "
                             f"{len(args)} argument(s) and {len(outs_si)} output(s); the PrimFunc "
                             f"has {len(buffers)} buffer parameter(s)", e)
        if len(scalars) != len(tir_vars):
            raise RelaxError(f"relax.build: function {self.name}: call_tir of {kname} passes "
                             f"{len(tir_vars)} tir var(s); the PrimFunc takes {len(scalars)} "
                             f"scalar parameter(s)", e)
        sinfos = [a.struct_info for a in args] + list(outs_si)
        for buf, si in zip(buffers, sinfos):
            if isinstance(si, TensorStructInfo):
                if si.ndim >= 0 and si.ndim != len(buf.shape):
                    raise RelaxError(f"relax.build: function {self.name}: {kname} expects "
                                     f"{buf.name} of rank {len(buf.shape)}, got {si!r}", e)
                if si.dtype != buf.dtype:
                    raise RelaxError(f"relax.build: function {self.name}: {kname} expects "
                                     f"{buf.name} of dtype {buf.dtype}, got {si!r}", e)
        self.prog.kernel(kname)
        return [self.value(a) for a in args], [self.expr(v, "tir_vars") for v in tir_vars]

    def call_tir(self, e: Call) -> int:
        gvar, tup = e.args[0], e.args[1]
        tir_vars = e.args[2].values if len(e.args) > 2 else ()
        out_si = e.sinfo_args[0]
        outs_si = _leaves(out_si)  # a (nested) tuple of outputs: the kernel takes them flat
        arg_regs, scalars = self._kernel_args(e, gvar, tup.fields, outs_si, tir_vars)
        out_regs = []
        for si in outs_si:
            if not isinstance(si, TensorStructInfo) or si.shape is None:
                raise RelaxError(f"relax.build: function {self.name}: call_tir of "
                                 f"{gvar.name_hint} needs outputs of known shape, got {si!r}", e)
            r = self.new_reg()
            self.emit("alloc", r, self.shape(si.shape, f"the output of {gvar.name_hint}"),
                      si.dtype)
            out_regs.append(r)
        self.emit("call_kernel", self.prog.kernel_symbol(gvar.name_hint), arg_regs + out_regs,
                  scalars, len(out_regs))
        return self._nest(out_si, iter(out_regs))

    def _nest(self, sinfo, regs) -> int:
        """The register of a value shaped like ``sinfo`` from the flat output registers."""
        if isinstance(sinfo, TupleStructInfo):
            fields = [self._nest(f, regs) for f in sinfo.fields]
            r = self.new_reg()
            self.emit("tuple", r, fields)
            return r
        return next(regs)

    def call_tir_dps(self, e: Call) -> int:
        gvar, tup, out = e.args[0], e.args[1], e.args[2]
        tir_vars = e.args[3].values if len(e.args) > 3 else ()
        outs = _leaf_exprs(out)
        arg_regs, scalars = self._kernel_args(e, gvar, tup.fields, [o.struct_info for o in outs],
                                              tir_vars)
        out_regs = [self.value(o) for o in outs]
        self.emit("call_kernel", self.prog.kernel_symbol(gvar.name_hint), arg_regs + out_regs,
                  scalars, len(out_regs))
        return self.value(out) if isinstance(out, Tuple) else out_regs[0]


def _leaf_exprs(e) -> list:
    if isinstance(e, Tuple):
        return [x for f in e.fields for x in _leaf_exprs(f)]
    return [e]


def _leaves(sinfo) -> list:
    if isinstance(sinfo, TupleStructInfo):
        return [x for f in sinfo.fields for x in _leaves(f)]
    return [sinfo]


def _is_symbolic_check(a) -> bool:
    return isinstance(a, list) and len(a) > 1 and a[0] == "check" and isinstance(a[1], list)


def _has_checks(spec: dict) -> bool:
    """Whether ``spec`` has checks that depend on symbolic variables (constants are checked
    with the binds)."""
    if any(_is_symbolic_check(a) for a in spec.get("dims", []) or []):
        return True
    if _is_symbolic_check(spec.get("value")):
        return True
    return any(_has_checks(f) for f in spec.get("fields", []))


def _json_attr(v, builtin: str, key: str):
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, IntImm):
        return int(v.value)
    if isinstance(v, FloatImm):
        return float(v.value)
    if isinstance(v, (tuple, list)):
        return [_json_attr(x, builtin, key) for x in v]
    raise RelaxError(f"relax.build: attribute {key}={v!r} of {builtin} cannot be stored in the "
                     f"VM program (plain numbers, strings and lists only)")


_CONST_SAMPLE = 64


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays of one dtype and shape hold the same bytes (NaNs, signed zeros)."""
    a = np.require(a, requirements="C").reshape(-1).view(np.uint8)
    return bool(np.array_equal(a, b.reshape(-1).view(np.uint8)))


class _ProgramCodegen:
    def __init__(self, mod: IRModule, aliases: Mapping[str, str] | None = None):
        self.mod = mod
        self.aliases = dict(aliases or {})
        self.constants: list[np.ndarray] = []
        self._const_index: dict[int, int] = {}
        self._const_by_value: dict[tuple, list[int]] = {}
        self._keep: list = []
        self.kernels: list[str] = []

    def constant(self, c: Constant) -> int:
        """The index of ``c`` in the constant pool (constants of the same dtype, shape and
        bytes are stored once)."""
        data = c.data
        index = self._const_index.get(id(data))
        if index is None:
            data_c = np.require(data, requirements="C")
            # a sample of the elements sorts the constants; equal samples compare all bytes
            # (hashing every weight's bytes was most of the VM code generation)
            flat = data_c.reshape(-1)
            step = max(1, flat.size // _CONST_SAMPLE)
            key = (data.dtype.str, data.shape, flat[::step][:_CONST_SAMPLE].tobytes())
            same = self._const_by_value.setdefault(key, [])
            for j in same:
                if _same_bytes(self.constants[j], data_c):
                    index = j
                    break
            else:
                index = len(self.constants)
                same.append(index)
                self.constants.append(data)
            self._const_index[id(data)] = index
            self._keep.append(data)  # ids stay unique while the pool is being built
        return index

    def kernel(self, name: str):
        name = self.kernel_symbol(name)
        if name not in self.kernels:
            self.kernels.append(name)

    def kernel_symbol(self, name: str) -> str:
        """The kernel the program calls for ``name`` (its representative after
        ``dedupe_kernels``)."""
        return self.aliases.get(name, name)

    def generate(self) -> dict:
        functions = {}
        for name, func in self.mod.functions.items():
            if isinstance(func, Function):
                functions[name] = _FunctionCodegen(name, func, self.mod, self).generate()
        if not functions:
            raise RelaxError("relax.build: the module has no Relax function")
        return {"version": PROGRAM_VERSION, "functions": functions, "kernels": self.kernels}


def vm_codegen(mod: IRModule, aliases: Mapping[str, str] | None = None) -> tuple[dict, list]:
    """The VM program (JSON data) and constants of a legalized, planned module; a kernel
    named in ``aliases`` is called by the name it maps to (see ``dedupe_kernels``)."""
    gen = _ProgramCodegen(mod, aliases)
    program = gen.generate()
    return program, gen.constants


# ---------------------------------------------------------------------------------------------


def build(mod: IRModule, target: "Target | str | dict" = "llvm", *, database=None,
          upper_bounds: Mapping[str, int] | None = None, pipeline=None, strict: bool = False,
          jobs: int | None = None, cache=None, whole_build_cache: bool = False,
          share: bool = True, verbose: bool = False) -> Executable:
    """Compile a Relax module into an ``Executable`` for ``target``.

    Parameters
    ----------
    mod : IRModule
        Relax functions (and the PrimFuncs they call), e.g. from ``BlockBuilder.get()`` or a
        frontend.
    target : Target | str | dict
        ``"llvm"`` (this machine) or any LLVM target (``"raspberry-pi/4b-aarch64"``): a
        cross-compiled executable is exported here and run on its board.
    database : optional
        Tuning records: any object with ``query_schedule(func, target)`` returning a
        ``tensorir.Schedule`` (or scheduled PrimFunc) for a kernel it knows, else None.
        Kernels it does not cover get the default schedules (``relax.default_schedules``).
        A ``metaschedule.Database`` with layout decisions (``relax.tune_layouts``) also
        chooses the convolutions' packed kernels (with the default pipeline).
    upper_bounds : dict[str, int], optional
        Upper bounds of symbolic dims by name (``{"n": 64}``): memory is planned statically at
        them (see ``StaticPlanBlockMemory``).
    pipeline : callable | list | None
        The graph passes, ``IRModule -> IRModule``; None: ``relax.get_pipeline()``.
        ``LegalizeOps`` always runs after it.
    strict : bool
        False (default): a kernel the default schedules cannot schedule is left as it is
        (correct but slow) with a ``DefaultScheduleWarning``. True: that is a ``RelaxError``
        naming the kernel and the cause (for tests and CI, where a slow kernel is a bug).
    jobs : int, optional
        LLVM targets: worker processes that schedule and compile the kernels (default: one per
        core this process may use, or ``$TILECRAFT_JOBS``; 1: all in this process). The
        executable is the same whatever the number.
    cache : None | bool | str | KernelCache
        LLVM targets: the persistent kernel cache (``targets.kernel_cache``). None: the
        default one (in ``$TILECRAFT_CACHE_DIR`` or ``~/.cache/tilecraft/kernels``; off with
        ``TILECRAFT_CACHE=0``); False: no cache; a directory or a ``KernelCache``. It also
        serves the kernels ``FoldConstant`` runs. The cache never changes the executable.
    whole_build_cache : bool
        LLVM targets, default pipeline and schedules (no ``database``, no ``pipeline``):
        look the whole executable up in ``cache`` first, by a hash of the exact input module,
        the target, the machine, tilecraft's code and ``upper_bounds`` / ``strict``, and store
        it there after a build (``relax.build_cache``). A hit skips every phase of the build;
        its kernel module has no ``get_source``. Off by default.
    share : bool
        LLVM targets without a ``database``: compile a family of at least three kernels that
        differ only in one dimension moving in even steps (DenseNet's channel counts) as one
        kernel with that dimension symbolic (``share_shaped_kernels``). False: each kernel at
        its own shapes (and no whole-build cache).
    verbose : bool
        Print where the time went (``exe.build_stats.summary()``).

    Returns
    -------
    Executable
        Run it with ``relax.VirtualMachine(exe, targets.cpu(0))``; ``exe.export_library(path)``
        writes one file; ``exe.build_stats`` holds the build's phase times and kernel counts.

    Examples
    --------
    >>> exe = build(mod, "llvm", upper_bounds={"n": 64})          # doctest: +SKIP
    >>> vm = VirtualMachine(exe, targets.cpu(0))                  # doctest: +SKIP
    >>> y = vm["main"](np.random.rand(7, 64).astype("float32"))   # doctest: +SKIP
    >>> exe = build(mod, "llvm", jobs=4, verbose=True)            # doctest: +SKIP
    build: 3.91 s
      graph passes              1.204 s   30.8 %
      ...
    """
    if not isinstance(mod, IRModule):
        raise TypeError(f"relax.build takes an IRModule, got {type(mod).__name__}")
    with _older_objects_frozen():
        return _build(mod, target, database=database, upper_bounds=upper_bounds,
                      pipeline=pipeline, strict=strict, jobs=jobs, cache=cache,
                      whole_build_cache=whole_build_cache, share=share, verbose=verbose)


@contextlib.contextmanager
def _older_objects_frozen():
    """Leave the objects that exist before the build (the input module, the imported
    packages, the caller's data) out of the cyclic garbage collector's passes while it runs
    (``gc.freeze``), and give them back after (``gc.unfreeze``). A build makes IR nodes by the
    hundred thousand, so the collector runs hundreds of times, and each full pass walked the
    whole heap: a sixth of a warm DenseNet-121 build (0.3 of 2.1 CPU s), 0.07 s of
    ResNet-50's. The build's own objects are collected as before, so its memory is the same.
    Nothing is done where objects are frozen already (the caller's, for its own reasons) or
    the collector is off."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _build(mod: IRModule, target, *, database, upper_bounds, pipeline, strict, jobs, cache,
           whole_build_cache, share, verbose) -> Executable:
    target = target if isinstance(target, Target) else Target(target)
    if target.kind not in ("llvm",) + gpu_schedules.GPU_KINDS:
        raise targets.TargetError(f"relax.build: no VM support for target {target}")
    stats = BuildStats()
    store = kernel_cache.resolve(cache)
    key = None
    if whole_build_cache and share and store is not None and target.kind == "llvm" and \
            database is None and (pipeline is None or pipeline == "default"):
        with stats.phase("whole-build cache"):
            key = build_cache.executable_key(mod, target, upper_bounds, strict)
            found = build_cache.load(store, key, target) if key is not None else None
        if found is not None:
            exe, stats.kernels = found
            stats.distinct = stats.cache_hits = len(exe.kernel_names)
            stats.whole_build_hit, stats.cache_dir = True, store.directory
            exe.build_stats = stats
            if verbose:
                print(stats.summary())
            return exe
    with kernel_cache.use(store if store is not None else False):
        with stats.phase("graph passes"):
            mod = _run_pipeline(mod, _layout_pipeline(pipeline, database, target), target)
            mod = legalize(mod)
    with stats.phase("memory planning"):
        mod = StaticPlanBlockMemory(upper_bounds, target=target)(mod)   # device sizes, limits
    with stats.phase("kernel deduplication"):
        called = _called_kernels(mod)
        aliases = dedupe_kernels(mod, called)
    if share and target.kind == "llvm" and database is None:
        with stats.phase("kernel sharing"):
            mod, aliases = share_shaped_kernels(mod, aliases, target, cache=store)
    with stats.phase("VM code generation"):
        program, constants = vm_codegen(mod, aliases)
    kernels = program["kernels"]
    stats.kernels, stats.distinct = len(called), len(kernels)
    module = None
    if kernels and target.kind == "llvm":
        with stats.phase("database"):
            specs = kernel_specs(mod, target, database, kernels, strict=strict)
        module = targets.build_kernels(specs, target, jobs=jobs, cache=store if store is not
                                       None else False, stats=stats)
    elif kernels:
        with stats.phase("scheduling"):
            scheduled = schedule_kernels(mod, target, database, kernels, strict=strict)
        with stats.phase("kernel compilation"):
            module = targets.build(IRModule(scheduled), target)
        stats.compiled = len(kernels)
    exe = Executable(program, constants, module, str(target))
    exe.build_stats = stats
    if key is not None and (module is None or module.cacheable):
        with stats.phase("whole-build cache"):
            build_cache.save(store, key, exe)
    if verbose:
        print(stats.summary())
    return exe


__all__ = ["build", "vm_codegen", "schedule_kernels", "kernel_specs", "dedupe_kernels",
           "share_shaped_kernels", "same_loop_structure",
           "legalize", "default_pipeline"]
