"""``relax.build``'s whole-build cache: an executable built before from the same input, reused.

``relax.build(mod, target, whole_build_cache=True)`` looks the whole build up before running
the graph passes. The key (``executable_key``) is a SHA-256 of

* the input module, exactly: its pickled form (structure, names, attributes, struct info and
  every constant's bytes; operators by name), so that any difference is another key; a module
  holding code from outside tilecraft (an operator the user registered, a user's function in
  an attribute) is not cached, since that code could change under the same pickle;
* the target and ``machine_key`` (CPU, features, code generation options, LLVM / llvmlite
  versions and the fingerprint of tilecraft's source code: a new tilecraft is a new key);
* the build options that change the executable (``upper_bounds``, ``strict``).

A build with a ``database`` or its own ``pipeline`` is not looked up (neither is part of the
key). The value is the executable: the VM program, the constants and the kernel module's
compiled code (``targets.build_module.kernel_module_to_bytes``), one entry in the kernel
cache's store, with its guarantees: written atomically, checksummed (a corrupt entry is a
miss, and the build runs and writes it again), least recently used entries trimmed to the
size bound, and none of it with ``cache=False`` or ``TILECRAFT_CACHE=0``.

An executable from this cache runs the same kernels on the same constants as the build that
stored it; its kernel module has no TensorIR, so ``exe.kernel_module.get_source()`` needs a
build without the whole-build cache.

Examples
--------
>>> exe = relax.build(mod, "llvm", whole_build_cache=True)   # doctest: +SKIP
>>> exe.build_stats.whole_build_hit                          # doctest: +SKIP
False
>>> relax.build(mod, "llvm", whole_build_cache=True).build_stats.whole_build_hit  # doctest: +SKIP
True
"""
from __future__ import annotations

import hashlib
import io
import json
import pickle
import types
import zipfile
from typing import Mapping

import numpy as np

from tilecraft.errors import TilecraftError
from tilecraft.targets import Target, kernel_cache
from tilecraft.targets.build_module import (kernel_module_from_bytes, kernel_module_to_bytes,
                                            machine_key)
from tilecraft.tensorir.function import IRModule

from .executable import PROGRAM_VERSION, Executable
from .op.base import Op

__all__ = ["executable_key", "load", "save", "ENTRY_FORMAT"]

ENTRY_FORMAT = 1   # of the entries below; bump when their layout changes


# modules whose code the key covers (tilecraft: the source fingerprint) or that only rebuild
# plain data (numpy arrays, builtins, pickle's helpers)
_KNOWN_CODE = ("tilecraft", "numpy", "builtins", "copyreg", "collections", "_codecs")


class _Uncacheable(TilecraftError):
    """The module holds code the key cannot cover (caught here: the build runs uncached)."""


def _known(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in _KNOWN_CODE


class _KeyPickler(pickle.Pickler):
    """Pickles IR for hashing: an operator by its registered name (tilecraft's operators'
    code is in the source fingerprint). Code from elsewhere -- an operator registered by the
    user, a function or class of the user's in the IR -- could change without changing the
    pickle, so a module that holds any is not cached (``_Uncacheable``)."""

    def persistent_id(self, obj):
        if isinstance(obj, Op):
            for fn in (obj.infer, obj.legalize):
                if fn is not None and not _known(getattr(fn, "__module__", None)):
                    raise _Uncacheable(f"operator {obj.name} has code outside tilecraft")
            return ("relax.Op", obj.name)
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)) and \
                not _known(getattr(obj, "__module__", None)):
            raise _Uncacheable(f"{obj!r} is code outside tilecraft")
        return None


class _HashWriter:
    def __init__(self):
        self.sha = hashlib.sha256()

    def write(self, data):
        self.sha.update(data)


def module_digest(mod: IRModule) -> str | None:
    """The SHA-256 of ``mod``'s pickled form (None when some part of it does not pickle, or
    holds code from outside tilecraft: such a module is not cached)."""
    out = _HashWriter()
    try:
        _KeyPickler(out, protocol=5).dump(mod)
    except (_Uncacheable, pickle.PicklingError, TypeError, AttributeError, RecursionError):
        return None
    return out.sha.hexdigest()


def executable_key(mod: IRModule, target: Target,
                   upper_bounds: Mapping[str, int] | None, strict: bool) -> str | None:
    """The whole-build cache key of building ``mod`` for ``target`` (an LLVM target) with the
    default pipeline and schedules; None when it cannot be cached.

    Examples
    --------
    >>> executable_key(mod, Target("llvm"), None, False)       # doctest: +SKIP
    '5f0c...'
    """
    digest = module_digest(mod)
    if digest is None:
        return None
    bounds = sorted((str(k), repr(v)) for k, v in dict(upper_bounds or {}).items())
    return kernel_cache.cache_key("relax-executable", ENTRY_FORMAT, PROGRAM_VERSION,
                                  machine_key(target), str(target), bounds, bool(strict),
                                  digest)


def save(store: kernel_cache.KernelCache, key: str, exe: Executable) -> bool:
    """Store ``exe`` (built for an LLVM target) under ``key``; False when it cannot be stored
    (constants of a dtype numpy names only by size, such as ml_dtypes' bfloat16)."""
    if any(c.dtype.kind not in "biufc" for c in exe.constants):
        return False
    calls = exe.build_stats.kernels if exe.build_stats is not None else len(exe.kernel_names)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        consts = []
        for i, c in enumerate(exe.constants):
            name = f"constants/{i}.bin"
            zf.writestr(name, np.require(c, requirements="C").tobytes())
            consts.append({"file": name, "dtype": c.dtype.str, "shape": list(c.shape)})
        zf.writestr("entry.json", json.dumps({"format": ENTRY_FORMAT, "target": exe.target,
                                              "constants": consts, "kernel_calls": calls,
                                              "module": exe.kernel_module is not None}))
        zf.writestr("program.json", json.dumps(exe.program, separators=(",", ":")))
        if exe.kernel_module is not None:
            zf.writestr("kernels.bin", kernel_module_to_bytes(exe.kernel_module))
    store.put(key, buf.getvalue())
    return True


def load(store: kernel_cache.KernelCache, key: str,
         target: Target) -> tuple[Executable, int] | None:
    """The executable stored under ``key`` and the number of kernel calls of its build (before
    deduplication), or None (not there, or not readable: a miss)."""
    data = store.get(key)
    if data is None:
        return None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            entry = json.loads(zf.read("entry.json"))
            if entry.get("format") != ENTRY_FORMAT or entry.get("target") != str(target):
                return None
            program = json.loads(zf.read("program.json"))
            constants = [np.frombuffer(zf.read(c["file"]), dtype=np.dtype(c["dtype"]))
                         .reshape(c["shape"]) for c in entry["constants"]]
            module = None
            if entry["module"]:
                module = kernel_module_from_bytes(zf.read("kernels.bin"), target, store)
                if module is None:
                    return None
    except (zipfile.BadZipFile, KeyError, ValueError, TypeError):
        return None
    return Executable(program, constants, module, str(target)), int(entry["kernel_calls"])
