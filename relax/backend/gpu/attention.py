"""The fused attention kernel of the GPU targets: ``softmax(Q Kᵀ * scale + mask) V`` in one
launch (FlashAttention's online softmax), built directly as a scheduled TensorIR function.

``relax.transform.FuseAttention`` finds the pattern in a graph and calls
``attention_kernel`` for its shapes; the kernel is already bound to work-groups and threads,
so the default GPU schedules leave it as it is.

The kernel, for one (batch..., query-row tile) per work-group:

* ``rows`` threads (``threadIdx.x``), one query row each: its ``q`` (``D`` floats) and its
  output accumulator ``o`` (``Dv`` floats) in registers, with the row's running maximum ``m``
  and running sum ``l`` of the online softmax;
* the key / value sequence in steps of ``cols`` positions: the ``K`` and ``V`` tiles of a
  step loaded into shared memory by all the work-group's threads (a cooperative fetch), then
  each thread computes its ``cols`` scores (``q . k * scale`` or ``/ scale``, plus the
  additive mask, or the bool mask's fill value where the mask is False), the tile's row
  maximum, rescales ``o`` and ``l`` by ``exp(m_old - m_new)`` and accumulates
  ``exp(s - m_new) * v`` into ``o``;
* at the end ``O[row] = o / l``.

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

__all__ = ["AttentionSpec", "attention_kernel", "attention_tiles", "ATTENTION_MAX_HEAD",
           "ATTENTION_ROWS"]

ATTENTION_ROWS = 32        # query rows (threads) per work-group on a GPU
ATTENTION_ROWS_CPU = 8     # ... on a CPU OpenCL driver (PoCL): fewer, larger work-items
ATTENTION_MAX_HEAD = 128   # largest head size (q and o of a row live in registers)
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


def attention_tiles(spec: AttentionSpec, target: Target) -> tuple[int, int]:
    """(query rows per work-group, key positions per step) for ``target``: the K and V tiles
    of a step must fit half the target's shared memory (WebGPU: 16 KiB in all)."""
    rows = ATTENTION_ROWS_CPU if for_cpu(target) else ATTENTION_ROWS
    limit = target.max_shared_memory_per_block
    cols = 32
    while cols > 4 and cols * (spec.D + spec.Dv) * 4 > limit // 2:
        cols //= 2
    return rows, cols


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
    rows, cols = attention_tiles(spec, target)
    unroll = "serial" if for_cpu(target) else "unrolled"
    f32 = "float32"
    batch, L, S, D, Dv = tuple(spec.batch), spec.L, spec.S, spec.D, spec.Dv
    Q = Buffer("Q", (*batch, L, D), f32)
    K = Buffer("K", (*batch, D, S) if spec.k_transposed else (*batch, S, D), f32)
    V = Buffer("V", (*batch, S, Dv), f32)
    O = Buffer("O", (*batch, L, Dv), f32)
    M = None
    if spec.mask is not None:
        M = Buffer("mask", tuple(spec.mask_shape), f32 if spec.mask == "add" else "bool")
    Ks = Buffer("K_shared", (cols, D), f32, scope="shared")
    Vs = Buffer("V_shared", (cols, Dv), f32, scope="shared")
    q = Buffer("q_local", (D,), f32, scope="local")
    o = Buffer("o_local", (Dv,), f32, scope="local")
    p = Buffer("p_local", (cols,), f32, scope="local")
    st = Buffer("row_state", (3,), f32, scope="local")     # m (running max), l (sum), m_new

    by, bx, tx = Var("by"), Var("bx"), Var("tx")
    kt, c, d, e = Var("kt"), Var("c"), Var("d"), Var("e")
    nbatch = 1
    for b in batch:
        nbatch = nbatch * b
    # the batch index of work-group row `by`, dim by dim (the last dim fastest)
    bidx, rest = [], by
    for b in reversed(batch[1:]):
        bidx.append(floormod(rest, b))
        rest = floordiv(rest, b)
    bidx = ([rest] if batch else []) + bidx[::-1]

    row = bx * rows + tx
    row_c = Select(row < L, row, L - 1)       # rows past L compute on the last row, unstored
    neg_inf = const(-math.inf, f32)

    def k_at(pos, dd):
        return K[(*bidx, dd, pos)] if spec.k_transposed else K[(*bidx, pos, dd)]

    def mask_at(col):
        full = (*bidx, row_c, col)
        idx = []
        for i, m in enumerate(spec.mask_shape):
            j = len(full) - len(spec.mask_shape) + i
            one = m == 1 if isinstance(m, int) else isinstance(m, IntImm) and m.value == 1
            idx.append(const(0, "int64") if one else full[j])
        return M[tuple(idx)]

    def fetch(buf, width, load):
        """The cooperative copy of one step's tile of ``width`` columns into ``buf``."""
        total = cols * width
        steps = -(-total // rows)
        flat = e * rows + tx
        cc, dd = floordiv(flat, width), floormod(flat, width)
        pos = kt * cols + cc
        pos_c = Select(pos < S, pos, S - 1)
        body = BufferStore(buf, load(pos_c, dd), [cc, dd])
        if total % rows:
            body = IfThenElse(flat < total, body)
        return For(e, 0, steps, "serial", body)

    def scores():
        col = kt * cols + c
        dot = For(d, 0, D, unroll, BufferStore(p, p[c] + q[d] * Ks[c, d], [c]))
        s = p[c] * const(spec.scale[1], f32) if spec.scale[0] == "mul" else \
            p[c] / const(spec.scale[1], f32)
        if spec.mask == "add":
            s = s + mask_at(col)
        elif spec.mask == "select":
            s = Select(mask_at(col), s, const(spec.fill, f32))
        s = Select(col < S, s, neg_inf)
        return For(c, 0, cols, unroll, seq(BufferStore(p, const(0.0, f32), [c]), dot,
                                            BufferStore(p, s, [c])))

    m, l, m_new = st[0], st[1], st[2]
    # while every score so far is -inf the running maximum is taken as 0: exp(-inf - 0) = 0
    m_safe = Select(m_new == neg_inf, const(0.0, f32), m_new)
    step = seq(
        fetch(Ks, D, k_at),
        fetch(Vs, Dv, lambda pos, dd: V[(*bidx, pos, dd)]),
        scores(),
        BufferStore(st, m, [2]),
        For(c, 0, cols, unroll, BufferStore(st, Max(m_new, p[c]), [2])),
        # rescale what was accumulated under the old maximum
        BufferStore(st, l * call("exp", m - m_safe), [1]),
        For(d, 0, Dv, unroll, BufferStore(o, o[d] * call("exp", m - m_safe), [d])),
        For(c, 0, cols, unroll, seq(
            BufferStore(p, call("exp", p[c] - m_safe), [c]),
            BufferStore(st, l + p[c], [1]),
            For(d, 0, Dv, unroll, BufferStore(o, o[d] + p[c] * Vs[c, d], [d])))),
        BufferStore(st, m_new, [0]),
    )
    thread = seq(
        For(d, 0, D, unroll, BufferStore(q, Q[(*bidx, row_c, d)], [d])),
        For(d, 0, Dv, unroll, BufferStore(o, const(0.0, f32), [d])),
        BufferStore(st, neg_inf, [0]),
        BufferStore(st, const(0.0, f32), [1]),
        For(kt, 0, _ceil_div(S, cols), "serial", step),
        For(d, 0, Dv, unroll, IfThenElse(row < L, BufferStore(O, o[d] / l,
                                                               [*bidx, row, d]))),
    )
    for buf in (st, p, o, q):
        thread = Allocate(buf, thread)
    body = For(tx, 0, rows, "thread_binding", thread, thread_tag="threadIdx.x")
    body = Allocate(Ks, Allocate(Vs, body))
    body = For(bx, 0, _ceil_div(L, rows), "thread_binding", body, thread_tag="blockIdx.x")
    body = For(by, 0, nbatch, "thread_binding", body, thread_tag="blockIdx.y")

    buffers = [Q, K, V] + ([M] if M is not None else []) + [O]
    handles = [Var(b.name, dt.HANDLE) for b in buffers]
    return PrimFunc(handles, body, dict(zip(handles, buffers)),
                    attrs={"global_symbol": name, "op_pattern": _OPAQUE,
                           "tir.is_scheduled": True})
