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
upload         name (+ blob: the file)                     name, size
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
"""
from __future__ import annotations

import importlib
import os
import platform
import re
import shutil
import signal
import socket
import sys
from typing import Any, Callable

import numpy as np

from tilecraft.errors import TilecraftError
from tilecraft.targets.runtime import (Device, Module, NDArray, array as nd_array, empty as nd_empty,
                             load_module)

from .protocol import (ERROR, REPLY, REQUEST, ConnectionClosed, IdleTimeout, ProtocolError,
                       RPCError, RPCTimeoutError, check_array_meta, decode_array, encode_array,
                       error_meta, recv_frame, send_frame)

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


class SessionLimits:
    """What one session may use. Sizes in bytes, times in seconds."""

    def __init__(self, max_frame: int = 512 << 20, max_upload: int = 256 << 20,
                 max_disk: int = 1 << 30, max_array: int = 256 << 20,
                 max_memory: int = 1 << 30, max_objects: int = 100000,
                 idle_timeout: float = 600.0, frame_timeout: float = 30.0,
                 max_call_seconds: float = 600.0):
        self.max_frame = int(max_frame)
        self.max_upload = int(max_upload)
        self.max_disk = int(max_disk)
        self.max_array = int(max_array)
        self.max_memory = int(max_memory)
        self.max_objects = int(max_objects)
        self.idle_timeout = float(idle_timeout)
        self.frame_timeout = float(frame_timeout)
        self.max_call_seconds = float(max_call_seconds)

    def to_json(self) -> dict:
        return dict(vars(self))


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


class _Halt(TilecraftError):
    """Raised by the close op: reply, then end the session."""


class Session:
    """The state of one session: its directory and its objects."""

    def __init__(self, sock: socket.socket, workdir: str, limits: SessionLimits, info: dict):
        self.sock = sock
        self.workdir = workdir
        self.limits = limits
        self.info = info
        self.objects: dict[int, Any] = {}
        self.next_handle = 1
        self.memory = 0
        self.disk = 0
        self.ops = {"info": self.op_info, "upload": self.op_upload,
                    "load_module": self.op_load_module, "array": self.op_array,
                    "get": self.op_get, "set": self.op_set, "call": self.op_call,
                    "time": self.op_time, "free": self.op_free, "close": self.op_close}

    # -- the loop -------------------------------------------------------------------------------
    def serve(self) -> int:
        lim = self.limits
        while True:
            try:
                frame = recv_frame(self.sock, timeout=lim.frame_timeout, max_frame=lim.max_frame,
                                   idle_timeout=lim.idle_timeout)
            except ConnectionClosed:
                return 0
            except IdleTimeout:
                self._send_error({"type": "SessionTimeout",
                                  "message": f"session idle for {lim.idle_timeout:g} s; closed "
                                             f"by the server"})
                return 0
            except (ProtocolError, RPCTimeoutError) as err:
                self._send_error(error_meta(err))
                return 1
            if frame.type != REQUEST:
                self._send_error({"type": "ProtocolError",
                                  "message": f"expected a REQUEST frame, got {frame.type_name}"})
                return 1
            try:
                self._free(frame.meta.get("free", ()))
                op = frame.meta.get("op")
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
            except Exception as err:  # reported to the client; the session goes on
                if not self._send_error(error_meta(err)):
                    return 1
                continue
            if not self._send(REPLY, meta, blobs):
                return 1

    def _send(self, ftype: int, meta: dict, blobs=()) -> bool:
        try:
            send_frame(self.sock, ftype, meta, blobs, timeout=self.limits.frame_timeout)
            return True
        except (RPCError, OSError):
            return False

    def _send_error(self, meta: dict) -> bool:
        return self._send(ERROR, meta)

    # -- objects --------------------------------------------------------------------------------
    def _put(self, obj) -> int:
        if len(self.objects) >= self.limits.max_objects:
            raise MemoryError(f"the session holds {len(self.objects)} objects, the limit")
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
            raise MemoryError(f"an array of {nd.nbytes} bytes would bring the session's arrays "
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
        name = check_file_name(meta.get("name"))
        if len(blobs) != 1:
            raise ValueError("upload carries exactly one blob")
        data = blobs[0]
        size = len(data)
        if size > self.limits.max_upload:
            raise ValueError(f"upload {name!r} is {size} bytes; the limit is "
                             f"{self.limits.max_upload}")
        path = os.path.join(self.workdir, name)
        old = os.path.getsize(path) if os.path.exists(path) else 0
        if self.disk - old + size > self.limits.max_disk:
            raise ValueError(f"upload {name!r} would bring the session's files to "
                             f"{self.disk - old + size} bytes; the limit is {self.limits.max_disk}")
        tmp = path + ".part"
        # O_EXCL | O_NOFOLLOW: never write through anything but a fresh file of our own
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     0o700)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.disk += size - old
        return {"name": name, "size": size}, ()

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
            raise MemoryError(f"an array of {nbytes} bytes would bring the session's arrays to "
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


def run_session(sock: socket.socket, workdir: str, limits: SessionLimits, info: dict) -> int:
    """Serve one session on ``sock`` until it closes; return the process exit code."""
    # A kernel that overruns its time limit must die even inside native code: default action.
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    sock.setblocking(True)
    try:
        return Session(sock, workdir, limits, info).serve()
    finally:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # the server holds a copy: shutdown sends the FIN
        except OSError:
            pass
        sock.close()
        shutil.rmtree(workdir, ignore_errors=True)
