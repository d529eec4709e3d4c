"""The tilecraft RPC wire protocol: versioned, length-prefixed binary frames.

Every message is one frame::

    header   12 bytes  magic b"TCRP" | version u8 | type u8 | flags u16 (0) | length u32
    payload  length bytes:
             meta length u32 | blob count u16 | blob count x (blob length u64)
             | meta: a JSON object (UTF-8) | the blobs, back to back

All integers are big-endian. ``meta`` carries small metadata (an operation name, handles,
shapes); blobs carry bulk data (a library, the raw bytes of an array) without any encoding.
Nothing is ever unpickled or evaluated: a frame is JSON and bytes, checked against explicit
limits (frame size, meta size, blob count) before anything is allocated, and every read has a
timeout, so a peer that sends junk, an absurd length or half a frame cannot hang or exhaust
the other side.

Arrays travel as ``{"dtype": "float32", "shape": [2, 3]}`` plus one blob holding the C-order,
little-endian element bytes (:func:`encode_array` / :func:`decode_array`).

This module needs only the standard library and numpy (it runs on the board).

Examples
--------
>>> import socket
>>> a, b = socket.socketpair()
>>> send_frame(a, REQUEST, {"op": "info"})
>>> frame = recv_frame(b, timeout=1.0)
>>> frame.type == REQUEST, frame.meta
(True, {'op': 'info'})
"""
from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any, Sequence

import numpy as np

from tilecraft.errors import TilecraftError

MAGIC = b"TCRP"
VERSION = 1
HEADER = struct.Struct("!4sBBHI")
HEADER_SIZE = HEADER.size           # 12
PAYLOAD_HEAD = struct.Struct("!IH")  # meta length, blob count
BLOB_LEN = struct.Struct("!Q")

# Frame types. Sessions: HELLO (server) -> AUTH (client) -> WELCOME (server), then REQUEST ->
# REPLY | ERROR pairs. PING / PONG are liveness checks; EVENT is a one-way notice (tracker
# <-> server: leases granted, sessions started and ended).
HELLO, AUTH, WELCOME, REQUEST, REPLY, ERROR, PING, PONG, EVENT = range(1, 10)
TYPE_NAMES = {HELLO: "HELLO", AUTH: "AUTH", WELCOME: "WELCOME", REQUEST: "REQUEST",
              REPLY: "REPLY", ERROR: "ERROR", PING: "PING", PONG: "PONG", EVENT: "EVENT"}

# Default limits. A frame must fit in memory on a small board, so the default cap is modest;
# servers and clients can raise it.
DEFAULT_MAX_FRAME = 512 << 20       # 512 MiB
MAX_META = 1 << 20                  # 1 MiB of JSON is far more than any request needs
MAX_BLOBS = 64
MAX_NDIM = 32
# Below this many bytes a frame is joined into one send: one TCP segment, no Nagle delay.
_JOIN_BELOW = 1 << 16

ARRAY_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                "uint64", "float16", "float32", "float64")


class RPCError(TilecraftError, RuntimeError):
    """Base class of everything the rpc package raises about the link or the remote side."""


class ProtocolError(RPCError):
    """A malformed, oversized or unexpected frame; the connection cannot be trusted after it."""


class ConnectionClosed(RPCError, ConnectionError):
    """The peer closed the connection (cleanly, between frames, or in the middle of one)."""


class RPCTimeoutError(RPCError, TimeoutError):
    """A read or write did not complete within its timeout."""


class IdleTimeout(RPCTimeoutError):
    """No frame began within the idle timeout (nothing of it was received)."""


class Frame:
    """A received frame: ``type`` (an int, e.g. ``REQUEST``), ``meta`` (dict), ``blobs``."""

    __slots__ = ("type", "meta", "blobs")

    def __init__(self, type: int, meta: dict, blobs: list):
        self.type = type
        self.meta = meta
        self.blobs = blobs

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type, str(self.type))

    def __repr__(self):
        sizes = [len(b) for b in self.blobs]
        return f"Frame({self.type_name}, {self.meta!r}, blobs={sizes})"


# -- encoding ------------------------------------------------------------------------------------
def _as_bytes_like(blob) -> memoryview:
    if isinstance(blob, np.ndarray):
        if not blob.flags.c_contiguous:
            blob = np.ascontiguousarray(blob)
        return memoryview(blob).cast("B") if blob.size else memoryview(b"")
    return memoryview(blob).cast("B")


def encode_frame(ftype: int, meta: dict | None = None, blobs: Sequence = ()) -> list:
    """The pieces of one frame (small ones joined): ``b"".join(pieces)`` is the frame.

    Blobs may be ``bytes``, ``bytearray``, ``memoryview`` or a contiguous numpy array; they are
    not copied when large.
    """
    if ftype not in TYPE_NAMES:
        raise ValueError(f"unknown frame type {ftype}")
    meta_bytes = json.dumps(meta or {}, separators=(",", ":")).encode("utf-8")
    if len(meta_bytes) > MAX_META:
        raise ValueError(f"frame metadata is {len(meta_bytes)} bytes; the limit is {MAX_META}")
    views = [_as_bytes_like(b) for b in blobs]
    if len(views) > MAX_BLOBS:
        raise ValueError(f"a frame carries at most {MAX_BLOBS} blobs, got {len(views)}")
    head = [PAYLOAD_HEAD.pack(len(meta_bytes), len(views))]
    head.extend(BLOB_LEN.pack(v.nbytes) for v in views)
    head.append(meta_bytes)
    length = sum(len(h) for h in head) + sum(v.nbytes for v in views)
    if length > 0xFFFFFFFF:
        raise ValueError(f"frame of {length} bytes does not fit the 32-bit length field")
    prefix = HEADER.pack(MAGIC, VERSION, ftype, 0, length) + b"".join(head)
    if length < _JOIN_BELOW:
        return [prefix + b"".join(bytes(v) for v in views)]
    return [prefix] + [v for v in views if v.nbytes]


def send_frame(sock: socket.socket, ftype: int, meta: dict | None = None, blobs: Sequence = (),
               timeout: float | None = 30.0) -> None:
    """Send one frame; ``timeout`` bounds each write (``RPCTimeoutError`` past it)."""
    pieces = encode_frame(ftype, meta, blobs)
    sock.settimeout(timeout)
    try:
        for piece in pieces:
            sock.sendall(piece)
    except socket.timeout:
        raise RPCTimeoutError(f"sending a {TYPE_NAMES[ftype]} frame timed out after {timeout} s") \
            from None
    except (BrokenPipeError, ConnectionResetError) as err:
        raise ConnectionClosed(f"connection lost while sending a {TYPE_NAMES[ftype]} frame: "
                               f"{err}") from None


# -- decoding ------------------------------------------------------------------------------------
_NOT_IDLE = object()


def _recv_exact(sock: socket.socket, n: int, timeout: float | None, what: str,
                deadline: float | None = None, idle_timeout=_NOT_IDLE):
    """Read exactly ``n`` bytes. ``timeout`` bounds each wait for more data (a trickling peer
    is tolerated only while it makes progress); ``deadline`` (time.monotonic) bounds the whole.
    With ``idle_timeout``, the wait for the first byte uses it and a timeout then raises
    ``IdleTimeout`` (and a clean close before any byte ``ConnectionClosed`` without fuss)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    idle = idle_timeout is not _NOT_IDLE
    while got < n:
        wait = idle_timeout if idle and got == 0 else timeout
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RPCTimeoutError(f"timed out reading {what} ({got} of {n} bytes received)")
            wait = left if wait is None else min(wait, left)
        sock.settimeout(wait)
        try:
            k = sock.recv_into(view[got:], min(n - got, 1 << 22))
        except socket.timeout:
            if idle and got == 0:
                raise IdleTimeout(f"no frame within {wait:.3g} s") from None
            raise RPCTimeoutError(f"timed out after {wait:.3g} s reading {what} ({got} of {n} "
                                  f"bytes received)") from None
        except (ConnectionResetError, BrokenPipeError) as err:
            raise ConnectionClosed(f"connection lost reading {what}: {err}") from None
        if k == 0:
            if idle and got == 0:
                raise ConnectionClosed("the peer closed the connection")
            raise ConnectionClosed(f"the peer closed the connection in the middle of {what} "
                                   f"({got} of {n} bytes received)")
        got += k
    return buf


def parse_header(data: bytes, max_frame: int = DEFAULT_MAX_FRAME) -> tuple[int, int]:
    """Check a 12-byte header; return ``(type, payload length)`` or raise ``ProtocolError``."""
    magic, version, ftype, flags, length = HEADER.unpack(bytes(data))
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {bytes(magic)!r} (expected {MAGIC!r}): the peer does "
                            f"not speak the tilecraft RPC protocol")
    if version != VERSION:
        raise ProtocolError(f"peer speaks RPC protocol version {version}; this side speaks "
                            f"version {VERSION}")
    if ftype not in TYPE_NAMES:
        raise ProtocolError(f"unknown frame type {ftype}")
    if flags != 0:
        raise ProtocolError(f"frame flags must be 0, got {flags:#x}")
    if length > max_frame:
        raise ProtocolError(f"frame of {length} bytes exceeds the {max_frame}-byte limit")
    if length < PAYLOAD_HEAD.size:
        raise ProtocolError(f"frame of {length} bytes is shorter than its payload header")
    return ftype, length


def parse_payload(ftype: int, payload) -> Frame:
    """Split a payload into meta and blobs, checking every length against the payload size."""
    view = memoryview(payload)
    meta_len, nblobs = PAYLOAD_HEAD.unpack_from(view, 0)
    if nblobs > MAX_BLOBS:
        raise ProtocolError(f"frame declares {nblobs} blobs; the limit is {MAX_BLOBS}")
    if meta_len > MAX_META:
        raise ProtocolError(f"frame metadata of {meta_len} bytes exceeds the {MAX_META}-byte "
                            f"limit")
    pos = PAYLOAD_HEAD.size
    if pos + BLOB_LEN.size * nblobs > len(payload):
        raise ProtocolError("frame is too short for its blob table")
    sizes = [BLOB_LEN.unpack_from(view, pos + BLOB_LEN.size * i)[0] for i in range(nblobs)]
    pos += BLOB_LEN.size * nblobs
    if pos + meta_len + sum(sizes) != len(payload):
        raise ProtocolError(f"frame lengths do not add up: payload {len(payload)} bytes, meta "
                            f"{meta_len}, blobs {sizes}")
    try:
        meta = json.loads(bytes(view[pos:pos + meta_len]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ProtocolError(f"frame metadata is not valid JSON: {err}") from None
    if not isinstance(meta, dict):
        raise ProtocolError(f"frame metadata must be a JSON object, got {type(meta).__name__}")
    pos += meta_len
    blobs = []
    for size in sizes:
        blobs.append(view[pos:pos + size])
        pos += size
    return Frame(ftype, meta, blobs)


def recv_frame(sock: socket.socket, timeout: float | None = 30.0,
               max_frame: int = DEFAULT_MAX_FRAME, idle_timeout: float | None = -1.0,
               expect: Sequence[int] | None = None, deadline: float | None = None) -> Frame:
    """Receive one frame.

    Parameters
    ----------
    sock : socket.socket
    timeout : float or None
        Longest wait for each piece of data once a frame has begun (``None``: no limit).
    max_frame : int
        Frames whose declared length exceeds this are refused before anything is allocated.
    idle_timeout : float or None
        Longest wait for the first byte of the header (default: ``timeout``).
    expect : sequence of int, optional
        Frame types acceptable here; any other raises ``ProtocolError`` (an ``ERROR`` frame is
        always returned so the caller can report it).
    deadline : float, optional
        A ``time.monotonic()`` instant by which the whole frame must have arrived.

    Raises
    ------
    ProtocolError, ConnectionClosed, RPCTimeoutError (``IdleTimeout`` if no frame began)
    """
    if idle_timeout == -1.0:
        idle_timeout = timeout
    head = _recv_exact(sock, HEADER_SIZE, timeout, "a frame header", deadline, idle_timeout)
    ftype, length = parse_header(head, max_frame)
    payload = _recv_exact(sock, length, timeout, f"a {TYPE_NAMES[ftype]} frame of {length} bytes",
                          deadline)
    frame = parse_payload(ftype, payload)
    if expect is not None and frame.type not in expect and frame.type != ERROR:
        want = "/".join(TYPE_NAMES[t] for t in expect)
        raise ProtocolError(f"expected a {want} frame, got {frame.type_name}")
    return frame


# -- arrays --------------------------------------------------------------------------------------
def encode_array(arr: np.ndarray) -> tuple[dict, np.ndarray]:
    """``(meta, blob)`` for an array: its dtype name, shape and C-order little-endian bytes."""
    arr = np.asarray(arr)
    name = arr.dtype.name
    if name not in ARRAY_DTYPES:
        raise ValueError(f"arrays of dtype {name} cannot be sent; supported: "
                         f"{', '.join(ARRAY_DTYPES)}")
    wire = arr.dtype.newbyteorder("<") if arr.dtype.itemsize > 1 else arr.dtype
    blob = np.ascontiguousarray(arr, dtype=wire)
    return {"dtype": name, "shape": [int(s) for s in arr.shape]}, blob


def check_array_meta(meta: Any, max_bytes: int) -> tuple[str, tuple, int]:
    """Validate ``{"dtype", "shape"}`` metadata; return (dtype, shape, nbytes)."""
    if not isinstance(meta, dict):
        raise ValueError(f"array description must be an object, got {type(meta).__name__}")
    dtype, shape = meta.get("dtype"), meta.get("shape")
    if dtype not in ARRAY_DTYPES:
        raise ValueError(f"array dtype {dtype!r} is not supported; supported: "
                            f"{', '.join(ARRAY_DTYPES)}")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM or \
            not all(type(s) is int and s >= 0 for s in shape):
        raise ValueError(f"array shape must be a list of at most {MAX_NDIM} non-negative "
                            f"integers, got {shape!r}")
    nbytes = np.dtype(dtype).itemsize
    for s in shape:
        nbytes *= s
        if nbytes > max_bytes:
            break
    if nbytes > max_bytes:
        raise ValueError(f"array of shape {tuple(shape)} and dtype {dtype} exceeds the "
                         f"{max_bytes}-byte array limit")
    return dtype, tuple(shape), nbytes


def decode_array(meta: dict, blob, max_bytes: int = DEFAULT_MAX_FRAME) -> np.ndarray:
    """The numpy array (native byte order, read-only view of ``blob`` when possible)."""
    dtype, shape, nbytes = check_array_meta(meta, max_bytes)
    if len(blob) != nbytes:
        raise ValueError(f"array of shape {shape} and dtype {dtype} needs {nbytes} bytes, the "
                            f"frame carries {len(blob)}")
    wire = np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).itemsize > 1 else np.dtype(dtype)
    arr = np.frombuffer(blob, dtype=wire).reshape(shape)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr


def error_meta(err: BaseException) -> dict:
    """The metadata of an ERROR frame describing an exception.

    ``bases`` names the built-in exception classes the exception derives from (for a library's
    ``VMArgumentError(ValueError, TypeError)``: ``["ValueError", "TypeError"]``), so that the
    client can raise something that ``except ValueError`` catches, as it would locally.

    Examples
    --------
    >>> error_meta(ValueError("bad shape"))
    {'type': 'ValueError', 'message': 'bad shape', 'bases': []}
    """
    msg = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    bases = [c.__name__ for c in type(err).__mro__[1:]
             if c.__module__ == "builtins" and c not in (Exception, BaseException, object)]
    return {"type": type(err).__name__, "message": str(msg), "bases": bases}
