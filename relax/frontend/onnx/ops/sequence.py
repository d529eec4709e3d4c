"""Sequences made inside the graph: SplitToSequence, SequenceConstruct, SequenceEmpty,
SequenceAt, SequenceLength, SequenceInsert, SequenceErase, ConcatFromSequence.

``torch.onnx.export`` writes ``torch.split`` / ``torch.chunk`` as ``SplitToSequence`` then
``SequenceAt``. A sequence whose length is known when the model is imported is a Relax tuple of
its tensors: positions must be known at import time too (``SequenceAt``'s ``position``), and a
sequence result of the graph is a tuple result of ``main``. Sequences as graph inputs (of a
length known only at run time) are not supported.
"""
from __future__ import annotations

import numpy as np

from tilecraft.tensorir.expr import IntImm

from .... import op as _op
from ....expr import Expr, TupleGetItem
from ....struct_info import TupleStructInfo
from ..registry import ConversionError, NeedsConstant, converter
from ..values import Known, Tensors
from .common import norm_axis, static_int, static_length
from .tensor import _runtime_split


def _items(ctx, node, i) -> list[Expr]:
    """The tensors of sequence input ``i``."""
    seq = ctx.input(node, i)
    si = seq.struct_info
    if not isinstance(si, TupleStructInfo):
        raise ConversionError(f"input {i} must be a sequence, got {si!r}")
    return [ctx.emit(TupleGetItem(seq, k)) for k in range(len(si.fields))]


def _position(ctx, node, i, n: int, insert: bool = False) -> int:
    """Input ``i`` (a position in a sequence of ``n``, negative from the end) as an int; the end
    of the sequence when absent."""
    if not node.has_input(i):
        return n if insert else n - 1
    v = ctx.known(node, i)
    if v is None or v.dtype == object:
        raise NeedsConstant(f"input {i} (position) must be known when the model is imported "
                            f"(sequences are tuples of a length known at import time)",
                            node.inputs[i])
    p = int(np.asarray(v).reshape(-1)[0])
    hi = n if insert else n - 1
    if not -n <= p <= hi:
        raise ConversionError(f"position {p} is out of range for a sequence of {n}")
    return p + n if p < 0 else p


@converter("SplitToSequence", family="sequence", const_inputs={1: "split"},
           doc="split along axis into a sequence (a tuple; sizes known at import time)")
def _split_to_sequence(ctx, node):
    x = ctx.input(node, 0)
    xs = ctx.shape(x)
    axis = norm_axis(node.attr("axis", 0), len(xs))
    dim = static_int(xs[axis])
    split = ctx.maybe_ints(node, 1) if node.has_input(1) else None
    scalar_split = node.has_input(1) and len(ctx.shape(ctx.input(node, 1))) == 0
    if node.has_input(1) and split is None:
        if scalar_split:
            raise NeedsConstant("input 1 (split) must be known when the model is imported (a "
                                "single size sets the length of the sequence)", node.inputs[1])
        # sizes computed at run time: as many pieces as the (static) number of sizes
        split = _runtime_split(ctx, node, xs[axis],
                               static_length(ctx, ctx.input(node, 1), "split"))
    if split is None or scalar_split:
        if dim is None:
            raise ConversionError(f"SplitToSequence of a dim of symbolic size {xs[axis]} into "
                                  f"equal pieces (the sequence length would depend on it)")
        step = 1 if split is None else split[0]
        sizes = [min(step, dim - b) for b in range(0, dim, step)]
    else:
        sizes = split
    pieces, begin = [], IntImm(0, "int64")
    for size in sizes:
        end = begin + size
        pieces.append(ctx.emit(_op.strided_slice(x, [axis], [begin], [end],
                                                 assume_inbound=True)))
        begin = end
    if split is None and not node.attr("keepdims", 1):
        pieces = [ctx.emit(_op.squeeze(p, [axis])) for p in pieces]
    return Tensors(pieces)


@converter("SequenceConstruct", family="sequence", doc="a sequence of the inputs (a tuple)")
def _sequence_construct(ctx, node):
    return Tensors(ctx.inputs(node))


@converter("SequenceEmpty", family="sequence", doc="an empty sequence")
def _sequence_empty(ctx, node):
    return Tensors([])


@converter("SequenceAt", family="sequence", const_inputs={1: "position"},
           doc="the tensor at a position (known at import time) of a sequence")
def _sequence_at(ctx, node):
    items = _items(ctx, node, 0)
    return items[_position(ctx, node, 1, len(items))]


@converter("SequenceLength", family="sequence", doc="the number of tensors of a sequence")
def _sequence_length(ctx, node):
    return Known(np.array(len(_items(ctx, node, 0)), dtype=np.int64))


@converter("SequenceInsert", family="sequence", const_inputs={2: "position"},
           doc="a sequence with a tensor inserted (position known at import time)")
def _sequence_insert(ctx, node):
    items = _items(ctx, node, 0)
    items.insert(_position(ctx, node, 2, len(items), insert=True), ctx.input(node, 1))
    return Tensors(items)


@converter("SequenceErase", family="sequence", const_inputs={1: "position"},
           doc="a sequence without the tensor at a position (known at import time)")
def _sequence_erase(ctx, node):
    items = _items(ctx, node, 0)
    del items[_position(ctx, node, 1, len(items))]
    return Tensors(items)


@converter("ConcatFromSequence", family="sequence",
           doc="concatenate (or stack, new_axis) the tensors of a sequence")
def _concat_from_sequence(ctx, node):
    items = _items(ctx, node, 0)
    if not items:
        raise ConversionError("ConcatFromSequence of an empty sequence")
    rank = len(ctx.shape(items[0]))
    if node.attr("new_axis", 0):
        axis = norm_axis(node.attr("axis"), rank + 1)
        items = [ctx.emit(_op.expand_dims(t, axis)) for t in items]
    else:
        axis = norm_axis(node.attr("axis"), rank)
    return _op.concat(items, axis) if len(items) > 1 else items[0]
