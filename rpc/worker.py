"""One RPC session on the board: the child process that serves a connected client.

The server forks one of these per session (see ``rpc.server``), so whatever a kernel does — a
segmentation fault, an endless loop — ends this process, not the server. The session owns a
private temporary directory: uploads land there under plain file names (no ``/``, no ``..``)
and the directory is removed when the session ends.

Requests are ``REQUEST`` frames whose ``meta["op"]`` names the operation; each gets one
``REPLY`` or ``ERROR`` frame. Objects (arrays, modules) live in a table of integer handles.

=============  ==========================================  =====================================
op             meta                                        reply
=============  ==========================================  =====================================
info                                                       platform description
upload         name, size, offset (+ blob: the piece at    name, size, received
               offset; the whole file by default)
load_module    name                                        handle, metadata
array          dtype, shape, device (+ blob, or none)      handle
get            handle                                      array meta (+ blob)
set            handle (+ blob)
call           module, function, args, timeout
time           module, function, device, number, repeat,   results (seconds per call)
               min_repeat_ms, args, timeout,
               cache_flush_bytes (optional)
free           handles
close                                                      (then the session ends)
PLUGIN.OP      args (JSON object), arrays, timeout         the handler's reply (+ array blobs)
=============  ==========================================  =====================================

``args`` is a list of ``["a", handle]`` (an array), ``["i", int]`` or ``["f", float]``. Any
request may carry ``"free": [handles]`` to release objects the client dropped.

Plugins add operations: a module that calls :func:`register_op` at import time, imported by the
server (``python -m tilecraft.rpc.server --plugin MODULE``) before it forks the session launcher, so every
session has its handlers. A plugin operation's name has a dot (``relax.vm_call``); its request
carries ``args`` (a JSON object) and ``arrays`` (each ``{"handle": h}``, an array of the session,
or ``{"dtype", "shape"}``, whose bytes are the request's next blob); the handler gets an
:class:`OpContext` (the session's directory, objects and arrays), the args and the arrays, and
returns a JSON object and, optionally, arrays to send back (their descriptions are the reply's
``arrays``, their bytes its blobs). The client calls one with ``Session.call_plugin``.

A ``call`` or ``time`` runs under ``timeout`` seconds of ``SIGALRM`` with its default action,
so a kernel stuck in native code is killed by the kernel, which needs no cooperation from it;
the server sees the signal and tells the client.

Resources are bounded per session (``SessionLimits``): the process's address space
(``RLIMIT_AS``: ``max_session_memory`` beyond what it had when it started, so a memory bomb in a
kernel or a plugin fails to allocate instead of pushing the board into the OOM killer), the
arrays it holds (``max_memory``), the size of any one upload, array and frame, and the files in
its directory (``max_disk``, also the ``RLIMIT_FSIZE`` of every file it writes). A refused request
(``LimitExceeded``) leaves the session going; a session that runs out of memory is ended with an
error saying so, and the server goes on serving.
"""
from __future__ import annotations

import importlib
import os
import platform
import re
import resource
import shutil
import signal
import socket
import sys
import traceback
from typing import Any, Callable

import numpy as np

from tilecraft.targets.runtime import (Device, Module, NDArray, array as nd_array, empty as nd_empty,
                             load_module)

from .protocol import (ERROR, REPLY, REQUEST, Channel, ConnectionClosed, FrameMAC, IdleTimeout,
                       ProtocolError, RPCError, RPCTimeoutError, check_array_meta, decode_array,
                       encode_array, error_meta)

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}$")
_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")

# Operations added by plugins: name -> handler(ctx, args, arrays). Filled at import time of the
# plugin modules, in the server process before it forks, so sessions inherit it.
_PLUGIN_OPS: dict[str, Callable] = {}


def register_op(name: str, handler: Callable, *, replace: bool = False) -> Callable:
    """Add a session operation (call it at import time of a plugin module).

    Parameters
    ----------
    name : str
        A dotted name, ``"<plugin>.<op>"`` (``"relax.vm_call"``), so it never shadows a
        built-in operation.
    handler : callable
        ``handler(ctx, args, arrays)``: ``ctx`` an :class:`OpContext`, ``args`` the request's
        JSON object, ``arrays`` its input arrays (``targets.NDArray`` for arrays of the
        session, read-only numpy arrays for those sent with the request). It returns a JSON
        object, or ``(json_object, arrays)`` to send arrays back (numpy arrays or NDArrays).
        An exception it raises goes back to the client as the same kind of error and the
        session goes on; it runs under the request's time limit.
    replace : bool
        Allow replacing another handler registered under ``name``.

    Returns the handler, so it works as a decorator factory's result.

    Examples
    --------
    >>> def scale(ctx, args, arrays):
    ...     return {}, [np.asarray(arrays[0]) * args["factor"]]
    >>> register_op("example.scale", scale)             # doctest: +SKIP
    >>> "example.scale" in plugin_ops()                   # doctest: +SKIP
    True
    """
    if not isinstance(name, str) or not _OP_NAME.match(name):
        raise ValueError(f"plugin operation name {name!r} must be dotted identifiers, "
                         f"'<plugin>.<op>' (e.g. 'relax.vm_call')")
    if not callable(handler):
        raise TypeError(f"register_op({name!r}): the handler must be callable, got "
                        f"{type(handler).__name__}")
    old = _PLUGIN_OPS.get(name)
    if old is not None and old is not handler and not replace:
        raise ValueError(f"plugin operation {name!r} is already registered (by "
                         f"{getattr(old, '__module__', '?')}); pass replace=True to replace it")
    _PLUGIN_OPS[name] = handler
    return handler


def plugin_ops() -> list[str]:
    """The names of the operations plugins registered in this process, sorted."""
    return sorted(_PLUGIN_OPS)


def load_plugins(modules) -> list[str]:
    """Import plugin modules (``--plugin MODULE``) so they register their operations.

    Returns the operation names registered by them. Raises ``ValueError`` naming the module when
    one cannot be imported or registers nothing.

    Examples
    --------
    >>> load_plugins(["tilecraft.relax.rpc_plugin"])             # doctest: +SKIP
    ['relax.load_executable', 'relax.vm_call', 'relax.vm_profile', 'relax.vm_time']
    """
    added = []
    for name in modules:
        before = set(_PLUGIN_OPS)
        try:
            importlib.import_module(name)
        except Exception as err:
            raise ValueError(f"plugin {name!r} could not be imported: {type(err).__name__}: "
                             f"{err}") from err
        new = sorted(set(_PLUGIN_OPS) - before)
        if not new and not any(getattr(h, "__module__", None) == name
                               for h in _PLUGIN_OPS.values()):
            raise ValueError(f"plugin {name!r} registered no operation (it should call "
                             f"rpc.worker.register_op at import time)")
        added += new
    return added


class LimitExceeded(MemoryError):
    """A request that would take the session past one of its limits; refused before anything
    is allocated, and the session goes on."""


class SessionLimits:
    """What one session may use. Sizes in bytes, times in seconds.

    ``max_session_memory`` is the address space the session process may add to what it has
    when it starts (``RLIMIT_AS``; 0: no limit). By default it is room for ``max_memory`` of
    arrays, one frame of ``max_frame`` in flight, and 512 MiB plus 16 MiB per core for loaded
    libraries, kernel threads' stacks and the like.

    Examples
    --------
    >>> lim = SessionLimits(max_memory=64 << 20, max_frame=16 << 20)
    >>> lim.max_session_memory >= (64 << 20) + (16 << 20) + (512 << 20)
    True
    """

    def __init__(self, max_frame: int = 512 << 20, max_upload: int = 256 << 20,
                 max_disk: int = 1 << 30, max_array: int = 256 << 20,
                 max_memory: int = 1 << 30, max_objects: int = 100000,
                 idle_timeout: float = 600.0, frame_timeout: float = 30.0,
                 max_call_seconds: float = 600.0, max_session_memory: int | None = None):
        self.max_frame = int(max_frame)
        self.max_upload = int(max_upload)
        self.max_disk = int(max_disk)
        self.max_array = int(max_array)
        self.max_memory = int(max_memory)
        self.max_objects = int(max_objects)
        self.idle_timeout = float(idle_timeout)
        self.frame_timeout = float(frame_timeout)
        self.max_call_seconds = float(max_call_seconds)
        if max_session_memory is None:
            max_session_memory = self.max_memory + self.max_frame + (512 << 20) + \
                (16 << 20) * (os.cpu_count() or 1)
        if int(max_session_memory) < 0:
            raise ValueError(f"max_session_memory must be >= 0 (0: no limit), got "
                             f"{max_session_memory}")
        self.max_session_memory = int(max_session_memory)
        for name in ("max_frame", "max_upload", "max_disk", "max_array", "max_memory"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    def to_json(self) -> dict:
        return dict(vars(self))


def _address_space() -> int | None:
    """The process's address space in bytes (Linux: /proc/self/statm), None if unknown."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[0])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def apply_resource_limits(limits: SessionLimits) -> dict:
    """Bound this (session) process: ``RLIMIT_AS`` to its address space now plus
    ``limits.max_session_memory``, ``RLIMIT_FSIZE`` to ``limits.max_disk`` (a write past it
    fails with ``EFBIG``: ``SIGXFSZ`` is ignored). Returns what was set, for the log; a limit
    the system does not support is left alone."""
    applied = {}

    def lower(which, value):
        soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        if soft == resource.RLIM_INFINITY or value < soft:
            resource.setrlimit(which, (value, hard))
        return value

    if limits.max_session_memory:
        base = _address_space()
        if base is not None:   # without it (not Linux) a cap could be below what is mapped
            try:
                applied["address_space"] = lower(resource.RLIMIT_AS,
                                                 base + limits.max_session_memory)
            except (ValueError, OSError):
                pass
    try:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        applied["file_size"] = lower(resource.RLIMIT_FSIZE, limits.max_disk)
    except (AttributeError, ValueError, OSError):
        pass
    return applied


def check_file_name(name: Any) -> str:
    """An upload name must be a plain file name: no directories, no ``..``, no absolute path.

    Examples
    --------
    >>> check_file_name("kernel.so")
    'kernel.so'
    >>> check_file_name("../etc/passwd")
    Traceback (most recent call last):
    ...
    ValueError: upload name '../etc/passwd' is not a plain file name ...
    """
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", "..") or \
            "/" in name or "\\" in name or "\x00" in name or os.path.isabs(name):
        raise ValueError(f"upload name {name!r} is not a plain file name (letters, digits, "
                         f"'_', '.', '+', '-'; no '/', no '..', at most 255 characters); uploads "
                         f"stay in the session's own directory")
    return name


class _Halt(Exception):
    """Raised by the close op: reply, then end the session."""


class Session:
    """The state of one session: its directory and its objects."""

    def __init__(self, channel: Channel, workdir: str, limits: SessionLimits, info: dict,
                 on_sent: Callable[[int], None] | None = None):
        self.channel = channel
        self.on_sent = on_sent
        self.workdir = workdir
        self.limits = limits
        self.info = info
        self.objects: dict[int, Any] = {}
        self.next_handle = 1
        self.memory = 0
        self.ops = {"info": self.op_info, "upload": self.op_upload,
                    "load_module": self.op_load_module, "array": self.op_array,
                    "get": self.op_get, "set": self.op_set, "call": self.op_call,
                    "time": self.op_time, "free": self.op_free, "close": self.op_close}

    # -- the loop -------------------------------------------------------------------------------
    def serve(self) -> int:
        """Answer requests until the client closes; the process's exit code. Whatever a
        request or a frame does, the client gets an ERROR frame or a clean close."""
        lim = self.limits
        while True:
            try:
                frame = self.channel.recv(timeout=lim.frame_timeout, max_frame=lim.max_frame,
                                          idle_timeout=lim.idle_timeout)
            except ConnectionClosed:
                return 0
            except IdleTimeout:
                self._send_error({"type": "SessionTimeout",
                                  "message": f"session idle for {lim.idle_timeout:g} s; closed "
                                             f"by the server"})
                return 0
            except (ProtocolError, RPCTimeoutError) as err:
                # a "ProtocolError" tells the client the session is over, whatever the cause
                _log(f"ending the session: {err}")
                self._send_error({"type": "ProtocolError" if isinstance(err, ProtocolError)
                                  else type(err).__name__, "message": str(err)})
                return 1
            except MemoryError:
                self._out_of_memory("receiving a frame")
                return 1
            except Exception as err:  # noqa: BLE001 - a bug here must still answer the client
                _log(f"ending the session: {type(err).__name__}: {err}\n"
                     f"{traceback.format_exc()}")
                self._send_error({"type": "ProtocolError",
                                  "message": f"the server could not read the frame: "
                                             f"{type(err).__name__}: {err}"})
                return 1
            if frame.type != REQUEST:
                self._send_error({"type": "ProtocolError",
                                  "message": f"expected a REQUEST frame, got {frame.type_name}"})
                return 1
            op = frame.meta.get("op")
            try:
                self._free(frame.meta.get("free", ()))
                handler = self.ops.get(op) if isinstance(op, str) else None
                if handler is None and isinstance(op, str) and op in _PLUGIN_OPS:
                    meta, blobs = self._plugin_op(op, frame.meta, frame.blobs)
                elif handler is None:
                    hint = (" (a plugin operation: start the server with --plugin MODULE, the "
                            "module that registers it)" if isinstance(op, str) and "." in op
                            else "")
                    raise ValueError(f"unknown operation {op!r}{hint}; known: "
                                     f"{', '.join(list(self.ops) + plugin_ops())}")
                else:
                    meta, blobs = handler(frame.meta, frame.blobs)
            except _Halt:
                self._send(REPLY, {})
                return 0
            except LimitExceeded as err:  # refused before allocating: the session goes on
                if not self._send_error(error_meta(err)):
                    return 1
                continue
            except MemoryError:  # an allocation failed: the process is at its limit
                del frame
                self._out_of_memory(f"serving {op!r}" if isinstance(op, str) else "a request")
                return 1
            except Exception as err:  # reported to the client; the session goes on
                if not self._send_error(error_meta(err)):
                    return 1
                continue
            if not self._send(REPLY, meta, blobs):
                return 1

    def _out_of_memory(self, doing: str) -> None:
        self.objects.clear()   # free what can be freed, so the error can be sent
        cap = self.limits.max_session_memory
        words = (f"the session ran out of memory {doing}: it may use "
                 f"{cap / (1 << 20):.0f} MiB of address space beyond its start "
                 f"(the server's --session-memory-mb), {self.limits.max_memory / (1 << 20):.0f} "
                 f"MiB of it for arrays (--max-memory-mb); the session is closed"
                 if cap else f"the session ran out of memory {doing}; the session is closed")
        _log(words)
        self._send_error({"type": "SessionLost", "message": words})

    def _send(self, ftype: int, meta: dict, blobs=()) -> bool:
        try:
            self.channel.send(ftype, meta, blobs, timeout=self.limits.frame_timeout)
        except (RPCError, OSError):
            return False
        finally:
            if self.on_sent is not None and self.channel.send_mac is not None:
                self.on_sent(self.channel.send_mac.seq)
        return True

    def _send_error(self, meta: dict) -> bool:
        return self._send(ERROR, meta)

    # -- objects --------------------------------------------------------------------------------
    def _put(self, obj) -> int:
        if len(self.objects) >= self.limits.max_objects:
            raise LimitExceeded(f"the session holds {len(self.objects)} objects, the limit")
        handle = self.next_handle
        self.next_handle += 1
        self.objects[handle] = obj
        return handle

    def _get(self, handle, kind: str, cls: type | None = None):
        obj = self.objects.get(handle) if type(handle) is int else None
        if obj is None:
            raise ValueError(f"no {kind} with handle {handle!r} in this session (freed?)")
        cls = cls or (NDArray if kind == "array" else Module)
        if not isinstance(obj, cls):
            raise ValueError(f"handle {handle} is not a {kind}")
        return obj

    def _put_array(self, nd: NDArray) -> int:
        if self.memory + nd.nbytes > self.limits.max_memory:
            raise LimitExceeded(f"an array of {nd.nbytes} bytes would bring the session's arrays "
                              f"to {self.memory + nd.nbytes} bytes; the limit is "
                              f"{self.limits.max_memory}")
        handle = self._put(nd)
        self.memory += nd.nbytes
        return handle

    def _free(self, handles):
        if not isinstance(handles, (list, tuple)):
            raise ValueError("'free' must be a list of handles")
        for h in handles:
            obj = self.objects.pop(h, None) if type(h) is int else None
            if isinstance(obj, NDArray):
                self.memory -= obj.nbytes

    @staticmethod
    def _device(spec) -> Device:
        if spec is None:
            return Device("cpu", 0)
        if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], str)
                and type(spec[1]) is int):
            raise ValueError(f"device must be [kind, index], got {spec!r}")
        return Device(spec[0], spec[1])

    def _args(self, specs) -> list:
        if not isinstance(specs, list):
            raise ValueError("args must be a list")
        out = []
        for i, spec in enumerate(specs):
            if not (isinstance(spec, list) and len(spec) == 2 and spec[0] in ("a", "i", "f")):
                raise ValueError(f"argument {i}: expected ['a', handle], ['i', int] or "
                                 f"['f', float], got {spec!r}")
            tag, value = spec
            if tag == "a":
                out.append(self._get(value, "array"))
            elif tag == "i":
                if type(value) is not int:
                    raise ValueError(f"argument {i}: {value!r} is not an integer")
                out.append(value)
            else:
                if type(value) not in (int, float):
                    raise ValueError(f"argument {i}: {value!r} is not a number")
                out.append(float(value))
        return out

    def _timeout(self, meta) -> float:
        t = meta.get("timeout")
        limit = self.limits.max_call_seconds
        if t is None:
            return limit
        if type(t) not in (int, float) or not t > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {t!r}")
        return min(float(t), limit)

    def _module_function(self, meta):
        mod = self._get(meta.get("module"), "module")
        name = meta.get("function")
        if not isinstance(name, str):
            raise ValueError(f"function name must be a string, got {name!r}")
        return mod, name

    # -- operations -----------------------------------------------------------------------------
    def op_info(self, meta, blobs):
        return dict(self.info, workdir=os.path.basename(self.workdir), plugins=plugin_ops()), ()

    def op_upload(self, meta, blobs):
        """Write a file, whole or in pieces: ``{"name", "size", "offset"}`` and the piece that
        starts at ``offset`` (default: the whole file in one piece). The pieces go to
        ``NAME.part``, appended in order and counted against the quota as they come; the last
        one renames it to ``NAME``. So a large upload never sits whole in the session's memory.
        """
        name = check_file_name(meta.get("name"))
        if len(blobs) != 1:
            raise ValueError("upload carries exactly one blob")
        data = blobs[0]
        size, offset = meta.get("size", len(data)), meta.get("offset", 0)
        if type(size) is not int or type(offset) is not int or not 0 <= offset <= size or \
                offset + len(data) > size:
            raise ValueError(f"upload {name!r}: a piece of {len(data)} bytes at offset "
                             f"{offset!r} does not fit a file of {size!r} bytes")
        if size > self.limits.max_upload:
            raise ValueError(f"upload {name!r} is {size} bytes; the limit is "
                             f"{self.limits.max_upload}")
        path = os.path.join(self.workdir, name)
        part = path + ".part"
        if offset == 0:
            if os.path.lexists(part):   # an upload of this name that was abandoned
                os.unlink(part)
            old = os.path.getsize(path) if os.path.exists(path) else 0
            # what the directory holds now, whoever wrote it (uploads, copies, plugins' files)
            used = self._disk_usage()
            if used - old + size > self.limits.max_disk:
                raise LimitExceeded(f"upload {name!r} would bring the session's files to "
                                    f"{used - old + size} bytes; the limit is "
                                    f"{self.limits.max_disk}")
            # O_EXCL | O_NOFOLLOW: never write through anything but a fresh file of our own
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        else:
            have = os.lstat(part).st_size if os.path.isfile(part) else None
            if have != offset:
                came = "no upload of it is under way" if have is None else \
                    f"{have} bytes came so far"
                raise ValueError(f"upload {name!r}: a piece at offset {offset}, but {came}")
            flags = os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(part, flags, 0o700)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        except BaseException:
            os.unlink(part)
            raise
        if offset + len(data) == size:
            os.replace(part, path)
        return {"name": name, "size": size, "received": offset + len(data)}, ()

    def _disk_usage(self) -> int:
        """Bytes of the files in the session's directory (each file once: loaded libraries are
        hard links of their uploads)."""
        seen, total = set(), 0
        for root, dirs, files in os.walk(self.workdir):
            for f in files:
                try:
                    st = os.lstat(os.path.join(root, f))
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
        return total

    def op_load_module(self, meta, blobs):
        name = check_file_name(meta.get("name"))
        path = os.path.join(self.workdir, name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no uploaded file {name!r} in this session; upload it first")
        # The dynamic loader hands back an already-loaded library when the path matches, even
        # if the file was replaced since: load a link of its own, so a re-upload takes effect.
        loaded = os.path.join(self.workdir, f".load{self.next_handle}-{name}")
        try:
            os.link(path, loaded)
        except OSError:
            shutil.copyfile(path, loaded)
        mod = load_module(loaded)
        handle = self._put(mod)
        return {"handle": handle, "metadata": mod.metadata, "functions": mod.function_names,
                "entry": mod.entry_name}, ()

    def op_array(self, meta, blobs):
        dev = self._device(meta.get("device"))
        dtype, shape, nbytes = check_array_meta(meta, self.limits.max_array)
        if self.memory + nbytes > self.limits.max_memory:
            raise LimitExceeded(f"an array of {nbytes} bytes would bring the session's arrays to "
                              f"{self.memory + nbytes} bytes; the limit is "
                              f"{self.limits.max_memory}")
        if blobs:
            data = decode_array(meta, blobs[0], self.limits.max_array)
            nd = nd_array(data, dev)
        else:
            nd = nd_empty(shape, dtype, dev)
        return {"handle": self._put_array(nd)}, ()

    def op_get(self, meta, blobs):
        nd = self._get(meta.get("handle"), "array")
        arr_meta, blob = encode_array(np.asarray(nd))
        return arr_meta, (blob,)

    def op_set(self, meta, blobs):
        nd = self._get(meta.get("handle"), "array")
        if len(blobs) != 1:
            raise ValueError("set carries exactly one blob")
        src = decode_array({"dtype": nd.dtype, "shape": list(nd.shape)}, blobs[0],
                           self.limits.max_array)
        nd.copyfrom(src)
        return {}, ()

    def op_call(self, meta, blobs):
        mod, name = self._module_function(meta)
        fn = mod[name]
        args = self._args(meta.get("args"))
        with _alarm(self._timeout(meta)):
            fn(*args)
        return {}, ()

    def op_time(self, meta, blobs):
        mod, name = self._module_function(meta)
        dev = self._device(meta.get("device"))
        number, repeat = meta.get("number", 10), meta.get("repeat", 3)
        min_ms = meta.get("min_repeat_ms", 0)
        if type(number) is not int or type(repeat) is not int or number < 1 or repeat < 1:
            raise ValueError(f"number and repeat must be positive integers, got {number!r}, "
                             f"{repeat!r}")
        if type(min_ms) not in (int, float) or min_ms < 0:
            raise ValueError(f"min_repeat_ms must be >= 0, got {min_ms!r}")
        flush = meta.get("cache_flush_bytes", 0)
        if type(flush) is not int or not 0 <= flush <= self.limits.max_array:
            raise ValueError(f"cache_flush_bytes must be an integer in [0, "
                             f"{self.limits.max_array}], got {flush!r}")
        args = self._args(meta.get("args"))
        evaluator = mod.time_evaluator(name, dev, number=number, repeat=repeat,
                                       min_repeat_ms=min_ms,
                                       f_preproc=self._cache_flusher(flush) if flush else None)
        with _alarm(self._timeout(meta)):
            result = evaluator(*args)
        return {"results": list(result.results)}, ()

    def _cache_flusher(self, nbytes: int):
        """Writes a buffer of ``nbytes`` (kept for the session): run before each repeat, it
        evicts the kernel's data from the caches, so every repeat starts cold."""
        buf = getattr(self, "_flush_buffer", None)
        if buf is None or buf.size != nbytes:
            buf = self._flush_buffer = np.zeros(nbytes, np.uint8)
        return lambda: np.add(buf, 1, out=buf)

    def op_free(self, meta, blobs):
        self._free(meta.get("handles", ()))
        return {}, ()

    def op_close(self, meta, blobs):
        raise _Halt()

    def _plugin_op(self, op: str, meta: dict, blobs):
        """Run a plugin's handler: decode its arrays, run it under the time limit, encode the
        arrays it sends back."""
        args = meta.get("args", {})
        if not isinstance(args, dict):
            raise ValueError(f"{op}: 'args' must be a JSON object, got {type(args).__name__}")
        specs = meta.get("arrays", [])
        if not isinstance(specs, list):
            raise ValueError(f"{op}: 'arrays' must be a list")
        arrays = []
        next_blob = 0
        for i, spec in enumerate(specs):
            if isinstance(spec, dict) and "handle" in spec:
                arrays.append(self._get(spec["handle"], "array"))
                continue
            if next_blob >= len(blobs):
                raise ValueError(f"{op}: array {i} has no blob (the request carries "
                                 f"{len(blobs)})")
            try:
                arrays.append(decode_array(spec, blobs[next_blob], self.limits.max_array))
            except ValueError as err:
                raise ValueError(f"{op}: array {i}: {err}") from None
            next_blob += 1
        if next_blob != len(blobs):
            raise ValueError(f"{op}: the request carries {len(blobs)} blobs for {next_blob} "
                             f"arrays")
        ctx = OpContext(self, op)
        with _alarm(self._timeout(meta)):
            out = _PLUGIN_OPS[op](ctx, args, arrays)
        reply, send = (out, ()) if isinstance(out, dict) else \
            (out if isinstance(out, tuple) and len(out) == 2 else (out, ()))
        if not isinstance(reply, dict):
            raise TypeError(f"{op}: the plugin's handler returned {type(reply).__name__}, not a "
                            f"JSON object (or an (object, arrays) pair)")
        metas, out_blobs = [], []
        for arr in send:
            arr_meta, blob = encode_array(arr.numpy() if isinstance(arr, NDArray) else arr)
            metas.append(arr_meta)
            out_blobs.append(blob)
        if "arrays" in reply:
            raise ValueError(f"{op}: a plugin's reply may not use the key 'arrays' (the arrays "
                             f"sent back are described there)")
        return dict(reply, arrays=metas), out_blobs


class OpContext:
    """What a plugin operation's handler sees of its session.

    Attributes
    ----------
    op : str
        The operation's name.
    workdir : str
        The session's private directory (uploads are there; removed when the session ends).
    limits : SessionLimits
    info : dict
        The board's description (``platform_info()``).

    Examples
    --------
    >>> def load(ctx, args, arrays):                                  # doctest: +SKIP
    ...     thing = load_my_format(ctx.file_path(args["name"]))
    ...     return {"handle": ctx.put(thing)}
    """

    def __init__(self, session: "Session", op: str):
        self._session = session
        self.op = op
        self.workdir = session.workdir
        self.limits = session.limits
        self.info = session.info

    def file_path(self, name) -> str:
        """The path of the uploaded file ``name`` (a plain file name) in the session directory;
        ``FileNotFoundError`` if there is none."""
        name = check_file_name(name)
        path = os.path.join(self.workdir, name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no uploaded file {name!r} in this session; upload it first")
        return path

    def put(self, obj) -> int:
        """Keep ``obj`` in the session; returns its handle (the client frees it like an array).
        Arrays go through ``put_array``, which counts their memory."""
        if isinstance(obj, NDArray):
            return self._session._put_array(obj)
        return self._session._put(obj)

    def get(self, handle, cls: type, what: str | None = None):
        """The object of ``handle``, which must be an instance of ``cls``; ``ValueError``
        naming ``what`` otherwise."""
        return self._session._get(handle, what or cls.__name__, cls)

    def put_array(self, nd) -> dict:
        """Keep an array (``targets.NDArray`` or numpy) in the session, counted against its
        memory limit; returns its description for the reply, ``{"handle", "dtype", "shape",
        "device"}``, which the client turns into a ``RemoteNDArray`` with
        ``Session.remote_array``."""
        if not isinstance(nd, NDArray):
            nd = nd_array(np.asarray(nd), Device("cpu", 0))
        handle = self._session._put_array(nd)
        return {"handle": handle, "dtype": nd.dtype, "shape": [int(s) for s in nd.shape],
                "device": [nd.device.kind, nd.device.index]}

    def array(self, handle) -> NDArray:
        """The session's array of ``handle``."""
        return self._session._get(handle, "array")

    def device(self, spec) -> Device:
        """A ``targets.Device`` from ``[kind, index]`` (``None``: the CPU)."""
        return Session._device(spec)


class _alarm:
    """Kill this process with SIGALRM (default action) if the block runs past ``seconds``."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __enter__(self):
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        return False


def platform_info() -> dict:
    """What the board says about itself in WELCOME and ``info``."""
    return {"machine": platform.machine(), "system": platform.system(),
            "python": platform.python_version(), "numpy": np.__version__,
            "cpu_count": os.cpu_count(), "byteorder": sys.byteorder}


def _log(message: str) -> None:
    """A line on the session's stderr (the server's log)."""
    try:
        print(f"rpc session {os.getpid()}: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def run_session(sock: socket.socket, workdir: str, limits: SessionLimits, info: dict,
                keys: tuple[bytes, bytes] | None = None,
                on_sent: Callable[[int], None] | None = None) -> int:
    """Serve one session on ``sock`` until it closes; return the process exit code.

    ``keys`` are the session's ``(client to server, server to client)`` frame keys when it was
    authenticated (the server sent the WELCOME, the first server-to-client frame, itself);
    ``on_sent(n)`` is told the sequence number of the next frame after each one sent, so that
    the server can still speak on the connection if this process dies.
    """
    # A kernel that overruns its time limit must die even inside native code: default action.
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    sock.setblocking(True)
    try:
        apply_resource_limits(limits)
        if keys is None:
            channel = Channel(sock)
        else:
            c2s, s2c = keys
            channel = Channel(sock, FrameMAC(s2c, 1), FrameMAC(c2s, 0))
        return Session(channel, workdir, limits, info, on_sent).serve()
    finally:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # the server holds a copy: shutdown sends the FIN
        except OSError:
            pass
        sock.close()
        shutil.rmtree(workdir, ignore_errors=True)
