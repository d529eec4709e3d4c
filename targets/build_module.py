"""``targets.build``: lower TensorIR and compile it for a target."""
from __future__ import annotations

import importlib

from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.transform import lower

from .runtime.module import Module
from .target import Target, TargetError


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


def build(func_or_mod, target: "Target | str | dict" = "llvm") -> Module:
    """Compile a PrimFunc or IRModule for ``target``; returns a runnable ``Module``.

    Parameters
    ----------
    func_or_mod : PrimFunc | IRModule
        TensorIR (scheduled or not); it is lowered with ``tensorir.transform.lower``.
    target : Target | str | dict
        Anything ``Target()`` accepts; ``"llvm"`` (the host CPU) by default.

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
        from .llvm.compiler import build_llvm  # loads llvmlite only when compiling
        return build_llvm(lower_module(mod, target), target)
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
