"""Functionalization: the in-place and view operators of a ``torch.export`` graph as pure values.

The graph ``torch.export.export`` gives by default keeps PyTorch's memory semantics. ``add_``
changes its input; ``view``, ``slice``, ``select``, ``transpose``, ``split``, ``detach``, ... return
tensors that share memory with their input, so a write through one of them changes the base
tensor and every other view of it::

    y = x.clone(); y[:, 0] = 1.0           # select(y, 1, 0) then fill_: writes into y
    v = y.view(-1, 2); v.mul_(2)           # y changes too
    return y                               # reads y after both writes

Relax values are immutable, so the importer tracks memory itself. Every tensor node is an
``Alias``: a ``Storage`` (the memory: its current Relax value and a version counted up at each
write) and the chain of ``ViewStep`` s from the storage's base tensor to the node. Then

- a **view** of a node is an ``Alias`` of the same storage one step longer (the step's value is
  what the operator's converter computes);
- an **in-place** operator computes the functional operator (``add_`` is ``add``) and writes
  the result back: each step of the chain, innermost first, scatters the new value into its
  parent (``slice`` into a ``scatter_elements`` along its dim, ``view`` into a reshape back,
  ``transpose`` into the inverse permutation), and the new base becomes the storage's value;
- a **read** of a node whose storage has been written since its value was computed replays its
  chain on the storage's current value.

Whether an operator returns a view is read from its schema (``Tensor(a) self -> Tensor(a)``);
for those that may or may not (``reshape``, ``contiguous``, ``to``), from whether torch's
recorded result shares memory with the input.
"""
from __future__ import annotations

import numpy as np

from ... import op as R
from ...expr import Expr, const
from .ops import (Unsupported, _axis, _cast, _dtype, _ndim, _shape, diagonal_scatter,
                  scatter_along, slice_start, strided_indices)

# operators whose view is the same elements in another shape (written back by a reshape)
RESHAPES = {"view", "reshape", "_reshape_alias", "unsqueeze", "squeeze", "flatten", "unflatten",
            "view_as"}
# the same tensor
IDENTITIES = {"alias", "detach", "lift_fresh", "to", "contiguous", "type_as", "resolve_conj",
              "resolve_neg"}
PERMUTES = {"transpose", "swapaxes", "swapdims", "permute", "t", "mT", "numpy_T", "adjoint",
            "mH"}
SLICES = {"slice", "narrow", "select", "split", "split_with_sizes", "chunk", "unbind"}


class Storage:
    """One block of memory as the importer sees it: its current value and a write counter."""
    __slots__ = ("value", "version")

    def __init__(self, value: Expr):
        self.value = value
        self.version = 0


class ViewStep:
    """One view operator applied to its parent: the node, which of its results (for ``split``
    and friends), and its arguments by schema name (``self`` is the parent)."""
    __slots__ = ("node", "index", "args", "op")

    def __init__(self, node, index, args: dict, op: str):
        self.node, self.index, self.args, self.op = node, index, args, op


class Alias:
    """A tensor node: a view (``steps`` from the base) of ``storage``; ``value`` is its value as
    of ``version`` of the storage."""
    __slots__ = ("storage", "steps", "value", "version")

    def __init__(self, storage: Storage, steps: tuple, value: Expr):
        self.storage, self.steps, self.value = storage, steps, value
        self.version = storage.version

    @staticmethod
    def fresh(value: Expr) -> "Alias":
        return Alias(Storage(value), (), value)

    def view(self, step: ViewStep, value: Expr) -> "Alias":
        return Alias(self.storage, self.steps + (step,), value)


def is_view(torch, node, op: str) -> bool:
    """Whether ``node`` (a call of the ATen operator ``op``) returns a view of its first
    argument."""
    schema = node.target._schema
    if not schema.returns or schema.returns[0].alias_info is None:
        return False
    if schema.returns[0].alias_info.is_write:
        return False                  # an in-place operator: handled as a write
    src = node.args[0] if node.args else None
    if not isinstance(src, torch.fx.Node):
        return False
    a, b = src.meta.get("val"), node.meta.get("val")
    if isinstance(b, (list, tuple)):
        b = next((t for t in b if isinstance(t, torch.Tensor)), None)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        # "may alias" operators (reshape, contiguous, to) copy when they must: ask torch
        try:
            from torch.multiprocessing.reductions import StorageWeakRef
            return StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())
        except (ImportError, RuntimeError, NotImplementedError, AttributeError):
            pass
    return True


def is_inplace(node) -> bool:
    """Whether ``node`` writes into its first argument (``add_``, ``copy_``, ``index_put_``)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.arguments:
        return False
    info = schema.arguments[0].alias_info
    return info is not None and info.is_write


# in-place operators that change a tensor's shape or strides, not its values: a later use of
# the tensor sees another view of the memory, which a written-back value cannot express
RESTRIDES = {"as_strided_", "squeeze_", "unsqueeze_", "transpose_", "t_", "swapaxes_",
             "swapdims_", "resize_", "resize_as_", "set_"}


def functional_name(op: str) -> str:
    """``add_`` -> ``add``, ``_index_put_impl_`` -> ``_index_put_impl``; an in-place operator
    that changes the shape instead of the values (``unsqueeze_``) keeps its name (it has no
    converter)."""
    if op in RESTRIDES:
        return op
    return op[:-1] if op.endswith("_") and not op.endswith("__") else op


# ---------------------------------------------------------------------------------------------
# writing a new value of a view back into its parent


def scatter_step(ctx, step: ViewStep, parent: Expr, child: Expr) -> Expr:
    """``parent`` with the elements ``step`` views replaced by ``child``."""
    op = step.op
    a = step.args
    child = _cast(ctx, child, _dtype(parent))
    if op in IDENTITIES:
        return child
    if op in RESHAPES:
        return ctx.emit(R.reshape(child, _shape(parent)))
    if op in PERMUTES:
        perm = _permutation(op, a, _ndim(parent))
        inverse = list(np.argsort(perm))
        return ctx.emit(R.permute_dims(child, [int(i) for i in inverse]))
    if op in SLICES:
        n = _ndim(parent)
        dim = _axis(a.get("dim", 0), n)
        size = _shape(parent)[dim]
        if op in ("select", "unbind"):
            child = ctx.emit(R.expand_dims(child, dim))
            index = step.index if op == "unbind" else a["index"]
            return scatter_along(ctx, parent, child, dim, slice_start({"start": index}, size))
        if op == "slice":
            stride = a.get("step") or 1
            return scatter_along(ctx, parent, child, dim, slice_start(a, size), stride)
        if op == "narrow":
            return scatter_along(ctx, parent, child, dim, slice_start(a, size))
        # split, split_with_sizes, chunk: result ``index`` starts after the ones before it
        vals = step.node.meta["val"]
        start = 0
        for v in vals[:step.index]:
            start = start + ctx._sym_value(v.shape[dim])
        return scatter_along(ctx, parent, child, dim, start)
    if op == "diagonal":
        return ctx.emit(diagonal_scatter(ctx, parent, child, a))
    if op == "as_strided":
        idx = strided_indices(ctx, step.node.args[0], a)
        flat = ctx.emit(R.reshape(parent, [-1]))
        upd = ctx.emit(R.reshape(child, [-1]))
        out = ctx.emit(R.scatter_elements(flat, const(idx.reshape(-1)), upd, axis=0))
        return ctx.emit(R.reshape(out, _shape(parent)))
    raise Unsupported(f"writing into the result of {op} (a view) is not supported")


def _permutation(op: str, a: dict, n: int) -> list[int]:
    """The permutation ``perm`` with ``view = permute_dims(parent, perm)``."""
    perm = list(range(n))
    if op == "permute":
        return [_axis(d, n) for d in a["dims"]]
    if op in ("transpose", "swapaxes", "swapdims"):
        keys = ("dim0", "dim1") if "dim0" in a else ("axis0", "axis1")
        d0, d1 = _axis(a[keys[0]], n), _axis(a[keys[1]], n)
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return perm
    if op in ("t", "numpy_T"):
        return perm[::-1] if n >= 2 else perm
    if n >= 2:                             # mT, mH, adjoint: the last two dims
        perm[-1], perm[-2] = perm[-2], perm[-1]
    return perm
