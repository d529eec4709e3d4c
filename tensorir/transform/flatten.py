"""``FlattenBuffers``: every buffer becomes one-dimensional; indices are linearized."""
from __future__ import annotations

from typing import Sequence

from .. import arith
from ..expr import BufferLoad, IntImm, PrimExpr, TIRError
from ..function import PrimFunc
from ..functor import IRMutator
from ..stmt import Allocate, Block, BlockRealize, Buffer, BufferStore
from ._common import fold_add, fold_mul, prim_func_pass, shape_vars_of, to_int64


def flat_size(buf: Buffer) -> PrimExpr:
    """The number of elements the flat form of ``buf`` needs (int64).

    Compact buffers need the product of their shape. A strided buffer needs one past its last
    element, ``1 + sum((shape[d] - 1) * strides[d])`` (0 when a dimension is known empty).
    """
    shape = [to_int64(s) for s in buf.shape]
    if buf.strides is None:
        size: PrimExpr = IntImm(1, "int64")
        for s in shape:
            size = fold_mul(size, s)
    elif any(isinstance(s, IntImm) and s.value == 0 for s in shape):
        return IntImm(0, "int64")
    else:
        size = IntImm(1, "int64")
        for s, st in zip(shape, buf.strides):
            size = fold_add(size, fold_mul(fold_add(s, IntImm(-1, "int64")), to_int64(st)))
    # context-free simplification holds everywhere: n * 3 * 8 -> n * 24
    return arith.simplify(size)


def flat_buffer(buf: Buffer) -> Buffer:
    """The 1-D buffer holding ``buf``'s elements: same name, dtype, scope and alignment.

    A compact 1-D buffer is its own flat form (so flattening twice changes nothing).
    """
    if buf.ndim == 1 and buf.strides is None and buf.shape[0].dtype == "int64":
        return buf
    return Buffer(buf.name, (flat_size(buf),), buf.dtype, scope=buf.scope, align=buf.align)


def linear_index(buf: Buffer, indices: Sequence[PrimExpr]) -> PrimExpr:
    """Row-major offset of ``buf[indices]`` (explicit strides honoured), as int64.

    Examples
    --------
    >>> from tilecraft.tensorir import Buffer, var
    >>> i, j = var("i"), var("j")
    >>> linear_index(Buffer("A", (4, 8)), [i, j])    # i * 8 + j
    i * 8 + j
    """
    indices = [to_int64(i) for i in indices]
    if not indices:
        return IntImm(0, "int64")
    if buf.strides is not None:
        out: PrimExpr = IntImm(0, "int64")
        for i, st in zip(indices, buf.strides):
            out = fold_add(out, fold_mul(i, to_int64(st)))
        return out
    # Horner form: ((i0 * s1 + i1) * s2 + i2) ...
    out = indices[0]
    for i, s in zip(indices[1:], buf.shape[1:]):
        out = fold_add(fold_mul(out, to_int64(s)), i)
    return out


class _Flattener(IRMutator):
    def __init__(self):
        super().__init__()
        self.flat: dict[Buffer, Buffer] = {}

    def flat_of(self, buf: Buffer) -> Buffer:
        new = self.flat.get(buf)
        if new is None:
            new = self.flat[buf] = flat_buffer(buf)
        return new

    def visit_BufferLoad(self, e: BufferLoad):
        indices = [self.visit(i) for i in e.indices]
        return BufferLoad(self.flat_of(e.buffer), [linear_index(e.buffer, indices)])

    def visit_BufferStore(self, s: BufferStore):
        indices = [self.visit(i) for i in s.indices]
        return BufferStore(self.flat_of(s.buffer), self.visit(s.value),
                           [linear_index(s.buffer, indices)])

    def visit_Allocate(self, s: Allocate):
        return Allocate(self.flat_of(s.buffer), self.visit(s.body))

    def visit_Block(self, block: Block):
        raise TIRError(f"FlattenBuffers: block {block.name} is still present; run "
                       f"ConvertBlocksToLoops first", block)

    def visit_BlockRealize(self, realize: BlockRealize):
        return self.visit_Block(realize.block)


@prim_func_pass
def FlattenBuffers(func: PrimFunc) -> PrimFunc:
    """Make every buffer one-dimensional.

    Loads and stores get one int64 index (row-major, or the buffer's explicit strides); each
    ``Allocate`` gets a flat buffer. The function's ``buffer_map`` maps each handle parameter to
    the flat buffer (shape ``(product,)``, same name, dtype and scope); attr ``"arg_buffers"``
    keeps the original multi-dimensional parameter buffers in parameter order and attr
    ``"shape_vars"`` their symbolic dims (free Vars in first-appearance order, scalar params
    excluded), which the code generators bind from the arguments' shapes. Blocks must be gone.

    Examples
    --------
    >>> from tilecraft.tensorir import te, transform
    >>> A = te.placeholder((4, 8), "float32", "A")
    >>> B = te.compute((4, 8), lambda i, j: A[i, j] + 1.0, "B")
    >>> f = transform.FlattenBuffers(transform.ConvertBlocksToLoops(te.create_prim_func([A, B])))
    >>> [b.shape[0].value for b in f.buffers]
    [32, 32]
    """
    attrs = func.attr_dict
    flattener = _Flattener()
    arg_buffers = tuple(attrs.get("arg_buffers", func.buffers))
    new_map = {p: flattener.flat_of(b) for p, b in func.buffer_map}
    body = flattener.visit(func.body)
    attrs.setdefault("arg_buffers", arg_buffers)
    attrs.setdefault("shape_vars", shape_vars_of(arg_buffers, exclude=func.scalar_params))
    return func.replace(body=body, buffer_map=new_map, attrs=attrs)
