"""Print Relax functions and modules as readable TVMScript-like text.

``to_script(node)`` (and ``expr.script()``, ``repr(expr)``) gives text such as::

    @I.ir_module
    class Module:
        @T.prim_func
        def add(...):
            ...

        @R.function
        def main(x: R.Tensor((n, 768), "float32"), y: R.Tensor((768,), "float32"))
                -> R.Tensor((n, 768), "float32"):        # (one line in the output)
            n = T.int64()
            with R.dataflow():
                lv: R.Tensor((n, 768), "float32") = R.call_tir(cls.add, (x, y),
                    out_sinfo=R.Tensor((n, 768), "float32"))   # (one line)
                gv: R.Tensor((n, 768), "float32") = R.nn.relu(lv)
                R.output(gv)
            return gv

Rules:

- Every binding shows its struct info (``lv: R.Tensor(...) = value``); symbolic dims used by a
  function are declared at its top (``n = T.int64()``), as TVMScript does.
- Names are unique within a function (``lv``, ``lv_1``); Relax variables and symbolic dims share
  one name space.
- Operators print by name without the ``relax.`` prefix (``R.add``, ``R.nn.conv2d(x, w,
  strides=[1, 1])``); other registered ops print under their full name (``test.add(x)``).
- Functions of the module are referred to as ``cls.name``; ``call_tir`` prints as
  ``R.call_tir(cls.f, (args,), out_sinfo=..., tir_vars=R.shape([...]))``.
- Scalar constants print inline (``R.const(1.5, "float32")``); tensors as short references
  ``metadata["relax.expr.Constant"][k]``, listed with their shape and dtype in a ``# Metadata``
  comment at the end of the text.
- A Relax function without ``global_symbol`` is private: ``@R.function(private=True)``.

The text is for reading (and for tests that compare the key lines of a pass's result); there is no
Relax parser. PrimFuncs of a module print through ``tensorir.script``.

Examples
--------
>>> from tilecraft.relax import BlockBuilder, Var, TensorStructInfo
>>> bb = BlockBuilder()
>>> x = Var("x", TensorStructInfo(("n", 4), "float32"))
>>> with bb.function("main", [x]):
...     _ = bb.emit_func_output(x)
>>> print(to_script(bb.get()["main"]))
@R.function
def main(x: R.Tensor((n, 4), "float32")) -> R.Tensor((n, 4), "float32"):
    n = T.int64()
    return x
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from tilecraft.tensorir.expr import Node, PrimExpr, Var as TirVar
from tilecraft.tensorir.function import IRModule, PrimFunc
# the TensorIR printer's internals: one namer for Relax names and symbolic dims, and the
# PrimFunc printer at the module's indentation (as tensorir.script's own module printer does)
from tilecraft.tensorir.script import (INDENT, RESERVED_NAMES, _Printer, sanitize, string_literal,
                                       unique_name)
from tilecraft.tensorir.script import to_script as tir_to_script

from .expr import (Binding, BindingBlock, Call, Constant, DataflowBlock, DataflowVar, Expr,
                   ExternFunc, Function, GlobalVar, If, MatchCast, PrimValue, SeqExpr, ShapeExpr,
                   StringImm, Tuple, TupleGetItem, Var, VarBinding)
from .expr import Op, register_printer, tir_vars_in
from .struct_info import (FuncStructInfo, ObjectStructInfo, PrimStructInfo, ShapeStructInfo,
                          StructInfo, TensorStructInfo, TupleStructInfo)

__all__ = ["to_script", "module_script"]

_RELAX_RESERVED = RESERVED_NAMES | {"R", "cls", "metadata"}
_INLINE_VALUES = 6   # constants with at most this many elements show their values in the metadata


def to_script(node) -> str:
    """The TVMScript-like text of a Relax node, a Relax function or an IRModule.

    Parameters
    ----------
    node : IRModule | relax.Function | relax.Expr | relax.Binding | relax.BindingBlock | StructInfo
        What to print. A module may hold Relax functions and PrimFuncs; both are printed.

    Returns
    -------
    str
        Deterministic text (the same IR prints the same text).

    Examples
    --------
    >>> from tilecraft.relax import Var, TensorStructInfo, Tuple
    >>> x = Var("x", TensorStructInfo((2, 3), "float32"))
    >>> to_script(Tuple([x, x]))
    '(x, x)'
    """
    if isinstance(node, IRModule):
        return module_script(node)
    p = _RelaxPrinter(in_module=False)
    if isinstance(node, Function):
        name = node.attr_dict.get("global_symbol", "main")
        p.function(node, sanitize(name) if isinstance(name, str) else "main")
        return p.finish()
    if isinstance(node, StructInfo):
        return p.sinfo(node)
    if isinstance(node, (Binding, BindingBlock)):
        p.declare_free(node)
        if isinstance(node, Binding):
            p.binding(node)
        else:
            p.block(node)
        return p.finish()
    if isinstance(node, SeqExpr):
        p.declare_free(node)
        p.seq_body(node)
        return p.finish()
    if isinstance(node, Expr):
        p.declare_free(node)
        text = p.expr(node)
        meta = p.metadata_lines()
        return text if not meta else text + "\n" + "\n".join(meta)
    if isinstance(node, Node):
        return tir_to_script(node)
    raise TypeError(f"relax.printer.to_script expects a Relax node or an IRModule, got "
                    f"{type(node).__name__} {node!r}")


def module_script(mod: IRModule) -> str:
    """The text of a module holding Relax functions and PrimFuncs, in insertion order.

    PrimFuncs print through ``tensorir.script``; Relax functions refer to the module's functions
    as ``cls.name``. Constants of all Relax functions share one metadata list.

    Examples
    --------
    >>> from tilecraft.relax import BlockBuilder, Var, TensorStructInfo
    >>> from tilecraft.tensorir import te
    >>> bb = BlockBuilder()
    >>> x = Var("x", TensorStructInfo((4,), "float32"))
    >>> with bb.function("main", [x]):
    ...     y = bb.emit_te(lambda a: te.compute(a.shape, lambda i: a[i] * 2.0, "double"), x)
    ...     _ = bb.emit_func_output(y)
    >>> text = module_script(bb.get())
    >>> "R.call_tir(cls.double, (x,)" in text
    True
    """
    if not isinstance(mod, IRModule):
        raise TypeError(f"module_script expects an IRModule, got {type(mod).__name__}")
    used: set[str] = set(_RELAX_RESERVED)
    shared = _RelaxPrinter(in_module=True)  # metadata numbering across the module
    chunks = []
    for key, fn in mod.functions.items():
        def_name = unique_name(sanitize(key), used)
        if isinstance(fn, PrimFunc):
            tp = _Printer(depth=1)
            extra = "" if def_name == key else f"(name={string_literal(key)})"
            tp.func(fn, def_name, extra)
            chunks.append(tp.text())
        elif isinstance(fn, Function):
            p = _RelaxPrinter(in_module=True, depth=1, constants=shared.constants)
            p.function(fn, def_name, module_key=key)
            chunks.append("\n".join(p.lines))
        else:
            chunks.append(INDENT + f"# {key}: {type(fn).__name__} (not printable)")
    if not chunks:
        chunks.append(INDENT + "pass")
    text = "@I.ir_module\nclass Module:\n" + "\n\n".join(chunks)
    meta = shared.metadata_lines()
    return text if not meta else text + "\n\n" + "\n".join(meta)


class _RelaxPrinter:
    def __init__(self, in_module: bool, depth: int = 0, constants: list | None = None):
        self.tir = _Printer()            # its namer names both Relax vars and symbolic dims
        self.tir.namer.taken |= _RELAX_RESERVED
        self.in_module = in_module
        self.depth = depth
        self.lines: list[str] = []
        self.constants: list[Constant] = [] if constants is None else constants

    # -- output ---------------------------------------------------------------------------------
    def emit(self, line: str):
        self.lines.append(INDENT * self.depth + line)

    def finish(self) -> str:
        meta = self.metadata_lines()
        return "\n".join(self.lines + ([""] + meta if meta else []))

    def metadata_lines(self) -> list[str]:
        if not self.constants:
            return []
        out = ["# Metadata (constants):"]
        for k, c in enumerate(self.constants):
            line = f'#   metadata["relax.expr.Constant"][{k}]: {self.sinfo(c.struct_info)}'
            if c.data.size <= _INLINE_VALUES:
                line += " = " + np.array2string(c.data, separator=", ").replace("\n", "")
            out.append(line)
        return out

    # -- names ----------------------------------------------------------------------------------
    def name(self, v) -> str:
        if id(v) not in self.tir.namer.names and isinstance(v, Var):
            # used where it is not defined (a loose expression, or ill-formed IR): name it
            return self.tir.namer.define(v, v.name_hint, root=True)
        return self.tir.namer.get(v)

    def define(self, v, hint: str) -> str:
        return self.tir.namer.define(v, hint)

    def declare_free(self, node):
        """Name the symbolic dims and Relax vars used in a loose expression (no declarations)."""
        for tv in tir_vars_in(node):
            self.define(tv, tv.name)

    def declare_tir_vars(self, func: Function):
        """Name every symbolic dim of ``func`` and print ``n = T.int64()`` for each."""
        for tv in tir_vars_in(func):
            if tv.__class__ is TirVar:
                name = self.define(tv, tv.name)
                self.emit(f"{name} = T.{tv.dtype}()")

    # -- struct info ----------------------------------------------------------------------------
    def prim(self, e: PrimExpr) -> str:
        return self.tir.expr(e)

    def shape(self, dims) -> str:
        inner = ", ".join(self.prim(d) for d in dims)
        return f"({inner},)" if len(dims) == 1 else f"({inner})"

    def sinfo(self, si: StructInfo) -> str:
        if isinstance(si, TensorStructInfo):
            if si.shape is not None:
                return f"R.Tensor({self.shape(si.shape)}, {string_literal(si.dtype)})"
            if si.ndim >= 0:
                return f"R.Tensor(ndim={si.ndim}, dtype={string_literal(si.dtype)})"
            return f"R.Tensor(dtype={string_literal(si.dtype)})"
        if isinstance(si, ShapeStructInfo):
            if si.values is not None:
                return f"R.Shape([{', '.join(self.prim(d) for d in si.values)}])"
            return f"R.Shape(ndim={si.ndim})"
        if isinstance(si, TupleStructInfo):
            return f"R.Tuple({', '.join(self.sinfo(f) for f in si.fields)})"
        if isinstance(si, PrimStructInfo):
            if si.value is not None:
                return f"R.Prim(value={self.prim(si.value)})"
            return f"R.Prim({string_literal(si.dtype)})"
        if isinstance(si, FuncStructInfo):
            ret = self.sinfo(si.ret)
            if si.params is None:
                return f"R.Callable(ret={ret})"
            params = ", ".join(self.sinfo(p) for p in si.params)
            return f"R.Callable(({params}{',' if len(si.params) == 1 else ''}), {ret})"
        if isinstance(si, ObjectStructInfo):
            return "R.Object"
        return f"R.Object  # {type(si).__name__}"

    # -- expressions ------------------------------------------------------------------------------
    def gvar(self, g: GlobalVar) -> str:
        name = sanitize(g.name_hint)
        return f"cls.{name}" if self.in_module else name

    def constant(self, c: Constant) -> str:
        if c.data.ndim == 0:
            v = c.data.item()
            text = f'float("{v}")' if isinstance(v, float) and not math.isfinite(v) else repr(v)
            return f"R.const({text}, {string_literal(c.struct_info.dtype)})"
        for k, other in enumerate(self.constants):
            if other is c:
                return f'metadata["relax.expr.Constant"][{k}]'
        self.constants.append(c)
        return f'metadata["relax.expr.Constant"][{len(self.constants) - 1}]'

    def value(self, v: Any) -> str:
        """An attribute value."""
        if v is None or isinstance(v, bool):
            return repr(v)
        if isinstance(v, (int, np.integer)):
            return str(int(v))
        if isinstance(v, (float, np.floating)):
            return repr(float(v)) if math.isfinite(v) else f'float("{float(v)}")'
        if isinstance(v, str):
            return string_literal(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(self.value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{self.value(k)}: {self.value(x)}" for k, x in v.items()) + "}"
        if isinstance(v, PrimExpr):
            return self.prim(v)
        if isinstance(v, StructInfo):
            return self.sinfo(v)
        if isinstance(v, Expr):
            return self.expr(v)
        if isinstance(v, np.ndarray):
            return np.array2string(v, separator=", ").replace("\n", "")
        return repr(v)

    def expr(self, e: Expr) -> str:
        if isinstance(e, (Var, DataflowVar)):
            return self.name(e)
        if isinstance(e, GlobalVar):
            return self.gvar(e)
        if isinstance(e, Constant):
            return self.constant(e)
        if isinstance(e, Tuple):
            inner = ", ".join(self.expr(f) for f in e.fields)
            return f"({inner},)" if len(e.fields) == 1 else f"({inner})"
        if isinstance(e, TupleGetItem):
            return f"{self.expr(e.tuple_value)}[{e.index}]"
        if isinstance(e, ShapeExpr):
            return f"R.shape([{', '.join(self.prim(d) for d in e.values)}])"
        if isinstance(e, PrimValue):
            return f"R.prim_value({self.prim(e.value)})"
        if isinstance(e, StringImm):
            return f"R.str({string_literal(e.value)})"
        if isinstance(e, ExternFunc):
            return f"R.ExternFunc({string_literal(e.global_symbol)})"
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, Function):
            return f"<function of {len(e.params)} parameters>"
        if isinstance(e, (SeqExpr, If)):
            # only reachable for a loose nested expression; bindings print them as statements
            sub = _RelaxPrinter(self.in_module, 0, self.constants)
            sub.tir = self.tir
            if isinstance(e, SeqExpr):
                sub.seq_body(e)
            else:
                sub.if_stmt("_", e)
            return "{ " + "; ".join(line.strip() for line in sub.lines) + " }"
        return f"<{type(e).__name__}>"

    def call(self, c: Call) -> str:
        attrs = [f"{k}={self.value(v)}" for k, v in c.attrs]
        if isinstance(c.op, Op):
            if c.op.name == "relax.call_tir" and len(c.args) >= 2 and \
                    isinstance(c.args[1], Tuple):
                parts = [self.expr(c.args[0]), self.expr(c.args[1])]
                out = c.sinfo_args[0] if c.sinfo_args else ObjectStructInfo()
                if isinstance(out, TupleStructInfo):
                    parts.append(f"out_sinfo=[{', '.join(self.sinfo(f) for f in out.fields)}]")
                else:
                    parts.append(f"out_sinfo={self.sinfo(out)}")
                if len(c.args) > 2:
                    parts.append(f"tir_vars={self.expr(c.args[2])}")
                return f"R.call_tir({', '.join(parts + attrs)})"
            name = c.op.name
            fn = "R." + name[len("relax."):] if name.startswith("relax.") else name
        elif isinstance(c.op, ExternFunc):
            fn = "R.call_packed"
            attrs = [string_literal(c.op.global_symbol)] + [self.expr(a) for a in c.args] + attrs
            if c.sinfo_args:
                attrs.append(f"sinfo_args={self.sinfo_list(c.sinfo_args)}")
            return f"{fn}({', '.join(attrs)})"
        else:
            fn = self.expr(c.op)
        parts = [self.expr(a) for a in c.args] + attrs
        if c.sinfo_args:
            parts.append(f"sinfo_args={self.sinfo_list(c.sinfo_args)}")
        return f"{fn}({', '.join(parts)})"

    def sinfo_list(self, sinfos) -> str:
        inner = ", ".join(self.sinfo(s) for s in sinfos)
        return f"({inner},)" if len(sinfos) == 1 else f"({inner})"

    # -- statements ------------------------------------------------------------------------------
    def binding(self, b: Binding):
        var = b.var
        if isinstance(b, VarBinding) and isinstance(b.value, If):
            name = self.define(var, var.name_hint)
            self.if_stmt(name, b.value, var.struct_info)
            return
        if isinstance(b, VarBinding) and isinstance(b.value, Function):
            name = self.define(var, var.name_hint)
            self.function(b.value, name, nested=True)
            return
        if isinstance(b, MatchCast):
            value = f"R.match_cast({self.expr(b.value)}, {self.sinfo(b.struct_info)})"
        else:
            value = self.expr(b.value)
        name = self.define(var, var.name_hint)
        self.emit(f"{name}: {self.sinfo(var.struct_info)} = {value}")

    def if_stmt(self, name: str, e: If, sinfo: StructInfo | None = None):
        ann = f": {self.sinfo(sinfo)}" if sinfo is not None else ""
        self.emit(f"if {self.expr(e.cond)}:")
        for branch, head in ((e.true_branch, None), (e.false_branch, "else:")):
            if head:
                self.emit(head)
            self.depth += 1
            self.tir.namer.push()
            if isinstance(branch, SeqExpr):
                for blk in branch.blocks:
                    self.block(blk)
                result = branch.body
            else:
                result = branch
            self.emit(f"{name}{ann} = {self.expr(result)}")
            self.tir.namer.pop()
            self.depth -= 1

    def block(self, blk: BindingBlock):
        if isinstance(blk, DataflowBlock):
            self.emit("with R.dataflow():")
            self.depth += 1
            outputs = []
            for b in blk.bindings:
                self.binding(b)
                if not isinstance(b.var, DataflowVar):
                    outputs.append(self.name(b.var))
            self.emit(f"R.output({', '.join(outputs)})")
            self.depth -= 1
        else:
            for b in blk.bindings:
                self.binding(b)

    def seq_body(self, seq: SeqExpr):
        for blk in seq.blocks:
            self.block(blk)
        self.emit(f"return {self.expr(seq.body)}")

    def function(self, f: Function, name: str, nested: bool = False, module_key: str | None = None):
        attrs = f.attr_dict
        symbol = attrs.pop("global_symbol", None)
        private = symbol is None and not nested
        if symbol is not None and symbol != (module_key or name):
            attrs["global_symbol"] = symbol
        self.tir.namer.push()
        params = []
        # symbolic dims first, so a parameter named like a dim gets the suffix
        dims = [tv for tv in tir_vars_in(f) if tv.__class__ is TirVar]
        for tv in dims:
            self.define(tv, tv.name)
        for p in f.params:
            params.append(f"{self.define(p, p.name_hint)}: {self.sinfo(p.struct_info)}")
        self.emit("@R.function(private=True)" if private else "@R.function")
        self.emit(f"def {name}({', '.join(params)}) -> {self.sinfo(f.ret_struct_info)}:")
        self.depth += 1
        for tv in dims:
            self.emit(f"{self.name(tv)} = T.{tv.dtype}()")
        if attrs:
            self.emit(f"R.func_attr({self.value(attrs)})")
        if isinstance(f.body, SeqExpr):
            self.seq_body(f.body)
        else:
            self.emit(f"return {self.expr(f.body)}")
        self.depth -= 1
        self.tir.namer.pop()




# expr.script() and repr() of Relax nodes print through this module
register_printer(to_script)
