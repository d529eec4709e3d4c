"""Navigation and surgery on a PrimFunc's statement tree, shared by every schedule primitive.

Blocks are found by name and loops by their loop variable; both survive the rebuilding that every
(immutable) transformation does, as long as the primitive keeps them. ``replace`` swaps one
statement (found by identity) for another and rebuilds the path above it.
"""
from __future__ import annotations

from typing import Callable, Iterator

from ..expr import Var
from ..function import PrimFunc
from ..functor import IRMutator
from ..stmt import (Allocate, AssertStmt, Block, BlockRealize, For, IfThenElse, LetStmt, SeqStmt,
                    Stmt, seq)


def stmt_children(s: Stmt) -> list[Stmt]:
    """The statements directly inside ``s``."""
    if isinstance(s, SeqStmt):
        return list(s.seq)
    if isinstance(s, (For, LetStmt, AssertStmt, Allocate)):
        return [s.body]
    if isinstance(s, BlockRealize):
        return [s.block]
    if isinstance(s, Block):
        return [s.body] if s.init is None else [s.init, s.body]
    if isinstance(s, IfThenElse):
        return [s.then_case] + ([s.else_case] if s.else_case is not None else [])
    return []


def walk(s: Stmt, parents: tuple = ()) -> Iterator[tuple[Stmt, tuple]]:
    """Pre-order (stmt, ancestors-outermost-first) pairs."""
    yield s, parents
    for c in stmt_children(s):
        yield from walk(c, parents + (s,))


def find_block(func: PrimFunc, name: str) -> tuple[BlockRealize, tuple]:
    """The BlockRealize of the block called ``name`` and its ancestors; KeyError if none,
    ValueError if several."""
    hits = [(s, p) for s, p in walk(func.body) if isinstance(s, BlockRealize) and s.block.name == name]
    if not hits:
        raise KeyError(name)
    if len(hits) > 1:
        raise ValueError(f"{len(hits)} blocks are named {name!r}")
    return hits[0]


def find_loop(func: PrimFunc, loop_var: Var) -> tuple[For, tuple]:
    """The For whose loop variable is ``loop_var`` and its ancestors; KeyError if none."""
    for s, p in walk(func.body):
        if isinstance(s, For) and s.loop_var is loop_var:
            return s, p
    raise KeyError(loop_var.name)


def all_blocks(func: PrimFunc) -> list[BlockRealize]:
    return [s for s, _ in walk(func.body) if isinstance(s, BlockRealize)]


def enclosing_block(ancestors: tuple) -> Block | None:
    """The innermost Block among ``ancestors`` (the scope a statement lives in)."""
    for a in reversed(ancestors):
        if isinstance(a, Block):
            return a
    return None


def loops_between(ancestors: tuple) -> list[For]:
    """The For loops among ``ancestors`` below the innermost enclosing block, outermost first."""
    out: list[For] = []
    for a in reversed(ancestors):
        if isinstance(a, Block):
            break
        if isinstance(a, For):
            out.append(a)
    return list(reversed(out))


def child_block_realizes(s: Stmt) -> list[BlockRealize]:
    """BlockRealizes under ``s`` that are not nested inside another block below ``s``."""
    out = []

    def rec(x):
        for c in stmt_children(x):
            if isinstance(c, BlockRealize):
                out.append(c)
            else:
                rec(c)

    if isinstance(s, BlockRealize):
        s = s.block
    if isinstance(s, Block):
        rec(s.body)  # the init of a block holds no blocks
    else:
        rec(s)
    return out


class _Replacer(IRMutator):
    def __init__(self, old: Stmt, new: Stmt | None):
        super().__init__()
        self.old, self.new, self.done = old, new, False

    def visit(self, node):
        if node is self.old:
            self.done = True
            return self.new
        if isinstance(node, (Var,)) or not isinstance(node, Stmt):
            return node  # expressions never contain statements
        return super().visit(node)

    def visit_SeqStmt(self, s: SeqStmt):
        items = [self.visit(x) for x in s.seq]
        if all(a is b for a, b in zip(items, s.seq)):
            return s
        items = [x for x in items if x is not None]
        if not items:
            return None
        return seq(*items)

    def generic_visit(self, node):
        # only walk statement-valued fields; expressions and buffers never hold statements
        changed = {}
        for f in node._fields:
            old = getattr(node, f)
            if isinstance(old, Stmt):
                new = self.visit(old)
                if new is not old:
                    changed[f] = new
        if not changed:
            return node
        kw = {f: getattr(node, f) for f in node._fields}
        kw.update(changed)
        if "annotations" in kw:
            kw["annotations"] = dict(kw["annotations"])
        return type(node)(**kw)


def replace(func: PrimFunc, old: Stmt, new: Stmt | None) -> PrimFunc:
    """``func`` with the statement ``old`` (by identity) replaced by ``new`` (None removes it)."""
    r = _Replacer(old, new)
    body = r.visit(func.body)
    if not r.done:
        raise KeyError("statement to replace is not in the function")
    return func.replace(body=body)


def map_blocks(stmt: Stmt, fn: Callable[[BlockRealize], Stmt]) -> Stmt:
    """Rebuild ``stmt`` with every BlockRealize ``br`` below it replaced by ``fn(br)``."""

    class M(IRMutator):
        def visit_BlockRealize(self, br):
            return fn(br)

    return M().visit(stmt)
