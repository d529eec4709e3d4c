"""``BuildStats``: where a build's time went, phase by phase, and what it compiled.

``relax.build`` fills one in (``exe.build_stats``; ``verbose=True`` prints its ``summary()``),
and so does ``targets.build`` for LLVM targets (``mod.build_stats``).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

__all__ = ["BuildStats"]

# what the per-kernel phases are called in a summary
KERNEL_PHASES = {"schedule": "scheduling", "lower": "lowering", "codegen": "LLVM IR generation",
                 "llvm_optimize": "LLVM optimization", "llvm_emit": "LLVM code generation"}


@dataclass
class BuildStats:
    """Times and counts of one build.

    Attributes
    ----------
    phases : dict[str, float]
        Wall-clock seconds of each phase of the build, in the order they ran.
    cpu : dict[str, float]
        CPU seconds of this process in each phase (the worker processes' are in
        ``kernel_phases``); on a loaded machine the wall-clock times grow, these do not.
    kernel_phases : dict[str, float]
        CPU seconds spent on the kernels that were compiled, by phase (``schedule``,
        ``lower``, ``codegen``, ``llvm_optimize``, ``llvm_emit``), summed over the kernels and
        the worker processes that compiled them: with several workers their sum exceeds the
        wall time of "compile kernels".
    kernels : int
        Kernels the program calls (before deduplication).
    distinct : int
        Kernels left after structurally equal ones were merged.
    cache_hits, compiled : int
        Distinct kernels taken from the kernel cache, and compiled.
    jobs : int
        Worker processes that compiled kernels (1: this process).
    cache_dir : str | None
        The kernel cache used (None: no cache).
    whole_build_hit : bool
        The executable came whole from ``relax.build``'s whole-build cache (no graph passes,
        no kernel lookups).

    Examples
    --------
    >>> exe = relax.build(mod, "llvm")                  # doctest: +SKIP
    >>> print(exe.build_stats.summary())                # doctest: +SKIP
    """

    phases: dict = field(default_factory=dict)
    cpu: dict = field(default_factory=dict)
    kernel_phases: dict = field(default_factory=dict)
    kernels: int = 0
    distinct: int = 0
    cache_hits: int = 0
    compiled: int = 0
    jobs: int = 1
    cache_dir: str | None = None
    whole_build_hit: bool = False

    @contextlib.contextmanager
    def phase(self, name: str):
        """Time the block as phase ``name`` (added to it when it ran before)."""
        start, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - start
            self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - cpu

    @property
    def total(self) -> float:
        """Seconds of all phases."""
        return sum(self.phases.values())

    def as_dict(self) -> dict:
        """Plain data (for JSON)."""
        return {"phases": dict(self.phases), "cpu": dict(self.cpu),
                "kernel_phases": dict(self.kernel_phases),
                "kernels": self.kernels, "distinct": self.distinct,
                "cache_hits": self.cache_hits, "compiled": self.compiled, "jobs": self.jobs,
                "cache_dir": self.cache_dir, "whole_build_hit": self.whole_build_hit,
                "total": self.total}

    def summary(self) -> str:
        """A few lines for people: each phase's seconds and share, then the kernels."""
        total = self.total or 1e-12
        lines = [f"build: {self.total:.2f} s  (wall clock, share, CPU of this process)"]
        for name, secs in self.phases.items():
            lines.append(f"  {name:<22s} {secs:8.3f} s  {100 * secs / total:5.1f} %  "
                         f"{self.cpu.get(name, 0.0):8.3f} s")
        if self.kernel_phases:
            busy = sum(self.kernel_phases.values())
            lines.append(f"  kernels compiled: {busy:.2f} CPU s in {self.jobs} "
                         f"process{'es' if self.jobs > 1 else ''}")
            for name, secs in self.kernel_phases.items():
                lines.append(f"    {KERNEL_PHASES.get(name, name):<20s} {secs:8.3f} s")
        cache = f"cache {self.cache_dir}" if self.cache_dir else "no cache"
        dedup = f", {self.distinct} distinct" if self.distinct and self.distinct != \
            self.kernels else ""
        if self.whole_build_hit:
            lines.append(f"  kernels: {self.kernels}{dedup}; the whole executable from the {cache}")
        else:
            lines.append(f"  kernels: {self.kernels}{dedup}; {self.cache_hits} from the {cache}, "
                         f"{self.compiled} compiled")
        return "\n".join(lines)
