"""``targets.build``: lower TensorIR and compile it for a target.

For LLVM targets a module is compiled kernel by kernel (``build_kernels``): each kernel comes
from the persistent kernel cache (``targets.kernel_cache``) when it was compiled before, and the
others are compiled in parallel worker processes (``jobs``, one per core by default), with the
same output as a serial build.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Sequence

from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.transform import lower

from . import kernel_cache
from .build_stats import BuildStats
from .runtime.module import Module
from .target import Target, TargetError


@dataclass(frozen=True)
class KernelSpec:
    """One kernel to compile: its name and TensorIR, and how to schedule it first.

    Attributes
    ----------
    name : str
        The function's name in the module (its C symbol is ``tilecraft_fn_<name>``).
    func : PrimFunc
        Scheduled TensorIR (or already lowered), or, with ``schedule``, the function to
        schedule.
    schedule : callable, optional
        ``schedule(func) -> PrimFunc``, run where the kernel is compiled (in a worker process
        when the build is parallel) and only when it is not in the cache. It must be
        deterministic.
    schedule_id : str, optional
        What ``schedule`` does, for the cache key (``"relax.default_schedules"``): a kernel
        with a schedule but no id is not cached.

    Examples
    --------
    >>> spec = KernelSpec("add", func)                                       # doctest: +SKIP
    >>> mod = build_kernels([spec], Target("llvm"), jobs=2)                  # doctest: +SKIP
    """

    name: str
    func: PrimFunc
    schedule: Callable[[PrimFunc], PrimFunc] | None = None
    schedule_id: str | None = None


def _as_module(func_or_mod) -> IRModule:
    if isinstance(func_or_mod, IRModule):
        return func_or_mod
    if isinstance(func_or_mod, PrimFunc):
        return IRModule({func_or_mod.attr_dict.get("global_symbol", "main"): func_or_mod})
    raise TypeError(f"targets.build takes a PrimFunc or an IRModule, got "
                    f"{type(func_or_mod).__name__}")


def is_lowered(func: PrimFunc) -> bool:
    """Whether ``func`` is already in the lowered form (lowering records ``arg_buffers``)."""
    return "arg_buffers" in func.attr_dict


def lower_module(mod: IRModule, target: Target | None = None) -> IRModule:
    """Lower every PrimFunc of ``mod`` that is not lowered yet (``tensorir.transform.lower``)."""
    out = {}
    for name, func in mod.functions.items():
        if isinstance(func, PrimFunc) and not is_lowered(func):
            func = lower(func, target)
        out[name] = func
    return IRModule(out)


def build_kernels(kernels: Sequence[KernelSpec], target: "Target | str | dict" = "llvm", *,
                  jobs: int | None = None, cache=None,
                  stats: BuildStats | None = None) -> Module:
    """Compile kernels into one module for an LLVM target (what ``targets.build`` and
    ``relax.build`` do for LLVM targets).

    Parameters
    ----------
    kernels : sequence of KernelSpec
        The module's functions, in order.
    target : Target | str | dict
        An LLVM target.
    jobs : int, optional
        Worker processes compiling the kernels the cache does not have (default: one per core
        this process may use; 1: compile here).
    cache : None | bool | str | KernelCache
        None: the default kernel cache (``targets.kernel_cache.default_cache``, or what
        ``kernel_cache.use`` set); False: none; a directory or a ``KernelCache``.
    stats : BuildStats, optional
        Filled in with the phases' times and kernel counts (also ``module.build_stats``).

    Examples
    --------
    >>> mod = build_kernels([KernelSpec("main", func)], "llvm", jobs=1)   # doctest: +SKIP
    """
    target = target if isinstance(target, Target) else Target(target)
    if target.kind != "llvm":
        raise TargetError(f"build_kernels compiles for LLVM targets, not {target.kind!r}; use "
                          f"targets.build")
    from .llvm.compiler import build_llvm  # loads llvmlite only when compiling
    return build_llvm(list(kernels), target, jobs=jobs, cache=cache, stats=stats)


def kernel_module_to_bytes(module: Module) -> bytes:
    """A module ``build_kernels`` made, as bytes: its compiled code and metadata, no TensorIR
    (``kernel_module_from_bytes`` loads it; ``relax.build``'s whole-build cache stores it).

    Examples
    --------
    >>> data = kernel_module_to_bytes(build(func, "llvm"))              # doctest: +SKIP
    >>> mod = kernel_module_from_bytes(data, Target("llvm"))            # doctest: +SKIP
    """
    from .llvm.compiler import module_to_bytes  # loads llvmlite only when compiling
    return module_to_bytes(module)


def kernel_module_from_bytes(data: bytes, target: Target, cache=None) -> Module | None:
    """The module ``kernel_module_to_bytes`` wrote, loaded for ``target`` (an LLVM target);
    None when ``data`` is not one for ``target``. ``cache``: the kernel cache that serves the
    thread-pool runtime object when the module is exported."""
    from .llvm.compiler import module_from_bytes  # loads llvmlite only when compiling
    return module_from_bytes(data, target, kernel_cache.resolve(cache))


def machine_key(target: "Target | str | dict") -> dict:
    """What compiled code for ``target`` depends on besides the IR (LLVM targets): the
    triple, CPU and features, code generation options, LLVM / llvmlite versions and
    ``kernel_cache.code_fingerprint()``; plain JSON data, for cache keys."""
    target = target if isinstance(target, Target) else Target(target)
    if target.kind != "llvm":
        raise TargetError(f"machine_key is for LLVM targets, not {target.kind!r}")
    from .llvm.compiler import target_machine_key  # loads llvmlite only when compiling
    return target_machine_key(target)


def build(func_or_mod, target: "Target | str | dict" = "llvm", *, jobs: int | None = None,
          cache=None) -> Module:
    """Compile a PrimFunc or IRModule for ``target``; returns a runnable ``Module``.

    Parameters
    ----------
    func_or_mod : PrimFunc | IRModule
        TensorIR (scheduled or not); it is lowered with ``tensorir.transform.lower``.
    target : Target | str | dict
        Anything ``Target()`` accepts; ``"llvm"`` (the host CPU) by default.
    jobs : int, optional
        LLVM targets: worker processes compiling the functions (default: one per core).
    cache : None | bool | str | KernelCache
        LLVM targets: the kernel cache (see ``build_kernels``); False builds without one.

    Examples
    --------
    >>> import numpy as np
    >>> from tilecraft.tensorir import te
    >>> A = te.placeholder((8,), "float32", "A")
    >>> B = te.compute((8,), lambda i: A[i] * 2.0, "B")
    >>> mod = build(te.create_prim_func([A, B]), "llvm")
    >>> a, b = np.arange(8, dtype="float32"), np.empty(8, "float32")
    >>> mod["main"](a, b)
    >>> float(b[3])
    6.0
    """
    target = target if isinstance(target, Target) else Target(target)
    mod = _as_module(func_or_mod)
    if not mod.functions:
        raise ValueError("targets.build: the module has no functions")
    if target.kind == "llvm":
        specs = [KernelSpec(name, func) for name, func in mod.functions.items()]
        return build_kernels(specs, target, jobs=jobs, cache=cache)
    try:
        # the back end packages are targets.opencl_backend and targets.webgpu_backend
        # (targets.webgpu / targets.opencl are the device functions)
        backend = importlib.import_module(f"{__package__}.{target.kind}_backend")
    except ImportError as err:
        raise TargetError(f"no code generator for target kind {target.kind!r}: {err}") from None
    build_fn = getattr(backend, "build_module", None)
    if build_fn is None:
        raise TargetError(f"targets.{target.kind}_backend has no build_module(mod, target) "
                          f"function")
    return build_fn(mod, target)


__all__ = ["build", "build_kernels", "KernelSpec", "lower_module", "is_lowered",
           "kernel_module_to_bytes", "kernel_module_from_bytes", "machine_key"]
