"""The tuner's GPU space of the default GEMM family: its tile decisions as knobs.

``relax.build``'s default GPU schedule of a GEMM-like kernel (dense, batch matmul, implicit-GEMM
and Winograd convolutions: ``relax.backend.gpu.gemm``) is a recipe with a few decisions that
made it fast — threads and registers per output dimension, the k-step, register fragments and
their vector width, the shared-memory fetch's vector width, the register prefetch, the number
of work-groups the tile is shrunk to fill, which inputs are staged in shared memory. The
generic GPU space (``MultiLevelTiling``) cannot express the fragments, vector fetches or
prefetch, so it rarely beats the recipe. ``GemmKnobs`` makes those decisions knobs of a
``metaschedule.KnobSpace``: each a ``sample_categorical`` in the schedule's trace (the database
replays them, the cost model sees the program they make), the recipe's own values the defaults
and the seed. ``gpu_space(target)`` is that space, with ``default_space(target)`` for every
other kernel; ``relax.tune`` uses it for ``opencl`` and ``webgpu`` targets. On a target with
tensor cores (``Target.tensor_cores``) the tensor-core fp16 GEMM's knobs come first
(``relax.tensor_core_space.TensorCoreKnobs``), then these, then the generic space.

Knobs (``GEMM_KNOBS``): ``rows_threads``, ``rows_regs``, ``cols_threads``, ``cols_regs`` (the
configured tile; the recipe gives unused column threads to the rows and halves registers until
``min_groups`` work-groups), ``k_step``, ``fragments`` (0 / 1), ``fragment_vector``,
``fetch_vector``, ``register_prefetch`` (0 / 1), ``min_groups``, ``shared`` (0: both inputs in
shared memory, 1: those read at plain indices, 2: none). A combination over the target's
threads per work-group is rejected before the recipe runs; one over its shared memory (or any
other limit) when the schedule is lowered for the target and by ``VerifyGPUCode``.

Examples
--------
>>> from tilecraft.targets import Target
>>> space = gpu_space(Target("opencl"))
>>> type(space).__name__
'KnobSpace'
"""
from __future__ import annotations

from tilecraft.targets import Target
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.structural import structural_hash
from tilecraft.tensorir.transform import lower_device

from tilecraft.metaschedule import Knob, KnobRule, KnobSpace, default_space

from . import gpu_schedules
from .backend.gpu.gemm import for_cpu
from .tensor_core_space import TensorCoreKnobs

__all__ = ["GEMM_KNOBS", "GemmKnobs", "gpu_space", "SHARED_MODES"]

SHARED_MODES = ("all", "compact", "none")
GEMM_KNOBS = ("rows_threads", "rows_regs", "cols_threads", "cols_regs", "k_step", "fragments",
              "fragment_vector", "fetch_vector", "register_prefetch", "min_groups", "shared")

# Candidates on a GPU: up to 32 x 32 threads (the target's limit rejects what is over it) and
# 8 registers per dimension (8 x 8 accumulators; 16 x 16 spilled on the H200), k-steps 4-32.
_GPU_CANDIDATES = {
    "threads": (4, 8, 16, 32), "regs": (1, 2, 4, 8), "k_step": (4, 8, 16, 32),
    "vector": (1, 2, 4), "min_groups": (32, 64, 128, 256, 512),
}
# A CPU OpenCL driver (PoCL): small tiles (it compiles large unrolled tiles for minutes);
# min_groups does not apply (the recipe does not shrink tiles for a CPU).
_CPU_CANDIDATES = {
    "threads": (2, 4, 8), "regs": (1, 2, 4), "k_step": (4, 8, 16), "vector": (1, 2, 4),
    "min_groups": (),
}


def _with(cands: tuple, default: int) -> tuple:
    return tuple(sorted(set(cands) | {int(default)}))


class GemmKnobs(KnobRule):
    """The default GPU GEMM recipe's decisions as knobs (see the module docstring), for every
    kernel whose default GPU schedule is one GEMM-family schedule (``gpu_schedules.
    gemm_default_schedule``); the defaults make exactly that schedule.

    Examples
    --------
    >>> rule = GemmKnobs()
    >>> rule.knobs(softmax_func, Target("opencl"), {}) is None       # doctest: +SKIP
    True
    """

    def knobs(self, func: PrimFunc, target: Target, hints: dict) -> list[Knob] | None:
        found = gpu_schedules.gemm_default_schedule(func, target)
        if found is None:
            return None
        defaults, default = found
        c = _CPU_CANDIDATES if for_cpu(target) else _GPU_CANDIDATES
        (rt, rr), (ct, cr) = defaults["tile_rows"], defaults["tile_cols"]
        shared = SHARED_MODES.index(defaults["shared"])
        knobs = [
            Knob("rows_threads", _with(c["threads"], rt), rt),
            Knob("rows_regs", _with(c["regs"], rr), rr),
            Knob("cols_threads", _with(c["threads"], ct), ct),
            Knob("cols_regs", _with(c["regs"], cr), cr),
            Knob("k_step", _with(c["k_step"], defaults["k_step"]), defaults["k_step"]),
            Knob("fragments", (0, 1), int(defaults["fragments"])),
            Knob("fragment_vector", _with(c["vector"], defaults["fragment_vector"]),
                 defaults["fragment_vector"]),
            Knob("fetch_vector", _with(c["vector"], defaults["fetch_vector"]),
                 defaults["fetch_vector"]),
            Knob("register_prefetch", (0, 1), int(defaults["register_prefetch"])),
            Knob("min_groups", _with(c["min_groups"], defaults["min_groups"]),
                 defaults["min_groups"]),
            Knob("shared", _with((0, 1, 2), shared), shared),
        ]
        # the recipe at the defaults must be the default schedule (else the seed would not be
        # what relax.build gives the kernel untuned)
        sch = Schedule(func)
        try:
            self.apply(sch, target, {k.name: k.default for k in knobs})
        except Exception:  # noqa: BLE001 - no GEMM space for this kernel; the generic one
            return None
        if structural_hash(default.func) != structural_hash(sch.func):
            return None
        return knobs

    def check(self, func: PrimFunc, target: Target, values: dict) -> str | None:
        threads = values["rows_threads"] * values["cols_threads"]
        if threads > target.max_threads_per_block:
            return (f"{values['rows_threads']} x {values['cols_threads']} = {threads} threads "
                    f"per work-group, over the target's {target.max_threads_per_block}")
        return None

    def apply(self, sch: Schedule, target: Target, values: dict) -> None:
        gpu_schedules.schedule_gemm_kernel(
            sch, target, shared=SHARED_MODES[values["shared"]],
            tile_rows=(values["rows_threads"], values["rows_regs"]),
            tile_cols=(values["cols_threads"], values["cols_regs"]),
            k_step=values["k_step"], fragments=bool(values["fragments"]),
            fragment_vector=values["fragment_vector"], fetch_vector=values["fetch_vector"],
            register_prefetch=bool(values["register_prefetch"]),
            min_groups=values["min_groups"])
        # over a limit of the target (shared memory, threads, vector widths): ValueError or
        # TIRError naming it, before any build
        lower_device(sch.func, target)


def gpu_space(target: Target) -> KnobSpace:
    """The tuner's GPU space: ``GemmKnobs`` for GEMM-like kernels, ``default_space(target)``
    for the others; on a target with tensor cores ``TensorCoreKnobs`` first, for the kernels
    ``relax.build`` gives the tensor-core fp16 GEMM (a ``KnobSpace`` whose fallback is the
    ``GemmKnobs`` one).

    Examples
    --------
    >>> space = gpu_space(Target("webgpu"))
    >>> space.rule.__class__.__name__
    'GemmKnobs'
    """
    target = target if isinstance(target, Target) else Target(target)
    space = KnobSpace(GemmKnobs(), fallback=default_space(target))
    if target.tensor_cores is not None:
        space = KnobSpace(TensorCoreKnobs(), fallback=space)
    return space
