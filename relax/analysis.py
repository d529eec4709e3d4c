"""Analyses of Relax programs: variables, use-def chains, struct-info relations, the fusion
pattern of a PrimFunc, and the well-formedness checker.

Examples
--------
>>> from tilecraft.relax import BlockBuilder, Var, TensorStructInfo
>>> bb = BlockBuilder()
>>> x = Var("x", TensorStructInfo((4,), "float32"))
>>> with bb.function("main", [x]):
...     _ = bb.emit_func_output(x)
>>> well_formed(bb.get())
True
"""
from __future__ import annotations

from typing import Iterable

from tilecraft.tensorir import arith
from tilecraft.tensorir.expr import (Add, BufferLoad, Cast, IntImm, Mul, Node, PrimExpr, Var as TirVar)
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.functor import post_order_visit, substitute
from tilecraft.tensorir.stmt import Block, BufferStore
from tilecraft.tensorir.structural import structural_equal

from .expr import (Binding, BindingBlock, Call, Constant, DataflowBlock, DataflowVar, Expr,
                   ExternFunc, Function, GlobalVar, If, MatchCast, PrimValue, RelaxError, SeqExpr,
                   ShapeExpr, StringImm, Tuple, TupleGetItem, Var, VarBinding)
from .op.base import Op, OpPattern
from .printer import to_script as _show
from .expr import tir_vars_in  # noqa: F401  (re-exported: part of the analysis API)
from .struct_info import (FuncStructInfo, ObjectStructInfo, PrimStructInfo, ShapeStructInfo,
                          StructInfo, TensorStructInfo, TupleStructInfo)

__all__ = ["free_vars", "bound_vars", "all_vars", "all_global_vars", "tir_vars_in",
           "get_var2val", "udchain", "derive_call_ret_struct_info", "struct_info_base_check",
           "is_base_of", "infer_op_pattern", "well_formed", "check_well_formed", "is_call_tir",
           "is_primitive"]


# ---------------------------------------------------------------------------------------------
# small predicates


def is_call_tir(e) -> bool:
    """``e`` is ``R.call_tir(gv, (args,), ...)``."""
    return isinstance(e, Call) and isinstance(e.op, Op) and e.op.name == "relax.call_tir"


def is_primitive(func) -> bool:
    """A Relax function marked ``Primitive=1`` (made by FuseOps, consumed by FuseTIR)."""
    return isinstance(func, Function) and bool(func.attr_dict.get("Primitive", 0))


# ---------------------------------------------------------------------------------------------
# variables


def _walk(node, on_def, on_use, on_gvar=None):
    """Visit a Relax expression: ``on_def(var)`` where a variable is defined (parameters,
    bindings), ``on_use(var)`` where one is used, in program order."""
    if isinstance(node, (list, tuple)):
        for x in node:
            _walk(x, on_def, on_use, on_gvar)
        return
    if isinstance(node, Var):  # DataflowVar too
        on_use(node)
        return
    if isinstance(node, GlobalVar):
        if on_gvar is not None:
            on_gvar(node)
        return
    if isinstance(node, Function):
        for p in node.params:
            on_def(p)
        _walk(node.body, on_def, on_use, on_gvar)
        return
    if isinstance(node, SeqExpr):
        for blk in node.blocks:
            _walk(blk, on_def, on_use, on_gvar)
        _walk(node.body, on_def, on_use, on_gvar)
        return
    if isinstance(node, BindingBlock):
        for b in node.bindings:
            _walk(b, on_def, on_use, on_gvar)
        return
    if isinstance(node, (VarBinding, MatchCast)):
        _walk(node.value, on_def, on_use, on_gvar)
        on_def(node.var)
        return
    if isinstance(node, Call):
        if isinstance(node.op, (Var, GlobalVar, Function)):
            _walk(node.op, on_def, on_use, on_gvar)
        _walk(node.args, on_def, on_use, on_gvar)
        return
    if isinstance(node, Tuple):
        _walk(node.fields, on_def, on_use, on_gvar)
        return
    if isinstance(node, TupleGetItem):
        _walk(node.tuple_value, on_def, on_use, on_gvar)
        return
    if isinstance(node, If):
        _walk([node.cond, node.true_branch, node.false_branch], on_def, on_use, on_gvar)
        return
    # Constant, ShapeExpr, PrimValue, StringImm, ExternFunc: no Relax variables


def free_vars(expr) -> list[Var]:
    """Relax variables used in ``expr`` that ``expr`` does not define, in first-use order.

    Examples
    --------
    >>> from tilecraft.relax import Var, Tuple
    >>> x = Var("x")
    >>> [v.name_hint for v in free_vars(Tuple([x, x]))]
    ['x']
    """
    defined: set[int] = set()
    out: dict[int, Var] = {}

    def use(v):
        if id(v) not in defined:
            out.setdefault(id(v), v)

    _walk(expr, lambda v: defined.add(id(v)), use)
    return [v for k, v in out.items() if k not in defined]


def bound_vars(expr) -> list[Var]:
    """Relax variables that ``expr`` defines (function parameters and binding variables), in
    definition order."""
    out: dict[int, Var] = {}
    _walk(expr, lambda v: out.setdefault(id(v), v), lambda v: None)
    return list(out.values())


def all_vars(expr) -> list[Var]:
    """Every Relax variable defined or used in ``expr``, in first-appearance order."""
    out: dict[int, Var] = {}
    _walk(expr, lambda v: out.setdefault(id(v), v), lambda v: out.setdefault(id(v), v))
    return list(out.values())


def all_global_vars(expr) -> list[GlobalVar]:
    """GlobalVars referenced in ``expr`` (call_tir targets and called functions), by name."""
    out: dict[str, GlobalVar] = {}
    _walk(expr, lambda v: None, lambda v: None, lambda g: out.setdefault(g.name_hint, g))
    return list(out.values())


def get_var2val(func) -> dict[Var, Expr]:
    """Each binding variable of ``func`` (a Function or SeqExpr, nested ones included) mapped
    to the value it is bound to (a MatchCast's value too).

    Examples
    --------
    >>> # var2val = get_var2val(mod["main"]); var2val[lv] is the Call bound to lv
    """
    out: dict[Var, Expr] = {}

    def visit(n):
        if isinstance(n, Function):
            visit(n.body)
        elif isinstance(n, SeqExpr):
            for blk in n.blocks:
                for b in blk.bindings:
                    out[b.var] = b.value
                    visit(b.value)
            visit(n.body)
        elif isinstance(n, If):
            visit(n.true_branch)
            visit(n.false_branch)

    visit(func)
    return out


def udchain(node) -> dict[Var, list[Var]]:
    """The use-def chain: each variable defined in ``node`` (a DataflowBlock, BindingBlock,
    SeqExpr or Function) mapped to the binding variables whose values use it, in order.

    A use in a function's return value is listed as ``None``.

    Examples
    --------
    >>> # for ``lv = add(x, y); gv = relu(lv)``: udchain(block)[lv] == [gv]
    """
    users: dict[Var, list] = {}

    def note(user, value):
        for v in free_vars(value):
            lst = users.setdefault(v, [])
            if not lst or lst[-1] is not user:
                lst.append(user)

    def visit_bindings(bindings):
        for b in bindings:
            users.setdefault(b.var, [])
            note(b.var, b.value)

    if isinstance(node, BindingBlock):
        visit_bindings(node.bindings)
    elif isinstance(node, (SeqExpr, Function)):
        seq = node.body if isinstance(node, Function) else node
        if isinstance(node, Function):
            for p in node.params:
                users.setdefault(p, [])
        if isinstance(seq, SeqExpr):
            for blk in seq.blocks:
                visit_bindings(blk.bindings)
            note(None, seq.body)
        else:
            note(None, seq)
    else:
        raise RelaxError(f"udchain expects a block, SeqExpr or Function, got "
                         f"{type(node).__name__}", node)
    return users


# ---------------------------------------------------------------------------------------------
# struct info relations


def _dims_relation(a: PrimExpr, b: PrimExpr, ana: arith.Analyzer) -> bool | None:
    """True: provably equal; False: provably different; None: unknown."""
    if a is b or structural_equal(a, b):
        return True
    if ana.can_prove_equal(a, b):
        return True
    try:
        if ana.can_prove(a != b):
            return False
    except Exception:  # noqa: BLE001 - a dim the analyzer cannot reason about: unknown
        return None
    return None


def _and(results: Iterable) -> bool | None:
    out = True
    for r in results:
        if r is False:
            return False
        if r is None:
            out = None
    return out


def struct_info_base_check(base: StructInfo, derived: StructInfo,
                           analyzer: arith.Analyzer | None = None) -> bool | None:
    """Is every value of ``derived`` also a value of ``base`` (``base`` is at least as general)?

    Returns True (provably), False (provably not: a different dtype, rank, constant dim or kind)
    or None (it depends on symbolic dims that cannot be compared).

    Examples
    --------
    >>> from tilecraft.relax import TensorStructInfo, ObjectStructInfo
    >>> struct_info_base_check(TensorStructInfo(ndim=2), TensorStructInfo((4, 5)))
    True
    >>> struct_info_base_check(TensorStructInfo((4, 5)), TensorStructInfo((4, 6)))
    False
    """
    ana = analyzer or arith.Analyzer()
    if isinstance(base, ObjectStructInfo):
        return True
    if isinstance(base, TensorStructInfo):
        if not isinstance(derived, TensorStructInfo):
            return None if isinstance(derived, ObjectStructInfo) else False
        if base.dtype != derived.dtype:
            return False
        if base.ndim >= 0 and derived.ndim >= 0 and base.ndim != derived.ndim:
            return False
        if base.ndim >= 0 and derived.ndim < 0:
            return None
        if base.shape is None:
            return True
        if derived.shape is None:
            return None
        return _and(_dims_relation(a, b, ana) for a, b in zip(base.shape, derived.shape))
    if isinstance(base, ShapeStructInfo):
        if not isinstance(derived, ShapeStructInfo):
            return None if isinstance(derived, ObjectStructInfo) else False
        if base.ndim >= 0 and derived.ndim >= 0 and base.ndim != derived.ndim:
            return False
        if base.values is None:
            return True if base.ndim < 0 or derived.ndim >= 0 else None
        if derived.values is None:
            return None
        return _and(_dims_relation(a, b, ana) for a, b in zip(base.values, derived.values))
    if isinstance(base, TupleStructInfo):
        if not isinstance(derived, TupleStructInfo):
            return None if isinstance(derived, ObjectStructInfo) else False
        if len(base.fields) != len(derived.fields):
            return False
        return _and(struct_info_base_check(a, b, ana) for a, b in zip(base.fields, derived.fields))
    if isinstance(base, PrimStructInfo):
        if not isinstance(derived, PrimStructInfo):
            return None if isinstance(derived, ObjectStructInfo) else False
        if base.dtype != derived.dtype:
            return False
        if base.value is None:
            return True
        if derived.value is None:
            return None
        return _dims_relation(base.value, derived.value, ana) if \
            base.value.dtype == derived.value.dtype else False
    if isinstance(base, FuncStructInfo):
        if not isinstance(derived, FuncStructInfo):
            return None if isinstance(derived, ObjectStructInfo) else False
        if base.params is None:
            return True
        if derived.params is None or len(base.params) != len(derived.params):
            return None if derived.params is None else False
        return _and([struct_info_base_check(derived_p, base_p, ana)  # contravariant params
                     for base_p, derived_p in zip(base.params, derived.params)]
                    + [struct_info_base_check(base.ret, derived.ret, ana)])
    return None


def is_base_of(base: StructInfo, derived: StructInfo) -> bool:
    """``struct_info_base_check(base, derived)`` is provably True."""
    return struct_info_base_check(base, derived) is True


def _compatible(a: StructInfo, b: StructInfo, ana) -> bool:
    """Could a value have both struct infos (neither provably excludes the other)?"""
    return struct_info_base_check(a, b, ana) is not False or \
        struct_info_base_check(b, a, ana) is not False


def _struct_info_equal(a: StructInfo, b: StructInfo, ana) -> bool | None:
    if a == b:
        return True
    return _and([struct_info_base_check(a, b, ana), struct_info_base_check(b, a, ana)])


def derive_call_ret_struct_info(func_sinfo, call: Call,
                                analyzer: arith.Analyzer | None = None) -> StructInfo:
    """The struct info of ``call``'s result.

    For an operator call this is the operator's inference. For a call of a function of struct
    info ``func_sinfo`` (a ``FuncStructInfo`` whose parameters may have symbolic dims), the
    symbolic dims are matched against the arguments' shapes and substituted into the return
    struct info; a return dim that uses a dim no argument determines becomes unknown.

    Examples
    --------
    >>> # f: (Tensor((n, 4))) -> Tensor((n * 2,)); called on a Tensor((8, 4)): Tensor((16,))
    """
    if isinstance(call.op, Op) and func_sinfo is None:
        return call.op.infer_struct_info(call)
    if func_sinfo is None:
        func_sinfo = call.op.struct_info
    if not isinstance(func_sinfo, FuncStructInfo):
        return ObjectStructInfo()
    if func_sinfo.params is None:
        return func_sinfo.ret
    if len(func_sinfo.params) != len(call.args):
        raise RelaxError(f"call of a function of {len(func_sinfo.params)} parameters with "
                         f"{len(call.args)} arguments", call)
    ana = analyzer or arith.Analyzer()
    vmap: dict[TirVar, PrimExpr] = {}
    for p, a in zip(func_sinfo.params, call.args):
        _match_sinfo(p, a.struct_info, vmap)
    unresolved = {id(v) for v in tir_vars_in(func_sinfo.ret)} - {id(v) for v in vmap}
    return _substitute_sinfo(func_sinfo.ret, vmap, unresolved, ana)


def _match_sinfo(param: StructInfo, arg: StructInfo, vmap: dict) -> None:
    """Bind the plain-variable dims of ``param`` to the matching dims of ``arg``."""
    if isinstance(param, TensorStructInfo) and isinstance(arg, TensorStructInfo):
        if param.shape is not None and arg.shape is not None and \
                len(param.shape) == len(arg.shape):
            for d, s in zip(param.shape, arg.shape):
                if isinstance(d, TirVar) and d not in vmap:
                    vmap[d] = s
    elif isinstance(param, ShapeStructInfo) and isinstance(arg, ShapeStructInfo):
        if param.values is not None and arg.values is not None and \
                len(param.values) == len(arg.values):
            for d, s in zip(param.values, arg.values):
                if isinstance(d, TirVar) and d not in vmap:
                    vmap[d] = s
    elif isinstance(param, PrimStructInfo) and isinstance(arg, PrimStructInfo):
        if isinstance(param.value, TirVar) and arg.value is not None and param.value not in vmap:
            vmap[param.value] = arg.value
    elif isinstance(param, TupleStructInfo) and isinstance(arg, TupleStructInfo):
        for p, a in zip(param.fields, arg.fields):
            _match_sinfo(p, a, vmap)


def _substitute_sinfo(si: StructInfo, vmap, unresolved: set, ana) -> StructInfo:
    def dims(values):
        out = []
        for d in values:
            if any(id(v) in unresolved for v in tir_vars_in([d])):
                return None
            out.append(ana.simplify(substitute(d, vmap)) if vmap else d)
        return out

    if isinstance(si, TensorStructInfo):
        if si.shape is None:
            return si
        new = dims(si.shape)
        return TensorStructInfo(new, si.dtype, si.ndim) if new is not None else \
            TensorStructInfo(None, si.dtype, si.ndim)
    if isinstance(si, ShapeStructInfo):
        if si.values is None:
            return si
        new = dims(si.values)
        return ShapeStructInfo(new) if new is not None else ShapeStructInfo(None, si.ndim)
    if isinstance(si, TupleStructInfo):
        return TupleStructInfo([_substitute_sinfo(f, vmap, unresolved, ana) for f in si.fields])
    if isinstance(si, PrimStructInfo) and si.value is not None:
        new = dims([si.value])
        return PrimStructInfo(si.dtype, new[0] if new is not None else None)
    return si


# ---------------------------------------------------------------------------------------------
# the fusion pattern of a PrimFunc (TVM's AnnotateTIROpPattern analysis)


def infer_op_pattern(func: PrimFunc) -> int:
    """The fusion pattern kind (``relax.op.OpPattern``) of a PrimFunc, from its blocks.

    A spatial block whose loads index the inputs exactly as it stores its output is ELEMWISE;
    loads at a subsequence of the store's indices make it BROADCAST; other index maps INJECTIVE.
    A reduction block is OUT_EWISE_FUSABLE when it accumulates a product (matmul, conv), else
    COMM_REDUCE. Several blocks take the highest kind; a block this analysis cannot read (no
    single store, no blocks) is OPAQUE.

    Examples
    --------
    >>> from tilecraft.tensorir import te
    >>> A = te.placeholder((4, 8), "float32", "A")
    >>> B = te.compute((4, 8), lambda i, j: A[i, j] * 2.0, "B")
    >>> infer_op_pattern(te.create_prim_func([A, B]))
    0
    """
    blocks: list[Block] = []
    post_order_visit(func.body, lambda n: blocks.append(n) if isinstance(n, Block) else None)
    blocks = [b for b in blocks if b.iter_vars or b.name != "root"]
    if not blocks:
        return OpPattern.OPAQUE
    kind = OpPattern.ELEMWISE
    for blk in blocks:
        kind = max(kind, _block_pattern(blk))
        if kind == OpPattern.OPAQUE:
            break
    return kind


def _block_pattern(blk: Block) -> int:
    stores: list[BufferStore] = []
    post_order_visit(blk.body, lambda n: stores.append(n) if isinstance(n, BufferStore) else None)
    if len(stores) != 1 or any(isinstance(n, Block) for n in _nodes(blk.body)):
        return OpPattern.OPAQUE
    store = stores[0]
    loads: list[BufferLoad] = []
    post_order_visit(store.value, lambda n: loads.append(n) if isinstance(n, BufferLoad) else None)
    has_reduce = any(iv.kind == "reduce" for iv in blk.iter_vars)
    if has_reduce:
        if blk.init is None:
            return OpPattern.OPAQUE
        return OpPattern.OUT_EWISE_FUSABLE if _is_fma(store) else OpPattern.COMM_REDUCE
    kind = OpPattern.ELEMWISE
    sidx = list(store.indices)
    for ld in loads:
        if ld.buffer is store.buffer:
            return OpPattern.OPAQUE
        if len(ld.indices) == len(sidx) and all(structural_equal(a, b)
                                                for a, b in zip(ld.indices, sidx)):
            continue
        if _is_subsequence(ld.indices, sidx):
            kind = max(kind, OpPattern.BROADCAST)
        else:
            kind = max(kind, OpPattern.INJECTIVE)
    return kind


def _nodes(stmt):
    out = []
    post_order_visit(stmt, out.append)
    return out


def _is_subsequence(sub, full) -> bool:
    """Each index of ``sub`` is a later index of ``full`` than the previous one, or a constant."""
    pos = 0
    for idx in sub:
        if isinstance(idx, IntImm):
            continue
        while pos < len(full) and not structural_equal(full[pos], idx):
            pos += 1
        if pos == len(full):
            return False
        pos += 1
    return True


def _is_fma(store: BufferStore) -> bool:
    """``C[i] = C[i] + a * b`` (casts allowed around the operands)."""
    v = store.value
    if not isinstance(v, Add):
        return False
    for acc, prod in ((v.a, v.b), (v.b, v.a)):
        while isinstance(prod, Cast):
            prod = prod.value
        if isinstance(acc, BufferLoad) and acc.buffer is store.buffer and isinstance(prod, Mul):
            loads = []
            post_order_visit(prod, lambda n: loads.append(n) if isinstance(n, BufferLoad) else None)
            return len(loads) >= 2
    return False


# ---------------------------------------------------------------------------------------------
# well-formedness


def well_formed(mod_or_func) -> bool:
    """True if ``check_well_formed`` finds nothing wrong.

    Examples
    --------
    >>> from tilecraft.relax import Var, Function, SeqExpr
    >>> x = Var("x")
    >>> well_formed(Function([], SeqExpr([], x)))  # x is not defined
    False
    """
    try:
        check_well_formed(mod_or_func)
    except RelaxError:
        return False
    return True


def check_well_formed(mod_or_func) -> None:
    """Check a module (or one Relax function) and raise ``RelaxError`` naming the function and
    the variable or callee at the first problem.

    Checks: every variable is defined before it is used and defined once in the module;
    DataflowVars are bound only in dataflow blocks and not used after their block; parameters
    are not DataflowVars; GlobalVars name functions of the module and ``call_tir`` targets are
    PrimFuncs taking as many buffers (inputs + outputs) and scalars as the call passes; each
    binding's struct info agrees with its value's, and each operator call's struct info with
    what the operator infers again from its arguments; ``match_cast`` only narrows (its target
    does not contradict the value's struct info); symbolic dims used in shape values are defined
    by a parameter or an earlier ``match_cast``; a function's body agrees with its declared
    return struct info.

    Examples
    --------
    >>> # check_well_formed(mod) raises e.g. RelaxError("function main: variable lv is used
    >>> # before it is defined")
    """
    if isinstance(mod_or_func, IRModule):
        checker = _WellFormed(mod_or_func)
        for name, f in mod_or_func.functions.items():
            if isinstance(f, Function):
                checker.function(name, f)
            elif not isinstance(f, PrimFunc):
                raise RelaxError(f"module function {name} is a {type(f).__name__}, neither a "
                                 f"Relax function nor a PrimFunc", f)
    elif isinstance(mod_or_func, Function):
        name = mod_or_func.attr_dict.get("global_symbol", "<function>")
        _WellFormed(None).function(name, mod_or_func)
    else:
        raise RelaxError(f"check_well_formed expects an IRModule or a relax Function, got "
                         f"{type(mod_or_func).__name__}", mod_or_func)


class _WellFormed:
    def __init__(self, mod: IRModule | None):
        self.mod = mod
        self.defined_once: dict[int, str] = {}   # id(var) -> function where it is defined
        self.func_name = ""
        self.ana = arith.Analyzer()
        self._keep: list = []                    # keep vars alive so their ids stay unique
        self.finished_dataflow: set[int] = set()  # DataflowVars of blocks already closed

    def fail(self, msg: str, node=None):
        raise RelaxError(f"function {self.func_name}: {msg}", node)

    # -- definitions ----------------------------------------------------------------------------
    def define(self, var, scope: set, where: str):
        if not isinstance(var, Var):
            self.fail(f"{where} binds {var!r}, which is not a relax.Var", var)
        prev = self.defined_once.get(id(var))
        if prev is not None:
            self.fail(f"variable {var.name_hint} is defined twice (again as {where}"
                      + (f"; first in function {prev}" if prev != self.func_name else "") + ")",
                      var)
        self.defined_once[id(var)] = self.func_name
        self._keep.append(var)
        scope.add(id(var))

    def function(self, name: str, f: Function, outer_scope: set | None = None,
                 outer_tir: set | None = None):
        saved_name = self.func_name
        self.func_name = name
        scope = set(outer_scope or ())
        tir_defined = set(outer_tir or ())
        for p in f.params:
            if isinstance(p, DataflowVar):
                self.fail(f"parameter {p.name_hint} is a DataflowVar; parameters are Vars", p)
            self.define(p, scope, f"a parameter")
            tir_defined |= {id(v) for v in tir_vars_in(p.struct_info)}
        self.seq(f.body, scope, tir_defined, func_body=True)
        if f.ret_struct_info is not None and \
                struct_info_base_check(f.ret_struct_info, f.body.struct_info, self.ana) is False:
            self.fail(f"the body's struct info {_show(f.body.struct_info)} contradicts the "
                      f"declared return struct info {_show(f.ret_struct_info)}", f)
        self.func_name = saved_name

    def seq(self, seq, scope: set, tir_defined: set, func_body: bool = False):
        if not isinstance(seq, SeqExpr):
            self.expr(seq, scope, tir_defined, in_dataflow=False)
            return
        local = set(scope)
        for blk in seq.blocks:
            is_df = isinstance(blk, DataflowBlock)
            block_dataflow: set[int] = set()
            for b in blk.bindings:
                self.binding(b, local, tir_defined, is_df)
                if isinstance(b.var, DataflowVar):
                    block_dataflow.add(id(b.var))
            # the block's DataflowVars are not visible after it
            local -= block_dataflow
            self.finished_dataflow |= block_dataflow
        self.expr(seq.body, local, tir_defined, in_dataflow=False)

    def binding(self, b: Binding, scope: set, tir_defined: set, in_dataflow: bool):
        var = b.var
        vname = getattr(var, "name_hint", repr(var))
        if isinstance(var, DataflowVar) and not in_dataflow:
            self.fail(f"the DataflowVar {vname} is bound outside a dataflow block", var)
        if isinstance(b, VarBinding):
            if isinstance(b.value, Function):
                # a local function may call itself through its variable
                self.define(var, scope, f"the binding of {vname}")
                self.function(f"{self.func_name}.{vname}", b.value, scope, tir_defined)
                return
            self.expr(b.value, scope, tir_defined, in_dataflow)
            rel = struct_info_base_check(var.struct_info, b.value.struct_info, self.ana)
            if rel is False:
                self.fail(f"variable {vname} is annotated {_show(var.struct_info)} but its value "
                          f"is {_show(b.value.struct_info)}", var)
        elif isinstance(b, MatchCast):
            self.expr(b.value, scope, tir_defined, in_dataflow)
            if not _compatible(b.value.struct_info, b.struct_info, self.ana):
                self.fail(f"match_cast of {vname} can never succeed: it casts a value of "
                          f"{_show(b.value.struct_info)} to {_show(b.struct_info)}", b)
            if struct_info_base_check(var.struct_info, b.struct_info, self.ana) is False:
                self.fail(f"variable {vname} of match_cast is annotated "
                          f"{_show(var.struct_info)} but the cast is to {_show(b.struct_info)}",
                          var)
            tir_defined |= {id(v) for v in tir_vars_in(b.struct_info)}
        else:
            self.fail(f"unknown binding {type(b).__name__}", b)
        self.define(var, scope, f"the binding of {vname}")

    # -- uses -----------------------------------------------------------------------------------
    def expr(self, e, scope: set, tir_defined: set, in_dataflow: bool):
        if isinstance(e, Var):
            if id(e) not in scope:
                if isinstance(e, DataflowVar) and id(e) in self.finished_dataflow:
                    self.fail(f"the dataflow variable {e.name_hint} is used outside its "
                              f"dataflow block", e)
                if id(e) in self.defined_once:
                    self.fail(f"variable {e.name_hint} is used where it is not visible (it is "
                              f"defined in another scope)", e)
                self.fail(f"variable {e.name_hint} is used before it is defined", e)
            return
        if isinstance(e, GlobalVar):
            if self.mod is not None and e.name_hint not in self.mod.functions:
                self.fail(f"it refers to the function {e.name_hint}, which is not in the module",
                          e)
            return
        if isinstance(e, Call):
            self.call(e, scope, tir_defined, in_dataflow)
            return
        if isinstance(e, Tuple):
            for f in e.fields:
                self.expr(f, scope, tir_defined, in_dataflow)
            return
        if isinstance(e, TupleGetItem):
            self.expr(e.tuple_value, scope, tir_defined, in_dataflow)
            return
        if isinstance(e, If):
            self.expr(e.cond, scope, tir_defined, in_dataflow)
            for br in (e.true_branch, e.false_branch):
                self.seq(br, scope, set(tir_defined))
            return
        if isinstance(e, SeqExpr):
            self.seq(e, scope, tir_defined)
            return
        if isinstance(e, Function):
            self.function(f"{self.func_name}.<lambda>", e, scope, tir_defined)
            return
        if isinstance(e, (ShapeExpr, PrimValue)):
            values = e.values if isinstance(e, ShapeExpr) else [e.value]
            self.tir_defined_check(values, tir_defined, e)
            return
        if isinstance(e, (Constant, StringImm, ExternFunc)):
            return
        self.fail(f"unexpected {type(e).__name__} in a Relax expression", e)

    def tir_defined_check(self, values, tir_defined: set, node):
        for v in tir_vars_in(list(values)):
            if id(v) not in tir_defined:
                self.fail(f"the symbolic variable {v.name} is used in {_show(node)} but no "
                          f"parameter or match_cast defines it", node)

    def call(self, c: Call, scope: set, tir_defined: set, in_dataflow: bool):
        if isinstance(c.op, (Var, GlobalVar, Function)):
            self.expr(c.op, scope, tir_defined, in_dataflow)
        elif not isinstance(c.op, (Op, ExternFunc)):
            self.fail(f"a call of {c.op!r}, which is not an operator, function or variable", c)
        is_tir = isinstance(c.op, Op) and c.op.name == "relax.call_tir"
        if is_tir:
            self.call_tir(c, tir_defined)   # names a missing callee as call_tir's
        for a in c.args[1:] if is_tir else c.args:
            self.expr(a, scope, tir_defined, in_dataflow)
        if isinstance(c.op, Op):
            try:
                inferred = c.op.infer_struct_info(c)
            except RelaxError as err:
                self.fail(f"{c.op.name}: {err}", c)
            if _struct_info_equal(inferred, c.struct_info, self.ana) is False:
                self.fail(f"the call {_show(c)} has struct info {_show(c.struct_info)} but "
                          f"{c.op.name} infers {_show(inferred)} from its arguments", c)
        elif isinstance(c.op, GlobalVar) and self.mod is not None:
            callee = self.mod.functions.get(c.op.name_hint)
            if isinstance(callee, PrimFunc):
                self.fail(f"the PrimFunc {c.op.name_hint} is called directly; call it with "
                          f"R.call_tir", c)
            if isinstance(callee, Function) and len(callee.params) != len(c.args):
                self.fail(f"{c.op.name_hint} takes {len(callee.params)} arguments but is called "
                          f"with {len(c.args)}", c)

    def call_tir(self, c: Call, tir_defined: set):
        if len(c.args) not in (2, 3) or not isinstance(c.args[0], GlobalVar) or \
                not isinstance(c.args[1], Tuple):
            self.fail("call_tir takes (GlobalVar, Tuple of arguments[, ShapeExpr of tir vars])", c)
        gv = c.args[0]
        if self.mod is None:
            return
        callee = self.mod.functions.get(gv.name_hint)
        if callee is None:
            self.fail(f"call_tir calls {gv.name_hint}, which is not in the module", c)
        if not isinstance(callee, PrimFunc):
            self.fail(f"call_tir calls {gv.name_hint}, which is a {type(callee).__name__}, not a "
                      f"PrimFunc", c)
        out = c.sinfo_args[0] if c.sinfo_args else None
        outs = list(out.fields) if isinstance(out, TupleStructInfo) else [out]
        args = list(c.args[1].fields)
        bufs = callee.buffers
        if len(bufs) != len(args) + len(outs):
            self.fail(f"call_tir of {gv.name_hint} passes {len(args)} arguments and "
                      f"{len(outs)} outputs, but the PrimFunc takes {len(bufs)} buffers", c)
        n_tir = len(c.args[2].values) if len(c.args) == 3 else 0
        if n_tir != len(callee.scalar_params):
            self.fail(f"call_tir of {gv.name_hint} passes {n_tir} tir_vars but the PrimFunc takes "
                      f"{len(callee.scalar_params)} scalar parameters", c)
        for i, (buf, si) in enumerate(zip(bufs, [a.struct_info for a in args] + outs)):
            if not isinstance(si, TensorStructInfo):
                kind, k = ("argument", i) if i < len(args) else ("output", i - len(args))
                self.fail(f"call_tir of {gv.name_hint}: {kind} {k} is {_show(si)}, not a tensor", c)
            if si.dtype != buf.dtype or (si.ndim >= 0 and si.ndim != len(buf.shape)):
                self.fail(f"call_tir of {gv.name_hint}: buffer {buf.name} is "
                          f"{len(buf.shape)}-d {buf.dtype} but gets {_show(si)}", c)
        for o in outs:
            if isinstance(o, TensorStructInfo) and o.shape is not None:
                self.tir_defined_check(o.shape, tir_defined, c)
