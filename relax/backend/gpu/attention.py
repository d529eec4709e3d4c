"""The fused attention kernel of the GPU targets: ``softmax(Q Kᵀ * scale + mask) V`` in one
launch (FlashAttention's online softmax), built directly as a scheduled TensorIR function.

``relax.transform.FuseAttention`` finds the pattern in a graph and calls
``attention_kernel`` for its shapes; the kernel is already bound to work-groups and threads,
so the default GPU schedules leave it as it is.

The kernel (``flash_kernel``; the arithmetic behind its tiles is in the comment above it): a
work-group per (batch..., block of ``BR`` query rows), its threads each owning a ``TR x TC``
block of the step's ``BR x BC`` score tile and a ``TR x Dv / CG`` block of the output in
registers:

* the block's Qᵀ is staged in shared memory once (WebGPU, whose 16 KB do not hold it beside
  the tiles: each thread's query row in registers); the key / value sequence goes in steps of
  ``BC`` positions, the step's Kᵀ and V tiles copied into shared memory by all the threads
  (consecutive threads on the operand's contiguous axis: coalesced), the transposed tiles'
  rows padded by 4 words;
* per ``d`` a thread reads its 4 rows of Qᵀ and 4 columns of Kᵀ as two 16-byte loads and
  does 16 multiply-adds; the scale, the mask (additive, or the bool mask's fill value) and
  ``-inf`` past ``S`` are applied in registers;
* the online softmax: each row's new maximum is met across the ``CG`` threads sharing the row
  through shared memory; the output and the running sum are rescaled by ``exp(m_old -
  m_new)``; the probabilities go to shared memory as Pᵀ and each thread accumulates
  ``P[rows, :] . V[:, dims]`` from one 16-byte load of Pᵀ and ``Dv / (4 CG)`` of V per key;
* at the end the rows' partial sums meet in shared memory: ``O[row, d] = o / l``.

The former kernel (``row_split_kernel``: one query row per 8 threads, ``q`` in registers, one
shared load per multiply-add) stays behind ``ATTENTION_KERNEL = "rows"`` for the benchmark's
before / after.

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

__all__ = ["AttentionSpec", "ATTENTION_DTYPES", "attention_kernel", "attention_tiles", "flash_kernel", "flash_tiles",
           "row_split_kernel", "ATTENTION_COLS", "ATTENTION_KERNEL", "ATTENTION_MAX_HEAD",
           "ATTENTION_ROWS", "ATTENTION_SPLIT", "FLASH_TILE", "FLASH_TILE_WEBGPU"]

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
    dtype : str
        The dtype of Q, K and V: ``"float32"``, or ``"float16"`` (a ``ToMixedPrecision``
        model's attention: the operands are converted to float32 as they are fetched, the
        scores, the softmax and the accumulation stay float32).
    out_dtype : str
        The dtype of the output (``"float16"``: rounded once, at the store).
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
    dtype: str = "float32"
    out_dtype: str = "float32"


ATTENTION_DTYPES = ("float32", "float16")


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


def _operand(name: str, logical: tuple, view, dtype: str = "float32") -> Buffer:
    """The buffer of an operand: its logical shape, or the shape of the tensor it views."""
    return Buffer(name, logical if view is None else tuple(view[0]), dtype)


def _as_f32(x):
    """A loaded operand value in float32 (the kernels compute in float32 whatever the
    operands' storage: a float16 operand is converted once, where it is fetched)."""
    return x if x.dtype == "float32" else x.astype("float32")


def _store_o(buf: Buffer, value, idx):
    """``O[idx] = value``, rounded to the output's dtype."""
    return BufferStore(buf, value if buf.dtype == "float32" else value.astype(buf.dtype), idx)


def _load(buf: Buffer, view, idx: tuple):
    """``buf`` read at logical index ``idx``, through the operand's view (see
    ``AttentionSpec``): the permutation undone, then the reshape's split of the last dim;
    the value in float32."""
    return _as_f32(_load_raw(buf, view, idx))


def _load_raw(buf: Buffer, view, idx: tuple):
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


def row_split_kernel(spec: AttentionSpec, target: Target, name: str = "fused_attention"
                     ) -> PrimFunc:
    """The former kernel (``ATTENTION_KERNEL = "rows"``): ``rows`` query rows per work-group,
    ``split`` threads per row, each keeping its row's whole ``q`` in registers and reading ``K``
    from shared memory once per multiply-add. Kept for the before / after benchmark.

    Raises
    ------
    ValueError
        A head size that is not a constant in 1..``ATTENTION_MAX_HEAD``, or an unknown mask
        or scale kind.
    """
    _check(spec)
    rows, split, cols = attention_tiles(spec, target)
    unroll = "serial" if for_cpu(target) else "unrolled"
    f32 = "float32"
    batch, L, S, D, Dv = tuple(spec.batch), spec.L, spec.S, spec.D, spec.Dv
    Q = _operand("Q", (*batch, L, D), spec.q_view, spec.dtype)
    K = _operand("K", (*batch, D, S) if spec.k_transposed else (*batch, S, D), spec.k_view,
                 spec.dtype)
    V = _operand("V", (*batch, S, Dv), spec.v_view, spec.dtype)
    O = _operand("O", (*batch, L, Dv), spec.o_view, spec.out_dtype)
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
            IfThenElse(row < L, _store_o(O, o[d] / l, _out_index(
                spec.o_view, (*bidx, row, d * split + t))))),
    )
    return _launch(name, thread, (st, sc, o, q), (red, Ps, Vs, Ks), (tx, threads),
                   (bx, _ceil_div(L, rows)), (by, nbatch), [Q, K, V, M, O])


def _launch(name: str, thread, local, shared, tx, bx, by, operands) -> PrimFunc:
    """The kernel around one thread's statement ``thread``: its ``local`` buffers allocated
    per thread, ``shared`` per work-group, ``(var, extent)`` of ``threadIdx.x`` / ``blockIdx.x``
    / ``blockIdx.y``; ``operands`` Q, K, V, the mask (None: no mask) and O."""
    for buf in local:
        thread = Allocate(buf, thread)
    body = For(tx[0], 0, tx[1], "thread_binding", thread, thread_tag="threadIdx.x")
    for buf in shared:
        body = Allocate(buf, body)
    body = For(bx[0], 0, bx[1], "thread_binding", body, thread_tag="blockIdx.x")
    body = For(by[0], 0, by[1], "thread_binding", body, thread_tag="blockIdx.y")
    buffers = [b for b in operands if b is not None]
    handles = [Var(b.name, dt.HANDLE) for b in buffers]
    return PrimFunc(handles, body, dict(zip(handles, buffers)),
                    attrs={"global_symbol": name, "op_pattern": _OPAQUE,
                           "tir.is_scheduled": True})


def _check(spec: AttentionSpec) -> None:
    """Raise ValueError for what no attention kernel here can compile."""
    for what, d in (("D", spec.D), ("Dv", spec.Dv)):
        if not isinstance(d, int) or not 1 <= d <= ATTENTION_MAX_HEAD:
            raise ValueError(f"fused attention: head size {what} = {d!r} must be a constant "
                             f"in 1..{ATTENTION_MAX_HEAD}")
    if spec.mask not in (None, "add", "select"):
        raise ValueError(f"fused attention: unknown mask kind {spec.mask!r}")
    if spec.scale[0] not in ("mul", "div"):
        raise ValueError(f"fused attention: unknown scale {spec.scale!r}")
    for what, t in (("dtype", spec.dtype), ("out_dtype", spec.out_dtype)):
        if t not in ATTENTION_DTYPES:
            raise ValueError(f"fused attention: {what} {t!r} is not one of {ATTENTION_DTYPES}")


def attention_kernel(spec: AttentionSpec, target: Target, name: str = "fused_attention"
                     ) -> PrimFunc:
    """The scheduled PrimFunc ``(Q, K, V[, mask], O)`` of ``spec`` for ``target``: the tiled
    kernel (``flash_kernel``), or the former one where ``ATTENTION_KERNEL`` is ``"rows"``.

    Raises
    ------
    ValueError
        A head size that is not a constant in 1..``ATTENTION_MAX_HEAD``, or an unknown mask
        or scale kind.
    """
    if ATTENTION_KERNEL == "rows":
        return row_split_kernel(spec, target, name)
    if ATTENTION_KERNEL != "tiled":
        raise ValueError(f"fused attention: ATTENTION_KERNEL = {ATTENTION_KERNEL!r} is "
                         f"neither 'tiled' nor 'rows'")
    return flash_kernel(spec, target, name)


# ---------------------------------------------------------------------------------------------
# the tiled kernel
#
# A work-group per (batch..., block of BR query rows); threads ``RG x CG`` (RG = BR / TR row
# groups, CG = BC / TC column groups), thread ``tx = rg * CG + cg``. Per step of BC key
# positions each thread owns a TR x TC block of the BR x BC score tile in registers (rows
# ``rg * TR + i``, columns ``cg * TC + j``) and a TR x (Dv / CG) block of the output (the same
# rows; dims in runs of 4, ``(v * CG + cg) * 4 + k``). Shared memory holds Qᵀ (D x BR, loaded
# once), the step's Kᵀ (D x BC) and V (BC x Dv) tiles, Pᵀ (BC x BR) and the row partials
# (BR x CG); the transposed layouts make a thread's TR rows / TC columns at one ``d`` four
# consecutive words: one 16-byte load (float4 / vec4) each.
#
# Arithmetic at BERT's shapes (D = Dv = 64, L = S = 128, 12 heads), OpenCL
# (BR, BC, TR, TC) = (32, 32, 4, 4): 64 threads (2 warps: rg 0..3 x cg 0..7 each).
# * QKᵀ, per d: one float4 of Qᵀ (4 distinct per warp, a broadcast: 1 wavefront) and one of
#   Kᵀ (8 consecutive float4 = 128 B: 1 wavefront) feed 16 FMAs: 8 FMA per shared wavefront
#   (the former kernel: 1 LDS per FMA, 8-way bank conflicts on K).
# * PV, per key c: one float4 of Pᵀ (broadcast) and Dv / 32 = 2 float4 of V (1 wavefront each)
#   feed TR x 8 = 32 FMAs: ~11 FMA per wavefront (the former: 2 loads per FMA).
#   An SM issues 4 FMA warp-instructions and ~1 shared wavefront per clock: both phases are
#   FMA-bound on paper.
# * Registers: scores 16 + output 32 + fragments 4 + 4 + 4 + 8 + row state 12 + addresses:
#   ~100 (the H100 allows 255; 64 threads x 100 x 6 work-groups = 38 K of the SM's 64 K).
# * Shared: Qᵀ 64 x 36 + Kᵀ 64 x 36 + V 32 x 64 + Pᵀ 32 x 36 + partials 32 x 9 floats =
#   32.3 KB (rows padded by 4 words: the stores of the transposing fetches spread over the
#   banks, the float4 reads stay aligned; the partials' by one: the 4 row groups of a warp
#   read them at one column); the 228 KB of an SM hold 6 work-groups (with the 1 KB the
#   driver reserves per block), 12 warps.
# * Work-groups: batch x 12 x 128 / 32: 48 at batch 1 (one per SM on 48 of the 132), 768 at
#   batch 16 (5.8 per SM, under the 6 x 132 = 792 that fit at once: one wave). Each reads K and V once per
#   query block: 4 x (K + V) of its head, 2 MB of L2 traffic at batch 16 per query block.
# * FLOPs at batch 16: 0.8 GFLOP = 400 M FMA; 132 SMs x 128 FMA/clk x 1.7 GHz = 29 T FMA/s:
#   14 us at peak, the target ~30-40 us (PyTorch ~51 us).
#
# WebGPU (16 KB of workgroup storage): Qᵀ (9 KB at D = 64, BR = 32) does not fit beside the
# tiles, so each thread keeps its one query row (TR = 1) in D registers, as the former kernel
# did, and (BR, BC, TR, TC) = (32, 16, 1, 4): 128 invocations, Kᵀ 64 x 20 + V 16 x 64 + Pᵀ
# 16 x 36 + partials 32 x 5 floats = 12 KB. Per d one vec4 of Kᵀ (4 distinct per warp: 1
# wavefront) feeds 4 FMAs; per key c one P word (broadcast) and 4 vec4 of V (1 wavefront
# each) feed 16 FMAs: ~3.5 FMA per wavefront, about the SM's 4 : 1 issue ratio (the former
# kernel: 1 conflicted load per FMA). With an adapter's limits of 32 KB (a WebGPU target
# from ``targets.webgpu(0).target()``) WebGPU takes the OpenCL tile instead.
#
# The sequence lengths are symbolic: a query row past L computes on row L - 1 and is not
# stored; a key position past S scores -inf (its exp is 0; V is read at S - 1 there).

ATTENTION_KERNEL = "tiled"            # "rows": the former kernel (benchmark's before / after)
FLASH_TILE = (32, 32, 4, 4)           # (BR, BC, TR, TC): Qᵀ in shared memory
FLASH_TILE_WEBGPU = (32, 16, 1, 4)    # q in registers (WebGPU's 16 KB)
_PAD = 4                              # words added to the transposed tiles' rows


def flash_tiles(spec: AttentionSpec, target: Target) -> tuple[int, int, int, int]:
    """(BR, BC, TR, TC) for ``spec`` on ``target``: ``FLASH_TILE`` where the target's shared
    memory holds it (``target.max_shared_memory_per_block``) and the target is not WebGPU, else
    ``FLASH_TILE_WEBGPU`` (q in registers), its key step (then its query block) halved until the
    tiles fit.

    >>> flash_tiles(AttentionSpec(batch=(), L=128, S=128, D=64, Dv=64), Target("opencl"))
    (32, 32, 4, 4)
    >>> flash_tiles(AttentionSpec(batch=(), L=128, S=128, D=64, Dv=64), Target("webgpu"))
    (32, 16, 1, 4)
    """
    limit = target.max_shared_memory_per_block
    # WebGPU takes the registers tile even where the adapter's storage would hold the
    # Q-in-shared-memory tile: on an H100 through Vulkan (2026-12-07, BERT's shapes, batch 16)
    # the shared-Q tile took 0.52 ms under the adapter's limits, the registers tile 0.19 ms
    # (OpenCL's shared-Q tile: 0.07 ms on the same card)
    if target.kind != "webgpu" and _flash_shared_bytes(spec, *FLASH_TILE) <= limit:
        return FLASH_TILE
    br, bc, tr, tc = FLASH_TILE_WEBGPU
    while _flash_shared_bytes(spec, br, bc, tr, tc) > limit:
        if bc > tc:
            bc //= 2
        elif br > tr:
            br //= 2
        else:
            raise ValueError(f"fused attention: head sizes D = {spec.D}, Dv = {spec.Dv} need "
                             f"more than the target's {limit} bytes of shared memory")
    return br, bc, tr, tc


def _flash_shared_bytes(spec: AttentionSpec, br: int, bc: int, tr: int, tc: int) -> int:
    q = spec.D * (br + _PAD) if tr > 1 else 0
    return 4 * (q + spec.D * (bc + _PAD) + bc * spec.Dv + bc * (br + _PAD) + br * (bc // tc + 1))


def _contiguous_axis(view, rank: int) -> int:
    """The logical axis of an operand whose consecutive elements are adjacent in memory."""
    if view is None:
        return rank - 1
    axes = view[1]
    return list(axes).index(len(axes) - 1)


def flash_kernel(spec: AttentionSpec, target: Target, name: str = "fused_attention",
                 tile: tuple[int, int, int, int] | None = None) -> PrimFunc:
    """The tiled attention kernel (FlashAttention's online softmax on a SIMT tile; see the
    arithmetic above), ``tile`` = (BR, BC, TR, TC) or ``flash_tiles``' choice.

    Raises
    ------
    ValueError
        As ``attention_kernel``; a tile whose sizes do not divide (BR by TR, BC by TC).
    """
    _check(spec)
    br, bc, tr, tc = tile or flash_tiles(spec, target)
    if br % tr or bc % tc or tr not in (1, 2, 4) or tc not in (1, 2, 4):
        raise ValueError(f"fused attention: tile {(br, bc, tr, tc)} must have TR, TC in "
                         f"1, 2, 4 dividing BR, BC")
    rg_n, cg_n = br // tr, bc // tc
    threads = rg_n * cg_n
    q_shared = tr > 1
    unroll = "serial" if for_cpu(target) else "unrolled"
    f32 = "float32"
    batch, L, S, D, Dv = tuple(spec.batch), spec.L, spec.S, spec.D, spec.Dv
    nb = len(batch)
    Q = _operand("Q", (*batch, L, D), spec.q_view, spec.dtype)
    K = _operand("K", (*batch, D, S) if spec.k_transposed else (*batch, S, D), spec.k_view,
                 spec.dtype)
    V = _operand("V", (*batch, S, Dv), spec.v_view, spec.dtype)
    O = _operand("O", (*batch, L, Dv), spec.o_view, spec.out_dtype)
    M = None
    if spec.mask is not None:
        M = Buffer("mask", tuple(spec.mask_shape), f32 if spec.mask == "add" else "bool")
    # the transposed tiles' rows padded (explicit strides: the allocation compaction keeps them)
    brp, bcp = br + _PAD, bc + _PAD
    Qs = Buffer("Q_shared", (D, br), f32, strides=(brp, 1), scope="shared")     # Qᵀ
    Ks = Buffer("K_shared", (D, bc), f32, strides=(bcp, 1), scope="shared")     # Kᵀ
    Vs = Buffer("V_shared", (bc, Dv), f32, scope="shared")
    Ps = Buffer("P_shared", (bc, br), f32, strides=(brp, 1), scope="shared")    # Pᵀ
    # rows padded by one word: the 4 row groups of a warp read their rows' partials at the same
    # column, which would fall into one bank at a stride of CG = 8 words
    red = Buffer("row_partials", (br, cg_n), f32, strides=(cg_n + 1, 1), scope="shared")
    # the output dims of a thread: runs of w = 4 (one float4 of V) where Dv allows, else single
    w = 4 if Dv % (4 * cg_n) == 0 else 1
    nv = -(-Dv // (cg_n * w))
    guard_dims = nv * cg_n * w != Dv
    s_l = Buffer("s_local", (tr * tc,), f32, scope="local")
    o_l = Buffer("o_local", (tr * nv * w,), f32, scope="local")
    m_l = Buffer("m_local", (tr,), f32, scope="local")      # running maximum per row
    l_l = Buffer("l_local", (tr,), f32, scope="local")      # this thread's part of the sum
    n_l = Buffer("mnew_local", (tr,), f32, scope="local")   # the step's new maximum
    c_l = Buffer("mref_local", (tr,), f32, scope="local")   # it, -inf read as 0
    x_l = Buffer("max_local", (1,), f32, scope="local")
    q_l = Buffer("q_local", (tr * D,) if not q_shared else (tr,), f32, scope="local")
    k_l = Buffer("k_frag", (tc,), f32, scope="local")
    p_l = Buffer("p_frag", (tr,), f32, scope="local")
    v_l = Buffer("v_frag", (nv * w,), f32, scope="local")

    by, bx, tx = Var("by"), Var("bx"), Var("tx")
    kt, d, e, c, t2 = Var("kt"), Var("d"), Var("e"), Var("c"), Var("t2")
    i, j, v, k = Var("i"), Var("j"), Var("v"), Var("k")
    nbatch = 1
    for b in batch:
        nbatch = nbatch * b
    bidx, rest = [], by
    for b in reversed(batch[1:]):
        bidx.append(floormod(rest, b))
        rest = floordiv(rest, b)
    bidx = ([rest] if batch else []) + bidx[::-1]
    rg, cg = floordiv(tx, cg_n), floormod(tx, cg_n)
    neg_inf, zero = const(-math.inf, f32), const(0.0, f32)

    def clamp(x, n):
        return Select(x < n, x, n - 1)

    def row_of(ii):                      # the thread's ii-th query row (global)
        return bx * br + rg * tr + ii

    def dim_of(vv, kk):                  # the thread's (vv, kk)-th output dim
        return (vv * cg_n + cg) * w + kk

    def k_at(pos, dd):
        idx = (*bidx, dd, pos) if spec.k_transposed else (*bidx, pos, dd)
        return _load(K, spec.k_view, idx)

    def mask_at(rr, col):
        full = (*bidx, rr, col)
        idx = []
        for a, m in enumerate(spec.mask_shape):
            jj = len(full) - len(spec.mask_shape) + a
            one = m == 1 if isinstance(m, int) else isinstance(m, IntImm) and m.value == 1
            idx.append(const(0, "int64") if one else full[jj])
        return M[tuple(idx)]

    def fetch(n_pos, width, base, limit, pos_fastest, load, store, transposed):
        """The cooperative copy of a ``n_pos x width`` tile (positions ``base + cc`` clamped
        below ``limit``, columns ``dd``) into shared memory, stored ``[dd, cc]`` where
        ``transposed`` (Qᵀ, Kᵀ; rows ``_PAD`` words longer than a multiple of 32) else
        ``[cc, dd]``. Consecutive threads go along the operand's contiguous axis, so that a warp
        reads whole 32-byte sectors of global memory (coalesced):

        * contiguous positions (Kᵀ given as ``(D, S)``): one word per thread, the warp on 32
          positions of one column (stores conflict-free);
        * contiguous columns into a transposed tile: a warp on an 8-column x 4-position block
          (four 32-byte sectors read whole), so that its stores at ``dd * (BC + 4) + cc`` fall
          into 32 different banks (a warp along 32 columns would hit 8 banks: 4-way
          conflicts on every store, as many wavefronts per step as the multiply-adds' loads);
        * contiguous columns into a row-major tile (V): one word per thread along a row.
          (Runs of 4 as one float4 load each were tried: PoCL computed them wrong for one tile
          when the loops around carry no unroll pragma, the C source otherwise the same; the
          loads are coalesced either way, the vectors would save instructions only.)
        """
        total = n_pos * width
        flat = e * threads + tx
        if pos_fastest:
            cc, dd = floormod(flat, n_pos), floordiv(flat, n_pos)
            body = store(cc, dd, load(clamp(base + cc, limit), dd))
        elif transposed and width % 8 == 0 and n_pos % 4 == 0 and threads % 32 == 0:
            blk, lane = floordiv(flat, 32), floormod(flat, 32)
            dd = floormod(blk, width // 8) * 8 + floormod(lane, 8)
            cc = floordiv(blk, width // 8) * 4 + floordiv(lane, 8)
            body = store(cc, dd, load(clamp(base + cc, limit), dd))
        else:
            cc, dd = floordiv(flat, width), floormod(flat, width)
            body = store(cc, dd, load(clamp(base + cc, limit), dd))
        if total % threads:
            body = IfThenElse(flat < total, body)
        return For(e, 0, -(-total // threads), "serial", body)

    k_pos_axis = nb + 1 if spec.k_transposed else nb
    fetch_k = fetch(bc, D, kt * bc, S,
                    _contiguous_axis(spec.k_view, nb + 2) == k_pos_axis, k_at,
                    lambda cc, dd, x: BufferStore(Ks, x, [dd, cc]), True)
    fetch_v = fetch(bc, Dv, kt * bc, S, _contiguous_axis(spec.v_view, nb + 2) == nb,
                    lambda pos, dd: _load(V, spec.v_view, (*bidx, pos, dd)),
                    lambda cc, dd, x: BufferStore(Vs, x, [cc, dd]), False)

    def vec_copy(dst, dst_base, load_at, n):
        """``dst[dst_base + x] = load_at(x)`` for x < n: one 16-byte load where n is 4."""
        return For(k, 0, n, "vectorized" if n in (2, 4) else unroll,
                   BufferStore(dst, load_at(k), [dst_base + k]))

    # the scores of the step: s[i, j] = q_i . k_j, then scaled, masked, -inf past S
    if q_shared:
        frag_q = vec_copy(q_l, 0, lambda x: Qs[d, rg * tr + x], tr)
        q_at = lambda ii: q_l[ii]                        # noqa: E731
    else:
        frag_q = None
        q_at = lambda ii: q_l[ii * D + d]                # noqa: E731
    dot = For(d, 0, D, unroll, seq(*[x for x in (
        frag_q,
        vec_copy(k_l, 0, lambda x: Ks[d, cg * tc + x], tc),
        For(i, 0, tr, unroll, For(j, 0, tc, unroll, BufferStore(
            s_l, s_l[i * tc + j] + q_at(i) * k_l[j], [i * tc + j])))) if x is not None]))
    col = kt * bc + cg * tc + j
    sv = s_l[i * tc + j]
    sv = sv * const(spec.scale[1], f32) if spec.scale[0] == "mul" else \
        sv / const(spec.scale[1], f32)
    if spec.mask == "add":
        sv = sv + mask_at(clamp(row_of(i), L), clamp(col, S))
    elif spec.mask == "select":
        sv = Select(mask_at(clamp(row_of(i), L), clamp(col, S)), sv, const(spec.fill, f32))
    finish = For(i, 0, tr, unroll, For(j, 0, tc, unroll, BufferStore(
        s_l, Select(col < S, sv, neg_inf), [i * tc + j])))

    # the online softmax: the rows' new maxima over the CG threads sharing them (shared
    # memory), the old accumulators rescaled, the probabilities into Pᵀ and the sums
    row_max = For(i, 0, tr, unroll, seq(
        BufferStore(x_l, neg_inf, [0]),
        For(j, 0, tc, unroll, BufferStore(x_l, Max(x_l[0], s_l[i * tc + j]), [0])),
        BufferStore(red, x_l[0], [rg * tr + i, cg])))
    corr = call("exp", m_l[i] - c_l[i])
    rescale = For(i, 0, tr, unroll, seq(
        BufferStore(n_l, m_l[i], [i]),
        For(t2, 0, cg_n, unroll, BufferStore(n_l, Max(n_l[i], red[rg * tr + i, t2]), [i])),
        # while every score so far is -inf the maximum is taken as 0: exp(-inf - 0) = 0
        BufferStore(c_l, Select(n_l[i] == neg_inf, zero, n_l[i]), [i]),
        BufferStore(l_l, l_l[i] * corr, [i]),
        For(v, 0, nv * w, unroll, BufferStore(o_l, o_l[i * nv * w + v] * corr,
                                              [i * nv * w + v])),
        For(j, 0, tc, unroll, seq(
            BufferStore(s_l, call("exp", s_l[i * tc + j] - c_l[i]), [i * tc + j]),
            BufferStore(l_l, l_l[i] + s_l[i * tc + j], [i]),
            BufferStore(Ps, s_l[i * tc + j], [cg * tc + j, rg * tr + i]))),
        BufferStore(m_l, n_l[i], [i])))

    # o[i, dims] += Pᵀ[c, row i] * V[c, dims]
    if w == 4:
        frag_v = For(v, 0, nv, unroll, vec_copy(v_l, v * 4, lambda x: Vs[c, dim_of(v, x)], 4))
    else:
        dd = dim_of(v, 0)
        frag_v = For(v, 0, nv, unroll, BufferStore(
            v_l, Vs[c, clamp(dd, Dv) if guard_dims else dd], [v]))
    pv = For(c, 0, bc, unroll, seq(
        vec_copy(p_l, 0, lambda x: Ps[c, rg * tr + x], tr),
        frag_v,
        For(i, 0, tr, unroll, For(v, 0, nv * w, unroll, BufferStore(
            o_l, o_l[i * nv * w + v] + p_l[i] * v_l[v], [i * nv * w + v])))))

    step = seq(
        fetch_k, fetch_v,
        For(i, 0, tr * tc, unroll, BufferStore(s_l, zero, [i])),
        dot, finish, row_max, rescale, pv)

    load_q = []
    if q_shared:
        load_q.append(fetch(br, D, bx * br, L, _contiguous_axis(spec.q_view, nb + 2) == nb,
                            lambda pos, dd: _load(Q, spec.q_view, (*bidx, pos, dd)),
                            lambda cc, dd, x: BufferStore(Qs, x, [dd, cc]), True))
    else:
        load_q.append(For(i, 0, tr, unroll, For(d, 0, D, unroll, BufferStore(
            q_l, _load(Q, spec.q_view, (*bidx, clamp(row_of(i), L), d)), [i * D + d]))))
    dim = dim_of(floordiv(v, w), floormod(v, w))
    store = _store_o(O, o_l[i * nv * w + v] / l_l[i],
                        _out_index(spec.o_view, (*bidx, row_of(i), dim)))
    ok = row_of(i) < L
    if guard_dims:
        ok = ok & (dim < Dv)
    thread = seq(
        *load_q,
        For(i, 0, tr * nv * w, unroll, BufferStore(o_l, zero, [i])),
        For(i, 0, tr, unroll, seq(BufferStore(m_l, neg_inf, [i]),
                                  BufferStore(l_l, zero, [i]))),
        For(kt, 0, _ceil_div(S, bc), "serial", step),
        # each row's sum over the CG threads sharing it
        For(i, 0, tr, unroll, BufferStore(red, l_l[i], [rg * tr + i, cg])),
        For(i, 0, tr, unroll, seq(
            BufferStore(l_l, zero, [i]),
            For(t2, 0, cg_n, unroll, BufferStore(l_l, l_l[i] + red[rg * tr + i, t2], [i])))),
        For(i, 0, tr, unroll, For(v, 0, nv * w, unroll, IfThenElse(ok, store))),
    )
    return _launch(name, thread, (v_l, p_l, k_l, q_l, x_l, c_l, n_l, l_l, m_l, o_l, s_l),
                   (red, Ps, Vs, Ks) + ((Qs,) if q_shared else ()), (tx, threads),
                   (bx, _ceil_div(L, br)), (by, nbatch), [Q, K, V, M, O])
