"""Hand schedules for elementwise (injective) kernels on CPUs, and the kernels the benchmarks use.

The schedule is TVM's x86 ``schedule_injective``: producers that are elementwise get inlined into
their consumers (one pass over memory), the loop nest becomes

    for outer in T.parallel(...):          # rows (or chunks) split over the cores
        for inner_0 in range(...):
            for inner_1 in T.vectorized(L):   # L lanes of the vector registers

and a tail (an extent that L does not divide, or a symbolic one) becomes a predicate that the
LLVM code generator tests once per vector on the last lane (whole vectors run without masks).

Examples
--------
>>> from tilecraft import targets
>>> from tilecraft.tensorir import Schedule
>>> from benchmarks.schedules import elementwise as ew
>>> sch = Schedule(ew.gelu_tanh_func())                    # symbolic n
>>> ew.schedule_elementwise(sch, "T_gelu", targets.Target("llvm"))
>>> mod = targets.build(sch.mod, "llvm")                    # doctest: +SKIP
"""
from __future__ import annotations

import math

from tilecraft import targets
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import IntImm
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.schedule import BlockRV, Schedule, ScheduleError

PARALLEL_MIN_ELEMENTS = 1 << 14   # below this a thread-pool launch costs more than it saves
FEW_ROWS = 64                     # fewer parallel rows than this: split the rows' chunks too


# ----------------------------------------------------------------------------------------------
# target helpers (shared by the softmax and conv2d schedules)


def as_target(target):
    """``targets.Target`` from a Target or a string (``"llvm"``)."""
    return target if isinstance(target, targets.Target) else targets.Target(target)


def vector_lanes(target, dtype: str = "float32") -> int:
    """Lanes of one vector register for ``dtype`` on ``target`` (float16 computes as float32).

    Examples
    --------
    >>> vector_lanes("llvm -mcpu=haswell", "float32")
    8
    """
    bits = 8 if dtype == "bool" else dt.bits(dtype)
    if dtype == "float16":
        bits = 32
    return max(4, as_target(target).vector_width // bits)


def block_rv(sch: Schedule, block) -> BlockRV:
    return sch.get_block(block) if isinstance(block, str) else block


def const_int(e) -> int | None:
    return e.value if isinstance(e, IntImm) else None


# ----------------------------------------------------------------------------------------------
# inlining


def is_output_block(sch: Schedule, block: BlockRV) -> bool:
    """Whether the block writes a buffer that is a parameter of the function."""
    params = {id(b) for b in sch.func.buffers}
    return any(id(w.buffer) in params for w in sch.get(block).writes)


def is_spatial(sch: Schedule, block: BlockRV) -> bool:
    blk = sch.get(block)
    return blk.init is None and all(iv.kind == "spatial" for iv in blk.iter_vars)


def inline_injective(sch: Schedule) -> list[str]:
    """``compute_inline`` every intermediate elementwise block into its consumers, reductions
    included (repeatedly, so chains collapse); blocks that cannot be inlined stay. Returns the
    names inlined, in order.

    Examples
    --------
    For ``cube = x * x * x``, ``inner = c * (x + k * cube)``, ``th = tanh(inner)``,
    ``out = 0.5 * x * (1 + th)`` (only ``out`` a parameter):

    >>> inline_injective(sch)              # doctest: +SKIP
    ['cube', 'inner', 'th']
    """
    done: list[str] = []
    changed = True
    while changed:
        changed = False
        for blk in sch.get_child_blocks(sch.get_block("root")) if _has_root(sch) else []:
            if is_output_block(sch, blk) or not is_spatial(sch, blk):
                continue
            name = sch.get(blk).name
            try:
                sch.compute_inline(blk)
            except ScheduleError:
                continue
            done.append(name)
            changed = True
            break
    return done


def _has_root(sch: Schedule) -> bool:
    root = sch.get_root()
    return root is not None and root.name == "root"


# ----------------------------------------------------------------------------------------------
# the schedule


def _pure_elementwise(sch: Schedule, block: BlockRV) -> bool:
    """Every access of the block is at exactly its iter vars, in order (no broadcast, no
    transpose): fusing all its loops keeps every index contiguous."""
    blk = sch.get(block)
    ivs = [iv.var for iv in blk.iter_vars]
    for region in list(blk.reads) + list(blk.writes):
        r = region.region
        if len(r) == 0:
            continue  # a 0-d buffer (a scalar)
        if len(r) != len(ivs):
            return False
        for rng, v in zip(r, ivs):
            if not (rng.min is v and const_int(rng.extent) == 1):
                return False
    return True


def schedule_elementwise(sch: Schedule, block, target, *,
                         parallel_min: int = PARALLEL_MIN_ELEMENTS) -> None:
    """Parallelize and vectorize one spatial (injective) block.

    The innermost loop is split by the vector lanes (``L = vector_width / bits``) and
    vectorized; the other loops are fused into one parallel loop. A block whose accesses are
    all at its own iter vars with constant extents (``C[i, j] = A[i, j] + B[i, j]``) that whole
    vectors cover has all its loops fused first, so a narrow inner extent still fills vectors. Loops that are
    already parallel or vectorized are left alone (the block was scheduled). Nothing runs in
    parallel when the block has fewer than ``parallel_min`` (constant) points.

    Parameters
    ----------
    sch : Schedule
    block : BlockRV or str
        A block with only spatial iter vars.
    target : targets.Target or str
        Sets the vector lanes.
    parallel_min : int
        The smallest constant iteration count worth a parallel loop.

    Examples
    --------
    Before (``n`` symbolic)::

        for i in range(n):
            with T.block("y"):
                y[vi] = T.exp(x[vi])

    ``schedule_elementwise(sch, "y", "llvm")`` on AVX-512::

        for i_0 in T.parallel((n + 15) // 16):
            for i_1 in T.vectorized(16):
                with T.block("y"):
                    vi = T.axis.spatial(n, i_0 * 16 + i_1)
                    T.where(i_0 * 16 + i_1 < n)
                    y[vi] = T.exp(x[vi])
    """
    block = block_rv(sch, block)
    if not is_spatial(sch, block):
        raise ScheduleError("schedule_elementwise", f"block {sch.get(block).name} has reduce "
                            f"iter vars; schedule it with a reduction schedule")
    loops = sch.get_loops(block)
    if not loops or any(sch.get(l).kind != "serial" for l in loops):
        return
    blk = sch.get(block)
    lanes = vector_lanes(target, blk.writes[0].buffer.dtype)
    extents = [sch.get(l).extent for l in loops]
    static = all(isinstance(e, IntImm) for e in extents)
    total = math.prod(e.value for e in extents) if static else None
    # (only when whole vectors cover it: a fused tail predicate defeats the bounds verifier,
    # whose run-time check would then keep the loop scalar)
    if len(loops) > 1 and static and total % lanes == 0 and _pure_elementwise(sch, block):
        loops = [sch.fuse(*loops)]
    rows, inner = loops[:-1], loops[-1]
    inner_ext = const_int(sch.get(inner).extent)
    chunks = None
    if inner_ext is not None and inner_ext <= lanes:
        if inner_ext > 1:
            sch.vectorize(inner)
    else:
        chunks, vec = sch.split(inner, [None, lanes])
        sch.vectorize(vec)
    if total is not None and total < parallel_min:
        return
    # the row loops run in parallel (fused into one); with few rows (or none) the vector
    # chunks of a row join them, so every core gets work
    row_count = math.prod(const_int(e) or 0 for e in extents[:len(rows)]) if rows else 0
    par = list(rows)
    if chunks is not None and (not rows or 0 < row_count < FEW_ROWS):
        par.append(chunks)
    if par:
        sch.parallel(sch.fuse(*par) if len(par) > 1 else par[0])


def schedule_injective(sch: Schedule, target, *,
                       parallel_min: int = PARALLEL_MIN_ELEMENTS) -> None:
    """Inline every intermediate elementwise block, then ``schedule_elementwise`` each
    remaining spatial block (TVM's ``schedule_injective``).

    Examples
    --------
    >>> sch = Schedule(func)                     # doctest: +SKIP
    >>> schedule_injective(sch, "llvm")          # doctest: +SKIP
    """
    inline_injective(sch)
    if not _has_root(sch):
        return
    for blk in sch.get_child_blocks(sch.get_block("root")):
        if is_spatial(sch, blk):
            schedule_elementwise(sch, blk, target, parallel_min=parallel_min)


# ----------------------------------------------------------------------------------------------
# the benchmark kernels (TE definitions; ``n`` symbolic unless a size is given)

GELU_TANH_C = 0.7978845608028654   # sqrt(2 / pi)
GELU_TANH_K = 0.044715
INV_SQRT2 = 0.7071067811865476


def _vector_input(n, dtype, names):
    n = te.var("n") if n is None else n
    return n, [te.placeholder((n,), dtype, name) for name in names]


def add_func(n=None, dtype: str = "float32") -> PrimFunc:
    """``T_add[i] = A[i] + B[i]``."""
    n, (a, b) = _vector_input(n, dtype, ("A", "B"))
    c = te.compute((n,), lambda i: a[i] + b[i], "T_add")
    return te.create_prim_func([a, b, c])


def exp_func(n=None, dtype: str = "float32") -> PrimFunc:
    """``T_exp[i] = exp(A[i])``."""
    n, (a,) = _vector_input(n, dtype, ("A",))
    c = te.compute((n,), lambda i: te.exp(a[i]), "T_exp")
    return te.create_prim_func([a, c])


def gelu_tanh(x):
    """The tanh form of GELU: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    return x * 0.5 * (1.0 + te.tanh(GELU_TANH_C * (x + GELU_TANH_K * x * x * x)))


def gelu_erf(x):
    """The exact (erf) form of GELU: ``x / 2 (1 + erf(x / sqrt 2))``."""
    return x * 0.5 * (1.0 + te.erf(x * INV_SQRT2))


def gelu_tanh_func(n=None, dtype: str = "float32") -> PrimFunc:
    """``T_gelu[i] = gelu_tanh(A[i])``, one fused block."""
    n, (a,) = _vector_input(n, dtype, ("A",))
    c = te.compute((n,), lambda i: gelu_tanh(a[i]), "T_gelu")
    return te.create_prim_func([a, c])


def gelu_erf_func(n=None, dtype: str = "float32") -> PrimFunc:
    """``T_gelu[i] = gelu_erf(A[i])``, one fused block."""
    n, (a,) = _vector_input(n, dtype, ("A",))
    c = te.compute((n,), lambda i: gelu_erf(a[i]), "T_gelu")
    return te.create_prim_func([a, c])
