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
               min_repeat_ms, args, timeout
free           handles
close                                                      (then the session ends)
=============  ==========================================  =====================================

``args`` is a list of ``["a", handle]`` (an array), ``["i", int]`` or ``["f", float]``. Any
request may carry ``"free": [handles]`` to release objects the client dropped.

A ``call`` or ``time`` runs under ``timeout`` seconds of ``SIGALRM`` with its default action,
so a kernel stuck in native code is killed by the kernel, which needs no cooperation from it;
the server sees the signal and tells the client.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import signal
import socket
import sys
from typing import Any

import numpy as np

from targets.runtime import Device, array as nd_array, empty as nd_empty, load_module

from .protocol import (ERROR, REPLY, REQUEST, ConnectionClosed, IdleTimeout, ProtocolError,
                       RPCError, RPCTimeoutError, check_array_meta, decode_array, encode_array,
                       error_meta, recv_frame, send_frame)

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}$")


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


class _Halt(Exception):
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
                if handler is None:
                    raise ValueError(f"unknown operation {op!r}; known: {', '.join(self.ops)}")
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

    def _get(self, handle, kind: str):
        obj = self.objects.get(handle) if type(handle) is int else None
        if obj is None:
            raise ValueError(f"no {kind} with handle {handle!r} in this session (freed?)")
        want = "array" if kind == "array" else "module"
        if (want == "array") != (type(obj).__name__ == "NDArray"):
            raise ValueError(f"handle {handle} is not a {kind}")
        return obj

    def _free(self, handles):
        if not isinstance(handles, (list, tuple)):
            raise ValueError("'free' must be a list of handles")
        for h in handles:
            obj = self.objects.pop(h, None) if type(h) is int else None
            if obj is not None and type(obj).__name__ == "NDArray":
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
        return dict(self.info, workdir=os.path.basename(self.workdir)), ()

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
        handle = self._put(nd)
        self.memory += nd.nbytes
        return {"handle": handle}, ()

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
        args = self._args(meta.get("args"))
        evaluator = mod.time_evaluator(name, dev, number=number, repeat=repeat,
                                       min_repeat_ms=min_ms)
        with _alarm(self._timeout(meta)):
            result = evaluator(*args)
        return {"results": list(result.results)}, ()

    def op_free(self, meta, blobs):
        self._free(meta.get("handles", ()))
        return {}, ()

    def op_close(self, meta, blobs):
        raise _Halt()


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
