"""Shared kernels: one PrimFunc with a symbolic dimension for a family of kernels that differ
only in integer constants lying on a line.

A network repeats a layer at many sizes: DenseNet-121's concatenations grow by 32 channels a
layer, so its 1x1 convolutions, its batch normalizations and its concatenations are each about
fifty kernels that differ in nothing but the channel count (and numbers that move with it, such
as ``C + 32``). ``share_kernels`` finds such families and writes each as one kernel whose
varying dimension is a variable bound from its arguments' shapes, so a build compiles one kernel
instead of fifty.

How: every integer immediate of a kernel is a *position* (in the walk order of ``IRMutator``,
parameter buffers' shapes first). Kernels that are equal when every position is blanked out
have the same *skeleton*; their position values are integer vectors. A family is a set of
kernels whose vectors lie on one line ``v = v0 + t * d`` (``d`` integer, primitive) where some
dimension of a parameter buffer moves by exactly ``d[p] = 1``: that dimension becomes the
variable ``x`` and every other moving position ``k`` the affine expression
``v0[k] + (x - v0[p]) * d[k]``. Only a dimension the kernel reads is shared, never one of a
buffer it writes: the output's shape, and with it the loops a schedule splits, vectorizes and
runs in parallel, stays the members' (a transpose whose channel count moved ran 2.5x slower
shared on Inception-v1; a reduction over a symbolic extent runs at its members' speed). Substituting a member's ``x`` gives back that member's every
constant, so each member computes what it did (``tests/tensorir/test_generalize.py`` checks
the shared kernel against each member with the interpreter).

Examples
--------
>>> shared = share_kernels([f_288, f_320, f_352])          # doctest: +SKIP
>>> shared[0].members, shared[0].values
((0, 1, 2), (288, 320, 352))
"""
from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from typing import Sequence

from . import dtype as dt
from .expr import Cast, IntImm, PrimExpr, Var
from .function import PrimFunc
from .functor import IRMutator, children, post_order_visit, visit_stmts
from .stmt import Block, Buffer, BufferStore, For
from .structural import _Hasher, structural_equal

__all__ = ["SharedKernel", "share_kernels", "kernel_positions", "loop_structure"]

# a placeholder for every integer immediate of a skeleton (any value: positions are compared
# by their recorded values, skeletons by their structure)
_BLANK = -0x5EED


@dataclass(frozen=True)
class SharedKernel:
    """A family of kernels written as one.

    Attributes
    ----------
    func : PrimFunc
        The shared kernel: the first member with its moving dimension ``param``.
    param : Var
        The variable, a dimension of one of ``func``'s parameter buffers (bound from it when
        the kernel is called).
    members : tuple[int, ...]
        Indices (into ``share_kernels``' argument) of the kernels it replaces, first one first.
    values : tuple[int, ...]
        ``param``'s value for each member.
    """

    func: PrimFunc
    param: Var
    members: tuple[int, ...]
    values: tuple[int, ...]


class _Positions(IRMutator):
    """Record every integer immediate in walk order; with ``exprs``, replace each by the
    expression of its position (``None``: keep it), else by ``_BLANK``."""

    def __init__(self, func: PrimFunc, exprs: list | None = None):
        super().__init__()
        self.values: list[int] = []
        self.dtypes: list[str] = []
        self.param_dims: list[int] = []   # positions that are a parameter buffer's dimension
        self.dim_owner: dict[int, int] = {}   # such a position -> id of its buffer
        self.exprs = exprs
        self._params = {id(b) for b in func.buffers}
        self._dims: set[int] = set()
        self._owner = 0

    def visit_Buffer(self, buf: Buffer):
        if id(buf) in self._params and buf not in self.buffer_map:
            saved = self._dims, self._owner
            self._dims, self._owner = {id(d) for d in buf.shape}, id(buf)
            try:
                return super().visit_Buffer(buf)
            finally:
                self._dims, self._owner = saved
        return super().visit_Buffer(buf)

    def visit_IntImm(self, e: IntImm):
        if dt.is_bool(e.dtype):
            return e
        k = len(self.values)
        self.values.append(e.value)
        self.dtypes.append(e.dtype)
        if id(e) in self._dims:
            self.param_dims.append(k)
            self.dim_owner[k] = self._owner
        if self.exprs is None:
            return IntImm(_BLANK, e.dtype)
        new = self.exprs[k]
        return e if new is None else new


def kernel_positions(func: PrimFunc) -> tuple[PrimFunc, list[int], list[str], list[int]]:
    """The skeleton of ``func`` (every integer immediate blanked, ``global_symbol`` dropped),
    the immediates' values and dtypes in walk order, and the positions that are dimensions of
    parameter buffers."""
    skeleton, values, dtypes, param_dims, _ = _kernel_positions(func)
    return skeleton, values, dtypes, param_dims


def _kernel_positions(func: PrimFunc):
    """``kernel_positions`` and, for each position that is a parameter buffer's dimension,
    the id of that buffer."""
    walker = _Positions(func)
    skeleton = walker.visit(func.with_attr("global_symbol", ""))
    return skeleton, walker.values, walker.dtypes, walker.param_dims, walker.dim_owner


def _written_dims(func: PrimFunc, param_dims: list[int], dim_owner: dict[int, int]) -> list[int]:
    """The positions that are dimensions of the parameter buffers ``func`` stores into."""
    written = _written_buffers(func)
    return [k for k in param_dims if dim_owner[k] in written]


class _BlankHasher(_Hasher):
    """``structural_hash`` with every integer immediate the same: kernels of one skeleton hash
    alike (a cheap first sort; ``kernel_positions`` and ``structural_equal`` decide)."""

    def h(self, x) -> int:
        if type(x) is IntImm and not dt.is_bool(x.dtype):
            return hash(("int", x.dtype))
        return super().h(x)


def _direction(a: list[int], b: list[int]) -> tuple[int, ...] | None:
    """The primitive integer direction from ``a`` to ``b``, its first nonzero entry positive."""
    d = [y - x for x, y in zip(a, b)]
    g = 0
    for v in d:
        g = gcd(g, v)
    if g == 0:
        return None
    first = next(v for v in d if v)
    g = g if first > 0 else -g
    return tuple(v // g for v in d)


def _expr(x: Var, scale: int, offset: int, dtype: str) -> PrimExpr:
    e: PrimExpr = x if x.dtype == dtype else Cast(dtype, x)
    if scale == -1:
        e = IntImm(0, dtype) - e
    elif scale != 1:
        e = e * IntImm(scale, dtype)
    if offset > 0:
        e = e + IntImm(offset, dtype)
    elif offset < 0:
        e = e - IntImm(-offset, dtype)
    return e


def _family(funcs, indices, vectors, direction, param_dims, dtypes, name,
            written_dims=()) -> SharedKernel | None:
    """The shared kernel of the members ``indices`` (their vectors on the line through the
    first along ``direction``), or None when no parameter dimension moves by exactly one step
    or a dimension of a buffer the kernel writes (``written_dims``, positions) moves."""
    p = next((k for k in param_dims if abs(direction[k]) == 1), None)
    if p is None:
        return None
    if any(direction[k] for k in written_dims):
        # refused below too, once the shared kernel is made: making it only to refuse it was
        # most of the sharing phase where every candidate's output moves (DenseNet-121's
        # batch normalizations and concatenations, a hundred tries)
        return None
    d = direction if direction[p] == 1 else tuple(-v for v in direction)
    v0 = vectors[indices[0]]
    x = Var(name, dtypes[p])
    exprs: list = [None] * len(v0)
    for k, step in enumerate(d):
        if step:
            exprs[k] = _expr(x, step, v0[k] - step * v0[p], dtypes[k])
    shared = _Positions(funcs[indices[0]], exprs).visit(funcs[indices[0]])
    if not any(dim is x for b in shared.buffers for dim in b.shape):
        return None      # the variable must be bound from an argument's shape
    written = _written_buffers(shared)
    if any(uses_var(dim, x) for b in shared.buffers if id(b) in written for dim in b.shape):
        return None      # the outputs' shapes, and so the loops a schedule splits, must not move
    return SharedKernel(shared, x, tuple(indices), tuple(vectors[i][p] for i in indices))


def _written_buffers(func: PrimFunc) -> set[int]:
    """The ids of the buffers ``func`` stores into (a store is a statement: the walk goes
    through statements only, not every expression)."""
    out: set[int] = set()
    visit_stmts(func.body, lambda s: out.add(id(s.buffer)) if isinstance(s, BufferStore) else None)
    return out


def _family_key(func: PrimFunc) -> tuple:
    """What every member of a family shares and is cheap to see: its parameters' dtypes and
    ranks, and the shapes of those it writes (a family's written dimensions never move)."""
    written = _written_buffers(func)
    return (tuple((b.dtype, len(b.shape)) for b in func.buffers),
            tuple((k, tuple(int(d.value) for d in b.shape))
                  for k, b in enumerate(func.buffers) if id(b) in written))


def uses_var(e, x: Var) -> bool:
    """Whether the expression ``e`` reads the variable ``x``."""
    found = []
    post_order_visit(e, lambda n: found.append(n) if n is x else None)
    return bool(found)


def share_kernels(funcs: Sequence[PrimFunc], min_members: int = 3,
                  param_name: str = "shared_dim") -> list[SharedKernel]:
    """Families of at least ``min_members`` kernels among ``funcs`` that one kernel with a
    symbolic dimension computes (see the module's doc); the kernels of no family are left out.
    Kernels with symbolic dimensions of their own are not shared.

    Parameters
    ----------
    funcs : sequence of PrimFunc
        Distinct kernels (not yet scheduled).
    min_members : int
        The smallest family worth a shared kernel.
    param_name : str
        The name of each shared kernel's variable.

    Returns
    -------
    list[SharedKernel]
        In the order of each family's first member.

    Examples
    --------
    >>> [s.members for s in share_kernels([f_a288, f_b, f_a320, f_a352])]  # doctest: +SKIP
    [(0, 2, 3)]
    """
    # kernels sorted by what a family shares, the cheap part first: most kernels of a network
    # have no possible partner, and the skeleton's hash walks the whole kernel
    by_key: dict[tuple, list[int]] = {}
    for i, f in enumerate(funcs):
        if any(not isinstance(dim, IntImm) for b in f.buffers for dim in b.shape):
            continue
        by_key.setdefault(_family_key(f), []).append(i)
    by_hash: dict[int, list[int]] = {}
    for i in sorted(i for indices in by_key.values() if len(indices) >= min_members
                    for i in indices):
        by_hash.setdefault(_BlankHasher().h(funcs[i].with_attr("global_symbol", "")),
                           []).append(i)
    vectors: dict[int, list[int]] = {}
    info: dict[int, tuple[list[str], list[int], dict[int, int]]] = {}
    written: dict[int, list[int]] = {}     # of the kernels tried as a family's first
    skeletons: list[tuple[PrimFunc, list[int]]] = []
    for candidates in by_hash.values():
        if len(candidates) < min_members:
            continue
        groups: list[tuple[PrimFunc, list[int]]] = []
        for i in candidates:
            skeleton, values, dtypes, param_dims, owner = _kernel_positions(funcs[i])
            vectors[i], info[i] = values, (dtypes, param_dims, owner)
            for group in groups:
                if structural_equal(group[0], skeleton):
                    group[1].append(i)
                    break
            else:
                groups.append((skeleton, [i]))
        skeletons.extend(groups)
    found = []
    for _, members in skeletons:
        rest = list(members)
        while len(rest) >= min_members:
            first, others = rest[0], rest[1:]
            lines: dict[tuple, list[int]] = {}
            for j in others:
                d = _direction(vectors[first], vectors[j])
                if d is not None:
                    lines.setdefault(d, []).append(j)
            best = max(lines.items(), key=lambda kv: len(kv[1]), default=None)
            family = None
            if best is not None and len(best[1]) + 1 >= min_members:
                dtypes, param_dims, owner = info[first]
                if first not in written:
                    written[first] = _written_dims(funcs[first], param_dims, owner)
                family = _family(funcs, [first] + best[1], vectors, best[0], param_dims,
                                 dtypes, param_name, written[first])
            if family is None:
                rest = others
                continue
            found.append(family)
            taken = set(family.members)
            rest = [j for j in rest if j not in taken]
    found.sort(key=lambda s: s.members[0])
    return found


def loop_structure(func: PrimFunc) -> tuple:
    """The loop nest of a (scheduled) kernel without its extents: for every loop and block in
    pre-order, its depth and its kind (``parallel``, ``vectorized``, ...) or block name. Two
    kernels with the same structure were scheduled alike: a shared kernel whose schedule keeps
    its members' structure runs their loops in their order (``relax.build`` shares a family
    only then: a symbolic dimension may change a default schedule's decisions).

    Examples
    --------
    >>> loop_structure(scheduled)                     # doctest: +SKIP
    ((1, 'parallel', None), (2, 'serial', None), (3, 'block', 'T_concat'))
    """
    out: list = []

    def walk(node, depth):
        if isinstance(node, For):
            out.append((depth, node.kind, node.thread_tag))
            depth += 1
        elif isinstance(node, Block):
            out.append((depth, "block", node.name))
            depth += 1
        for c in children(node):
            if not isinstance(c, (Buffer, PrimExpr)):
                walk(c, depth)
    walk(func.body, 0)
    return tuple(out)
