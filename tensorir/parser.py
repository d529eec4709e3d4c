"""Read the TVMScript-like text of ``func.script()`` back into IR.

The text is Python syntax, so it is read with Python's ``ast`` module and IR is built from the
syntax tree; nothing is ever evaluated. ``tensorir.script`` describes the printed form; this
module accepts exactly that form plus a few hand-written conveniences (``T.axis.remap``, ``x = v``
lets, ``A[:, j]`` regions, bare literals where a dtype is implied, chained comparisons).

Malformed text raises ``ParseError`` (a ``ValueError``) naming the line and what was expected.
"""
from __future__ import annotations

import ast
import textwrap
from contextlib import contextmanager
from typing import Mapping

from tilecraft.errors import TilecraftError

from . import dtype as dt
from .expr import (INTRINSICS, Add, And, BufferLoad, Call, Cast, Div, EQ, FloatImm, FloorDiv,
                   FloorMod, GE, GT, IntImm, LE, LT, Let, Max, Min, Mod, Mul, NE, Not, Or,
                   PrimExpr, Select, StringImm, Sub, TIRError, Var)
from .function import IRModule, PrimFunc
from .stmt import (Allocate, AssertStmt, Block, BlockRealize, Buffer, BufferRegion, BufferStore,
                   Evaluate, For, IfThenElse, IterVar, LetStmt, Range, SeqStmt, Stmt)
from .script import recursion_room
from .structural import structural_equal

__all__ = ["parse", "ParseError"]


class ParseError(TilecraftError, ValueError):
    """Malformed TensorIR text; ``lineno`` is the 1-based line of the problem (or None)."""

    def __init__(self, message: str, lineno: int | None = None, source_line: str | None = None):
        self.message = message
        self.lineno = lineno
        text = message if lineno is None else f"line {lineno}: {message}"
        if source_line and source_line.strip():
            line = source_line.strip()
            text += f"\n    {line if len(line) <= 160 else line[:157] + '...'}"
        super().__init__(text)


def parse(text: str, extra_vars: Mapping[str, "Var | Buffer"] | None = None
          ) -> "PrimFunc | IRModule | PrimExpr":
    """Parse the text of ``func.script()``, ``mod.script()`` or ``expr.script()``.

    Parameters
    ----------
    text : str
        A ``@T.prim_func`` function, an ``@I.ir_module`` class, or a single expression. Common
        leading indentation is ignored, so triple-quoted strings work as they are.
    extra_vars : Mapping[str, Var | Buffer], optional
        Names the text may use without defining them (free variables of an expression, say).
        In an expression, other unknown names become new int64 ``Var``s.

    Returns
    -------
    PrimFunc | IRModule | PrimExpr

    Raises
    ------
    ParseError
        On malformed text, with the line number and what was expected.

    Examples
    --------
    >>> from tilecraft.tensorir import var
    >>> n = var("n")
    >>> e = parse("n * 4 + 1", {"n": n})
    >>> e.script()
    'n * 4 + 1'
    """
    if not isinstance(text, str):
        raise TypeError(f"parse expects a str, got {type(text).__name__}")
    with recursion_room():
        return _parse(textwrap.dedent(text), extra_vars)


def _parse(text: str, extra_vars):
    try:
        tree = ast.parse(text)
    except SyntaxError as err:
        hint = ""
        if "nested parentheses" in str(err.msg):
            hint = " (Python reads at most 200 nested parentheses; split the expression)"
        raise ParseError(f"invalid syntax: {err.msg}{hint}", err.lineno, err.text) from None
    except (RecursionError, MemoryError):
        raise ParseError("the text is nested too deeply to parse") from None
    p = _Parser(text, extra_vars)
    body = [s for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))]
    if len(body) == 1:
        node = body[0]
        if isinstance(node, ast.FunctionDef):
            return p.prim_func(node)[1]
        if isinstance(node, ast.ClassDef):
            return p.module(node)
        if isinstance(node, ast.Expr):
            p.auto_vars = True
            return p.value(node.value)
    where = body[1] if len(body) > 1 else (body[0] if body else None)
    raise p.error(where, "expected one @T.prim_func function, one @I.ir_module class or one "
                         "expression" + ("" if body else ", got empty text"))


class _Lit:
    """A bare Python number or bool; it gets its dtype from where it is used."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


_BINOPS = {ast.Add: Add, ast.Sub: Sub, ast.Mult: Mul, ast.Div: Div, ast.FloorDiv: FloorDiv,
           ast.Mod: FloorMod, ast.BitAnd: And, ast.BitOr: Or}
_CMPOPS = {ast.Eq: EQ, ast.NotEq: NE, ast.Lt: LT, ast.LtE: LE, ast.Gt: GT, ast.GtE: GE}
_PAIR_FUNCS = {"min": Min, "max": Max, "truncdiv": Div, "truncmod": Mod, "floordiv": FloorDiv,
               "floormod": FloorMod}
_FOR_KINDS = {"range": "serial", "serial": "serial", "parallel": "parallel",
              "vectorized": "vectorized", "unroll": "unrolled", "thread_binding": "thread_binding"}
_AXIS_KINDS = {"axis.spatial": "spatial", "axis.reduce": "reduce", "axis.S": "spatial",
               "axis.R": "reduce"}
_STATEMENT_FUNCS = {"reads", "writes", "where", "block_attr", "func_attr", "init", "block",
                    "evaluate", "alloc_buffer", "match_buffer", "allocate", "grid", "serial",
                    "parallel", "vectorized", "unroll", "thread_binding", "LetStmt", "Assert",
                    "Buffer", "prim_func", "axis.spatial", "axis.reduce", "axis.remap"}


def _is_dtype(name: str) -> bool:
    try:
        dt.parse(name)
        return True
    except dt.DataTypeError:
        return False


def _zero(dtype: str) -> PrimExpr:
    return FloatImm(0.0, dtype) if dt.is_float(dtype) else IntImm(0, dtype)


def make_range(start: PrimExpr, stop: PrimExpr) -> Range:
    """The Range [start, stop), undoing the printer's ``start, start + extent`` exactly."""
    if isinstance(start, IntImm) and start.value == 0 and start.dtype == stop.dtype:
        return Range(start, stop)
    if isinstance(start, IntImm) and isinstance(stop, IntImm) and start.dtype == stop.dtype:
        return Range(start, IntImm(stop.value - start.value, stop.dtype))
    if isinstance(stop, Add) and structural_equal(stop.a, start):
        return Range(start, stop.b)
    return Range(start, stop - start)


class _Parser:
    def __init__(self, text: str, extra_vars):
        self.lines = text.splitlines()
        self.scopes: list[dict] = [dict(extra_vars or {})]
        self.auto_vars = False  # expressions: unknown names become int64 Vars
        self.loops: dict[int, tuple] = {}  # loop var id -> (min, extent), for T.axis.remap

    # -- errors, names ----------------------------------------------------------------------

    def error(self, node, message: str) -> ParseError:
        lineno = getattr(node, "lineno", None)
        line = self.lines[lineno - 1] if lineno and 0 < lineno <= len(self.lines) else None
        return ParseError(message, lineno, line)

    @contextmanager
    def scope(self):
        self.scopes.append({})
        try:
            yield
        finally:
            self.scopes.pop()

    def define(self, name: str, obj, node):
        # the printer never defines a name twice in one scope; hand-written text that does is
        # almost surely a mistake (two `vi = T.axis...` lines), so say so
        if name in self.scopes[-1]:
            raise self.error(node, f"{name!r} is already defined here; use a new name")
        self.scopes[-1][name] = obj

    def lookup(self, name: str, node):
        for s in reversed(self.scopes):
            if name in s:
                return s[name]
        if self.auto_vars:
            v = Var(name, "int64")
            self.scopes[0][name] = v
            return v
        raise self.error(node, f"undefined name {name!r}")

    def lookup_buffer(self, node) -> Buffer:
        if not isinstance(node, ast.Name):
            raise self.error(node, f"expected a buffer name, got {_show(node)}")
        obj = self.lookup(node.id, node)
        if not isinstance(obj, Buffer):
            raise self.error(node, f"{node.id} is not a buffer")
        return obj

    @staticmethod
    def tname(node) -> str | None:
        """``"axis.spatial"`` for ``T.axis.spatial``, ``"range"`` for ``range``; else None."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            if node.id == "T" and parts:
                return ".".join(reversed(parts))
            if node.id == "range" and not parts:
                return "range"
        return None

    def bind(self, call: ast.Call, names: list[str], required: int, what: str) -> dict:
        """Match a call's arguments to parameter ``names`` (the first ``required`` mandatory)."""
        out: dict[str, ast.expr] = {}
        if any(isinstance(a, ast.Starred) for a in call.args):
            raise self.error(call, f"{what}: *args are not supported")
        if len(call.args) > len(names):
            raise self.error(call, f"{what} takes at most {len(names)} argument(s) "
                                   f"({', '.join(names)}), got {len(call.args)}")
        for n, a in zip(names, call.args):
            out[n] = a
        for kw in call.keywords:
            if kw.arg is None or kw.arg not in names:
                raise self.error(kw.value, f"{what}: unexpected keyword argument {kw.arg!r}; "
                                           f"expected {', '.join(names)}")
            if kw.arg in out:
                raise self.error(kw.value, f"{what}: argument {kw.arg!r} given twice")
            out[kw.arg] = kw.value
        missing = [n for n in names[:required] if n not in out]
        if missing:
            raise self.error(call, f"{what}: missing argument {missing[0]!r}")
        return out

    def string(self, node, what: str) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        raise self.error(node, f"{what} must be a string literal, got {_show(node)}")

    def dtype_arg(self, node, what: str) -> str:
        s = self.string(node, what)
        if not _is_dtype(s):
            raise self.error(node, f"{what}: unknown dtype {s!r}")
        return s

    def int_literal(self, node, what: str) -> int:
        v = self.literal(node)
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.error(node, f"{what} must be an integer literal, got {_show(node)}")
        return v

    def literal(self, node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) \
                and isinstance(node.operand, ast.Constant) \
                and isinstance(node.operand.value, (int, float)) \
                and not isinstance(node.operand.value, bool):
            return -node.operand.value
        return None

    # -- expressions ------------------------------------------------------------------------

    def value(self, node, like: str | None = None) -> PrimExpr:
        """Parse an expression into a PrimExpr; a bare literal takes dtype ``like`` if given."""
        return self.to_expr(self.expr(node), node, like)

    def to_expr(self, x, node, like: str | None = None) -> PrimExpr:
        if isinstance(x, PrimExpr):
            return x
        if isinstance(x, _Lit):
            v = x.value
            try:
                if isinstance(v, bool):
                    return IntImm(int(v), "bool")
                if isinstance(v, int):
                    if like is not None and dt.is_float(like):
                        return FloatImm(float(v), like)
                    if like is not None and dt.is_integer(like):
                        return IntImm(v, like)
                    return IntImm(v, "int64")
                if like is None:
                    return FloatImm(v, "float32")
                if dt.is_float(like):
                    return FloatImm(v, like)
            except dt.DataTypeError as err:
                raise self.error(node, str(err)) from None
            raise self.error(node, f"the float literal {v!r} is used where a {like} value is "
                                   f"expected")
        raise self.error(node, f"expected an expression, got {_show(node)}")

    def expr(self, node):
        """A PrimExpr, or a ``_Lit`` for a bare literal (its dtype is decided by the caller)."""
        try:
            return self._expr(node)
        except (TIRError, dt.DataTypeError) as err:
            raise self.error(node, str(err)) from None

    def _expr(self, node):
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, (bool, int, float)):
                return _Lit(v)
            if isinstance(v, str):
                return StringImm(v)
            raise self.error(node, f"expected an expression, got the constant {v!r}")
        if isinstance(node, ast.Name):
            obj = self.lookup(node.id, node)
            if isinstance(obj, Buffer):
                raise self.error(node, f"buffer {node.id} is not a value; index it as "
                                       f"{node.id}[...]")
            if not isinstance(obj, PrimExpr):
                raise self.error(node, f"{node.id} is not an expression")
            return obj
        if isinstance(node, ast.UnaryOp):
            x = self.expr(node.operand)
            if isinstance(node.op, ast.USub):
                if isinstance(x, _Lit) and not isinstance(x.value, bool):
                    return _Lit(-x.value)
                x = self.to_expr(x, node.operand)
                return Sub(_zero(x.dtype), x)
            if isinstance(node.op, ast.UAdd):
                return x
            return Not(self.to_expr(x, node.operand))  # `not x` and `~x`
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                a, b = self.binary_operands(node.left, node.right)
                return Call(a.dtype, "pow", [a, b])
            cls = _BINOPS.get(type(node.op))
            if cls is None:
                raise self.error(node, f"unsupported operator {type(node.op).__name__}")
            a, b = self.binary_operands(node.left, node.right)
            return cls(a, b)
        if isinstance(node, ast.BoolOp):
            cls = And if isinstance(node.op, ast.And) else Or
            acc = self.expr(node.values[0])
            acc_node = node.values[0]
            for nv in node.values[1:]:
                a, b = self.binary_operands(acc_node, nv, acc)
                acc, acc_node = cls(a, b), node
            return acc
        if isinstance(node, ast.Compare):
            terms = []
            left, left_node = self.expr(node.left), node.left
            for op, nr in zip(node.ops, node.comparators):
                cls = _CMPOPS.get(type(op))
                if cls is None:
                    raise self.error(node, f"unsupported comparison {type(op).__name__}")
                right = self.expr(nr)
                a, b = self.binary_operands(left_node, nr, left, right)
                terms.append(cls(a, b))
                left, left_node = b, nr  # a < b < c means a < b and b < c
            out = terms[0]
            for t in terms[1:]:
                out = And(out, t)
            return out
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.Subscript):
            buf = self.lookup_buffer(node.value)
            return BufferLoad(buf, self.indices(node.slice))
        raise self.error(node, f"expected an expression, got {_show(node)}")

    def binary_operands(self, na, nb, xa=None, xb=None) -> tuple[PrimExpr, PrimExpr]:
        """Operands of a binary operator: one bare literal takes the other side's dtype; two get
        their default dtypes (int64, float32, bool)."""
        a = self.expr(na) if xa is None else xa
        b = self.expr(nb) if xb is None else xb
        if isinstance(a, _Lit) and isinstance(b, _Lit):
            return self.to_expr(a, na), self.to_expr(b, nb)
        if isinstance(a, _Lit):
            return self.to_expr(a, na, b.dtype), b
        if isinstance(b, _Lit):
            return a, self.to_expr(b, nb, a.dtype)
        return a, b

    def indices(self, node) -> list[PrimExpr]:
        elts = node.elts if isinstance(node, ast.Tuple) else [node]
        out = []
        for e in elts:
            if isinstance(e, ast.Slice):
                raise self.error(e, "a slice is only allowed in T.reads / T.writes regions")
            out.append(self.value(e))
        return out

    def call(self, node: ast.Call):
        name = self.tname(node.func)
        if name is None or name == "range":
            raise self.error(node, f"expected a T.<function> call, got {_show(node.func)}(...)")
        what = f"T.{name}"
        if _is_dtype(name):
            if not node.args and not node.keywords:
                raise self.error(node, f"{what}() declares a variable; write `n = {what}()` at "
                                       f"the top of the function")
            a = self.bind(node, ["value"], 1, what)["value"]
            x = self.expr(a)
            if isinstance(x, StringImm):
                if not dt.is_float(name):
                    raise self.error(a, f"{what} takes a number, got a string")
                try:
                    return FloatImm(float(x.value), name)
                except ValueError:
                    raise self.error(a, f"{what}: {x.value!r} is not a float") from None
            if isinstance(x, _Lit):
                v = x.value
                if dt.is_float(name):
                    return FloatImm(float(v), name)
                if name == dt.HANDLE:
                    raise self.error(node, "T.handle(...) takes no value")
                if isinstance(v, float) and not v.is_integer():
                    raise self.error(a, f"{what} needs an integer, got {v!r}")
                return IntImm(int(v), name)
            return x.astype(name)  # T.float32(i) on an expression: a cast
        if name == "Cast":
            args = self.bind(node, ["dtype", "value"], 2, what)
            return Cast(self.dtype_arg(args["dtype"], "T.Cast dtype"), self.value(args["value"]))
        if name == "Select":
            args = self.bind(node, ["condition", "true_value", "false_value"], 3, what)
            t, f = self.binary_operands(args["true_value"], args["false_value"])
            return Select(self.value(args["condition"]), t, f)
        if name == "if_then_else":
            args = self.bind(node, ["condition", "true_value", "false_value"], 3, what)
            t, f = self.binary_operands(args["true_value"], args["false_value"])
            return Call(t.dtype, "if_then_else", [self.value(args["condition"]), t, f])
        if name in _PAIR_FUNCS:
            args = self.bind(node, ["a", "b"], 2, what)
            a, b = self.binary_operands(args["a"], args["b"])
            return _PAIR_FUNCS[name](a, b)
        if name == "pow":
            args = self.bind(node, ["x", "y"], 2, what)
            a, b = self.binary_operands(args["x"], args["y"])
            return Call(a.dtype, "pow", [a, b])
        if name == "call_intrin":
            if len(node.args) < 2 or node.keywords:
                raise self.error(node, "T.call_intrin takes (dtype, op, *args)")
            dtype = self.dtype_arg(node.args[0], "T.call_intrin dtype")
            op = self.string(node.args[1], "T.call_intrin op")
            return Call(dtype, op, [self.value(a) for a in node.args[2:]])
        if name == "Let":
            return self.let(node)
        if name in INTRINSICS:
            if node.keywords:
                raise self.error(node, f"{what} takes no keyword arguments")
            args = [self.value(a) for a in node.args]
            if len(args) != INTRINSICS[name]:
                raise self.error(node, f"{what} takes {INTRINSICS[name]} argument(s), got "
                                       f"{len(args)}")
            return Call(args[0].dtype, name, args)
        if name == "min_extent":
            raise self.error(node, "T.min_extent(min, extent) is a range: use it in a loop, an "
                                   "axis domain or a buffer region")
        if name in _STATEMENT_FUNCS or name.startswith("axis."):
            raise self.error(node, f"{what} is not an expression here")
        raise self.error(node, f"unknown function {what}")

    def let(self, node: ast.Call) -> PrimExpr:
        args = self.bind(node, ["body", "where"], 2, "T.Let")
        where = args["where"]
        if not isinstance(where, ast.Dict) or not where.keys:
            raise self.error(where, "T.Let needs where={var: value, ...}")
        with self.scope():
            bound = []
            for k, v in zip(where.keys, where.values):
                if not isinstance(k, ast.Name):
                    raise self.error(k or where, "T.Let where= keys must be variable names")
                value = self.value(v)
                var = Var(k.id, value.dtype)
                self.define(k.id, var, k)
                bound.append((var, value))
            out = self.value(args["body"])
        for var, value in reversed(bound):
            out = Let(var, value, out)
        return out

    # -- attribute values -------------------------------------------------------------------

    def attr_value(self, node):
        """A JSON-like Python value (numbers, strings, lists, dicts), or IR for T.* / names."""
        lit = self.literal(node)
        if lit is not None:
            return lit
        if isinstance(node, ast.Constant):
            if node.value is None or isinstance(node.value, (bool, str)):
                return node.value
            raise self.error(node, f"unsupported attribute value {node.value!r}")
        if isinstance(node, ast.List):
            return [self.attr_value(e) for e in node.elts]
        if isinstance(node, ast.Tuple):
            return tuple(self.attr_value(e) for e in node.elts)
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise self.error(node, "**-unpacking is not supported in attribute dicts")
            return {self.attr_value(k): self.attr_value(v) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "float":
            s = self.string(self.bind(node, ["value"], 1, "float")["value"], "float()")
            try:
                return float(s)
            except ValueError:
                raise self.error(node, f"float({s!r}) is not a float") from None
        if isinstance(node, ast.Call) and self.tname(node.func) == "opaque":
            raise self.error(node, "T.opaque(...) stands for an object that has no text form; "
                                   "it cannot be parsed back")
        if isinstance(node, ast.Name):
            return self.lookup(node.id, node)
        return self.value(node)

    def attr_dict(self, node, what: str) -> dict:
        if not isinstance(node, ast.Dict):
            raise self.error(node, f"{what} must be a dict literal, got {_show(node)}")
        d = self.attr_value(node)
        for k in d:
            if not isinstance(k, str):
                raise self.error(node, f"{what} keys must be strings, got {k!r}")
        return d

    # -- ranges, regions, buffers -----------------------------------------------------------

    def range_of(self, args: list, node) -> Range:
        """``(extent)``, ``(start, stop)`` or ``(T.min_extent(min, extent))`` -> Range."""
        if len(args) == 1:
            a = args[0]
            if isinstance(a, ast.Call) and self.tname(a.func) == "min_extent":
                b = self.bind(a, ["min", "extent"], 2, "T.min_extent")
                return Range(self.value(b["min"]), self.value(b["extent"]))
            e = self.value(a)
            return Range(IntImm(0, e.dtype) if dt.is_integer(e.dtype) else _zero(e.dtype), e)
        if len(args) == 2:
            try:
                return make_range(self.value(args[0]), self.value(args[1]))
            except TIRError as err:
                raise self.error(node, str(err)) from None
        raise self.error(node, f"expected an extent or (start, stop), got {len(args)} values")

    def region(self, node) -> BufferRegion:
        if not isinstance(node, ast.Subscript):
            raise self.error(node, f"expected a buffer region such as A[vi, 0:n], got "
                                   f"{_show(node)}")
        buf = self.lookup_buffer(node.value)
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if len(elts) == 1 and isinstance(elts[0], ast.Tuple) and not elts[0].elts:
            elts = []  # A[()]
        if len(elts) != buf.ndim:
            raise self.error(node, f"region of {buf.name} has {len(elts)} entries for "
                                   f"{buf.ndim} dimension(s)")
        ranges = []
        for d, e in enumerate(elts):
            if isinstance(e, ast.Slice):
                if e.step is not None:
                    raise self.error(e, "a region slice takes no step")
                lo = self.value(e.lower) if e.lower is not None else IntImm(0, buf.shape[d].dtype)
                hi = self.value(e.upper) if e.upper is not None else buf.shape[d]
                try:
                    ranges.append(make_range(lo, hi))
                except TIRError as err:
                    raise self.error(e, str(err)) from None
            elif isinstance(e, ast.Call) and self.tname(e.func) == "min_extent":
                ranges.append(self.range_of([e], e))
            else:
                x = self.value(e)
                ranges.append(Range(x, IntImm(1, x.dtype)))
        return BufferRegion(buf, ranges)

    def regions(self, call: ast.Call) -> list[BufferRegion]:
        if call.keywords:
            raise self.error(call, "T.reads / T.writes take buffer regions only")
        args = call.args
        if len(args) == 1 and isinstance(args[0], (ast.List, ast.Tuple)):
            args = args[0].elts
        return [self.region(a) for a in args]

    def shape(self, node) -> list[PrimExpr]:
        if isinstance(node, (ast.Tuple, ast.List)):
            return [self.value(e) for e in node.elts]
        return [self.value(node)]

    def buffer(self, name: str, call: ast.Call, what: str, names: list[str]) -> Buffer:
        """Build a Buffer from ``T.Buffer`` / ``T.alloc_buffer`` / ``T.allocate`` /
        ``T.match_buffer`` arguments (``names`` gives their order)."""
        args = self.bind(call, names, names.index("shape") + 1, what)
        shape = self.shape(args["shape"])
        dtype = self.dtype_arg(args["dtype"], f"{what} dtype") if "dtype" in args else "float32"
        strides = None
        if "strides" in args and not (isinstance(args["strides"], ast.Constant)
                                      and args["strides"].value is None):
            strides = self.shape(args["strides"])
        scope = self.string(args["scope"], f"{what} scope") if "scope" in args else "global"
        align = self.int_literal(args["align"], f"{what} align") if "align" in args else 64
        try:
            return Buffer(name, shape, dtype, strides=strides, scope=scope, align=align)
        except TIRError as err:
            raise self.error(call, str(err)) from None

    # -- statements -------------------------------------------------------------------------

    def body(self, stmts: list) -> Stmt:
        """A statement list. A flat let / assert / allocate takes the rest of the list as body."""
        out: list[Stmt] = []
        for k, node in enumerate(stmts):
            if isinstance(node, ast.Pass):
                continue
            flat = self.flat_binder(node)
            if flat is not None:
                rest = stmts[k + 1:]
                if not rest:
                    raise self.error(node, f"expected the statements of the {flat}'s body after "
                                           f"it (write `pass` for none)")
                out.append(self.binder(node, flat, rest))
                break
            out.append(self.stmt(node))
        return out[0] if len(out) == 1 else SeqStmt(out)

    def flat_binder(self, node) -> str | None:
        if isinstance(node, ast.AnnAssign):
            return "let"
        if isinstance(node, ast.Assert):
            return "assert"
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            v = node.value
            name = self.tname(v.func) if isinstance(v, ast.Call) else None
            if name == "allocate":
                return "allocate"
            if name is not None and (name in ("alloc_buffer", "match_buffer", "Buffer")
                                     or name.startswith("axis.")
                                     or (_is_dtype(name) and not v.args and not v.keywords)):
                where = {"alloc_buffer": "at the top of a block (after its T.axis lines)",
                         "match_buffer": "at the top of the function",
                         "Buffer": "at the top of the function"}.get(name, "")
                if name.startswith("axis."):
                    where = "at the top of a block"
                elif not where:
                    where = "at the top of the function"
                raise self.error(node, f"T.{name} is only allowed {where}")
            return "let"
        return None

    def binder(self, node, kind: str, rest: list) -> Stmt:
        try:
            if kind == "let":
                if isinstance(node, ast.AnnAssign):
                    if not isinstance(node.target, ast.Name) or node.value is None:
                        raise self.error(node, "expected `name: T.<dtype> = value`")
                    dtype = self.annotation_dtype(node.annotation)
                    value = self.value(node.value, dtype)
                    name = node.target.id
                else:
                    value = self.value(node.value)
                    name = node.targets[0].id
                    dtype = value.dtype
                var = Var(name, dtype)
                with self.scope():
                    self.define(name, var, node)
                    return LetStmt(var, value, self.body(rest))
            if kind == "assert":
                cond = self.value(node.test)
                msg = "" if node.msg is None else self.string(node.msg, "assert message")
                return AssertStmt(cond, msg, self.body(rest))
            name = node.targets[0].id
            buf = self.allocate_buffer(name, node.value)
            with self.scope():
                self.define(name, buf, node)
                return Allocate(buf, self.body(rest))
        except TIRError as err:
            raise self.error(node, str(err)) from None

    def allocate_buffer(self, name: str, call: ast.Call) -> Buffer:
        return self.buffer(name, call, "T.allocate",
                           ["shape", "dtype", "scope", "strides", "align"])

    def annotation_dtype(self, node) -> str:
        name = self.tname(node)
        if name is None or not _is_dtype(name):
            raise self.error(node, f"expected a dtype annotation such as T.int64, got "
                                   f"{_show(node)}")
        return name

    def stmt(self, node) -> Stmt:
        try:
            return self._stmt(node)
        except (TIRError, dt.DataTypeError) as err:
            raise self.error(node, str(err)) from None

    def _stmt(self, node) -> Stmt:
        if isinstance(node, ast.Assign):
            if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Subscript):
                raise self.error(node, "expected a buffer store such as A[i] = value")
            target = node.targets[0]
            buf = self.lookup_buffer(target.value)
            indices = self.indices(target.slice)
            return BufferStore(buf, self.value(node.value, buf.dtype), indices)
        if isinstance(node, ast.Expr):
            v = node.value
            name = self.tname(v.func) if isinstance(v, ast.Call) else None
            if name == "evaluate":
                return Evaluate(self.value(self.bind(v, ["value"], 1, "T.evaluate")["value"]))
            if name in ("reads", "writes", "where", "block_attr"):
                raise self.error(node, f"T.{name} must come at the top of a block, before its body")
            if name == "func_attr":
                raise self.error(node, "T.func_attr must come at the top of the function")
            return Evaluate(self.value(v))
        if isinstance(node, ast.For):
            return self.for_loop(node)
        if isinstance(node, ast.With):
            return self.with_stmt(node)
        if isinstance(node, ast.If):
            cond = self.value(node.test)
            with self.scope():
                then = self.body(node.body)
            other = None
            if node.orelse:
                with self.scope():
                    other = self.body(node.orelse)
            return IfThenElse(cond, then, other)
        raise self.error(node, f"unsupported statement {type(node).__name__}; expected a "
                               f"buffer store, for, with, if, assert or T.evaluate")

    def for_loop(self, node: ast.For) -> Stmt:
        if node.orelse:
            raise self.error(node, "for ... else is not supported")
        it = node.iter
        name = self.tname(it.func) if isinstance(it, ast.Call) else None
        if name == "grid":
            if it.keywords or not it.args:
                raise self.error(it, "T.grid takes the loop extents")
            extents = [self.value(a) for a in it.args]
            targets = node.target.elts if isinstance(node.target, ast.Tuple) else [node.target]
            if len(targets) != len(extents) or not all(isinstance(t, ast.Name) for t in targets):
                raise self.error(node, f"T.grid with {len(extents)} extent(s) needs as many loop "
                                       f"variable names")
            with self.scope():
                loop_vars = []
                for t, e in zip(targets, extents):
                    v = Var(t.id, e.dtype)
                    self.define(t.id, v, t)
                    self.loops[id(v)] = (IntImm(0, e.dtype), e)
                    loop_vars.append(v)
                body = self.body(node.body)
            for v, e in reversed(list(zip(loop_vars, extents))):
                body = For(v, IntImm(0, e.dtype), e, "serial", body)
            return body
        if name not in _FOR_KINDS:
            raise self.error(it, f"expected range(...), T.serial/parallel/vectorized/unroll/"
                                 f"thread_binding(...) or T.grid(...), got {_show(it)}")
        kind = _FOR_KINDS[name]
        pos = list(it.args)
        kws = {k.arg: k.value for k in it.keywords}
        for k in kws:
            if k not in ("thread", "annotations", "dtype") or (name == "range"):
                raise self.error(it, f"{_show(it.func)}: unexpected keyword argument {k!r}")
        if name == "thread_binding" and pos and isinstance(pos[-1], ast.Constant) \
                and isinstance(pos[-1].value, str):
            kws.setdefault("thread", pos.pop())
        rng = self.range_of(pos, it)
        thread = self.string(kws["thread"], "thread") if "thread" in kws else None
        if kind == "thread_binding" and thread is None:
            raise self.error(it, 'T.thread_binding needs thread="threadIdx.x" (or another tag)')
        annotations = self.attr_dict(kws["annotations"], "annotations") \
            if "annotations" in kws else None
        dtype = self.dtype_arg(kws["dtype"], "loop dtype") if "dtype" in kws else rng.extent.dtype
        if not isinstance(node.target, ast.Name):
            raise self.error(node.target, "expected one loop variable name")
        v = Var(node.target.id, dtype)
        with self.scope():
            self.define(v.name, v, node.target)
            self.loops[id(v)] = (rng.min, rng.extent)
            body = self.body(node.body)
        return For(v, rng.min, rng.extent, kind, body, thread_tag=thread, annotations=annotations)

    def with_stmt(self, node: ast.With) -> Stmt:
        if len(node.items) != 1:
            raise self.error(node, "expected one item in a with statement")
        item = node.items[0]
        call = item.context_expr
        name = self.tname(call.func) if isinstance(call, ast.Call) else None
        target = item.optional_vars
        if name == "block":
            if target is not None:
                raise self.error(node, "with T.block(...) takes no `as` target")
            return self.block(node, call)
        if name == "init":
            raise self.error(node, "with T.init() is only allowed at the top of a block")
        if name == "Assert":
            args = self.bind(call, ["condition", "message"], 2, "T.Assert")
            cond = self.value(args["condition"])
            msg = self.string(args["message"], "T.Assert message")
            with self.scope():
                return AssertStmt(cond, msg, self.body(node.body))
        if name in ("LetStmt", "allocate"):
            if not isinstance(target, ast.Name):
                raise self.error(node, f"with T.{name}(...) needs `as name`")
            if name == "LetStmt":
                args = self.bind(call, ["value"], 1, "T.LetStmt")
                value = self.value(args["value"])
                var = Var(target.id, value.dtype)
                with self.scope():
                    self.define(target.id, var, target)
                    return LetStmt(var, value, self.body(node.body))
            buf = self.allocate_buffer(target.id, call)
            with self.scope():
                self.define(target.id, buf, target)
                return Allocate(buf, self.body(node.body))
        raise self.error(node, f"expected with T.block(...), T.LetStmt(...), T.Assert(...) or "
                               f"T.allocate(...), got {_show(call)}")

    def block(self, node: ast.With, call: ast.Call) -> BlockRealize:
        args = self.bind(call, ["name"], 1, "T.block")
        bname = self.string(args["name"], "block name")
        iter_vars, values = [], []
        predicate = None
        reads = writes = annotations = init = None
        allocs = []
        stmts = node.body
        with self.scope():
            k = 0
            while k < len(stmts):
                s = stmts[k]
                kind = self.block_header(s)
                if kind is None:
                    break
                try:
                    if kind == "axis":
                        self.axis(s, iter_vars, values)
                    elif kind == "remap":
                        self.remap(s, iter_vars, values)
                    elif kind == "alloc":
                        name = s.targets[0].id
                        buf = self.buffer(name, s.value, "T.alloc_buffer",
                                          ["shape", "dtype", "strides", "scope", "align"])
                        self.define(name, buf, s)
                        allocs.append(buf)
                    elif kind == "init":
                        if init is not None:
                            raise self.error(s, "a block has at most one T.init()")
                        with self.scope():
                            init = self.body(s.body)
                    else:
                        c = s.value
                        if kind == "where":
                            if predicate is not None:
                                raise self.error(s, "a block has at most one T.where")
                            predicate = self.value(self.bind(c, ["predicate"], 1,
                                                             "T.where")["predicate"])
                        elif kind == "reads":
                            if reads is not None:
                                raise self.error(s, "a block has at most one T.reads")
                            reads = self.regions(c)
                        elif kind == "writes":
                            if writes is not None:
                                raise self.error(s, "a block has at most one T.writes")
                            writes = self.regions(c)
                        else:
                            if annotations is not None:
                                raise self.error(s, "a block has at most one T.block_attr")
                            annotations = self.attr_dict(
                                self.bind(c, ["attrs"], 1, "T.block_attr")["attrs"], "T.block_attr")
                except TIRError as err:
                    raise self.error(s, str(err)) from None
                k += 1
            rest = stmts[k:]
            if not rest:
                raise self.error(node, f"block {bname!r} has no body (write `pass` for none)")
            body = self.body(rest)
        try:
            block = Block(bname, iter_vars, reads or [], writes or [], body, init=init,
                          alloc_buffers=allocs, annotations=annotations)
            return BlockRealize(values, predicate, block)
        except TIRError as err:
            raise self.error(node, str(err)) from None

    def block_header(self, s) -> str | None:
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.value, ast.Call):
            name = self.tname(s.value.func)
            t = s.targets[0]
            if isinstance(t, ast.Name) and name in _AXIS_KINDS:
                return "axis"
            if isinstance(t, ast.Name) and name == "alloc_buffer":
                return "alloc"
            if isinstance(t, (ast.Tuple, ast.Name)) and name == "axis.remap":
                return "remap"
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            name = self.tname(s.value.func)
            if name in ("where", "reads", "writes", "block_attr"):
                return name
        if isinstance(s, ast.With) and len(s.items) == 1 \
                and isinstance(s.items[0].context_expr, ast.Call) \
                and self.tname(s.items[0].context_expr.func) == "init":
            return "init"
        return None

    def axis(self, s: ast.Assign, iter_vars: list, values: list):
        call = s.value
        kind = _AXIS_KINDS[self.tname(call.func)]
        args = self.bind(call, ["dom", "binding", "dtype"], 2, f"T.axis.{kind}")
        dom = args["dom"]
        if isinstance(dom, ast.Tuple):
            if len(dom.elts) != 2:
                raise self.error(dom, "an axis domain is an extent or (start, stop)")
            rng = self.range_of(dom.elts, dom)
        else:
            rng = self.range_of([dom], dom)
        binding = self.value(args["binding"])
        dtype = self.dtype_arg(args["dtype"], "axis dtype") if "dtype" in args else rng.extent.dtype
        name = s.targets[0].id
        v = Var(name, dtype)
        iter_vars.append(IterVar(v, rng, kind))
        values.append(binding)
        self.define(name, v, s)

    def remap(self, s: ast.Assign, iter_vars: list, values: list):
        call = s.value
        args = self.bind(call, ["kinds", "bindings"], 2, "T.axis.remap")
        kinds = self.string(args["kinds"], "T.axis.remap kinds")
        bnode = args["bindings"]
        bindings = bnode.elts if isinstance(bnode, (ast.List, ast.Tuple)) else [bnode]
        t = s.targets[0]
        targets = t.elts if isinstance(t, ast.Tuple) else [t]
        if not (len(kinds) == len(bindings) == len(targets)):
            raise self.error(s, f"T.axis.remap: {len(kinds)} kinds, {len(bindings)} bindings and "
                                f"{len(targets)} names differ in number")
        for ch, b, tn in zip(kinds, bindings, targets):
            if ch not in "SR" or not isinstance(tn, ast.Name):
                raise self.error(s, 'T.axis.remap kinds are "S" (spatial) or "R" (reduce)')
            lv = self.value(b)
            dom = self.loops.get(id(lv)) if isinstance(lv, Var) else None
            if dom is None:
                raise self.error(b, f"T.axis.remap binds loop variables; {_show(b)} is not one")
            v = Var(tn.id, lv.dtype)
            iter_vars.append(IterVar(v, Range(dom[0], dom[1]), "spatial" if ch == "S" else "reduce"))
            values.append(lv)
            self.define(tn.id, v, tn)

    # -- functions and modules --------------------------------------------------------------

    def decorator(self, node, expected: str) -> dict:
        """Check a ``@T.prim_func`` / ``@I.ir_module`` decorator; returns its keyword args."""
        what = "@T.prim_func" if expected == "T.prim_func" else "@I.ir_module"
        if len(node.decorator_list) != 1:
            raise self.error(node, f"expected the decorator {what}")
        d = node.decorator_list[0]
        call = d if isinstance(d, ast.Call) else None
        f = call.func if call else d
        mod, _, attr = expected.partition(".")
        if not (isinstance(f, ast.Attribute) and f.attr == attr and isinstance(f.value, ast.Name)
                and f.value.id == mod):
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "R":
                raise self.error(d, "relax functions (@R.function) are not read by "
                                    "tensorir.parse")
            raise self.error(d, f"expected the decorator {what}, got @{_show(d)}")
        if call is None:
            return {}
        if call.args:
            raise self.error(d, f"{what} takes keyword arguments only")
        return {k.arg: k.value for k in call.keywords}

    def prim_func(self, fdef) -> tuple[str, PrimFunc]:
        if not isinstance(fdef, ast.FunctionDef):
            raise self.error(fdef, f"expected a @T.prim_func function, got {_show(fdef)}")
        kwargs = self.decorator(fdef, "T.prim_func")
        name = fdef.name
        for k, v in kwargs.items():
            if k == "name":
                name = self.string(v, "@T.prim_func name")
            elif k != "private":
                raise self.error(v, f"@T.prim_func: unexpected keyword argument {k!r}")
        a = fdef.args
        if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or a.defaults:
            raise self.error(fdef, "prim_func parameters are plain `name: annotation` entries")
        with self.scope():
            params: list = [None] * len(a.args)
            buffer_map = {}
            pending = []
            for k, arg in enumerate(a.args):
                ann = arg.annotation
                if ann is None:
                    raise self.error(arg, f"parameter {arg.arg} needs an annotation: "
                                          f"T.Buffer(...), T.handle or T.<dtype>")
                if isinstance(ann, ast.Call) and self.tname(ann.func) == "Buffer":
                    pending.append((k, arg))
                    continue
                dtype = self.annotation_dtype(ann)
                params[k] = Var(arg.arg, dtype)
                self.define(arg.arg, params[k], arg)
            # leading header statements: attrs, symbolic vars, match_buffer, free buffers
            stmts = list(fdef.body)
            if stmts and isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant) \
                    and isinstance(stmts[0].value.value, str):
                stmts = stmts[1:]  # a docstring
            header = []
            while stmts and self.func_header(stmts[0]) is not None:
                header.append(stmts.pop(0))
            for s in header:  # symbolic vars first: the signature may use them
                if self.func_header(s) == "var":
                    v = Var(s.targets[0].id, self.tname(s.value.func))
                    self.define(v.name, v, s)
            for k, arg in pending:
                buf = self.buffer(arg.arg, arg.annotation, "T.Buffer",
                                  ["shape", "dtype", "strides", "scope", "align"])
                params[k] = Var(arg.arg + "_handle", "handle")
                buffer_map[params[k]] = buf
                self.define(arg.arg, buf, arg)
            attr_stmts = [s for s in header if self.func_header(s) == "attr"]
            if len(attr_stmts) > 1:
                raise self.error(attr_stmts[1], "a function has at most one T.func_attr")
            for s in header:
                kind = self.func_header(s)
                if kind == "match":
                    bname = s.targets[0].id
                    args = self.bind(s.value, ["param", "shape", "dtype", "strides", "scope",
                                               "align"], 2, "T.match_buffer")
                    h = args["param"]
                    hv = self.lookup(h.id, h) if isinstance(h, ast.Name) else None
                    if not isinstance(hv, Var) or hv.dtype != dt.HANDLE or hv not in params:
                        raise self.error(s, f"T.match_buffer's first argument must be a T.handle "
                                            f"parameter, got {_show(h)}")
                    if hv in buffer_map:
                        raise self.error(s, f"parameter {h.id} is matched twice")
                    rest = ast.Call(func=s.value.func, args=s.value.args[1:],
                                    keywords=[kw for kw in s.value.keywords if kw.arg != "param"])
                    ast.copy_location(rest, s.value)
                    buf = self.buffer(bname, rest, "T.match_buffer",
                                      ["shape", "dtype", "strides", "scope", "align"])
                    buffer_map[hv] = buf
                    self.define(bname, buf, s)
                elif kind == "buffer":
                    bname = s.targets[0].id
                    buf = self.buffer(bname, s.value, "T.Buffer",
                                      ["shape", "dtype", "strides", "scope", "align"])
                    self.define(bname, buf, s)
            attrs = None
            for s in attr_stmts:  # last: attribute values may name any declared buffer
                attrs = self.attr_dict(
                    self.bind(s.value, ["attrs"], 1, "T.func_attr")["attrs"], "T.func_attr")
            if not stmts:
                raise self.error(fdef, f"function {fdef.name} has no body (write `pass` for none)")
            body = self.body(stmts)
        for p in params:
            if p.dtype == dt.HANDLE and p not in buffer_map:
                raise self.error(fdef, f"handle parameter {p.name} has no T.match_buffer")
        try:
            return name, PrimFunc(params, body, buffer_map, attrs)
        except TIRError as err:
            raise self.error(fdef, str(err)) from None

    def func_header(self, s) -> str | None:
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) \
                and self.tname(s.value.func) == "func_attr":
            return "attr"
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
                and isinstance(s.value, ast.Call):
            name = self.tname(s.value.func)
            if name is None:
                return None
            if _is_dtype(name) and not s.value.args and not s.value.keywords:
                return "var"
            if name == "match_buffer":
                return "match"
            if name == "Buffer":
                return "buffer"
        return None

    def module(self, cdef: ast.ClassDef) -> IRModule:
        self.decorator(cdef, "I.ir_module")
        funcs = {}
        for node in cdef.body:
            if isinstance(node, ast.Pass):
                continue
            name, f = self.prim_func(node)
            if name in funcs:
                raise self.error(node, f"the module defines {name!r} twice")
            funcs[name] = f
        return IRModule(funcs)


def _show(node) -> str:
    """Short source text of an AST node for error messages."""
    if node is None:
        return "nothing"
    try:
        text = ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every node ast.parse makes
        text = type(node).__name__
    return text if len(text) <= 60 else text[:57] + "..."
