"""The client side of RPC: sessions on a remote board, directly or through a tracker.

Examples
--------
>>> import numpy as np
>>> from tilecraft import rpc, targets                          # doctest: +SKIP
>>> targets.build(func, "raspberry-pi/4b-aarch64").export_library("add.so")   # doctest: +SKIP
>>> with rpc.connect_tracker("127.0.0.1", 9190).request("rasp4", timeout=60) as sess:
...     sess.upload("add.so")
...     mod = sess.load_module("add.so")
...     dev = sess.cpu(0)
...     a = sess.array(np.random.rand(1024).astype("float32"), dev)
...     b = sess.empty((1024,), "float32", dev)
...     mod["main"](a, b)
...     print(b.numpy()[:4], mod.time_evaluator("main", dev, number=100)(a, b).mean)
... # doctest: +SKIP
"""
from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Sequence

import numpy as np

from tilecraft.targets.runtime import BenchmarkResult, Device

from .auth import AuthenticationError, as_token, client_handshake
from .protocol import (ERROR, MAX_BLOBS, REPLY, REQUEST, Channel, ConnectionClosed, ProtocolError,
                       RPCError, RPCTimeoutError, decode_array, encode_array)

__all__ = ["connect", "connect_tracker", "Session", "RemoteDevice", "RemoteNDArray",
           "RemoteModule", "RemoteFunction", "PluginReply", "TrackerClient", "RemoteError",
           "SessionLost", "ServerBusy", "TrackerError"]

# Seconds the client waits beyond a call's own time limit for the server to report on it.
_CALL_MARGIN = 10.0
# Uploads travel in pieces of this size (each one frame, written to disk by the board as it
# comes): memory on the board stays small, and each piece's MAC is computed on hot data.
UPLOAD_PIECE = 4 << 20


class RemoteError(RPCError):
    """An exception raised on the server while serving a request; the session goes on.

    ``remote_type`` is the remote exception's class name. For the common built-in types the
    exception is also an instance of that type, so ``except ValueError`` catches a remote
    shape mismatch just as it catches a local one.
    """

    remote_type = "Exception"


class SessionLost(RPCError):
    """The session ended on the server (a crashed or killed kernel, an idle timeout, the server
    going away); open a new one."""


class ServerBusy(RPCError):
    """The server has as many sessions open as it allows."""


class TrackerError(RPCError):
    """The tracker refused a request or none of its servers became free in time."""


_REMOTE_TYPES: dict[tuple, type] = {}
_BUILTIN = {"ValueError": ValueError, "TypeError": TypeError, "KeyError": KeyError,
            "IndexError": IndexError, "FileNotFoundError": FileNotFoundError,
            "MemoryError": MemoryError, "NotImplementedError": NotImplementedError,
            "OSError": OSError}


def _remote_error(meta: dict) -> RPCError:
    kind = str(meta.get("type", "Exception"))
    message = str(meta.get("message", ""))
    if kind in ("SessionLost", "SessionTimeout"):
        return SessionLost(message)
    if kind == "AuthenticationError":
        return AuthenticationError(message)
    if kind == "ServerBusy":
        return ServerBusy(message)
    if kind == "ProtocolError":
        return ProtocolError(f"the server reports a protocol error: {message}")
    # The remote class if it is a common built-in one, else the built-in classes it derives
    # from (a library's ``VMArgumentError(ValueError, TypeError)`` is caught by ``except
    # ValueError`` here too); the message then starts with the remote class's name.
    bases = meta.get("bases") if isinstance(meta.get("bases"), list) else []
    builtin = [_BUILTIN[b] for b in [kind] + bases if isinstance(b, str) and b in _BUILTIN]
    if not builtin:
        err = RemoteError(f"{kind}: {message}")
        err.remote_type = kind
        return err
    if kind not in _BUILTIN:
        message = f"{kind}: {message}"
    key = (kind, tuple(builtin))
    cls = _REMOTE_TYPES.get(key)
    if cls is None:
        # a base already implied by an earlier one would break the MRO: keep the most derived
        chosen = [b for b in builtin if not any(o is not b and issubclass(o, b) for o in builtin)]
        try:
            cls = type(f"Remote{kind}", (RemoteError, *chosen), {"remote_type": kind})
        except TypeError:  # incompatible layouts (two OSError-like bases): the first only
            cls = type(f"Remote{kind}", (RemoteError, chosen[0]), {"remote_type": kind})
        _REMOTE_TYPES[key] = cls
    return cls(message)


def _device_spec(dev) -> list:
    if dev is None:
        return ["cpu", 0]
    if isinstance(dev, (RemoteDevice, Device)):
        return [dev.kind, dev.index]
    raise TypeError(f"expected a device (sess.cpu(0)), got {type(dev).__name__}")


class RemoteDevice:
    """A device on the board: ``sess.cpu(0)``, ``sess.device("cpu", 0)``."""

    __slots__ = ("session", "kind", "index")

    def __init__(self, session: "Session", kind: str, index: int = 0):
        Device(kind, index)  # validates the kind and index
        self.session, self.kind, self.index = session, kind, int(index)

    def sync(self) -> None:
        """Remote calls return when the kernel has finished; nothing is left to wait for."""

    def __eq__(self, other):
        return isinstance(other, RemoteDevice) and other.session is self.session and \
            (other.kind, other.index) == (self.kind, self.index)

    def __hash__(self):
        return hash((id(self.session), self.kind, self.index))

    def __repr__(self):
        return f"remote {self.kind}({self.index})"


class RemoteNDArray:
    """An array that lives on the board. ``.numpy()`` copies it here."""

    def __init__(self, session: "Session", handle: int, shape: tuple, dtype: str,
                 device: RemoteDevice):
        self.session = session
        self.handle = handle
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def numpy(self) -> np.ndarray:
        """A numpy copy of the remote contents."""
        frame = self.session._request("get", {"handle": self.handle})
        return decode_array(frame.meta, frame.blobs[0], self.session.max_frame).copy()

    asnumpy = numpy

    def copyfrom(self, source) -> "RemoteNDArray":
        """Overwrite the remote contents with ``source`` (same shape and dtype)."""
        src = np.asarray(source)
        if tuple(src.shape) != self.shape:
            raise ValueError(f"copyfrom: source shape {tuple(src.shape)} differs from the "
                             f"array's {self.shape}")
        if src.dtype.name != self.dtype:
            raise ValueError(f"copyfrom: source dtype {src.dtype.name} differs from the array's "
                             f"{self.dtype}; convert it first with .astype()")
        _, blob = encode_array(src)
        self.session._request("set", {"handle": self.handle}, (blob,))
        return self

    def __del__(self):
        session = getattr(self, "session", None)
        if session is not None:
            session._release(self.handle)

    def __repr__(self):
        return f"<rpc.RemoteNDArray shape={self.shape}, {self.dtype}, {self.device}>"


class RemoteFunction:
    """A kernel of a remote module: call it with remote arrays and numbers."""

    def __init__(self, module: "RemoteModule", name: str):
        self.module = module
        self.name = name

    def __call__(self, *args, timeout: float | None = None) -> None:
        sess = self.module.session
        t = sess.call_timeout if timeout is None else float(timeout)
        sess._request("call", {"module": self.module.handle, "function": self.name,
                               "args": sess._pack_args(args, self.name), "timeout": t},
                      timeout=t + _CALL_MARGIN, what=f"calling {self.name}")

    def __repr__(self):
        return f"<rpc.RemoteFunction {self.name}>"


class RemoteModule:
    """A kernel library loaded on the board (``sess.load_module(name)``)."""

    def __init__(self, session: "Session", handle: int, name: str, metadata: dict,
                 functions: list, entry: str):
        self.session = session
        self.handle = handle
        self.name = name
        self.metadata = metadata
        self.function_names = list(functions)
        self.entry_name = entry

    @property
    def target(self) -> str:
        return self.metadata.get("target", "")

    def __contains__(self, name: str) -> bool:
        return name in self.function_names

    def __getitem__(self, name: str) -> RemoteFunction:
        if name not in self.function_names:
            raise KeyError(f"remote module {self.name!r} has no function {name!r}; it has "
                           f"{sorted(self.function_names)}")
        return RemoteFunction(self, name)

    def get_function(self, name: str) -> RemoteFunction:
        return self[name]

    def __call__(self, *args):
        return self[self.entry_name](*args)

    def time_evaluator(self, name: str, dev=None, number: int = 10, repeat: int = 3,
                       min_repeat_ms: float = 0, timeout: float | None = None,
                       cache_flush_bytes: int = 0):
        """A function that times ``name`` on the board's own clock, like ``Module.time_evaluator``.

        Returns a callable taking the kernel's arguments and returning a
        ``targets.BenchmarkResult`` (seconds per call: ``.mean``, ``.median``, ``.results``).
        The network is not in the timings: the board runs the ``number x repeat`` calls itself.
        With ``cache_flush_bytes``, the board writes a buffer of that size before each repeat
        (bigger than its caches: every repeat starts with cold caches).

        Examples
        --------
        >>> timer = mod.time_evaluator("main", sess.cpu(0), number=100)   # doctest: +SKIP
        >>> timer(a, b).mean                                               # doctest: +SKIP
        2.4e-06
        """
        if name not in self.function_names:
            raise KeyError(f"remote module {self.name!r} has no function {name!r}")
        if int(number) < 1 or int(repeat) < 1:
            raise ValueError(f"time_evaluator: number and repeat must be >= 1 (got {number}, "
                             f"{repeat})")
        sess = self.session
        spec = _device_spec(dev)

        def evaluator(*args) -> BenchmarkResult:
            t = sess.call_timeout if timeout is None else float(timeout)
            frame = sess._request("time", {"module": self.handle, "function": name,
                                           "device": spec, "number": int(number),
                                           "repeat": int(repeat),
                                           "min_repeat_ms": float(min_repeat_ms),
                                           "args": sess._pack_args(args, name), "timeout": t,
                                           **({"cache_flush_bytes": int(cache_flush_bytes)}
                                              if cache_flush_bytes else {})},
                                  timeout=t + _CALL_MARGIN, what=f"timing {name}")
            return BenchmarkResult(frame.meta["results"])

        return evaluator

    def __repr__(self):
        return f"<rpc.RemoteModule {self.name!r} functions={self.function_names}>"


class PluginReply:
    """What a plugin operation answered (``Session.call_plugin``): ``meta``, its JSON object,
    and ``arrays``, numpy copies of the arrays it sent back."""

    __slots__ = ("meta", "arrays")

    def __init__(self, meta: dict, arrays: list):
        self.meta = meta
        self.arrays = arrays

    def __repr__(self):
        return f"PluginReply({self.meta!r}, arrays={[a.shape for a in self.arrays]})"


class Session:
    """A session on an RPC server. Make one with ``rpc.connect`` or a tracker's ``request``.

    Everything created in a session (uploaded files, modules, arrays) lives on the board until
    the session ends; ``close()`` ends it (a ``with`` block does too). A session serves one
    request at a time; it may be shared between threads.

    Attributes
    ----------
    key : str
        The server's device key.
    platform : dict
        What the board said about itself (machine, python, numpy, cpu_count).
    call_timeout : float
        Default time limit of a kernel call or timing run, in seconds; the server kills the
        session process past it (``SessionLost``).
    plugins : list[str] or None
        The plugin operations the server has (``--plugin``; see ``call_plugin``); None for a
        server too old to say.
    authenticated : bool
        Whether the session was opened with a token: then both sides proved they hold it and
        every frame carries a MAC and a sequence number, checked before it is read.
    """

    def __init__(self, channel: Channel, welcome: dict, timeout: float,
                 call_timeout: float, address: tuple[str, int]):
        self._channel = channel
        self._lock = threading.RLock()
        self._to_free: list[int] = []
        self._closed = False
        self.address = address
        self.timeout = float(timeout)
        self.call_timeout = float(call_timeout)
        self.session_id = welcome.get("session")
        self.key = welcome.get("key")
        self.platform = welcome.get("platform", {})
        self.limits = welcome.get("limits", {})
        self.max_frame = int(self.limits.get("max_frame", 512 << 20)) + (1 << 20)
        # None: a server from before plugins, which cannot say
        plugins = welcome.get("plugins")
        self.plugins = list(plugins) if isinstance(plugins, list) else None

    # -- plumbing -------------------------------------------------------------------------------
    def _request(self, op: str, meta: dict | None = None, blobs: Sequence = (),
                 timeout: float | None = None, what: str | None = None):
        body = {"op": op}
        if meta:
            body.update(meta)
        with self._lock:
            if self._closed:
                raise SessionLost("the session is closed")
            if self._to_free:
                body["free"], self._to_free = self._to_free, []
            wait = self.timeout if timeout is None else timeout
            try:
                try:
                    self._channel.send(REQUEST, body, blobs, timeout=self.timeout)
                except ConnectionClosed:
                    # The server may have said why before it closed (e.g. a frame too large).
                    frame = self._pending_error()
                    if frame is None:
                        raise
                    raise SessionLost(f"{what or op}: the server ended the session: "
                                      f"{frame.meta.get('message')}")
                frame = self._channel.recv(timeout=self.timeout, idle_timeout=wait,
                                           max_frame=self.max_frame, expect=[REPLY])
            except ConnectionClosed as err:
                self._abandon()
                raise SessionLost(f"{what or op}: the server closed the session ({err})") \
                    from None
            except (RPCError, OSError) as err:
                self._abandon()
                if isinstance(err, RPCTimeoutError):
                    raise RPCTimeoutError(f"{what or op}: no answer from the server: {err}; the "
                                          f"session is closed") from None
                raise
            if frame.type == ERROR:
                if frame.meta.get("type") == "ProtocolError":  # the server ends the session
                    self._abandon()
                    raise SessionLost(f"{what or op}: the server ended the session: "
                                      f"{frame.meta.get('message')}")
                err = _remote_error(frame.meta)
                if isinstance(err, SessionLost):
                    self._abandon()
                    if what:
                        err = type(err)(f"{what}: {err}")
                raise err
            return frame

    def _pending_error(self):
        try:
            frame = self._channel.recv(timeout=0.5, max_frame=1 << 20)
        except (RPCError, OSError):
            return None
        return frame if frame.type == ERROR else None

    def _abandon(self) -> None:
        self._closed = True
        self._channel.close()

    def _release(self, handle: int) -> None:
        if not self._closed:
            self._to_free.append(handle)  # sent with the next request

    def _pack_args(self, args, fname: str) -> list:
        out = []
        for i, a in enumerate(args):
            if isinstance(a, RemoteNDArray):
                if a.session is not self:
                    raise ValueError(f"{fname}: argument {i} belongs to another session")
                out.append(["a", a.handle])
            elif isinstance(a, (bool, np.bool_)):
                out.append(["i", int(a)])
            elif isinstance(a, (int, np.integer)):
                out.append(["i", int(a)])
            elif isinstance(a, (float, np.floating)):
                out.append(["f", float(a)])
            elif isinstance(a, np.ndarray):
                raise TypeError(f"{fname}: argument {i} is a local numpy array; copy it to the "
                                f"board first with sess.array(x) (outputs come back with "
                                f".numpy())")
            else:
                raise TypeError(f"{fname}: argument {i} must be a remote array or a number, "
                                f"got {type(a).__name__}")
        return out

    # -- the API --------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def authenticated(self) -> bool:
        return self._channel.authenticated

    def info(self) -> dict:
        """The board's description (machine, python, numpy, cpu_count, ...)."""
        return self._request("info").meta

    def upload(self, data, name: str | None = None) -> str:
        """Copy a file (a path, or bytes) into the session's directory on the board.

        ``name`` is a plain file name (default: the path's base name); it may not contain
        ``/`` or be ``..``. Returns the name.

        Examples
        --------
        >>> sess.upload("build/add.so")            # doctest: +SKIP
        'add.so'
        >>> sess.upload(b"...", "other.so")        # doctest: +SKIP
        'other.so'
        """
        if isinstance(data, (bytes, bytearray, memoryview)):
            if name is None:
                raise ValueError("upload: give a name for uploaded bytes")
            blob = data
        else:
            path = os.fspath(data)
            with open(path, "rb") as f:
                blob = f.read()
            name = name or os.path.basename(path)
        view = memoryview(blob).cast("B")
        size = view.nbytes
        limit = self.limits.get("max_upload")
        if limit is not None and size > limit:
            raise ValueError(f"upload {name!r} is {size} bytes; the server accepts at most "
                             f"{limit}")
        # in pieces: the board writes each to disk as it comes, and holds none for long
        piece = max(1, min(UPLOAD_PIECE, self.max_frame - (2 << 20)))
        for offset in range(0, max(size, 1), piece):
            chunk = view[offset:offset + piece]
            # big pieces take a while to send: allow ~1 MB/s on top of the usual timeout
            self._request("upload", {"name": name, "size": size, "offset": offset}, (chunk,),
                          timeout=self.timeout + chunk.nbytes / 1e6)
        return name

    def load_module(self, name: str) -> RemoteModule:
        """Load an uploaded kernel library (``targets.load_module`` on the board)."""
        meta = self._request("load_module", {"name": name}).meta
        return RemoteModule(self, meta["handle"], name, meta["metadata"], meta["functions"],
                            meta["entry"])

    def cpu(self, index: int = 0) -> RemoteDevice:
        return RemoteDevice(self, "cpu", index)

    def device(self, kind: str, index: int = 0) -> RemoteDevice:
        """A device of the board by kind: ``sess.device("cpu", 0)``."""
        return RemoteDevice(self, kind, index)

    def array(self, source, device=None) -> RemoteNDArray:
        """Copy a numpy array (or anything ``np.asarray`` takes) to the board."""
        arr = np.asarray(source)
        self._check_array_size(arr.nbytes, arr.shape, arr.dtype.name)
        meta, blob = encode_array(arr)
        dev = device or self.cpu(0)
        meta["device"] = _device_spec(dev)
        handle = self._request("array", meta, (blob,),
                               timeout=self.timeout + blob.nbytes / 1e6).meta["handle"]
        return RemoteNDArray(self, handle, arr.shape, arr.dtype.name, self._as_remote(dev))

    def empty(self, shape, dtype="float32", device=None) -> RemoteNDArray:
        """An uninitialized array on the board."""
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        shape = tuple(int(s) for s in shape)
        name = np.dtype(dtype).name
        dev = device or self.cpu(0)
        handle = self._request("array", {"dtype": name, "shape": list(shape),
                                         "device": _device_spec(dev)}).meta["handle"]
        return RemoteNDArray(self, handle, shape, name, self._as_remote(dev))

    def _check_array_size(self, nbytes: int, shape, dtype: str) -> None:
        limit = self.limits.get("max_array")
        if limit is not None and nbytes > limit:
            raise ValueError(f"an array of shape {tuple(shape)} and dtype {dtype} is {nbytes} "
                             f"bytes; the server accepts arrays of at most {limit}")

    def _as_remote(self, dev) -> RemoteDevice:
        return dev if isinstance(dev, RemoteDevice) else RemoteDevice(self, dev.kind, dev.index)

    # -- plugins --------------------------------------------------------------------------------
    def call_plugin(self, op: str, /, *, arrays: Sequence = (), timeout: float | None = None,
                    **args) -> PluginReply:
        """Run the plugin operation ``op`` on the board (see ``rpc.worker.register_op``).

        Parameters
        ----------
        op : str
            The operation, ``"<plugin>.<op>"``; the server must have been started with the
            plugin (``python -m tilecraft.rpc.server --plugin MODULE``).
        arrays : sequence
            Input arrays: ``RemoteNDArray`` of this session (passed by handle) or anything
            ``np.asarray`` takes (sent with the request).
        timeout : float, optional
            Time limit of the operation on the board (default ``call_timeout``); past it the
            board kills the session process (``SessionLost``).
        **args
            The operation's JSON arguments.

        Returns a ``PluginReply``: ``.meta`` (the operation's JSON answer) and ``.arrays``
        (numpy arrays it sent back). A plugin typically wraps this in a typed client API
        (``relax.rpc_plugin.RemoteVirtualMachine``).

        Examples
        --------
        >>> reply = sess.call_plugin("example.scale", factor=2.0,
        ...                          arrays=[np.ones(3, "float32")])     # doctest: +SKIP
        >>> reply.arrays[0]                                            # doctest: +SKIP
        array([2., 2., 2.], dtype=float32)
        """
        if not isinstance(op, str) or "." not in op:
            raise ValueError(f"call_plugin: {op!r} is not a plugin operation name "
                             f"('<plugin>.<op>')")
        if self.plugins is not None and op not in self.plugins:
            raise ValueError(f"the server at {self.address[0]}:{self.address[1]} has no "
                             f"operation {op!r}: start it with --plugin MODULE, the module "
                             f"that registers it (it has: {', '.join(self.plugins) or 'none'})")
        specs, blobs = [], []
        nbytes = 0
        for i, a in enumerate(arrays):
            if isinstance(a, RemoteNDArray):
                if a.session is not self:
                    raise ValueError(f"{op}: array {i} belongs to another session")
                specs.append({"handle": a.handle})
                continue
            arr = a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray) else a
            arr = np.asarray(arr)
            self._check_array_size(arr.nbytes, arr.shape, arr.dtype.name)
            meta, blob = encode_array(arr)
            specs.append(meta)
            blobs.append(blob)
            nbytes += blob.nbytes
        if len(blobs) > MAX_BLOBS:
            raise ValueError(f"{op}: {len(blobs)} arrays sent with one request; at most "
                             f"{MAX_BLOBS}: copy the others to the board first with sess.array")
        t = self.call_timeout if timeout is None else float(timeout)
        frame = self._request(op, {"args": args, "arrays": specs, "timeout": t}, blobs,
                              timeout=t + _CALL_MARGIN + nbytes / 1e6, what=op)
        metas = frame.meta.get("arrays", [])
        if not isinstance(metas, list) or len(metas) != len(frame.blobs):
            raise ProtocolError(f"{op}: the reply describes {len(metas)} arrays and carries "
                                f"{len(frame.blobs)} blobs")
        out = [decode_array(m, b, self.max_frame).copy() for m, b in zip(metas, frame.blobs)]
        meta = {k: v for k, v in frame.meta.items() if k != "arrays"}
        return PluginReply(meta, out)

    def release(self, handle: int) -> None:
        """Free an object a plugin keeps on the board (``OpContext.put``), with the next
        request; a plugin's client half calls it when its proxy object is dropped."""
        self._release(int(handle))

    def remote_array(self, desc: dict) -> RemoteNDArray:
        """The ``RemoteNDArray`` of an array a plugin kept on the board (the description its
        handler made with ``OpContext.put_array``: ``{"handle", "dtype", "shape", "device"}``).
        It is freed on the board when dropped here, like any remote array."""
        try:
            kind, index = desc.get("device", ["cpu", 0])
            return RemoteNDArray(self, int(desc["handle"]), tuple(int(s) for s in desc["shape"]),
                                 str(desc["dtype"]), RemoteDevice(self, kind, int(index)))
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise ProtocolError(f"malformed remote array description {desc!r}: {err}") from None

    def close(self) -> None:
        """End the session: the board drops its objects and files. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            try:
                self._request("close", timeout=min(self.timeout, 5.0))
            except RPCError:
                pass
            self._abandon()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if not getattr(self, "_closed", True):
            self._abandon()

    def __repr__(self):
        state = "closed" if self._closed else "open"
        return (f"<rpc.Session {self.key!r} at {self.address[0]}:{self.address[1]} "
                f"({self.platform.get('machine', '?')}, {state})>")


def connect(host: str, port: int, token=None, *, timeout: float = 30.0,
            call_timeout: float = 60.0, ticket: str | None = None,
            key: str | None = None) -> Session:
    """Open a session on the RPC server at ``host:port``.

    Parameters
    ----------
    host, port : str, int
    token : str or bytes, optional
        The server's shared secret, if it requires one (``--token-file``). It is never sent:
        the client proves it holds it, the server proves it back, and the session's frames
        are authenticated with keys derived from it. With a token, a server that does not
        authenticate is refused before anything is sent to it.
    timeout : float
        Seconds to wait for the connection, the handshake and each ordinary reply.
    call_timeout : float
        Default time limit of kernel calls and timing runs (``Session.call_timeout``).
    ticket : str, optional
        A tracker lease (``TrackerClient.request`` passes it).
    key : str, optional
        The device key the server must have (``TrackerClient.request`` passes the one asked
        for); ``ProtocolError`` otherwise.

    Raises
    ------
    AuthenticationError, ServerBusy, ProtocolError, ConnectionError, RPCTimeoutError

    Examples
    --------
    >>> with rpc.connect("192.168.1.23", 9090, token=open("token").read()) as sess:   # doctest: +SKIP
    ...     print(sess.info()["machine"])
    aarch64
    """
    token = as_token(token)
    deadline = time.monotonic() + timeout
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        channel, welcome, hello, _ = client_handshake(
            sock, token, server="tilecraft-rpc", auth={"ticket": ticket}, timeout=timeout,
            deadline=deadline, where=f"the server at {host}:{port}", remote_error=_remote_error)
        if key is not None and (hello.get("key") != key or welcome.get("key") != key):
            raise ProtocolError(f"the server at {host}:{port} serves key {hello.get('key')!r}, "
                                f"not {key!r}")
        return Session(channel, welcome, timeout, call_timeout, (host, port))
    except BaseException:
        sock.close()
        raise


class TrackerClient:
    """A connection point to a tracker: ``rpc.connect_tracker(host, port, token=...)``.

    ``token`` is the tracker's own secret (its ``--token-file``), not the boards'."""

    def __init__(self, host: str, port: int, timeout: float = 10.0, token=None):
        self.host, self.port = host, int(port)
        self.timeout = float(timeout)
        self.token = as_token(token)

    def _ask(self, meta: dict, wait: float):
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            channel, _, _, _ = client_handshake(
                sock, self.token, server="tilecraft-tracker", auth={"role": "client"},
                timeout=self.timeout, where=f"the tracker at {self.host}:{self.port}",
                remote_error=self._refusal)
            channel.send(REQUEST, meta, timeout=self.timeout)
            frame = channel.recv(timeout=self.timeout, idle_timeout=wait, expect=[REPLY],
                                 max_frame=16 << 20)
        finally:
            sock.close()
        if frame.type == ERROR:
            raise self._refusal(frame.meta)
        return frame.meta

    def _refusal(self, meta: dict) -> RPCError:
        kind, message = meta.get("type"), meta.get("message", "")
        if kind == "AuthenticationError":
            return AuthenticationError(f"tracker {self.host}:{self.port}: {message}")
        if kind == "TimeoutError":
            return TrackerError(f"tracker {self.host}:{self.port}: {message}")
        return TrackerError(f"tracker {self.host}:{self.port} refused the request: {kind}: "
                            f"{message}")

    def summary(self) -> dict:
        """The tracker's servers and queues (see ``rpc.tracker.Tracker.summary``)."""
        return self._ask({"op": "summary"}, self.timeout)

    def request(self, key: str, timeout: float = 60.0, priority: int = 0, token=None, *,
                session_timeout: float = 30.0, call_timeout: float = 60.0) -> Session:
        """Wait (up to ``timeout`` seconds) for a free server of ``key`` and open a session.

        Higher ``priority`` requests are served first; equal ones in arrival order. ``token``
        is the boards' secret if they require one (the tracker's own is the
        ``TrackerClient``'s). The session is bound to the board the tracker matched: the board
        accepts the lease's ticket only if the tracker gave it that ticket, and must serve
        ``key``. The server returns to the pool when the session is closed.

        Examples
        --------
        >>> tracker = rpc.connect_tracker("127.0.0.1", 9190, token=tracker_token)   # doctest: +SKIP
        >>> sess = tracker.request("rasp4", timeout=30, token=board_token)          # doctest: +SKIP
        """
        deadline = time.monotonic() + float(timeout)
        last = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TrackerError(f"no session for key {key!r} within {timeout:g} s"
                                   + (f" (last attempt: {last})" if last else ""))
            lease = self._ask({"op": "request", "key": key, "priority": int(priority),
                               "timeout": left}, left + self.timeout)
            try:
                host, port, ticket = lease["host"], lease["port"], lease["ticket"]
            except (KeyError, TypeError):
                raise ProtocolError(f"tracker {self.host}:{self.port}: malformed lease "
                                    f"{lease!r}") from None
            try:
                return connect(host, port, token, timeout=session_timeout,
                               call_timeout=call_timeout, ticket=ticket, key=key)
            except (ServerBusy, ConnectionError, RPCTimeoutError, ProtocolError,
                    RemoteError) as err:
                last = err  # a server that died or filled up meanwhile: ask again
                time.sleep(0.05)

    def __repr__(self):
        return f"<rpc.TrackerClient {self.host}:{self.port}>"


def connect_tracker(host: str, port: int, timeout: float = 10.0, token=None) -> TrackerClient:
    """A handle on the tracker at ``host:port`` (connects per request).

    ``token`` is the tracker's secret (its ``--token-file``), if it has one: every request is
    then authenticated both ways, as sessions on boards are.

    Examples
    --------
    >>> tracker = rpc.connect_tracker("127.0.0.1", 9190, token=open("tracker-token").read())
    ... # doctest: +SKIP
    >>> tracker.summary()["queue_info"]                       # doctest: +SKIP
    {'rasp4': {'free': 1, 'pending': 0, 'total': 1}}
    """
    return TrackerClient(host, port, timeout, token)
