"""Split-K for the GPU GEMM family: a GEMM-like kernel whose output tiles fill the GPU poorly and
whose reduction is long runs as two kernels.

A BERT dense layer at batch 1 (128 x 768 outputs) has 24 output tiles of 64 x 64: a tile per
work-group leaves 108 of an H100's 132 multiprocessors idle, and the GEMM rule's answer without
split-K (register tiles of 1 x 2 accumulators, 192 work-groups, ``gemm._fill``) spends its time
in shared-memory reads instead of multiply-adds. Split-K keeps the efficient tile and splits the
reduction ``K`` into ``S`` parts instead:

- kernel 1, the GEMM tile over ``(S, row tiles, column tiles)``: ``rfactor`` of the outer loop
  of the reduction split into ``S`` parts, the rfactor block scheduled by
  ``gemm.schedule_gemm`` (its tile, shared-memory staging and register fragments unchanged;
  the part index is one more batch loop), writing float32 partials ``[S, *output]`` to a
  global temporary of the host program;
- kernel 2, the sum of the ``S`` partials with the fused epilogue (bias, residual, GELU)
  inlined into its write-back: an injective-style kernel of 256 threads, four consecutive
  outputs a thread (where the output's last dim divides by 4), each part's four partials one
  float4 load into registers, a symbolic batch on ``blockIdx.y``.

The rule (``split_factor``): split where the output tiles of at least
``GEMM_SPLITK_MIN_REGS`` accumulators a thread (64 x 64 with the 16 x 16 threads) make fewer
than ``GEMM_SPLITK_GROUPS`` work-groups and the reduction has at least ``GEMM_SPLITK_MIN_K``
multiply-adds an output. ``S`` is the smallest part count whose work-groups reach
``GEMM_SPLITK_TARGET_GROUPS`` (one wave: a work-group on each multiprocessor), else the largest
allowed; allowed are ``2 .. GEMM_SPLITK_MAX`` parts that divide the reduction into equal whole
k-steps (a convolution: whole input channels) of at least ``GEMM_SPLITK_MIN_PART``
multiply-adds. BERT-base at batch 1 (OpenCL, k-step 16): 768 -> 768 and 3072 -> 768 get
``S = 6`` (144 work-groups of 64 x 64, parts of 128 and 512); 768 -> 3072 and GPT-2's 768 ->
2304 (96 and 72 work-groups of 64 x 64) are not split. A symbolic batch gets the split schedule
below ``GEMM_SPLITK_BATCH`` (sized for batch 1), chosen per call on the host
(``batch_dispatch``; ``relax.gpu_schedules``); the schedules sized for larger batches apply
the rule at the batch they are sized for. Where a split fails (a primitive refuses, a device
limit), the kernel gets the GEMM tile unsplit. Not for CPU targets (``gemm.for_cpu``).
``TILECRAFT_GPU_SPLITK=0`` turns it off (read at each build).

The summation order differs from the single kernel's (S partial sums added at the end), so
results agree with it to rounding, not bit for bit.

Examples
--------
>>> from tilecraft.tensorir import te
>>> from tilecraft.tensorir.schedule import Schedule
>>> A = te.placeholder((128, 3072), "float32", "A")
>>> W = te.placeholder((3072, 768), "float32", "W")
>>> k = te.reduce_axis((0, 3072), "k")
>>> C = te.compute((128, 768), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
>>> sch = Schedule(te.create_prim_func([A, W, C]))
>>> split_factor(sch, sch.get_block("C"), Target("opencl"))
6
"""
from __future__ import annotations

import os

from tilecraft.targets import Target
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.schedule import Schedule, ScheduleError

from .gemm import (_gemm_groups, default_config, for_cpu, output_groups, schedule_gemm,
                   GEMM_BALANCE_MPS)
from .schedule_utils import SYMBOLIC, is_under, loop_extent, node_of, spatial_loops

__all__ = ["GEMM_SPLITK_GROUPS", "GEMM_SPLITK_TARGET_GROUPS", "GEMM_SPLITK_MIN_REGS",
           "GEMM_SPLITK_MIN_K", "GEMM_SPLITK_MIN_PART", "GEMM_SPLITK_MAX", "GEMM_SPLITK_BATCH",
           "splitk_enabled", "split_factor", "schedule_split_k"]

# Split where the output tiles of at least GEMM_SPLITK_MIN_REGS accumulators a thread make
# fewer work-groups than this: half the H100's 132 multiprocessors.
GEMM_SPLITK_GROUPS = GEMM_BALANCE_MPS // 2
# The work-groups S parts should reach: one on each multiprocessor.
GEMM_SPLITK_TARGET_GROUPS = GEMM_BALANCE_MPS
# The register tile the rule keeps (4 x 4: the smallest the work-group balance goes to,
# gemm.GEMM_BALANCE_MIN_REGS).
GEMM_SPLITK_MIN_REGS = 16
# Multiply-adds an output at least, before and after the split: a short reduction is not
# worth a second kernel, a short part leaves the k-step loop (and its prefetch) too few steps.
GEMM_SPLITK_MIN_K = 512
GEMM_SPLITK_MIN_PART = 128
GEMM_SPLITK_MAX = 16
# A symbolic batch runs the split schedule (sized for batch 1) below this batch: at BERT's
# 768-wide layers the rule splits batch 1 (24 tiles of 64 x 64) and 2 (48), not 3 (72).
GEMM_SPLITK_BATCH = 3
THREADS = 256          # threads a work-group of the sum kernel
VECTOR = 4             # outputs a thread of the sum kernel (one float4)


def splitk_enabled() -> bool:
    """Whether split-K is on: ``TILECRAFT_GPU_SPLITK`` is not ``0`` (read at each call, so a
    benchmark can build with and without it in one process)."""
    return os.environ.get("TILECRAFT_GPU_SPLITK", "1").strip() != "0"


def _reduction_parts(sch: Schedule, block, step: int) -> tuple[int, int, list[int]]:
    """``(K, unit, choices)``: the multiply-adds an output, those of one unit the split keeps
    whole (1; a convolution's window: one input channel) and the part counts allowed (see the
    module docstring), for ``block``'s reduce loops in te order."""
    _, reduce = spatial_loops(sch, block)
    extents = [loop_extent(node_of(sch, lp)) for lp in reduce]
    if not extents or SYMBOLIC in extents:
        return 0, 1, []
    outer = extents[0]
    unit = 1
    for e in extents[1:]:
        unit *= e
    K = outer * unit
    choices = []
    for s in range(2, GEMM_SPLITK_MAX + 1):
        if outer % s:
            continue
        part = outer // s
        # whole k-steps a part (the GEMM's inner split then has no tail); a convolution
        # steps over whole channels (gemm._split_reduction) and needs whole channels only
        if unit == 1 and part % min(step, outer) or part * unit < GEMM_SPLITK_MIN_PART:
            continue
        choices.append(s)
    return K, unit, choices


def split_factor(sch: Schedule, block, target: Target, small: bool = False,
                 nominal_batch: int | None = None, nominal_rows: int | None = None,
                 **config) -> int:
    """The part count ``S`` the rule (module docstring) gives the GEMM-like ``block`` under
    ``schedule_gemm``'s sizing (a symbolic batch counted as ``nominal_batch``), 1 where it is
    not split: a CPU target, split-K off, a short reduction, enough output tiles, a float
    type other than float32 (the partials are float32), no allowed part count."""
    if not splitk_enabled() or for_cpu(target) or target.kind not in ("opencl", "webgpu"):
        return 1
    node = node_of(sch, block)
    if any(w.buffer.dtype != "float32" for w in node.writes):
        return 1
    if nominal_rows is not None:
        return 1       # (a symbolic row loop: the few-rows tile is its own variant)
    full = default_config(target)
    full.update({k: v for k, v in config.items() if v is not None})
    K, _, choices = _reduction_parts(sch, block, int(full["k_step"]))
    if K < GEMM_SPLITK_MIN_K or not choices:
        return 1
    groups = output_groups(sch, block, target, small, nominal_batch, None,
                           min_regs=GEMM_SPLITK_MIN_REGS, **full)
    if groups >= GEMM_SPLITK_GROUPS:
        return 1
    for s in choices:
        if groups * s >= GEMM_SPLITK_TARGET_GROUPS:
            return s
    return choices[-1]


def schedule_split_k(sch: Schedule, block, target: Target, parts: int, shared: str = "all",
                     small: bool = False, nominal_batch: int | None = None,
                     **config) -> set:
    """Split-K on the GEMM-like ``block`` in ``parts`` parts (module docstring): the names of
    the blocks scheduled (those of ``schedule_gemm`` on the partials' block, the sum and its
    write-back with the epilogue). ``shared``, ``small``, ``nominal_batch`` and ``config`` as
    for ``schedule_gemm`` (the batch of the tile's sizing counts the parts too).
    ``ScheduleError`` where it does not apply."""
    prim = "split-K"
    if parts < 2:
        raise ScheduleError(prim, f"{parts} parts: nothing to split", None)
    node = node_of(sch, block)
    spatial, reduce = spatial_loops(sch, block)
    if len(spatial) < 2 or not reduce:
        raise ScheduleError(prim, "not a 2-D tiled reduction", None)
    _gemm_groups(sch, block, spatial)          # (refuses what the GEMM tile would)
    outer = loop_extent(node_of(sch, reduce[0]))
    if outer == SYMBOLIC or outer % parts:
        raise ScheduleError(prim, f"the reduction of {node.name} ({outer}) does not divide "
                            f"into {parts} parts", node)
    consumers = sch.get_consumers(block)
    ko, _ = sch.split(reduce[0], [parts, None])
    rf = sch.rfactor(ko, 0)
    # the part index outermost: a batch loop of the GEMM tile (both inputs read it), never its
    # innermost (column) loop
    sch.reorder(ko, *spatial)
    names = schedule_gemm(sch, rf, target, shared, small, nominal_batch, **config,
                          min_regs=GEMM_SPLITK_MIN_REGS)
    names |= _schedule_sum(sch, block, consumers)
    return names


def _schedule_sum(sch: Schedule, block, consumers) -> set:
    """The sum of the partials (``block`` after ``rfactor``: a reduction over the parts) with
    the epilogue ``consumers`` inlined into its register write-back: the constant trailing
    output loops fused over 256 threads of ``VECTOR`` outputs (a float4) each, the leading
    loops up to a symbolic one on ``blockIdx.y``."""
    node = node_of(sch, block)
    loops = sch.get_loops(block)
    spatial, reduce = spatial_loops(sch, block)
    if len(reduce) != 1 or node_of(sch, loops[-1]) is not node_of(sch, reduce[0]):
        raise ScheduleError("split-K", f"the sum {node.name} is not one reduce loop inside "
                            f"its output loops", node)
    (kr,) = reduce
    symbolic = [i for i, lp in enumerate(spatial) if loop_extent(node_of(sch, lp)) == SYMBOLIC]
    cut = symbolic[-1] + 1 if symbolic else 0
    lead, tail = spatial[:cut], spatial[cut:]
    if not tail:
        raise ScheduleError("split-K", f"the sum {node.name} has no constant output loop", node)
    inner = loop_extent(node_of(sch, tail[-1]))
    lanes = VECTOR if inner % VECTOR == 0 and \
        all(dt.bits(w.buffer.dtype) == 32 for w in node.writes) else 1
    v = None
    if lanes > 1:
        # the innermost output loop split by the vector (not the fused loops: a vector of the
        # fused index would need (4t + v) % N proven contiguous)
        jo, v = sch.split(tail[-1], [None, lanes])
        tail = tail[:-1] + [jo]
    fused = sch.fuse(*tail) if len(tail) > 1 else tail[0]
    bx, tx = sch.split(fused, [None, THREADS])
    if lead:
        by = sch.fuse(*lead) if len(lead) > 1 else lead[0]
        sch.bind(by, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    if v is not None:
        sch.reorder(kr, v)       # the parts outside: each step one float4 of a partial
    names = {node.name}
    local = sch.cache_write(block, 0, "local")
    names.add(node_of(sch, local).name)
    sch.reverse_compute_at(local, tx)
    for c in consumers:          # bias / residual / activation into the write-back
        try:
            sch.reverse_compute_inline(c)
        except ScheduleError:
            pass
    init = sch.decompose_reduction(block, kr)
    names.add(node_of(sch, init).name)
    if v is not None:
        # each step's four partials read into registers first, as one float4 / vec4 load
        # (the code generators vectorize a copy from memory into a register array, as the
        # GEMM's fragments; not the accumulation itself), then added there
        upd = node_of(sch, block)
        written = {w.buffer for w in upd.writes}
        idx = next(i for i, r in enumerate(upd.reads) if r.buffer not in written)
        frag = sch.cache_read(block, idx, "local")
        names.add(node_of(sch, frag).name)
        sch.compute_at(frag, kr)
        copy = [lp for lp in sch.get_loops(frag) if node_of(sch, lp).kind == "serial" and
                is_under(sch, lp, kr)]
        if copy and loop_extent(node_of(sch, copy[-1])) == lanes:
            sch.vectorize(copy[-1])
        sch.unroll(v)
        for b in (init, local):
            inner_loops = [lp for lp in sch.get_loops(b) if node_of(sch, lp).kind == "serial"]
            if inner_loops:
                sch.unroll(inner_loops[-1])
    return names
