"""The fused attention kernel of the GPU targets: ``softmax(Q Kᵀ * scale + mask) V`` in one
launch (FlashAttention's online softmax), built directly as a scheduled TensorIR function.

``relax.transform.FuseAttention`` finds the pattern in a graph and calls
``attention_kernel`` for its shapes; the kernel is already bound to work-groups and threads,
so the default GPU schedules leave it as it is.

The kernel, for one (batch..., tile of ``rows`` query rows) per work-group, ``split``
threads per row (``rows * split`` threads on ``threadIdx.x``):

* each thread keeps its row's ``q`` (``D`` floats) in registers, its share of the output
  accumulator ``o`` (``Dv / split`` of the row's dims, ``d = k * split + t``) and of the row's
  running sum ``l``, and the row's running maximum ``m`` of the online softmax;
* the key / value sequence goes in steps of ``cols`` positions: the step's ``K`` (rows padded
  by one word: no bank conflicts) and ``V`` tiles are loaded into shared memory by all the
  threads (a cooperative fetch); each thread computes ``cols / split`` scores of its row
  (columns ``j * split + t``: ``q . k * scale`` or ``/ scale``, plus the additive mask, or the
  bool mask's fill value where the mask is False) and their maximum; the row's ``split``
  maxima meet in shared memory, giving the new ``m``; ``o`` and ``l`` are rescaled by
  ``exp(m_old - m_new)``, the probabilities ``exp(s - m_new)`` go to shared memory (and into
  ``l``), and each thread accumulates ``P[row, :] . V[:, d]`` for its dims;
* at the end the row's ``split`` partial sums meet in shared memory: ``O[row, d] = o / l``.

The scores never reach global memory: per (batch, head) the kernel reads ``Q``, ``K``, ``V``
(``K`` and ``V`` once per row tile) and writes ``O``, where the unfused form writes and reads
the ``L x S`` scores three times (the matmul, the softmax, the second matmul) in three launches.

A position whose every score is ``-inf`` (a fully masked row) gives ``0 / 0 = nan``, as the
unfused softmax does; a row with some finite scores is exact however its ``-inf`` columns
fall across the steps (the running maximum is taken as 0 while it is still ``-inf``).

The sequence lengths ``L`` and ``S`` and the batch dims may be symbolic (the grid is a host
expression of them); the head sizes ``D`` and ``Dv`` must be constants (the registers of a
thread are fixed when the kernel is compiled).

Examples
--------
>>> from tilecraft.targets import Target
>>> from tilecraft.tensorir import Var
>>> n = Var("n")
>>> spec = AttentionSpec(batch=(n, 4), L=n, S=n, D=16, Dv=16, scale=("mul", 0.25))
>>> f = attention_kernel(spec, Target("opencl"))
>>> f.attr_dict["op_pattern"]
8
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from tilecraft.targets import Target
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import (IntImm, Max, Select, Var, call, const,
                                     floordiv, floormod)
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.stmt import Allocate, Buffer, BufferStore, For, IfThenElse, seq

from .gemm import for_cpu

__all__ = ["AttentionSpec", "attention_kernel", "attention_tiles", "ATTENTION_COLS",
           "ATTENTION_MAX_HEAD", "ATTENTION_ROWS", "ATTENTION_SPLIT"]

ATTENTION_ROWS = 16        # query rows per work-group
ATTENTION_SPLIT = 8        # threads sharing a row: its score columns and its output dims
ATTENTION_COLS = 32        # key positions per step (fewer where shared memory is short)
ATTENTION_MAX_HEAD = 128   # largest head size (a thread keeps the whole q row in registers)
_OPAQUE = 8                # relax OpPattern.OPAQUE: the kernel never fuses with its neighbours


@dataclass(frozen=True)
class AttentionSpec:
    """The shapes and operators of one fused attention.

    Parameters
    ----------
    batch : tuple
        The leading dims shared by Q (``(*batch, L, D)``), Kᵀ (``(*batch, D, S)``), V
        (``(*batch, S, Dv)``) and the output (``(*batch, L, Dv)``): ints or symbolic Vars.
    L, S : int | Var
        Query and key sequence lengths.
    D, Dv : int
        Head sizes of the queries / keys and of the values.
    scale : tuple
        ``("mul", c)`` or ``("div", c)``: the scores are ``q . k * c`` or ``q . k / c``;
        ``("mul", 1.0)`` for none.
    mask : str | None
        None; ``"add"``: a float32 tensor added to the scores; ``"select"``: a bool tensor, the
        score kept where True and ``fill`` where False.
    mask_shape : tuple
        The mask's shape, right-aligned with the scores' ``(*batch, L, S)``; a dim of 1
        broadcasts.
    fill : float
        The ``"select"`` mask's value where it is False.
    k_transposed : bool
        True: K is given as Kᵀ ``(*batch, D, S)`` (what ``matmul(Q, Kᵀ)`` reads); False: as
        ``(*batch, S, D)``.
    q_view, k_view, v_view : tuple | None
        None: the operand is passed in its logical shape above. ``(shape, axes, split,
        offset)``: it is passed as the tensor it is a view of, ``permute_dims(reshape(x, (...,
        C // split, split)), axes)`` (``split`` None: ``permute_dims(x, axes)``) where ``x`` is
        the last-dim slice ``[offset:offset + C]`` of the passed tensor of ``shape`` (a fused
        QKV projection; else ``offset`` 0 and ``x`` itself): the kernel reads it directly, so
        the heads' transposes (and slices) of an import cost no kernel.
    o_view : tuple | None
        None: the output is ``(*batch, L, Dv)``. ``(shape, axes, Dv, 0)``: the kernel writes
        ``reshape(permute_dims(O, axes), shape)`` instead, where the reshape merges the last two
        dims (the heads joined back into the hidden dim, as the imports do next).
    """
    batch: tuple
    L: object
    S: object
    D: int
    Dv: int
    scale: tuple = ("mul", 1.0)
    mask: str | None = None
    mask_shape: tuple = field(default=())
    fill: float = 0.0
    k_transposed: bool = True
    q_view: tuple | None = None
    k_view: tuple | None = None
    v_view: tuple | None = None
    o_view: tuple | None = None


def attention_tiles(spec: AttentionSpec, target: Target) -> tuple[int, int, int]:
    """(query rows per work-group, threads per row, key positions per step) for ``target``.

    The step's K and V tiles (and the probabilities) must fit the target's shared memory
    (WebGPU: 16 KiB); the threads of a row split its columns and output dims evenly."""
    rows, cols = ATTENTION_ROWS, ATTENTION_COLS
    limit = target.max_shared_memory_per_block

    def shared_bytes(c):
        return 4 * (c * (spec.D + 1) + c * spec.Dv + rows * (c + 1) + rows * ATTENTION_SPLIT)
    while cols > 4 and shared_bytes(cols) > limit:
        cols //= 2
    split = ATTENTION_SPLIT
    while split > 1 and (spec.Dv % split or cols % split):
        split //= 2
    return rows, split, cols


def _operand(name: str, logical: tuple, view) -> Buffer:
    """The buffer of an operand: its logical shape, or the shape of the tensor it views."""
    return Buffer(name, logical if view is None else tuple(view[0]), "float32")


def _load(buf: Buffer, view, idx: tuple):
    """``buf`` read at logical index ``idx``, through the operand's view (see
    ``AttentionSpec``): the permutation undone, then the reshape's split of the last dim."""
    if view is None:
        return buf[tuple(idx)]
    _, axes, split, offset = view
    pre = [None] * len(axes)
    for i, a in enumerate(axes):
        pre[a] = idx[i]
    if split is not None:
        pre = pre[:-2] + [pre[-2] * split + pre[-1]]
    if offset:
        pre[-1] = pre[-1] + offset
    return buf[tuple(pre)]


def _out_index(view, idx: tuple) -> list:
    """The output's index of logical index ``idx`` through ``view`` (see ``o_view``)."""
    if view is None:
        return list(idx)
    _, axes, split, _ = view
    p = [idx[a] for a in axes]
    return p[:-2] + [p[-2] * split + p[-1]]


def _ceil_div(a, b: int):
    return floordiv(a + (b - 1), b)


def attention_kernel(spec: AttentionSpec, target: Target, name: str = "fused_attention"
                     ) -> PrimFunc:
    """The scheduled PrimFunc ``(Q, K, V[, mask], O)`` of ``spec`` for ``target``.

    Raises
    ------
    ValueError
        A head size that is not a constant in 1..``ATTENTION_MAX_HEAD``, or an unknown mask
        or scale kind.
    """
    for what, d in (("D", spec.D), ("Dv", spec.Dv)):
        if not isinstance(d, int) or not 1 <= d <= ATTENTION_MAX_HEAD:
            raise ValueError(f"fused attention: head size {what} = {d!r} must be a constant "
                             f"in 1..{ATTENTION_MAX_HEAD}")
    if spec.mask not in (None, "add", "select"):
        raise ValueError(f"fused attention: unknown mask kind {spec.mask!r}")
    if spec.scale[0] not in ("mul", "div"):
        raise ValueError(f"fused attention: unknown scale {spec.scale!r}")
    rows, split, cols = attention_tiles(spec, target)
    unroll = "serial" if for_cpu(target) else "unrolled"
    f32 = "float32"
    batch, L, S, D, Dv = tuple(spec.batch), spec.L, spec.S, spec.D, spec.Dv
    Q = _operand("Q", (*batch, L, D), spec.q_view)
    K = _operand("K", (*batch, D, S) if spec.k_transposed else (*batch, S, D), spec.k_view)
    V = _operand("V", (*batch, S, Dv), spec.v_view)
    O = _operand("O", (*batch, L, Dv), spec.o_view)
    M = None
    if spec.mask is not None:
        M = Buffer("mask", tuple(spec.mask_shape), f32 if spec.mask == "add" else "bool")
    # K's rows padded by one word: the threads of a row read different rows of it at the same
    # column, which then fall into different banks
    Ks = Buffer("K_shared", (cols, D + 1), f32, scope="shared")
    Vs = Buffer("V_shared", (cols, Dv), f32, scope="shared")
    # a step's probabilities; rows padded by one word: the rows a warp holds fall into
    # different banks when each reads its row at the same column
    Ps = Buffer("P_shared", (rows, cols + 1), f32, scope="shared")
    red = Buffer("row_partials", (rows, split), f32, scope="shared")  # per-thread max / sum
    q = Buffer("q_local", (D,), f32, scope="local")
    o = Buffer("o_local", (Dv // split,), f32, scope="local")
    sc = Buffer("s_local", (cols // split,), f32, scope="local")
    st = Buffer("row_state", (4,), f32, scope="local")  # m, l (this thread's part), m_new, max

    by, bx, tx = Var("by"), Var("bx"), Var("tx")
    kt, j, d, e, t2 = Var("kt"), Var("j"), Var("d"), Var("e"), Var("t2")
    nbatch = 1
    for b in batch:
        nbatch = nbatch * b
    # the batch index of work-group row `by`, dim by dim (the last dim fastest)
    bidx, rest = [], by
    for b in reversed(batch[1:]):
        bidx.append(floormod(rest, b))
        rest = floordiv(rest, b)
    bidx = ([rest] if batch else []) + bidx[::-1]

    r, t = floordiv(tx, split), floormod(tx, split)   # the thread's row and its part of it
    row = bx * rows + r
    row_c = Select(row < L, row, L - 1)       # rows past L compute on the last row, unstored
    neg_inf = const(-math.inf, f32)

    def k_at(pos, dd):
        idx = (*bidx, dd, pos) if spec.k_transposed else (*bidx, pos, dd)
        return _load(K, spec.k_view, idx)

    def mask_at(col):
        full = (*bidx, row_c, col)
        idx = []
        for i, m in enumerate(spec.mask_shape):
            jj = len(full) - len(spec.mask_shape) + i
            one = m == 1 if isinstance(m, int) else isinstance(m, IntImm) and m.value == 1
            idx.append(const(0, "int64") if one else full[jj])
        return M[tuple(idx)]

    threads = rows * split

    def fetch(buf, width, load):
        """The cooperative copy of one step's tile of ``width`` columns into ``buf``."""
        total = cols * width
        flat = e * threads + tx
        cc, dd = floordiv(flat, width), floormod(flat, width)
        pos = kt * cols + cc
        pos_c = Select(pos < S, pos, S - 1)
        body = BufferStore(buf, load(pos_c, dd), [cc, dd])
        if total % threads:
            body = IfThenElse(flat < total, body)
        return For(e, 0, -(-total // threads), "serial", body)

    def score(c):
        """The thread's ``j``-th score of the step (column ``c`` of the tile) into sc[j]."""
        col = kt * cols + c
        dot = For(d, 0, D, unroll, BufferStore(sc, sc[j] + q[d] * Ks[c, d], [j]))
        s = sc[j] * const(spec.scale[1], f32) if spec.scale[0] == "mul" else \
            sc[j] / const(spec.scale[1], f32)
        if spec.mask == "add":
            s = s + mask_at(col)
        elif spec.mask == "select":
            s = Select(mask_at(col), s, const(spec.fill, f32))
        return seq(BufferStore(sc, const(0.0, f32), [j]), dot,
                   BufferStore(sc, Select(col < S, s, neg_inf), [j]))

    m, l, m_new = st[0], st[1], st[2]
    # while every score so far is -inf the running maximum is taken as 0: exp(-inf - 0) = 0
    m_safe = Select(m_new == neg_inf, const(0.0, f32), m_new)
    corr = call("exp", m - m_safe)
    step = seq(
        fetch(Ks, D, k_at),
        fetch(Vs, Dv, lambda pos, dd: _load(V, spec.v_view, (*bidx, pos, dd))),
        # this thread's columns c = j * split + t of the tile, then their maximum
        For(j, 0, cols // split, unroll, score(j * split + t)),
        BufferStore(st, neg_inf, [3]),
        For(j, 0, cols // split, unroll, BufferStore(st, Max(st[3], sc[j]), [3])),
        BufferStore(red, st[3], [r, t]),
        # the row's new maximum over its threads' parts
        BufferStore(st, m, [2]),
        For(t2, 0, split, unroll, BufferStore(st, Max(m_new, red[r, t2]), [2])),
        # rescale what was accumulated under the old maximum
        BufferStore(st, l * corr, [1]),
        For(d, 0, Dv // split, unroll, BufferStore(o, o[d] * corr, [d])),
        For(j, 0, cols // split, unroll, seq(
            BufferStore(sc, call("exp", sc[j] - m_safe), [j]),
            BufferStore(st, l + sc[j], [1]),
            BufferStore(Ps, sc[j], [r, j * split + t]))),
        # o[d] (the thread's output dims d * split + t) += P[r, :] . V[:, d]
        For(j, 0, cols, unroll if cols <= 32 else "serial",
            For(d, 0, Dv // split, unroll,
                BufferStore(o, o[d] + Ps[r, j] * Vs[j, d * split + t], [d]))),
        BufferStore(st, m_new, [0]),
    )
    thread = seq(
        For(d, 0, D, unroll, BufferStore(q, _load(Q, spec.q_view, (*bidx, row_c, d)), [d])),
        For(d, 0, Dv // split, unroll, BufferStore(o, const(0.0, f32), [d])),
        BufferStore(st, neg_inf, [0]),
        BufferStore(st, const(0.0, f32), [1]),
        For(kt, 0, _ceil_div(S, cols), "serial", step),
        # the row's sum over its threads' parts
        BufferStore(red, l, [r, t]),
        BufferStore(st, const(0.0, f32), [1]),
        For(t2, 0, split, unroll, BufferStore(st, l + red[r, t2], [1])),
        For(d, 0, Dv // split, unroll,
            IfThenElse(row < L, BufferStore(O, o[d] / l, _out_index(
                spec.o_view, (*bidx, row, d * split + t))))),
    )
    for buf in (st, sc, o, q):
        thread = Allocate(buf, thread)
    body = For(tx, 0, threads, "thread_binding", thread, thread_tag="threadIdx.x")
    for buf in (red, Ps, Vs, Ks):
        body = Allocate(buf, body)
    body = For(bx, 0, _ceil_div(L, rows), "thread_binding", body, thread_tag="blockIdx.x")
    body = For(by, 0, nbatch, "thread_binding", body, thread_tag="blockIdx.y")

    buffers = [Q, K, V] + ([M] if M is not None else []) + [O]
    handles = [Var(b.name, dt.HANDLE) for b in buffers]
    return PrimFunc(handles, body, dict(zip(handles, buffers)),
                    attrs={"global_symbol": name, "op_pattern": _OPAQUE,
                           "tir.is_scheduled": True})
