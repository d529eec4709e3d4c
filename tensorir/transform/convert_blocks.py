"""``LowerInitBlock`` and ``ConvertBlocksToLoops``: from TensorIR blocks to plain loops."""
from __future__ import annotations

from .. import arith
from ..expr import IntImm, TIRError, true
from ..function import PrimFunc
from ..functor import IRMutator
from ..stmt import Allocate, Block, BlockRealize, For, IfThenElse, Stmt, is_true, seq
from ._common import VarSubstituter, affine_coeffs, prim_func_pass, subst, uses_any

# Loop kinds whose iterations run in order, so "before the first iteration" is well defined.
_ORDERED_KINDS = ("serial", "unrolled", "vectorized")


def init_condition(block: Block):
    """``all(v == v.dom.min for reduce iter vars v)``, or None when the block has none."""
    cond = None
    for iv in block.iter_vars:
        if iv.kind == "reduce":
            c = iv.var == iv.dom.min
            cond = c if cond is None else cond & c
    return cond


def _init_into_body(block: Block) -> Block:
    cond = init_condition(block)
    init = block.init if cond is None else IfThenElse(cond, block.init)
    return block.replace(body=seq(init, block.body), init=None)


class _InitLowerer(IRMutator):
    def visit_Block(self, block):
        block = self.generic_visit(block)
        return block if block.init is None else _init_into_body(block)


@prim_func_pass
def LowerInitBlock(func: PrimFunc) -> PrimFunc:
    """Move each block's ``init`` into its body as ``if (all reduce vars at their min): init``.

    The result is still in block form (schedulable); ``ConvertBlocksToLoops`` does the same and
    also hoists the init out of the reduction loops where it can.

    Examples
    --------
    >>> from tilecraft.tensorir import te, transform
    >>> A = te.placeholder((4, 8), "float32", "A")
    >>> k = te.reduce_axis((0, 8), "k")
    >>> B = te.compute((4,), lambda i: te.sum(A[i, k], axis=k), "B")
    >>> f = transform.LowerInitBlock(te.create_prim_func([A, B]))
    """
    body = _InitLowerer().visit(func.body)
    return func if body is func.body else func.replace(body=body)


class _BlockLowerer(IRMutator):
    # -- loops: hoist a reduction init out of the reduce loops around its block
    def visit_For(self, loop: For):
        hoisted = self._hoist_init(loop)
        if hoisted is not None:
            return hoisted
        return self.generic_visit(loop)

    def _hoist_init(self, loop: For) -> Stmt | None:
        """``for k: block(init, body)`` -> ``init; for k: body`` when "every reduce iter var at
        its min" means exactly "the first iteration of the loops from ``loop`` inwards".

        That holds when those loops run in order from their min, each reduce iter value is
        affine in their vars with non-negative coefficients (so it is smallest at the first
        iteration, and only there once every loop var has a positive coefficient somewhere),
        equals its domain's min at the first iteration, and the spatial iter values do not
        depend on the loops. The 1:1 case ``vk = k`` and a split ``vk = ko * 4 + ki`` both fit.
        """
        chain = []
        s: Stmt = loop
        while isinstance(s, For):
            chain.append(s)
            s = s.body
        if not isinstance(s, BlockRealize) or s.block.init is None:
            return None
        realize, block = s, s.block
        if block.alloc_buffers or not any(iv.kind == "reduce" for iv in block.iter_vars):
            return None
        loop_vars = [f.loop_var for f in chain]
        if any(f.kind not in _ORDERED_KINDS for f in chain) or \
                any(uses_any(f.min, loop_vars) or uses_any(f.extent, loop_vars) for f in chain):
            return None
        first = {f.loop_var: f.min for f in chain}
        positive = set()
        for iv, value in zip(block.iter_vars, realize.iter_values):
            if iv.kind != "reduce":
                if uses_any(value, loop_vars):
                    return None
                continue
            affine = affine_coeffs(arith.simplify(value), loop_vars)
            if affine is None or any(c < 0 for c in affine[0].values()):
                return None
            positive.update(affine[0])
            start = arith.simplify(subst(value, first) - iv.dom.min)
            if not (isinstance(start, IntImm) and start.value == 0):
                return None
        if len(positive) != len(chain):
            return None
        # the init ran at the first iteration only: spatial vars at their values, reduce vars
        # at their min, guarded by the predicate of that iteration
        vmap = {iv.var: (iv.dom.min if iv.kind == "reduce" else v)
                for iv, v in zip(block.iter_vars, realize.iter_values)}
        init = self.visit(subst(block.init, vmap))
        pred = arith.simplify(subst(realize.predicate, first))
        if not is_true(pred):
            init = IfThenElse(pred, init)
        body: Stmt = realize.replace(block=block.replace(init=None))
        for f in reversed(chain):
            body = f.replace(body=body)
        return seq(init, self.visit(body))

    # -- blocks
    def visit_BlockRealize(self, realize: BlockRealize):
        block = realize.block
        if block.init is not None:
            block = _init_into_body(block)
        vmap = {iv.var: v for iv, v in zip(block.iter_vars, realize.iter_values)}
        sub = VarSubstituter(vmap)
        body = self.visit(sub.visit(block.body))
        for buf in reversed(block.alloc_buffers):
            body = Allocate(sub.visit(buf), body)
        if not is_true(realize.predicate):
            body = IfThenElse(realize.predicate, body)
        return body

    def visit_Block(self, block: Block):
        # a Block outside a BlockRealize has no values for its iter vars
        if block.iter_vars:
            raise TIRError(f"ConvertBlocksToLoops: block {block.name} is not inside a "
                           f"BlockRealize, so its iteration variables have no values", block)
        return self.visit_BlockRealize(BlockRealize([], true(), block))


@prim_func_pass
def ConvertBlocksToLoops(func: PrimFunc) -> PrimFunc:
    """Remove every Block / BlockRealize.

    Each block iter var is replaced by its iter value; a non-trivial predicate becomes an
    ``IfThenElse`` around the block's body; ``alloc_buffers`` (the root block's intermediates
    included) become ``Allocate`` statements around it; a reduction ``init`` becomes
    ``IfThenElse(all reduce vars == their min, init)`` before the body, or is *hoisted* out
    of the innermost loops around the block when the reduce iter values are those loops'
    variables (``vk = k``, or split: ``vk = ko * 4 + ki``; affine with non-negative
    coefficients, at the domain's min on the first iteration) and the spatial values do not
    depend on them: then no test is left in the reduction loop. Block annotations are
    dropped.

    Examples
    --------
    >>> from tilecraft.tensorir import te, transform
    >>> A = te.placeholder((4, 8), "float32", "A")
    >>> k = te.reduce_axis((0, 8), "k")
    >>> B = te.compute((4,), lambda i: te.sum(A[i, k], axis=k), "B")
    >>> f = transform.ConvertBlocksToLoops(te.create_prim_func([A, B]))
    >>> # for i: { B[i] = 0.0; for k: B[i] = B[i] + A[i, k] }
    """
    body = _BlockLowerer().visit(func.body)
    return func if body is func.body else func.replace(body=body)


__all__ = ["LowerInitBlock", "ConvertBlocksToLoops", "init_condition"]
