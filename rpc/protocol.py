"""The tilecraft RPC wire protocol: versioned, length-prefixed binary frames, authenticated
once a session has a key.

Every message is one frame::

    header   12 bytes  magic b"TCRP" | version u8 | type u8 | flags u16 | length u32
    payload  length bytes:
             meta length u32 | blob count u16 | blob count x (blob length u64)
             | meta: a JSON object (UTF-8) | the blobs, back to back
    trailer  40 bytes, only with flags & FLAG_MAC:
             sequence number u64 | HMAC-SHA256(key, header | payload | sequence number)

All integers are big-endian. ``meta`` carries small metadata (an operation name, handles,
shapes); blobs carry bulk data (a library, the raw bytes of an array) without any encoding.
Nothing is ever unpickled or evaluated: a frame is JSON and bytes, checked against explicit
limits (frame size, meta size and nesting depth, blob count) before anything is allocated or
decoded, and every read has a timeout, so a peer that sends junk, an absurd length, a JSON bomb
or half a frame cannot hang, crash or exhaust the other side.

After an authenticated handshake (``rpc.auth``) each direction of a connection has its own key
(:class:`FrameMAC`), and every frame carries the trailer: a sequence number that counts the
frames of that direction from 0, and a MAC over the frame and that number. The receiver checks
the MAC *before* it decodes anything and refuses a frame that fails it (forged or altered), one
whose number is not the next (replayed, reordered or dropped) and one without a trailer
(injected): the connection cannot be trusted after any of them, and is ended.
:class:`Channel` holds a socket and its two keys.

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
>>> k1, k2 = b"1" * 32, b"2" * 32                  # session keys (rpc.auth derives them)
>>> Channel(a, FrameMAC(k1), FrameMAC(k2)).send(REQUEST, {"op": "info"})
>>> Channel(b, FrameMAC(k2), FrameMAC(k1)).recv(timeout=1.0).meta
{'op': 'info'}
"""
from __future__ import annotations

import hashlib
import hmac
import json
import queue
import re
import socket
import struct
import threading
import time
from typing import Any, Sequence

import numpy as np

MAGIC = b"TCRP"
# 2: authenticated handshakes bind both nonces, and frames after them carry a MAC trailer
VERSION = 2
HEADER = struct.Struct("!4sBBHI")
HEADER_SIZE = HEADER.size           # 12
PAYLOAD_HEAD = struct.Struct("!IH")  # meta length, blob count
BLOB_LEN = struct.Struct("!Q")
FLAG_MAC = 0x0001                   # a MAC trailer follows the payload
SEQ = struct.Struct("!Q")
MAC_SIZE = 32                       # HMAC-SHA256
TRAILER_SIZE = SEQ.size + MAC_SIZE  # 40

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
MAX_META_DEPTH = 32                 # requests nest 4 deep; json.loads recurses once per level
MAX_NUMBER_DIGITS = 100             # str -> int is quadratic on Pythons before 3.11
MAX_BLOBS = 64
MAX_NDIM = 32
# Below this many bytes a frame is joined into one send: one TCP segment, no Nagle delay.
_JOIN_BELOW = 1 << 16
# Large frames are read and written in pieces of this size.
_CHUNK = 1 << 22
# From this size on a frame's MAC is computed by a helper thread while the frame is sent or
# received (hashlib releases the GIL), so hashing overlaps with the copying.
_HASH_IN_THREAD = 1 << 20

ARRAY_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                "uint64", "float16", "float32", "float64")


class RPCError(RuntimeError):
    """Base class of everything the rpc package raises about the link or the remote side."""


class ProtocolError(RPCError):
    """A malformed, oversized or unexpected frame; the connection cannot be trusted after it."""


class FrameAuthError(ProtocolError):
    """A frame of an authenticated connection failed its MAC, came out of sequence or came
    without one: forged, altered, injected, replayed or reordered."""


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


class FrameMAC:
    """One direction of an authenticated connection: its key and the next sequence number.

    ``tag(header, payload pieces, seq)`` is ``HMAC-SHA256(key, header | payload | seq u64)``.
    A session has two, one per direction, with keys derived in the handshake (``rpc.auth``), so
    a frame cannot be reflected back to its sender nor moved to another session.

    Examples
    --------
    >>> mac = FrameMAC(b"k" * 32)
    >>> len(mac.tag(b"header" * 2, [b"payload"], 0)), mac.seq
    (32, 0)
    """

    __slots__ = ("key", "seq", "_base", "_spare")

    def __init__(self, key: bytes, seq: int = 0):
        if not isinstance(key, (bytes, bytearray)) or len(key) < 16:
            raise ValueError("a frame key must be at least 16 bytes")
        self.key = bytes(key)
        self.seq = int(seq)
        self._base = hmac.new(self.key, digestmod=hashlib.sha256)
        self._spare = None

    def hasher(self):
        """A fresh HMAC of this key (copying a keyed one is cheaper than keying anew)."""
        h, self._spare = self._spare, None
        return h if h is not None else self._base.copy()

    def prepare(self) -> None:
        """Make the next frame's HMAC now, while waiting for the peer, so that a request and
        its reply do not wait for it."""
        if self._spare is None:
            self._spare = self._base.copy()

    def tag(self, header, pieces, seq: int) -> bytes:
        h = self._base.copy()
        h.update(header)
        for p in pieces:
            h.update(p)
        h.update(SEQ.pack(seq))
        return h.digest()


class _Hasher:
    """Feeds one HMAC with the pieces of a frame, in order: inline for a small frame, in a
    helper thread for a large one, so that hashing overlaps with the socket copies."""

    __slots__ = ("h", "_queue", "_thread", "_error")

    def __init__(self, h, nbytes: int):
        self.h = h
        self._queue = self._thread = self._error = None
        if nbytes >= _HASH_IN_THREAD:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._run, name="rpc-frame-mac", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while (piece := self._queue.get()) is not None:
            try:
                self.h.update(piece)
            except BaseException as err:  # noqa: BLE001 - reported by digest()
                self._error = err

    def update(self, piece) -> None:
        if self._queue is None:
            self.h.update(piece)
        else:
            self._queue.put(piece)

    def digest(self) -> bytes:
        self.close()
        if self._error is not None:
            raise self._error
        return self.h.digest()

    def close(self) -> None:
        """Wait for the helper thread (if any) to have hashed everything it was given."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


# -- encoding ------------------------------------------------------------------------------------
def _as_bytes_like(blob) -> memoryview:
    if isinstance(blob, np.ndarray):
        if not blob.flags.c_contiguous:
            blob = np.ascontiguousarray(blob)
        return memoryview(blob).cast("B") if blob.size else memoryview(b"")
    return memoryview(blob).cast("B")


def _encode(ftype: int, meta: dict | None, blobs: Sequence, flags: int):
    """``(prefix, views)``: the header and payload head (meta included), and the blobs."""
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
    prefix = HEADER.pack(MAGIC, VERSION, ftype, flags, length) + b"".join(head)
    return prefix, views, length


def encode_frame(ftype: int, meta: dict | None = None, blobs: Sequence = ()) -> list:
    """The pieces of one plain frame (small ones joined): ``b"".join(pieces)`` is the frame.

    Blobs may be ``bytes``, ``bytearray``, ``memoryview`` or a contiguous numpy array; they are
    not copied when large.
    """
    prefix, views, length = _encode(ftype, meta, blobs, 0)
    if length < _JOIN_BELOW:
        return [prefix + b"".join(bytes(v) for v in views)]
    return [prefix] + [v for v in views if v.nbytes]


def send_frame(sock: socket.socket, ftype: int, meta: dict | None = None, blobs: Sequence = (),
               timeout: float | None = 30.0, mac: FrameMAC | None = None) -> None:
    """Send one frame; ``timeout`` bounds each write (``RPCTimeoutError`` past it).

    With ``mac``, the frame carries the trailer (``mac.seq``, then the MAC) and ``mac.seq``
    advances.
    """
    sock.settimeout(timeout)
    try:
        if mac is None:
            for piece in encode_frame(ftype, meta, blobs):
                sock.sendall(piece)
            return
        prefix, views, length = _encode(ftype, meta, blobs, FLAG_MAC)
        seq = SEQ.pack(mac.seq)
        if length < _JOIN_BELOW:
            frame = prefix + b"".join(bytes(v) for v in views) if views else prefix
            h = mac.hasher()
            h.update(frame)
            h.update(seq)
            sock.sendall(b"".join((frame, seq, h.digest())))
        else:
            # each piece is hashed (by a helper thread) while it is being sent
            h = _Hasher(mac.hasher(), length)
            try:
                h.update(prefix)
                sock.sendall(prefix)
                for v in views:
                    for pos in range(0, v.nbytes, _CHUNK):
                        piece = v[pos:pos + _CHUNK]
                        h.update(piece)
                        sock.sendall(piece)
                h.update(seq)
                tag = h.digest()
            finally:
                h.close()
            sock.sendall(seq + tag)
        mac.seq += 1
        mac.prepare()
    except socket.timeout:
        raise RPCTimeoutError(f"sending a {TYPE_NAMES[ftype]} frame timed out after {timeout} s") \
            from None
    except (BrokenPipeError, ConnectionResetError) as err:
        raise ConnectionClosed(f"connection lost while sending a {TYPE_NAMES[ftype]} frame: "
                               f"{err}") from None


# -- decoding ------------------------------------------------------------------------------------
_NOT_IDLE = object()


def _recv_exact(sock: socket.socket, n: int, timeout: float | None, what: str,
                deadline: float | None = None, idle_timeout=_NOT_IDLE, hasher=None):
    """Read exactly ``n`` bytes. ``timeout`` bounds each wait for more data (a trickling peer
    is tolerated only while it makes progress); ``deadline`` (time.monotonic) bounds the whole.
    With ``idle_timeout``, the wait for the first byte uses it and a timeout then raises
    ``IdleTimeout`` (and a clean close before any byte ``ConnectionClosed`` without fuss).
    ``hasher`` (an HMAC) is fed the bytes as they arrive.

    Large buffers are ``numpy.empty``: their pages are committed as the bytes arrive, so a peer
    that declares a large frame and sends little costs little memory."""
    buf = bytearray(n) if n < (1 << 20) else np.empty(n, np.uint8)
    view = memoryview(buf).cast("B")
    got = hashed = 0
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
            k = sock.recv_into(view[got:], min(n - got, _CHUNK))
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
        if hasher is not None and (got - hashed >= _HASH_IN_THREAD or got == n):
            hasher.update(view[hashed:got])
            hashed = got
    return buf


def parse_header(data: bytes, max_frame: int = DEFAULT_MAX_FRAME) -> tuple[int, int, int]:
    """Check a 12-byte header; return ``(type, payload length, flags)`` or raise
    ``ProtocolError``."""
    magic, version, ftype, flags, length = HEADER.unpack(bytes(data))
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {bytes(magic)!r} (expected {MAGIC!r}): the peer does "
                            f"not speak the tilecraft RPC protocol")
    if version != VERSION:
        raise ProtocolError(f"peer speaks RPC protocol version {version}; this side speaks "
                            f"version {VERSION}")
    if ftype not in TYPE_NAMES:
        raise ProtocolError(f"unknown frame type {ftype}")
    if flags & ~FLAG_MAC:
        raise ProtocolError(f"unknown frame flags {flags:#x}")
    if length > max_frame:
        raise ProtocolError(f"frame of {length} bytes exceeds the {max_frame}-byte limit")
    if length < PAYLOAD_HEAD.size:
        raise ProtocolError(f"frame of {length} bytes is shorter than its payload header")
    return ftype, length, flags


# strings, with their escapes: what is left is the structure (strings cannot nest)
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_LONG_NUMBER = re.compile(rb"[0-9]{%d}" % (MAX_NUMBER_DIGITS + 1))


def check_meta(raw: bytes, max_depth: int = MAX_META_DEPTH) -> None:
    """Refuse (``ProtocolError``) frame metadata nested deeper than ``max_depth`` or holding a
    number of more than ``MAX_NUMBER_DIGITS`` digits, before ``json.loads`` sees it: deep
    nesting makes the decoder recurse (``RecursionError``), long numbers make it spin.

    Examples
    --------
    >>> check_meta(b'{"a": [[1, 2], {"b": "[[[["}]}')
    >>> check_meta(b"[" * 1000)
    Traceback (most recent call last):
    ...
    rpc.protocol.ProtocolError: frame metadata nests 1000 levels deep; the limit is 32
    """
    skeleton = _JSON_STRING.sub(b'""', raw)
    opens = skeleton.count(b"[") + skeleton.count(b"{")
    if opens > max_depth:   # enough brackets to be too deep: measure the depth
        a = np.frombuffer(skeleton, np.uint8)
        step = ((a == 0x5B) | (a == 0x7B)).astype(np.int32) - ((a == 0x5D) | (a == 0x7D))
        depth = int(np.cumsum(step).max())
        if depth > max_depth:
            raise ProtocolError(f"frame metadata nests {depth} levels deep; the limit is "
                                f"{max_depth}")
    if _LONG_NUMBER.search(skeleton):
        raise ProtocolError(f"frame metadata holds a number of more than {MAX_NUMBER_DIGITS} "
                            f"digits")


def parse_payload(ftype: int, payload) -> Frame:
    """Split a payload into meta and blobs, checking every length against the payload size,
    and the metadata's size and nesting before decoding it."""
    view = memoryview(payload).cast("B")
    meta_len, nblobs = PAYLOAD_HEAD.unpack_from(view, 0)
    if nblobs > MAX_BLOBS:
        raise ProtocolError(f"frame declares {nblobs} blobs; the limit is {MAX_BLOBS}")
    if meta_len > MAX_META:
        raise ProtocolError(f"frame metadata of {meta_len} bytes exceeds the {MAX_META}-byte "
                            f"limit")
    pos = PAYLOAD_HEAD.size
    if pos + BLOB_LEN.size * nblobs > len(view):
        raise ProtocolError("frame is too short for its blob table")
    sizes = [BLOB_LEN.unpack_from(view, pos + BLOB_LEN.size * i)[0] for i in range(nblobs)]
    pos += BLOB_LEN.size * nblobs
    if pos + meta_len + sum(sizes) != len(view):
        raise ProtocolError(f"frame lengths do not add up: payload {len(view)} bytes, meta "
                            f"{meta_len}, blobs {sizes}")
    raw = bytes(view[pos:pos + meta_len])
    check_meta(raw)
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ProtocolError(f"frame metadata is not valid JSON: {err}") from None
    except (RecursionError, MemoryError) as err:  # check_meta should have caught it
        raise ProtocolError(f"frame metadata cannot be decoded: {type(err).__name__}") from None
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
               expect: Sequence[int] | None = None, deadline: float | None = None,
               mac: FrameMAC | None = None, plain_error: bool = False) -> Frame:
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
    mac : FrameMAC, optional
        The connection is authenticated: the frame must carry a trailer whose MAC checks and
        whose sequence number is ``mac.seq`` (which then advances); it is checked before the
        payload is decoded.
    plain_error : bool
        With ``mac``, also accept an unauthenticated ``ERROR`` frame (a server refusing a
        client in its handshake has no key yet).

    Raises
    ------
    ProtocolError (``FrameAuthError`` for a frame that fails authentication), ConnectionClosed,
    RPCTimeoutError (``IdleTimeout`` if no frame began)
    """
    if idle_timeout == -1.0:
        idle_timeout = timeout
    # keyed before the wait for the frame, not after it arrives
    h = mac.hasher() if mac is not None else None
    head = _recv_exact(sock, HEADER_SIZE, timeout, "a frame header", deadline, idle_timeout)
    ftype, length, flags = parse_header(head, max_frame)
    what = f"a {TYPE_NAMES[ftype]} frame of {length} bytes"
    if mac is None or (plain_error and ftype == ERROR and not flags):
        if flags:
            raise ProtocolError(f"{what} carries a MAC on a connection without a key")
        payload = _recv_exact(sock, length, timeout, what, deadline)
    else:
        if not flags & FLAG_MAC:
            raise FrameAuthError(f"{what} without a MAC on an authenticated connection "
                                 f"(injected?)")
        if length < _JOIN_BELOW:   # one read for the payload and its trailer, one digest
            body = _recv_exact(sock, length + TRAILER_SIZE, timeout, what, deadline)
            payload = memoryview(body)[:length]
            seq_bytes = bytes(body[length:length + SEQ.size])
            tag = bytes(body[length + SEQ.size:])
            h.update(head)
            h.update(payload)
            h.update(seq_bytes)
            digest = h.digest()
        else:   # hashed while it arrives (by a helper thread when large)
            h = _Hasher(h, length)
            try:
                h.update(bytes(head))
                payload = _recv_exact(sock, length, timeout, what, deadline, hasher=h)
                trailer = _recv_exact(sock, TRAILER_SIZE, timeout, f"the MAC of {what}",
                                      deadline)
                seq_bytes, tag = bytes(trailer[:SEQ.size]), bytes(trailer[SEQ.size:])
                h.update(seq_bytes)
                digest = h.digest()
            finally:
                h.close()
        if not hmac.compare_digest(digest, tag):
            raise FrameAuthError(f"{what} failed authentication: its MAC does not match "
                                 f"(forged, altered, or from another session)")
        seq = SEQ.unpack(seq_bytes)[0]
        if seq != mac.seq:
            raise FrameAuthError(f"{what} is out of sequence: number {seq}, expected "
                                 f"{mac.seq} (replayed, reordered or dropped)")
        mac.seq += 1
    frame = parse_payload(ftype, payload)
    if expect is not None and frame.type not in expect and frame.type != ERROR:
        want = "/".join(TYPE_NAMES[t] for t in expect)
        raise ProtocolError(f"expected a {want} frame, got {frame.type_name}")
    return frame


class Channel:
    """A connection and, once authenticated, the keys of its two directions.

    ``send`` and ``recv`` are ``send_frame`` / ``recv_frame`` with the channel's MACs; each
    direction is serialized by a lock of its own, so one thread may read while others write.

    Parameters
    ----------
    sock : socket.socket
    send_mac, recv_mac : FrameMAC, optional
        Both or neither: an authenticated channel, or a plain one.

    Examples
    --------
    >>> import socket
    >>> a, b = socket.socketpair()
    >>> k1, k2 = b"1" * 32, b"2" * 32
    >>> left = Channel(a, FrameMAC(k1), FrameMAC(k2))
    >>> right = Channel(b, FrameMAC(k2), FrameMAC(k1))
    >>> left.send(REQUEST, {"op": "info"}); right.recv(timeout=1.0).meta
    {'op': 'info'}
    """

    def __init__(self, sock: socket.socket, send_mac: FrameMAC | None = None,
                 recv_mac: FrameMAC | None = None):
        if (send_mac is None) != (recv_mac is None):
            raise ValueError("a channel authenticates both directions or neither")
        self.sock = sock
        self.send_mac = send_mac
        self.recv_mac = recv_mac
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()

    @property
    def authenticated(self) -> bool:
        return self.send_mac is not None

    def send(self, ftype: int, meta: dict | None = None, blobs: Sequence = (),
             timeout: float | None = 30.0) -> None:
        with self._send_lock:
            send_frame(self.sock, ftype, meta, blobs, timeout, self.send_mac)

    def recv(self, timeout: float | None = 30.0, max_frame: int = DEFAULT_MAX_FRAME,
             idle_timeout: float | None = -1.0, expect: Sequence[int] | None = None,
             deadline: float | None = None, plain_error: bool = False) -> Frame:
        with self._recv_lock:
            return recv_frame(self.sock, timeout, max_frame, idle_timeout, expect, deadline,
                              self.recv_mac, plain_error)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


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
