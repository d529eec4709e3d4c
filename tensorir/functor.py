"""Generic traversal of the immutable IR: the walker convention, visitors, mutators, substitution.

Every walk over the IR -- passes, the code generators (``targets``), the interpreter -- is an
``IRFunctor``: ``visit(node, *args)`` calls the method ``visit_<ClassName>(node, *args)`` of the
node's class (``visit_For``, ``visit_Add``, ...), and ``visit_default(node, *args)`` for a class
the walker has no method for. ``IRVisitor`` and ``IRMutator`` make ``visit_default`` recurse into
the children; a code generator makes it raise (an expression it cannot translate is an error).

A mutator returns the *same* node object when nothing below it changed, so passes that touch
little allocate little and identity checks (``new is old``) tell whether a pass did anything.

Subclass ``IRMutator`` and define ``visit_<ClassName>(self, node)`` for the nodes you care about;
call ``self.generic_visit(node)`` to recurse into the children.
"""
from __future__ import annotations

from typing import Callable, Mapping

from .expr import Let, Node, PrimExpr, TIRError, Var, convert
from .function import PrimFunc
from .stmt import Block, Buffer, For, LetStmt, Stmt


def children(node: Node) -> list[Node]:
    """The Node children of ``node`` in field order (through tuples and buffer maps)."""
    out: list[Node] = []
    for f in node._fields:
        value = getattr(node, f)
        if isinstance(value, Node):
            out.append(value)
        elif isinstance(value, (tuple, list)):
            _nodes_in(value, out)
    return out


def _nodes_in(values, out: list) -> None:
    # a list built in place, not nested generators: every walk of the IR goes through here
    for v in values:
        if isinstance(v, Node):
            out.append(v)
        elif isinstance(v, (tuple, list)):
            _nodes_in(v, out)


class IRFunctor:
    """Dispatch on the type of a node: the one walker convention of the IR.

    ``visit(node, *args)`` calls ``self.visit_<type(node).__name__>(node, *args)`` when the
    class defines it, else ``self.visit_default(node, *args)``, which raises. The extra
    arguments are the walker's own (the interpreter passes the active-lane mask).

    Examples
    --------
    >>> from tilecraft.tensorir import var
    >>> class Printer(IRFunctor):
    ...     def visit_Var(self, v):
    ...         return v.name
    ...     def visit_Add(self, e):
    ...         return f"({self.visit(e.a)} + {self.visit(e.b)})"
    >>> i, j = var("i"), var("j")
    >>> Printer().visit(i + j)
    '(i + j)'

    ``Printer().visit(i * j)`` raises ``TIRError("Printer has no visit_Mul for i * j")``.
    """

    # node class -> the function ``visit`` calls, per walker class (filled on first use):
    # the name lookup once per class and node class, not once per node
    _dispatch: dict = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._dispatch = {}

    def visit(self, node, *args):
        try:
            fn = self._dispatch[type(node)]
        except KeyError:
            fn = self._resolve(type(node))
        return fn(self, node, *args)

    @classmethod
    def _resolve(cls, node_type: type):
        fn = getattr(cls, "visit_" + node_type.__name__, None)
        if fn is None:
            fn = cls.visit_default
        cls._dispatch[node_type] = fn
        return fn

    def visit_default(self, node, *args):
        """What ``visit`` does for a node class without a ``visit_<ClassName>`` method."""
        raise TIRError(f"{type(self).__name__} has no visit_{type(node).__name__} for {node!r}",
                       node if isinstance(node, Node) else None)


class IRVisitor(IRFunctor):
    """Read-only pre-order traversal; ``visit_<ClassName>`` hooks, ``generic_visit`` recurses."""

    def __init__(self):
        self._seen_buffers: set[int] = set()

    def visit_default(self, node):
        return self.generic_visit(node)

    def generic_visit(self, node):
        if isinstance(node, Buffer):
            # a buffer's shape is visited once, however often the buffer is used
            if id(node) in self._seen_buffers:
                return
            self._seen_buffers.add(id(node))
        for c in children(node):
            self.visit(c)


class IRMutator(IRFunctor):
    """Rebuilding traversal; returns the same object where nothing changed.

    Buffers are mutated once and memoized, so every reference to a buffer maps to the same new
    buffer.
    """

    def __init__(self):
        self.buffer_map: dict[Buffer, Buffer] = {}

    def visit_default(self, node):
        return self.generic_visit(node)

    def visit_Buffer(self, buf: Buffer):
        if buf in self.buffer_map:
            return self.buffer_map[buf]
        new = self.generic_visit(buf)
        self.buffer_map[buf] = new
        return new

    def visit_Var(self, v: Var):
        return v

    def _mutate_value(self, value):
        if isinstance(value, Node):
            return self.visit(value)
        if isinstance(value, tuple):
            return self._mutate_tuple(value)
        return value

    def _mutate_tuple(self, value: tuple) -> tuple:
        """``value`` with its nodes mutated; the same tuple when none changed."""
        new = None
        for k, v in enumerate(value):
            if isinstance(v, Node):
                w = self.visit(v)
            elif isinstance(v, tuple):
                w = self._mutate_tuple(v)
            else:
                continue
            if w is not v:
                if new is None:
                    new = list(value)
                new[k] = w
        return value if new is None else tuple(new)

    def generic_visit(self, node):
        changed = None
        for f in node._fields:
            old = getattr(node, f)
            if isinstance(old, Node):
                new = self.visit(old)
            elif isinstance(old, tuple):
                new = self._mutate_tuple(old)
            else:
                continue
            if new is not old:
                if changed is None:
                    changed = {}
                changed[f] = new
        if changed is None:
            return node
        return _rebuild(node, changed)


def _rebuild(node, changed):
    if isinstance(node, PrimFunc):
        if "buffer_map" in changed:
            changed["buffer_map"] = dict(changed["buffer_map"])
        return node.replace(**changed)
    if isinstance(node, Buffer):
        # a new buffer object: identity changes, which is what a substitution into a shape means
        kw = {f: getattr(node, f) for f in node._fields}
        kw.update(changed)
        return Buffer(**kw)
    kwargs = {f: getattr(node, f) for f in node._fields}
    kwargs.update(changed)
    if "annotations" in kwargs and isinstance(kwargs["annotations"], tuple):
        kwargs["annotations"] = dict(kwargs["annotations"])
    return type(node)(**kwargs)


class _Substituter(IRMutator):
    def __init__(self, vmap: Mapping[Var, PrimExpr] | Callable[[Var], PrimExpr | None]):
        super().__init__()
        self.vmap = vmap

    def visit_Var(self, v):
        if callable(self.vmap):
            r = self.vmap(v)
        else:
            r = self.vmap.get(v)
        return v if r is None else r


def substitute(node, vmap):
    """Replace variables in ``node``: ``vmap`` is a dict Var -> expr, or a function Var -> expr|None.

    Examples
    --------
    >>> from tilecraft.tensorir import var
    >>> i = var("i")
    >>> substitute(i + 1, {i: i * 2})
    i * 2 + 1
    """
    if not vmap:
        return node
    if isinstance(vmap, Mapping):
        vmap = {k: (v if isinstance(v, Node) else _const(v, k)) for k, v in vmap.items()}
    return _Substituter(vmap).visit(node)


def _const(value, like: Var):
    return convert(value, like)


def post_order_visit(node, fn: Callable[[Node], None]) -> None:
    """Call ``fn`` on every node below ``node`` (children first), buffers' shapes included once."""
    seen: set[int] = set()

    def rec(n):
        if isinstance(n, Buffer):
            if id(n) in seen:
                return
            seen.add(id(n))
        # the children in field order, as ``children`` lists them, without building the list
        for f in n._fields:
            value = getattr(n, f)
            if isinstance(value, Node):
                rec(value)
            elif isinstance(value, (tuple, list)):
                seq(value)
        fn(n)

    def seq(values):
        for v in values:
            if isinstance(v, Node):
                rec(v)
            elif isinstance(v, (tuple, list)):
                seq(v)

    rec(node)


def visit_stmts(stmt: Stmt, fn: Callable[[Stmt], None]) -> None:
    """Call ``fn`` on ``stmt`` and every statement below it (parents first), through statements
    only: expressions are not walked, which makes it much cheaper than ``post_order_visit``
    where only statements matter (blocks, stores).

    >>> from tilecraft.tensorir import te
    >>> A = te.placeholder((4,), "float32", "A")
    >>> f = te.create_prim_func([A, te.compute((4,), lambda i: A[i] + 1.0, "B")])
    >>> found = []
    >>> visit_stmts(f.body, lambda s: found.append(type(s).__name__))
    >>> "BufferStore" in found
    True
    """
    def rec(s):
        fn(s)
        for f in s._fields:
            value = getattr(s, f)
            if isinstance(value, Stmt):
                rec(value)
            elif isinstance(value, (tuple, list)):
                for x in value:
                    if isinstance(x, Stmt):
                        rec(x)
    rec(stmt)


def free_vars(node) -> list[Var]:
    """Variables used in ``node`` that ``node`` does not define (loop, iter and let vars are
    defined), in first-use order."""
    defined: set[Var] = set()
    out: dict[Var, None] = {}
    # a buffer's shape and strides are walked once, however many loads and stores name it:
    # what a later walk could add is in ``out`` or ``defined`` already (both only grow)
    seen_buffers: set[int] = set()

    def rec(n):
        if isinstance(n, Var):
            if n not in defined:
                out.setdefault(n, None)
            return
        if isinstance(n, Buffer):
            if id(n) in seen_buffers:
                return
            seen_buffers.add(id(n))
        elif isinstance(n, For):
            defined.add(n.loop_var)
        elif isinstance(n, Block):
            for iv in n.iter_vars:
                defined.add(iv.var)
        elif isinstance(n, (LetStmt, Let)):
            defined.add(n.var)
        # the children in field order, as ``children`` lists them, without building the list
        for f in n._fields:
            value = getattr(n, f)
            if isinstance(value, Node):
                rec(value)
            elif isinstance(value, (tuple, list)):
                seq(value)

    def seq(values):
        for v in values:
            if isinstance(v, Node):
                rec(v)
            elif isinstance(v, (tuple, list)):
                seq(v)

    rec(node)
    return [v for v in out if v not in defined]
