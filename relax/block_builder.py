"""``BlockBuilder``: build Relax functions in A-normal form, as in TVM.

Examples
--------
>>> import numpy as np
>>> from tilecraft.relax import BlockBuilder, Var, TensorStructInfo, const, op
>>> bb = BlockBuilder()
>>> x = Var("x", TensorStructInfo(("n", 4), "float32"))
>>> with bb.function("main", [x]):
...     with bb.dataflow():
...         y = bb.emit(op.add(x, const(np.ones(4, "float32"))))
...         gv = bb.emit_output(y)
...     bb.emit_func_output(gv)
>>> mod = bb.get()
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import re
import types
from typing import Any, Callable, Sequence

from tilecraft.tensorir import te
from tilecraft.tensorir.expr import FloatImm, IntImm, Var as TirVar
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.stmt import Block, Stmt
from tilecraft.tensorir.functor import children, post_order_visit, visit_stmts
from tilecraft.tensorir.structural import structural_equal, structural_hash
from tilecraft.errors import TilecraftError

from .expr import (BindingBlock, Call, DataflowBlock, DataflowVar, Expr, Function, GlobalVar,
                   MatchCast, Op, RelaxError, SeqExpr, ShapeExpr, Tuple, Var, VarBinding)
from .struct_info import (StructInfo, TensorStructInfo, TupleStructInfo, shape_of_sinfo)


def call_tir(gvar: GlobalVar, args: Sequence[Expr] | Expr, out_sinfo, tir_vars=None) -> Call:
    """Call the PrimFunc ``gvar`` on ``args``; the VM allocates outputs of ``out_sinfo``
    (a TensorStructInfo, or a list of them for several outputs) and passes them last.

    ``tir_vars``: values of symbolic variables the PrimFunc takes as scalar parameters.
    """
    if isinstance(out_sinfo, (list, tuple)):
        out_sinfo = out_sinfo[0] if len(out_sinfo) == 1 else TupleStructInfo(out_sinfo)
    if not isinstance(args, Tuple):
        args = Tuple(list(args) if isinstance(args, (list, tuple)) else [args])
    call_args = [gvar, args]
    if tir_vars:
        call_args.append(ShapeExpr(tir_vars))
    return Call(Op.get("relax.call_tir"), call_args, sinfo_args=[out_sinfo])


def _without_symbol(func: PrimFunc) -> PrimFunc:
    attrs = func.attr_dict
    attrs.pop("global_symbol", None)
    return func.replace(attrs=attrs)


def _sanitize(name: str) -> str:
    name = re.sub(r"[^0-9A-Za-z_]", "_", name) or "v"
    return name if not name[0].isdigit() else "v" + name


def _shape_key(func: PrimFunc) -> tuple:
    """What structurally equal PrimFuncs share and is cheap to see: their parameters' dtypes
    and their buffers' dtypes and constant dims (a symbolic dim as its dtype only)."""
    bufs = dict(func.buffer_map)
    out = []
    for p in func.params:
        b = bufs.get(p)
        if b is None:
            out.append(p.dtype)
        else:
            out.append((b.dtype, tuple(d.value if isinstance(d, IntImm) else d.dtype
                                       for d in b.shape)))
    return tuple(out)


class PrimFuncIndex:
    """PrimFuncs by structure, to find one structurally equal to another (``global_symbol``
    left out). PrimFuncs are grouped by their parameters' shapes and dtypes; a lookup in a
    group of at most ``COMPARE_DIRECTLY`` compares with each member (a comparison stops at the
    first difference, and one of equal kernels costs what hashing one does), a larger group
    is structurally hashed, each member at most once. Most kernels of a network differ in
    their shapes, and a network's repeated blocks make small groups of equal kernels: hashing
    every kernel every pass was a fifth of a warm ResNet-50 build, hashing each kernel of a
    group a tenth.

    Examples
    --------
    >>> index = PrimFuncIndex()                      # doctest: +SKIP
    >>> index.add("add", add_func)                   # doctest: +SKIP
    >>> index.find(add_func_copy)                    # doctest: +SKIP
    'add'
    """

    COMPARE_DIRECTLY = 4

    def __init__(self):
        # shape key -> [[name, PrimFunc, the same without global_symbol or None, its hash or
        # None]], in order
        self._by_shape: dict[tuple, list[list]] = {}

    def add(self, name: str, func: PrimFunc) -> None:
        """Index ``func`` under ``name`` (after the ones added before)."""
        self._by_shape.setdefault(_shape_key(func), []).append([name, func, None, None])

    def find(self, func: PrimFunc) -> str | None:
        """The name of the first PrimFunc added that is structurally equal to ``func``."""
        entries = self._by_shape.get(_shape_key(func))
        if not entries:
            return None
        key = _without_symbol(func)
        if len(entries) <= self.COMPARE_DIRECTLY:
            for entry in entries:
                if entry[2] is None:
                    entry[2] = _without_symbol(entry[1])
                if structural_equal(entry[2], key):
                    return entry[0]
            return None
        h = structural_hash(key)
        for entry in entries:
            if entry[2] is None:
                entry[2] = _without_symbol(entry[1])
            if entry[3] is None:
                entry[3] = structural_hash(entry[2])
            if entry[3] == h and structural_equal(entry[2], key):
                return entry[0]
        return None

    def remove(self, name: str) -> None:
        for key, entries in list(self._by_shape.items()):
            self._by_shape[key] = [e for e in entries if e[0] != name]


class _Unkeyable(TilecraftError):
    """An argument of ``call_te`` that ``_call_te_key`` cannot stand for by value."""


def _value_key(x, names: list[str] | None):
    """``x`` as a hashable value that is equal only for arguments a te function cannot tell
    apart but by their tensors' names: a tensor by its static shape and dtype (its placeholder's
    name, made unique as ``call_te`` does, goes to ``names``; ``names`` None: no tensor may
    appear, as in what a closure holds), plain values by type and value, lists, tuples and
    dicts item by item, frozen-or-not dataclasses field by field, functions by ``_func_key``.
    Raise ``_Unkeyable`` for anything else."""
    if isinstance(x, Expr):
        if names is None:
            raise _Unkeyable(x)
        si = x.struct_info
        shape = si.static_shape() if isinstance(si, TensorStructInfo) else None
        if shape is None:
            raise _Unkeyable(x)
        name = _sanitize(getattr(x, "name_hint", "") or f"p{len(names)}")
        names.append(_unique_name(name, names))
        return ("tensor", shape, si.dtype)
    if x is None or isinstance(x, (bool, int, str)):
        return (type(x).__name__, x)
    if isinstance(x, float):
        return ("float", x.hex())      # -0.0 and 0.0 differ, a NaN equals itself
    if isinstance(x, (tuple, list)):
        return (type(x).__name__,) + tuple(_value_key(v, names) for v in x)
    if isinstance(x, dict):
        return ("dict",) + tuple((_value_key(k, names), _value_key(v, names))
                                 for k, v in x.items())
    if isinstance(x, types.FunctionType):
        return _func_key(x)
    if isinstance(x, (IntImm, FloatImm)):
        return (type(x).__name__, x.dtype, _value_key(x.value, names))
    if isinstance(x, enum.Enum):
        return (type(x), x.value)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x),) + tuple(_value_key(getattr(x, f.name), names)
                                  for f in dataclasses.fields(x))
    raise _Unkeyable(x)


def _func_key(f: types.FunctionType):
    """A function by what it computes with: itself where it holds nothing of its own, else
    (a closure a legalization makes per call: ``lambda *i: a[perm]``) its code and the values
    of its closure's cells and its defaults, which may not hold Relax expressions."""
    if not f.__closure__ and not f.__defaults__ and not f.__kwdefaults__:
        return f
    try:
        cells = tuple(c.cell_contents for c in f.__closure__ or ())
    except ValueError:          # a cell not yet filled
        raise _Unkeyable(f) from None
    return ("closure", f.__code__, _value_key(cells, None), _value_key(f.__defaults__, None),
            _value_key(f.__kwdefaults__, None))


def _unique_name(name: str, taken) -> str:
    """``name``, or ``name_k`` with the least k not in ``taken`` (placeholder names)."""
    if name not in taken:
        return name
    k = 1
    while f"{name}_{k}" in taken:
        k += 1
    return f"{name}_{k}"


def _call_te_key(te_func, args, kwargs) -> tuple[tuple, list[str]] | None:
    """What ``call_te(te_func, *args, **kwargs)``'s kernel is made from, but the tensors'
    names, and those names (its placeholders'); None where an argument is not a plain value
    (a symbolic shape, a PrimExpr, an object of its own)."""
    names: list[str] = []
    try:
        func = _func_key(te_func) if isinstance(te_func, types.FunctionType) else te_func
        key = (func, tuple(_value_key(a, names) for a in args),
               tuple((k, _value_key(v, names)) for k, v in kwargs.items()))
        hash(key)           # a bound method of an unhashable object, an unhashable enum value
    except (_Unkeyable, TypeError):
        return None
    return key, names


def _inner_names(func: PrimFunc, n_inputs: int) -> frozenset[str]:
    """The names in ``func`` that a te function may have made from its inputs' names: its
    blocks', its intermediate and output buffers' (``helpers.out_name`` names an output
    ``T_add_1`` when an input is named ``T_add``)."""
    found = set()
    bufs = dict(func.buffer_map)
    for p in func.params[n_inputs:]:
        if p in bufs:
            found.add(bufs[p].name)

    for block in _blocks(func.body):
        found.add(block.name)
        found.update(b.name for b in block.alloc_buffers)
    return frozenset(found)


def _blocks(stmt: Stmt) -> list[Block]:
    """The blocks in ``stmt``, through statements only (a block is never inside an
    expression): walking every expression was most of ``_inner_names``."""
    out: list[Block] = []
    visit_stmts(stmt, lambda s: out.append(s) if isinstance(s, Block) else None)
    return out


def _names_clash(names: Sequence[str], inner: frozenset[str]) -> bool:
    """Whether a placeholder name is (or is the stem ``x`` of ``x_3`` of) an inner name: then
    the kernel may depend on the name, and is not reused by shapes alone."""
    for name in names:
        if name in inner:
            return True
        stem = name + "_"
        if any(s.startswith(stem) and s[len(stem):].isdigit() for s in inner):
            return True
    return False


@dataclasses.dataclass(frozen=True)
class _TeKernel:
    """A kernel ``call_te`` made: its name in the module, its outputs' struct info, the names
    it may have made from its inputs' (``_inner_names``)."""
    name: str
    out_sinfo: list
    inner: frozenset


def _tensor_args(args, kwargs) -> list:
    """The Relax tensors among ``call_te``'s arguments, in the order it makes placeholders."""
    found: list = []

    def walk(a):
        if isinstance(a, Expr):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                walk(x)
    for a in args:
        walk(a)
    for v in kwargs.values():
        walk(v)
    return found


class _FunctionScope:
    def __init__(self, name, params, attrs):
        self.name, self.params, self.attrs = name, list(params), dict(attrs or {})
        self.blocks: list[BindingBlock] = []
        self.bindings: list = []          # of the block being built
        self.in_dataflow = False
        self.done = False


class _Branch:
    """The bindings of a branch (``BlockBuilder.branch``), set when its scope ends."""

    def __init__(self):
        self.bindings: list = []


class BlockBuilder:
    """Builds an IRModule of Relax functions and the PrimFuncs they call."""

    def __init__(self, mod: IRModule | None = None):
        self._funcs: dict[str, Any] = dict(mod.functions) if mod is not None else {}
        # the PrimFuncs, to reuse an identical one (global_symbol left out)
        self._prims = PrimFuncIndex()
        for name, f in self._funcs.items():
            if isinstance(f, PrimFunc):
                self._prims.add(name, f)
        # call_te's kernels by what made them, but the tensors' names (``_call_te_key``)
        self._te_kernels: dict[tuple, _TeKernel] = {}
        self._scope: _FunctionScope | None = None
        self._bound: dict[int, Expr] = {}   # id(var) -> value it was bound to
        self._names: dict[str, int] = {}

    # -- names -------------------------------------------------------------------------------------
    def _fresh(self, hint: str) -> str:
        hint = _sanitize(hint)
        n = self._names.get(hint, 0)
        self._names[hint] = n + 1
        return hint if n == 0 else f"{hint}{n}"

    def _fresh_global(self, hint: str) -> str:
        hint = _sanitize(hint)
        if hint not in self._funcs:
            return hint
        k = 1
        while f"{hint}{k}" in self._funcs:
            k += 1
        return f"{hint}{k}"

    # -- functions -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def function(self, name: str, params: Sequence[Var] | None = None, attrs: dict | None = None):
        """Build the function ``name``; finish with ``emit_func_output``."""
        if self._scope is not None:
            raise RelaxError("BlockBuilder: functions cannot be nested")
        for p in params or []:
            if not isinstance(p, Var):
                raise RelaxError(f"function {name}: parameter {p!r} is not a relax.Var")
        self._scope = _FunctionScope(name, params or [], attrs)
        try:
            yield self
            if not self._scope.done:
                raise RelaxError(f"function {name}: emit_func_output was not called")
        finally:
            self._scope = None

    @contextlib.contextmanager
    def dataflow(self):
        """A dataflow block: bindings are pure; only ``emit_output`` values leave it."""
        s = self._require_scope("dataflow")
        if s.in_dataflow:
            raise RelaxError("BlockBuilder: dataflow blocks cannot be nested")
        self._flush_block()
        s.in_dataflow = True
        try:
            yield self
        finally:
            s.blocks.append(DataflowBlock(s.bindings))
            s.bindings = []
            s.in_dataflow = False

    @contextlib.contextmanager
    def branch(self):
        """Collect the bindings emitted inside into a block of their own (plain ``Var``s), for
        a branch of an ``If``: ``with bb.branch() as br: out = bb.emit(...)``, then
        ``SeqExpr([BindingBlock(br.bindings)], out)``. The function's current block (dataflow
        or not) goes on after it.

        Examples
        --------
        >>> with bb.branch() as br:                                       # doctest: +SKIP
        ...     y = bb.emit(op.add(x, x))
        >>> then = SeqExpr([BindingBlock(br.bindings)], y)                # doctest: +SKIP
        """
        s = self._require_scope("branch")
        saved = (s.bindings, s.in_dataflow)
        s.bindings, s.in_dataflow = [], False
        br = _Branch()
        try:
            yield br
        finally:
            br.bindings = s.bindings
            s.bindings, s.in_dataflow = saved

    def _require_scope(self, what: str) -> _FunctionScope:
        if self._scope is None:
            raise RelaxError(f"BlockBuilder.{what} must be used inside `with bb.function(...)`")
        return self._scope

    def _flush_block(self):
        s = self._scope
        if s.bindings:
            s.blocks.append(BindingBlock(s.bindings))
            s.bindings = []

    # -- bindings --------------------------------------------------------------------------------------
    def emit(self, expr: Expr, name_hint: str = "lv") -> Var:
        """Bind ``expr`` to a new variable (a DataflowVar inside a dataflow block)."""
        s = self._require_scope("emit")
        expr = self.normalize(expr)
        cls = DataflowVar if s.in_dataflow else Var
        var = cls(self._fresh(name_hint), expr.struct_info)
        s.bindings.append(VarBinding(var, expr))
        self._bound[id(var)] = expr
        return var

    def match_cast(self, value: Expr, struct_info: StructInfo, name_hint: str = "lv") -> Var:
        """Bind ``value`` with the (more precise) ``struct_info``, checked at run time."""
        s = self._require_scope("match_cast")
        value = self.normalize(value)
        cls = DataflowVar if s.in_dataflow else Var
        var = cls(self._fresh(name_hint), struct_info)
        s.bindings.append(MatchCast(var, value, struct_info))
        return var

    def emit_output(self, output, name_hint: str = "gv") -> Var:
        """Inside a dataflow block: bind a value that is visible after the block."""
        s = self._require_scope("emit_output")
        if not s.in_dataflow:
            raise RelaxError("emit_output is only for dataflow blocks; use emit outside them")
        if isinstance(output, (list, tuple)):
            output = Tuple(output)
        output = self.normalize(output)
        var = Var(self._fresh(name_hint), output.struct_info)
        s.bindings.append(VarBinding(var, output))
        self._bound[id(var)] = output
        return var

    def emit_func_output(self, output, params: Sequence[Var] | None = None) -> GlobalVar:
        """Finish the function: its result is ``output`` (an Expr or a list, made a Tuple)."""
        s = self._require_scope("emit_func_output")
        if s.in_dataflow:
            raise RelaxError("emit_func_output must come after the dataflow block")
        if s.done:
            raise RelaxError(f"function {s.name}: emit_func_output called twice")
        if params is not None:
            s.params = list(params)
        if isinstance(output, (list, tuple)):
            output = Tuple(output)
        output = self.normalize(output)
        self._flush_block()
        self._check_dataflow_scoping(s, output)
        func = Function(s.params, SeqExpr(s.blocks, output), attrs=dict(s.attrs, global_symbol=s.name))
        self._funcs[s.name] = func
        s.done = True
        return GlobalVar(s.name, func.struct_info)

    def _check_dataflow_scoping(self, s: _FunctionScope, output: Expr):
        local = set()
        for blk in s.blocks:
            if isinstance(blk, DataflowBlock):
                local |= {id(b.var) for b in blk.bindings if isinstance(b.var, DataflowVar)}

        def uses(e):
            if isinstance(e, DataflowVar) and id(e) in local:
                raise RelaxError(f"function {s.name}: the dataflow variable {e.name_hint} is used "
                                 f"outside its dataflow block; pass it through emit_output", e)
            if isinstance(e, Function):
                return
            for c in children(e):
                if isinstance(c, Expr):
                    uses(c)

        for blk in s.blocks:
            if not isinstance(blk, DataflowBlock):
                for b in blk.bindings:
                    uses(b.value)
        uses(output)

    def lookup_binding(self, var: Var) -> Expr | None:
        """The value ``var`` was bound to by this builder, if any."""
        return self._bound.get(id(var))

    def normalize(self, expr) -> Expr:
        """Check an expression can be bound (lists become Tuples)."""
        if isinstance(expr, (list, tuple)):
            expr = Tuple([self.normalize(e) for e in expr])
        if not isinstance(expr, Expr):
            raise RelaxError(f"cannot bind {expr!r}: not a Relax expression")
        return expr

    # -- TensorIR functions -----------------------------------------------------------------------------
    def add_func(self, func, name_hint: str) -> GlobalVar:
        """Add a function to the module (an identical PrimFunc already there is reused)."""
        if isinstance(func, PrimFunc):
            same = self._prims.find(func)
            if same is not None:
                return GlobalVar(same)
            name = self._fresh_global(name_hint)
            self._prims.add(name, func)
            func = func.with_attr("global_symbol", name)
        else:
            name = self._fresh_global(name_hint)
        self._funcs[name] = func
        return GlobalVar(name, getattr(func, "struct_info", None))

    def _forget_kernel(self, name: str) -> None:
        """``name`` is no kernel to reuse any more (the function was removed)."""
        self._prims.remove(name)
        self._te_kernels = {k: v for k, v in self._te_kernels.items() if v.name != name}

    def reuse_te_kernel(self, te_func: Callable, args: Sequence, kwargs: dict
                        ) -> tuple[tuple | None, Call | None]:
        """Look up the kernel ``call_te(te_func, *args, **kwargs)`` made before: the same te
        function on tensors of the same static shapes and dtypes, with the same other arguments
        (plain values and dataclasses of them). Return the lookup key (None where an argument
        is not a plain value) and the ``call_tir`` of that kernel on these arguments, or None
        where there is none, it was removed, or a placeholder name of either call is one its
        te function may have made a name from (``_names_clash``).

        Examples
        --------
        >>> keyed, call = bb.reuse_te_kernel(te_add, (x, y), {})       # doctest: +SKIP
        """
        keyed = _call_te_key(te_func, args, kwargs)
        if keyed is None:
            return None, None
        made = self._te_kernels.get(keyed[0])
        if made is None or made.name not in self._funcs or _names_clash(keyed[1], made.inner):
            return keyed, None
        return keyed, call_tir(GlobalVar(made.name), _tensor_args(args, kwargs), made.out_sinfo)

    def remember_te_kernel(self, keyed: tuple | None, name: str, out_sinfo: list,
                           func: PrimFunc) -> None:
        """Keep the kernel ``name`` (``func``: static shapes, no scalar parameters) as the one
        made for ``keyed`` (``reuse_te_kernel``'s key), unless its placeholders' names may have
        shaped it."""
        if keyed is None:
            return
        inner = _inner_names(func, len(keyed[1]))
        if not _names_clash(keyed[1], inner):
            self._te_kernels[keyed[0]] = _TeKernel(name, out_sinfo, inner)

    def update_func(self, gvar: GlobalVar | str, func) -> None:
        name = gvar.name_hint if isinstance(gvar, GlobalVar) else gvar
        self._funcs[name] = func

    def call_te(self, te_func: Callable, *args, primfunc_name_hint: str | None = None,
                **kwargs) -> Call:
        """Run ``te_func`` on te placeholders standing for the tensor arguments, turn the result
        into a PrimFunc, add it to the module and return the ``call_tir`` of it.

        Tensor-valued Relax arguments (also inside lists) become placeholders of their symbolic
        shapes; other arguments (ints, floats, strings, PrimExprs) pass through unchanged.
        """
        keyed, reused = self.reuse_te_kernel(te_func, args, kwargs)
        if reused is not None:
            # the same te function on tensors of the same shapes and dtypes, with the same other
            # arguments: the same kernel (AlterLayout packs the weights of ResNet-50's 53
            # convolutions with a few distinct kernels), which add_func would find again
            return reused
        placeholders: list[te.Tensor] = []
        relax_args: list[Expr] = []

        def convert(a):
            if isinstance(a, Expr):
                si = a.struct_info
                if not isinstance(si, TensorStructInfo):
                    raise RelaxError(f"emit_te: argument {a!r} must be a tensor, got {si!r}", a)
                shape = shape_of_sinfo(si, f"emit_te argument {getattr(a, 'name_hint', a)!r}")
                name = _sanitize(getattr(a, "name_hint", "") or f"p{len(placeholders)}")
                ph = te.placeholder(shape, si.dtype, self._unique_placeholder_name(
                    name, placeholders))
                placeholders.append(ph)
                relax_args.append(a)
                return ph
            if isinstance(a, (list, tuple)):
                return type(a)(convert(x) for x in a)
            return a

        te_args = [convert(a) for a in args]
        te_kwargs = {k: convert(v) for k, v in kwargs.items()}
        outs = te_func(*te_args, **te_kwargs)
        single = isinstance(outs, te.Tensor)
        out_list = [outs] if single else list(outs)
        if not out_list or not all(isinstance(o, te.Tensor) for o in out_list):
            raise RelaxError(f"emit_te: {getattr(te_func, '__name__', te_func)} must return a te "
                             f"Tensor or a list of them, got {outs!r}")
        # an output may be one of the inputs (identity): copy it so the kernel writes its output
        inputs_by_id = {id(p) for p in placeholders}
        fixed = []
        for o in out_list:
            if id(o) in inputs_by_id or o.op == "placeholder":
                o = te.compute(o.shape, lambda *i, _o=o: _o[i], o.name + "_copy")
            fixed.append(o)
        out_list = fixed
        # symbolic vars the kernel needs that no input shape binds: scalar parameters
        # only a dim that IS a variable binds it (from the argument's shape); a variable seen only
        # inside a compound dim such as n * 3 must be passed to the kernel as a scalar
        bound = {d for p in placeholders for d in p.shape if isinstance(d, TirVar)}
        extra: list[TirVar] = []
        for o in placeholders + out_list:
            for d in o.shape:
                def visit(n):
                    if isinstance(n, TirVar) and n not in bound and n not in extra:
                        extra.append(n)
                post_order_visit(d, visit)
        func = te.create_prim_func(placeholders + out_list + extra)
        name = primfunc_name_hint or getattr(te_func, "__name__", None) or out_list[0].name
        gvar = self.add_func(func, name if name != "<lambda>" else out_list[0].name)
        out_sinfo = [TensorStructInfo(o.shape, o.dtype) for o in out_list]
        if not extra:
            self.remember_te_kernel(keyed, gvar.name_hint, out_sinfo, func)
        return call_tir(gvar, relax_args, out_sinfo, tir_vars=extra or None)

    @staticmethod
    def _unique_placeholder_name(name, existing):
        names = {p.name for p in existing}
        if name not in names:
            return name
        k = 1
        while f"{name}_{k}" in names:
            k += 1
        return f"{name}_{k}"

    def emit_te(self, te_func: Callable, *args, name_hint: str = "lv", **kwargs) -> Var:
        """``emit(call_te(te_func, *args, **kwargs))``."""
        return self.emit(self.call_te(te_func, *args, **kwargs), name_hint=name_hint)

    # -- result ------------------------------------------------------------------------------------------
    def get(self) -> IRModule:
        """The module built so far."""
        if self._scope is not None and not self._scope.done:
            raise RelaxError(f"BlockBuilder.get: function {self._scope.name} is not finished")
        return IRModule(self._funcs)
