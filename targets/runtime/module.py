"""Compiled modules and the functions in them: ``mod["main"](*arrays)``, ``time_evaluator``,
``export_library`` and ``load_module``.

A ``Module`` knows its functions from the metadata every kernel library carries (see
``docs/abi.md``): names, parameters, the target. Calling a function packs Python objects into the
C calling convention (``targets.runtime.abi``); the compiled entry itself checks counts, dtypes,
ranks and dimensions, so a C caller on a board gets the same checks.

This module needs only ctypes and numpy: it is what the board side of ``rpc`` runs.

Examples
--------
>>> mod = load_module("add.so")              # doctest: +SKIP
>>> mod["main"](a, b, c)                     # doctest: +SKIP
>>> mod.time_evaluator("main", cpu(0))(a, b, c).mean   # doctest: +SKIP
1.2e-06
"""
from __future__ import annotations

import ctypes
import json
import os
import statistics
import time
from typing import Any, Callable, Sequence

import numpy as np

from ..fileio import atomic_write
from ..target import arch_of_triple, host_triple
from . import abi
from .amx import request_amx
from .device import Device, cpu
from .elf import NotELFError, read_elf_file_header
from .ndarray import NDArray


class BenchmarkResult:
    """Timings of a ``time_evaluator`` run, in seconds per call.

    Attributes
    ----------
    results : tuple[float, ...]
        One mean time per repeat.
    mean, median, std, min, max : float
    """

    def __init__(self, results: Sequence[float]):
        self.results = tuple(float(r) for r in results)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.results)

    @property
    def median(self) -> float:
        return statistics.median(self.results)

    @property
    def std(self) -> float:
        return statistics.pstdev(self.results) if len(self.results) > 1 else 0.0

    @property
    def min(self) -> float:
        return min(self.results)

    @property
    def max(self) -> float:
        return max(self.results)

    def __repr__(self):
        return (f"BenchmarkResult(mean={self.mean * 1e6:.3f} us, median={self.median * 1e6:.3f} us,"
                f" std={self.std * 1e6:.3f} us, repeats={len(self.results)})")


def repeat_timings(time_calls: Callable[[int], tuple[float, float]], number: int, repeat: int,
                   min_repeat_ms: float = 0, f_preproc: Any = None) -> BenchmarkResult:
    """The measuring loop the device modules' ``time_evaluator`` share.

    ``time_calls(n)`` runs the function ``n`` times and returns ``(seconds, wall_seconds)``:
    the time to report for the ``n`` calls and the wall-clock time ``min_repeat_ms`` is checked
    against. A measurement shorter than ``min_repeat_ms`` is redone with more calls (at least
    twice as many). ``f_preproc`` runs before each measurement (e.g. a cache flush).

    Examples
    --------
    >>> repeat_timings(lambda n: (n * 1e-3, n * 1e-3), number=4, repeat=2).results
    (0.001, 0.001)
    """
    n = number
    results = []
    for _ in range(repeat):
        while True:
            if f_preproc is not None:
                f_preproc()
            seconds, wall = time_calls(n)
            if min_repeat_ms <= 0 or wall * 1000 >= min_repeat_ms:
                break
            grow = min_repeat_ms / max(wall * 1000, 1e-3)
            n = max(n * 2, int(n * grow * 1.2))
        results.append(seconds / n)
    return BenchmarkResult(results)


_CPU = abi.DLDevice(abi.DL_CPU, 0)
_C0 = ctypes.c_char * 0
_addressof = ctypes.addressof


class _Packed:
    """Arguments packed for one C call; keeps every buffer it points to alive."""

    __slots__ = ("values", "codes", "count", "keep")

    def __init__(self, n: int):
        self.values = (abi.TCValue * max(n, 1))()
        self.codes = (ctypes.c_int32 * max(n, 1))()
        self.count = n
        self.keep: list = []


def _array_of(arg, pname: str, fname: str) -> np.ndarray:
    if isinstance(arg, NDArray):
        if arg.device.kind != "cpu":
            raise ValueError(f"{fname}: argument {pname} lives on {arg.device}; this is a CPU "
                             f"kernel, copy it to cpu(0) first")
        return arg._data
    if isinstance(arg, np.ndarray):
        return arg
    raise ValueError(f"{fname}: argument {pname} must be an NDArray or a numpy array, got "
                     f"{type(arg).__name__}")


class Function:
    """A kernel of a module; call it with arrays and scalars in parameter order.

    Outputs are written in place. A wrong argument count, dtype, rank or dimension raises
    ``ValueError`` naming the argument.
    """

    def __init__(self, module: "Module", meta: dict, address: int | None, unavailable: str | None):
        self.module = module
        self.name = meta["name"]
        self.meta = meta
        self.params = meta["params"]
        self._unavailable = unavailable
        self._cfunc = abi.ENTRY_FUNCTYPE(address) if address else None
        # per parameter, what packing needs, decided once
        self._np_dtypes = [np.dtype(p["dtype"]) for p in self.params]
        self._dl_dtypes = [abi.DLDataType(*abi.dl_dtype(p["dtype"])) for p in self.params]
        self._fast = _FastPacker(self) if _FastPacker.supported() and self._cfunc else None

    def __repr__(self):
        sig = ", ".join(p["name"] for p in self.params)
        return f"<tilecraft.Function {self.name}({sig})>"

    # -- packing ----------------------------------------------------------------------------------
    def _pack(self, args: Sequence[Any]) -> _Packed:
        packed = _Packed(len(args))
        for i, arg in enumerate(args):
            param = self.params[i] if i < len(self.params) else None
            if param is None:
                self._pack_extra(packed, i, arg)
            elif param["kind"] == "buffer":
                self._pack_buffer(packed, i, arg, param)
            else:
                self._pack_scalar(packed, i, arg, param)
        return packed

    def _pack_buffer(self, packed: _Packed, i: int, arg, param: dict):
        arr = arg._data if type(arg) is NDArray else _array_of(arg, param["name"], self.name)
        flags = arr.flags
        if arr.dtype != self._np_dtypes[i] or not flags.c_contiguous or not flags.aligned or \
                (param["written"] and not flags.writeable) or not arr.dtype.isnative:
            self._reject_buffer(arr, param)
        self._put_tensor(packed, i, arr, self._dl_dtypes[i])

    def _reject_buffer(self, arr: np.ndarray, param: dict):
        pname, fname = param["name"], self.name
        if arr.dtype.name != param["dtype"] or not arr.dtype.isnative:
            raise ValueError(f"{fname}: argument {pname} has dtype {arr.dtype.name}"
                             f"{'' if arr.dtype.isnative else ' (non-native byte order)'}, "
                             f"expected {param['dtype']}")
        if not arr.flags.c_contiguous:
            raise ValueError(f"{fname}: argument {pname} is not C-contiguous (strides "
                             f"{arr.strides}); pass np.ascontiguousarray(...) and, for an output, "
                             f"copy the result back yourself")
        if not arr.flags.aligned:
            raise ValueError(f"{fname}: argument {pname} is not aligned to its element size")
        raise ValueError(f"{fname}: argument {pname} is written by the kernel but the array is "
                         f"read-only")

    @staticmethod
    def _put_tensor(packed: _Packed, i: int, arr: np.ndarray, dl_dtype=None):
        ndim = arr.ndim
        shape = (ctypes.c_int64 * (ndim or 1))(*arr.shape)
        if dl_dtype is None:
            dl_dtype = abi.DLDataType(*abi.dl_dtype(arr.dtype.name))
        t = abi.DLTensor(arr.ctypes.data, _CPU, ndim, dl_dtype, ctypes.addressof(shape), None, 0)
        packed.keep.append((arr, shape, t))
        packed.values[i].v_handle = ctypes.addressof(t)
        packed.codes[i] = abi.TYPE_DLTENSOR

    def _pack_scalar(self, packed: _Packed, i: int, arg, param: dict):
        pname, dtype = param["name"], param["dtype"]
        if isinstance(arg, (np.ndarray, NDArray)) and getattr(arg, "ndim", 1) != 0:
            raise ValueError(f"{self.name}: argument {pname} is a scalar {dtype} parameter, got an "
                             f"array")
        if isinstance(arg, np.ndarray):
            arg = arg[()]
        if dtype.startswith("float"):
            if not isinstance(arg, (int, float, np.integer, np.floating)) or isinstance(arg, bool):
                raise ValueError(f"{self.name}: argument {pname} must be a number ({dtype}), got "
                                 f"{type(arg).__name__}")
            packed.values[i].v_float64 = float(arg)
            packed.codes[i] = abi.TYPE_FLOAT
            return
        if not isinstance(arg, (int, np.integer, bool, np.bool_)):
            raise ValueError(f"{self.name}: argument {pname} must be an integer ({dtype}), got "
                             f"{type(arg).__name__} {arg!r}")
        value = int(arg)
        lo, hi = _int_range(dtype)
        if not lo <= value <= hi:
            raise ValueError(f"{self.name}: argument {pname} = {value} does not fit in {dtype} "
                             f"[{lo}, {hi}]")
        if value > 2 ** 63 - 1:  # uint64 travels in the int64 slot, two's complement
            value -= 2 ** 64
        packed.values[i].v_int64 = value
        packed.codes[i] = abi.TYPE_INT

    def _pack_extra(self, packed: _Packed, i: int, arg):
        """An argument beyond the parameter list: pack it by its type, the entry reports the count."""
        if isinstance(arg, NDArray):
            arg = arg._data
        if isinstance(arg, np.ndarray):
            self._put_tensor(packed, i, np.ascontiguousarray(arg))
        elif isinstance(arg, (float, np.floating)):
            packed.values[i].v_float64 = float(arg)
            packed.codes[i] = abi.TYPE_FLOAT
        elif isinstance(arg, (int, np.integer)):
            packed.values[i].v_int64 = int(arg)
            packed.codes[i] = abi.TYPE_INT
        else:
            raise ValueError(f"{self.name} takes {len(self.params)} argument(s) "
                             f"({', '.join(p['name'] for p in self.params)}); argument {i} is an "
                             f"unsupported {type(arg).__name__}")

    # -- calling ----------------------------------------------------------------------------------
    def _invoke(self, packed: _Packed) -> None:
        rc = self._cfunc(ctypes.addressof(packed.values), ctypes.addressof(packed.codes),
                         packed.count)
        if rc != 0:
            raise ValueError(self.module._last_error() or f"{self.name} failed with code {rc}")

    def _check_runnable(self):
        if self._unavailable:
            raise RuntimeError(self._unavailable)

    def __call__(self, *args) -> None:
        if self._unavailable:
            raise RuntimeError(self._unavailable)
        fast = self._fast
        if fast is not None and len(args) == len(self.params):
            words = fast.pack(args)
            if words is not None:
                rc = self._cfunc(words, fast.codes_addr, fast.count)
                if rc != 0:
                    raise ValueError(self.module._last_error() or
                                     f"{self.name} failed with code {rc}")
                return
        self._invoke(self._pack(args))


class _FastPacker:
    """The common call, packed with few Python operations: arrays of the right dtype and layout
    and plain Python numbers. Arguments and DLTensors live in one int64 array per thread (a
    64-bit little-endian DLTensor is 6 words), whose constant words are written once. Anything
    unusual returns None and takes the general path, which explains what is wrong."""

    def __init__(self, fn: Function):
        self.fn = fn
        params = fn.params
        self.count = len(params)
        self.layout = []   # per param: ("buffer", tensor word, shape word, ndim) | ("int"|"float",)
        word = self.count
        shapes = word + 6 * sum(p["kind"] == "buffer" for p in params)
        self.template = []
        codes = []
        for p in params:
            if p["kind"] == "buffer":
                nd = len(p["shape"])
                self.layout.append(("buffer", word, shapes, nd))
                code, bits, lanes = abi.dl_dtype(p["dtype"])
                self.template.append((word + 1, abi.DL_CPU))
                self.template.append((word + 2, nd | code << 32 | bits << 40 | lanes << 48))
                word += 6
                shapes += nd
                codes.append(abi.TYPE_DLTENSOR)
            elif p["dtype"].startswith("float"):
                self.layout.append(("float",))
                codes.append(abi.TYPE_FLOAT)
            else:
                self.layout.append(("int", *_int_range(p["dtype"])))
                codes.append(abi.TYPE_INT)
        self.size = max(shapes, 1)
        self._codes = (ctypes.c_int32 * max(self.count, 1))(*codes)
        self.codes_addr = ctypes.addressof(self._codes)
        import threading
        self._local = threading.local()

    @staticmethod
    def supported() -> bool:
        import sys
        return ctypes.sizeof(ctypes.c_void_p) == 8 and sys.byteorder == "little"

    def _buffer(self):
        local = self._local
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = (ctypes.c_int64 * self.size)()
            for w, v in self.template:
                buf[w] = v
            local.buf, local.base = buf, ctypes.addressof(buf)
            local.fview = (ctypes.c_double * self.size).from_buffer(buf)
        return buf, local.base, local.fview

    def pack(self, args):
        buf, base, fview = self._buffer()
        fn = self.fn
        dtypes = fn._np_dtypes
        params = fn.params
        for i, arg in enumerate(args):
            slot = self.layout[i]
            kind = slot[0]
            if kind == "buffer":
                if type(arg) is NDArray:
                    arr, ptr = arg._data, arg._ptr
                elif type(arg) is np.ndarray:
                    arr, ptr = arg, None
                else:
                    return None
                flags = arr.flags
                if arr.dtype != dtypes[i] or not flags.c_contiguous or not flags.aligned or \
                        (params[i]["written"] and not flags.writeable):
                    return None
                if ptr is None:  # from_buffer is twice as fast as .ctypes.data (writable only)
                    ptr = _addressof(_C0.from_buffer(arr)) if flags.writeable else arr.ctypes.data
                _, t, s, nd = slot
                buf[t] = ptr
                if nd == arr.ndim:
                    buf[s:s + nd] = arr.shape
                else:
                    return None  # a wrong rank: the general path packs it, the entry reports it
                buf[t + 3] = base + 8 * s
                buf[i] = base + 8 * t
            elif kind == "float":
                if type(arg) is not float and type(arg) is not int:
                    return None
                fview[i] = arg
            else:
                if type(arg) is not int or not slot[1] <= arg <= slot[2] or arg >= 1 << 63:
                    return None
                buf[i] = arg
        return base


def _int_range(dtype: str) -> tuple[int, int]:
    if dtype == "bool":
        return 0, 1
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


class Module:
    """A compiled module: functions by name, plus source, timing and export.

    Use ``mod["main"]`` (or ``mod.entry_func``) to get a callable; ``mod(*args)`` calls the
    entry function. Built by ``targets.build`` or loaded by ``targets.load_module``.
    """

    def __init__(self, metadata: dict):
        self.metadata = metadata
        self._funcs_meta = {f["name"]: f for f in metadata["functions"]}
        self._cache: dict[str, Function] = {}
        self._call_sequence: list = []    # [the runner or None], once looked up

    def _prepare_cpu(self) -> None:
        """Ask for the CPU state the module's code needs before it is loaded: the AMX tiles
        when a function uses them (``targets.runtime.amx``; raises ``AMXError`` if refused)."""
        if any(f.get("uses_amx") for f in self.metadata["functions"]):
            request_amx()

    # -- to be provided by subclasses ----------------------------------------------------------
    def _address(self, symbol: str) -> int:
        raise NotImplementedError

    def _unavailable_reason(self) -> str | None:
        """None if functions can run in this process, else why not."""
        return None

    def _last_error(self) -> str:
        addr = self._address(abi.LAST_ERROR_SYMBOL)
        msg = abi.LAST_ERROR_FUNCTYPE(addr)()
        return msg.decode("utf-8", "replace") if msg else ""

    # -- functions ------------------------------------------------------------------------------
    @property
    def function_names(self) -> list[str]:
        return list(self._funcs_meta)

    @property
    def target(self) -> str:
        """The target string the module was compiled for."""
        return self.metadata.get("target", "")

    @property
    def entry_name(self) -> str:
        """The entry function's name: ``"main"`` when there is one, else the first function."""
        entry = self.metadata.get("entry")
        if entry in self._funcs_meta:
            return entry
        if "main" in self._funcs_meta:
            return "main"
        return next(iter(self._funcs_meta))

    @property
    def entry_func(self) -> Function:
        return self[self.entry_name]

    def get_function(self, name: str) -> Function:
        return self[name]

    def __contains__(self, name: str) -> bool:
        return name in self._funcs_meta

    def __getitem__(self, name: str) -> Function:
        if name in self._cache:
            return self._cache[name]
        meta = self._funcs_meta.get(name)
        if meta is None:
            raise KeyError(f"module has no function {name!r}; it has {sorted(self._funcs_meta)}")
        reason = self._unavailable_reason()
        address = None if reason else self._address(meta["symbol"])
        fn = Function(self, meta, address, reason)
        self._cache[name] = fn
        return fn

    def __call__(self, *args):
        return self.entry_func(*args)

    def call_sequence(self):
        """The library's sequence runner (``abi.CALL_SEQUENCE_SYMBOL``: many kernel calls in
        one foreign call, for the Relax VM), a ctypes function; None where the module's
        functions cannot run in this process or the library predates the runner.

        Examples
        --------
        >>> run = mod.call_sequence()      # doctest: +SKIP
        >>> run(records_address, 2, failed_address)   # doctest: +SKIP
        0
        """
        if not self._call_sequence:
            runner = None
            if self._unavailable_reason() is None:
                try:
                    address = self._address(abi.CALL_SEQUENCE_SYMBOL)
                except (KeyError, ValueError, NotImplementedError):
                    address = None     # an older library: its kernels are called one by one
                if address:
                    runner = abi.CALL_SEQUENCE_FUNCTYPE(address)
            self._call_sequence.append(runner)
        return self._call_sequence[0]

    # -- threads --------------------------------------------------------------------------------
    @property
    def num_threads(self) -> int:
        """Threads parallel loops use (0: all online cores, decided at run time)."""
        if self._unavailable_reason():
            return int(self.metadata.get("num_cores") or 0)
        return ctypes.c_int32.from_address(self._address(abi.NUM_THREADS_SYMBOL)).value

    @num_threads.setter
    def num_threads(self, n: int) -> None:
        n = int(n)
        if n < 0:
            raise ValueError(f"num_threads must be >= 0, got {n}")
        if self._unavailable_reason():
            raise RuntimeError(self._unavailable_reason())
        ctypes.c_int32.from_address(self._address(abi.NUM_THREADS_SYMBOL)).value = n

    def _init_threads(self):
        self.num_threads = int(self.metadata.get("num_cores") or os.cpu_count() or 1)

    # -- other services -------------------------------------------------------------------------
    def get_source(self, fmt: str = "ll") -> str:
        raise ValueError(f"{type(self).__name__} has no source code to show")

    def export_library(self, path: str) -> str:
        raise NotImplementedError

    def time_evaluator(self, name: str, device: Device | None = None, number: int = 10,
                       repeat: int = 3, min_repeat_ms: float = 0,
                       f_preproc: "Any" = None) -> "Any":
        """A function that runs ``name`` ``number`` times per repeat and returns the timings.

        Parameters
        ----------
        name : str
            The function to time.
        device : Device
            Where it runs (``cpu(0)``).
        number : int
            Calls averaged into one measurement.
        repeat : int
            Measurements taken; ``.results`` has one entry per repeat.
        min_repeat_ms : float
            If one repeat takes less than this, ``number`` grows until it does not.
        f_preproc : callable, optional
            Called with no arguments before each repeat, outside the timed region (the tuner
            flushes the CPU caches with it, as TVM's ``f_preproc``).

        Examples
        --------
        >>> t = mod.time_evaluator("main", cpu(0), number=100)(a, b, c)   # doctest: +SKIP
        >>> t.mean                                                       # doctest: +SKIP
        8.1e-07
        """
        fn = self[name]
        device = device or cpu(0)
        if device.kind != "cpu":
            raise ValueError(f"time_evaluator: this module runs on the CPU, not on {device}")
        if number < 1 or repeat < 1:
            raise ValueError(f"time_evaluator: number and repeat must be >= 1 (got {number}, "
                             f"{repeat})")

        def evaluator(*args) -> BenchmarkResult:
            fn._check_runnable()
            packed = fn._pack(args)
            fn._invoke(packed)  # checks the arguments once and warms caches up
            cfunc, values, codes, count = (fn._cfunc, ctypes.addressof(packed.values),
                                           ctypes.addressof(packed.codes), packed.count)
            n = number
            results = []
            clock = time.perf_counter
            for _ in range(repeat):
                while True:
                    if f_preproc is not None:
                        f_preproc()
                    start = clock()
                    for _ in range(n):
                        rc = cfunc(values, codes, count)
                    elapsed = clock() - start
                    if rc != 0:
                        raise ValueError(self._last_error())
                    if min_repeat_ms <= 0 or elapsed * 1000 >= min_repeat_ms:
                        break
                    grow = min_repeat_ms / max(elapsed * 1000, 1e-3)
                    n = max(n * 2, int(n * grow * 1.2))
                device.sync()
                results.append(elapsed / n)
            return BenchmarkResult(results)

        return evaluator

    def __repr__(self):
        return f"<tilecraft.{type(self).__name__} {self.target!r} functions={self.function_names}>"


def read_metadata_from_library(lib: ctypes.CDLL, path: str) -> dict:
    try:
        first = ctypes.c_char.in_dll(lib, abi.METADATA_SYMBOL)
    except ValueError:
        raise ValueError(f"{path} is not a tilecraft kernel library (no {abi.METADATA_SYMBOL} "
                         f"symbol)") from None
    text = ctypes.string_at(ctypes.addressof(first))
    meta = json.loads(text.decode("utf-8"))
    version = meta.get("abi_version")
    if version != abi.ABI_VERSION:
        raise ValueError(f"{path} uses kernel ABI version {version}; this runtime speaks version "
                         f"{abi.ABI_VERSION}")
    return meta


class LibraryModule(Module):
    """A kernel library loaded with ``ctypes`` (``targets.load_module``)."""

    def __init__(self, path: str, lib: ctypes.CDLL, metadata: dict):
        super().__init__(metadata)
        self.path = path
        self._lib = lib
        self._init_threads()

    def _address(self, symbol: str) -> int:
        try:
            return ctypes.cast(getattr(self._lib, symbol), ctypes.c_void_p).value
        except AttributeError:
            raise ValueError(f"{self.path}: symbol {symbol} is missing") from None

    def export_library(self, path: str) -> str:
        """Copy the library to ``path`` (atomically)."""
        with open(self.path, "rb") as f:
            atomic_write(path, f.read(), mode=0o755)
        return os.fspath(path)


def host_arch() -> str:
    """This machine's architecture name (``targets.target.arch_of_triple`` of the host)."""
    return arch_of_triple(host_triple())


# Loaders of non-ELF module files (the GPU back ends' JSON modules): (sniff, load) pairs, where
# sniff(first 256 bytes) says whether load(path) reads the file. Back ends register on import.
_MODULE_LOADERS: list = []


def register_module_loader(sniff, load) -> None:
    """Let ``load_module`` read files for which ``sniff(first_bytes)`` is true with ``load``."""
    _MODULE_LOADERS.append((sniff, load))


def load_module(path: str) -> Module:
    """Load a kernel library written by ``Module.export_library``.

    Needs only ctypes and numpy (no LLVM). The library's metadata says which functions it has
    and what they take; a library built for another architecture raises ``RuntimeError``.

    Examples
    --------
    >>> mod = build(func, "llvm")           # doctest: +SKIP
    >>> mod.export_library("/tmp/k.so")     # doctest: +SKIP
    >>> load_module("/tmp/k.so")["main"](a, b)   # doctest: +SKIP
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(path):
        raise FileNotFoundError(f"no kernel library at {path}")
    if _MODULE_LOADERS:
        with open(path, "rb") as f:
            head = f.read(256)
        for sniff, load in _MODULE_LOADERS:
            if sniff(head):
                return load(path)
    try:
        header = read_elf_file_header(path)
    except NotELFError:
        header = None  # not ELF (e.g. a Mach-O on macOS): let the dynamic loader judge
    if header is not None:
        host = host_arch()
        if not header.arch_matches(host):
            raise RuntimeError(f"{path} is a {header.bits}-bit {header.machine_name} library and "
                               f"cannot run on this machine ({host}); run it on its board, e.g. "
                               f"through rpc")
    try:
        lib = ctypes.CDLL(path)
    except OSError as err:
        raise RuntimeError(f"cannot load kernel library {path}: {err}") from None
    module = LibraryModule(path, lib, read_metadata_from_library(lib, path))
    module._prepare_cpu()
    return module
