"""Authentication of RPC connections: a handshake over a shared token that cannot be
downgraded, and per-connection keys that authenticate every frame after it.

The same handshake opens a session on a board and a connection to a tracker (each with its
own token)::

    server -> HELLO    {"server": "tilecraft-rpc" | "tilecraft-tracker", "protocol": 2,
                        "key": ..., "nonce": Ns, "auth": "hmac-sha256" | "none"}
    client -> AUTH     {"nonce": Nc, "ticket": ..., ..., "proof": P_client}
    server -> WELCOME  {..., "proof": P_server}        (the first frame with a MAC)

``T = SHA-256(canonical HELLO | canonical AUTH without its proof)`` is the transcript: both
nonces, the server's key, the client's ticket, everything either side said. Then

* ``P_client = HMAC-SHA256(token, "client proof" | T)``, checked by the server;
* ``P_server = HMAC-SHA256(token, "server proof" | T)``, checked by the client;
* the keys ``HMAC-SHA256(token, "client to server" | T)`` and ``"server to client"``, with
  which every later frame carries a MAC and a sequence number (``protocol.FrameMAC``).

The token never crosses the wire; a proof is bound to both fresh nonces, so it cannot be
replayed, reflected (the roles differ), or relayed into another session: a go-between that
passes the proofs along gets no key, so it can neither read replies it could use nor inject a
frame. A client that has a token refuses a server whose HELLO says ``"auth": "none"`` (a
downgrade) before it sends anything, and a server that cannot prove itself.

A server with no token (``--insecure-local``) listens on loopback only: anyone who can open a
session can run code on the board.

Why MACs and not TLS: the board needs Python >= 3.9 and numpy only, and the standard library's
``ssl`` gains pre-shared keys only in 3.13; TLS would need certificates made and distributed
for every board, and its state cannot follow the connection into the session process the
server forks (the keys can). Frames are authenticated, not encrypted: an eavesdropper sees
libraries and arrays (tunnel the link, e.g. WireGuard, if they are secret).

Examples
--------
>>> token = b"s3cret"
>>> t = transcript({"nonce": "aa"}, {"nonce": "bb"})
>>> verify_proof(token, t, proof(token, t, "client"), "client")
True
>>> verify_proof(token, t, proof(token, t, "client"), "server")   # no reflection
False
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import socket
import time

from .protocol import (AUTH, ERROR, HELLO, VERSION, WELCOME, Channel, ConnectionClosed,
                       FrameAuthError, FrameMAC, ProtocolError, RPCError, recv_frame, send_frame)

NONCE_BYTES = 32
AUTH_SCHEME = "hmac-sha256"
# the handshake is small: frames before the keys exist are capped hard
HANDSHAKE_MAX_FRAME = 64 << 10


class AuthenticationError(RPCError):
    """The token was missing or wrong (on either side), the server could not prove itself, or
    a peer offered less security than this side requires."""


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def canonical(meta: dict) -> bytes:
    """The bytes both sides hash for a handshake frame's metadata (sorted keys, no spaces)."""
    return json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def transcript(hello: dict, auth: dict) -> bytes:
    """SHA-256 of the handshake: the HELLO's metadata and the AUTH's without its ``proof``."""
    body = {k: v for k, v in auth.items() if k != "proof"}
    h = hashlib.sha256(b"tilecraft-rpc/2 handshake\0")
    for part in (canonical(hello), canonical(body)):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


def _mac(token: bytes, label: str, data: bytes) -> bytes:
    return hmac.new(token, label.encode("ascii") + b"\0" + data, hashlib.sha256).digest()


def proof(token: bytes, transcript_hash: bytes, role: str) -> bytes:
    """``role``'s proof (``"client"`` or ``"server"``) that it knows ``token``."""
    if role not in ("client", "server"):
        raise ValueError(f"role must be 'client' or 'server', got {role!r}")
    return _mac(token, f"{role} proof", transcript_hash)


def verify_proof(token: bytes, transcript_hash: bytes, answer, role: str) -> bool:
    """Whether ``answer`` (bytes or a hex string) is ``role``'s proof; constant time."""
    if isinstance(answer, str):
        try:
            answer = bytes.fromhex(answer)
        except ValueError:
            return False
    if not isinstance(answer, (bytes, bytearray)):
        return False
    return hmac.compare_digest(proof(token, transcript_hash, role), bytes(answer))


def session_keys(token: bytes, transcript_hash: bytes) -> tuple[bytes, bytes]:
    """``(client to server, server to client)`` keys of the frames after the handshake."""
    return (_mac(token, "client to server", transcript_hash),
            _mac(token, "server to client", transcript_hash))


def registration_proof(board_token: bytes, transcript_hash: bytes, key: str, host: str,
                       port: int) -> bytes:
    """A board's proof, to a tracker, that it holds the token of the boards of ``key``: bound
    to this tracker connection's handshake and to the address it registers."""
    what = canonical({"key": key, "host": host, "port": port})
    return _mac(board_token, "register", transcript_hash + what)


def as_token(token) -> bytes | None:
    """A token given as str or bytes, whitespace stripped; None stays None."""
    if token is None:
        return None
    if isinstance(token, str):
        token = token.encode("utf-8")
    if not isinstance(token, (bytes, bytearray)):
        raise TypeError(f"token must be str or bytes, got {type(token).__name__}")
    token = bytes(token).strip()
    if not token:
        raise ValueError("token is empty")
    return token


def load_token(path: str) -> bytes:
    """Read a token file (its content, surrounding whitespace stripped; must not be empty)."""
    with open(path, "rb") as f:
        data = f.read(1 << 16)
    token = data.strip()
    if not token:
        raise ValueError(f"token file {path} is empty; put a secret in it, e.g. "
                         f"`openssl rand -hex 32 > {path}`")
    return token


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` listens on loopback only (127.0.0.0/8, ::1, "localhost")."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:  # a host name: loopback only if every address it resolves to is
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addrs = {info[4][0] for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def check_bind_security(host: str, token: bytes | None, insecure_local: bool,
                        what: str = "server") -> None:
    """Refuse (``AuthenticationError``) to serve without a token unless on loopback and
    explicitly asked to (``--insecure-local``).

    Examples
    --------
    >>> check_bind_security("127.0.0.1", None, True)    # loopback, explicitly insecure
    >>> check_bind_security("127.0.0.1", None, False)
    Traceback (most recent call last):
    ...
    rpc.auth.AuthenticationError: refusing to serve on 127.0.0.1 without a token: ...
    """
    if token is not None:
        return
    if not is_loopback(host):
        raise AuthenticationError(
            f"refusing to listen on {host} without a token: anyone who can reach it could "
            f"{'run code on this machine' if what == 'server' else 'register boards or take them'}"
            f". Pass --token-file FILE (and give its peers the same token); --insecure-local "
            f"serves without one on loopback only")
    if not insecure_local:
        raise AuthenticationError(
            f"refusing to serve on {host} without a token: every user of this machine could "
            f"{'run code as you' if what == 'server' else 'register boards or take them'}. "
            f"Pass --token-file FILE, or --insecure-local if that is what you want")


# -- the handshake ----------------------------------------------------------------------------------
class ServerHandshake:
    """The server's half: ``start()`` sends the HELLO and checks the AUTH; ``welcome(meta)``
    answers with the server's proof and returns the channel (authenticated when there is a
    token). Between the two the caller may refuse the client (``reject``).

    Parameters
    ----------
    sock : socket.socket
    token : bytes or None
    hello : dict
        What the HELLO says besides the nonce, protocol and scheme (``server``, ``key``).
    timeout : float
        For each frame; ``deadline`` (``time.monotonic``) bounds the whole handshake.

    Examples
    --------
    >>> hs = ServerHandshake(conn, token, {"server": "tilecraft-rpc", "key": "rasp4"},
    ...                      timeout=10)                                     # doctest: +SKIP
    >>> auth_meta = hs.start()                    # AuthenticationError: a wrong proof
    ... # doctest: +SKIP
    >>> channel = hs.welcome({"session": 1})      # doctest: +SKIP
    """

    def __init__(self, sock: socket.socket, token: bytes | None, hello: dict, timeout: float,
                 deadline: float | None = None):
        self.sock = sock
        self.token = token
        self.timeout = float(timeout)
        self.deadline = deadline if deadline is not None else time.monotonic() + self.timeout
        self.hello = dict(hello, protocol=VERSION, nonce=new_nonce().hex(),
                          auth=AUTH_SCHEME if token is not None else "none")
        self.transcript = None
        self.auth = None

    def start(self) -> dict:
        """Send the HELLO, receive the AUTH and check its proof; return the AUTH's metadata.

        Raises ``AuthenticationError`` (the proof is missing or wrong), ``ConnectionClosed``
        (the client gave up) or the errors of ``recv_frame``."""
        send_frame(self.sock, HELLO, self.hello, timeout=self.timeout)
        frame = recv_frame(self.sock, timeout=self.timeout, max_frame=HANDSHAKE_MAX_FRAME,
                           expect=[AUTH], deadline=self.deadline)
        if frame.type == ERROR:
            raise ConnectionClosed(f"the client gave up during the handshake: "
                                   f"{frame.meta.get('message')}")
        self.auth = frame.meta
        self.transcript = transcript(self.hello, frame.meta)
        if self.token is not None and not verify_proof(self.token, self.transcript,
                                                       frame.meta.get("proof"), "client"):
            raise AuthenticationError("authentication failed: this server needs a token and "
                                      "the client's proof was missing or wrong")
        return frame.meta

    def welcome(self, meta: dict) -> Channel:
        """Send the WELCOME (with this server's proof; the first authenticated frame) and
        return the connection's channel."""
        channel = self.channel()
        if self.token is not None:
            meta = dict(meta, proof=proof(self.token, self.transcript, "server").hex())
        channel.send(WELCOME, meta, timeout=self.timeout)
        return channel

    def channel(self, sent: int = 0, received: int = 0) -> Channel:
        """The channel of this connection; with a token, its MACs start at sequence numbers
        ``sent`` (server to client) and ``received``."""
        if self.token is None:
            return Channel(self.sock)
        c2s, s2c = session_keys(self.token, self.transcript)
        return Channel(self.sock, FrameMAC(s2c, sent), FrameMAC(c2s, received))

    def keys(self) -> tuple[bytes, bytes] | None:
        """``(client to server, server to client)``, or None without a token."""
        return None if self.token is None else session_keys(self.token, self.transcript)


def client_handshake(sock: socket.socket, token: bytes | None, *, server: str,
                     auth: dict | None = None, timeout: float = 30.0,
                     deadline: float | None = None, where: str = "the server",
                     remote_error=None) -> tuple[Channel, dict, dict, bytes]:
    """The client's half: read the HELLO, answer it, check the WELCOME.

    Parameters
    ----------
    token : bytes or None
        With a token the client refuses a server that does not authenticate (a downgrade)
        before it sends anything, and one that cannot prove it knows the token.
    server : str
        What the HELLO must call itself (``"tilecraft-rpc"``, a board; ``"tilecraft-tracker"``).
    auth : dict
        What the AUTH carries besides the nonce and proof (a lease ticket).
    remote_error : callable, optional
        Turns an ERROR frame's metadata into the exception to raise.

    Returns ``(channel, welcome meta, hello meta, transcript hash)``.
    """
    deadline = deadline if deadline is not None else time.monotonic() + timeout
    raise_error = remote_error or (lambda meta: RPCError(f"{meta.get('type')}: "
                                                         f"{meta.get('message')}"))
    hello = recv_frame(sock, timeout=timeout, max_frame=HANDSHAKE_MAX_FRAME, expect=[HELLO],
                       deadline=deadline)
    if hello.type == ERROR:
        raise raise_error(hello.meta)
    meta = hello.meta
    if meta.get("protocol") != VERSION:
        raise ProtocolError(f"{where} speaks RPC protocol {meta.get('protocol')!r}; this "
                            f"client speaks {VERSION}")
    if meta.get("server") != server:
        raise ProtocolError(f"{where} is a {meta.get('server')!r}, not a {server!r}")
    scheme = meta.get("auth")
    if scheme not in (AUTH_SCHEME, "none"):
        raise ProtocolError(f"{where} offers authentication {scheme!r}; this client knows "
                            f"{AUTH_SCHEME!r}")
    if token is not None and scheme == "none":
        raise AuthenticationError(f"{where} does not authenticate (its greeting says "
                                  f"'auth: none'), but this client has a token: refusing to "
                                  f"talk to a server that cannot prove it knows it")
    if token is None and scheme != "none":
        raise AuthenticationError(f"{where} requires a token" + (
            ": rpc.connect(host, port, token=...)" if server == "tilecraft-rpc" else
            ": rpc.connect_tracker(host, port, token=...)"))
    nonce = meta.get("nonce")
    if not isinstance(nonce, str) or len(nonce) != 2 * NONCE_BYTES:
        raise ProtocolError(f"{where}'s challenge is malformed")
    body = dict(auth or {}, nonce=new_nonce().hex())
    t = transcript(meta, body)
    if token is not None:
        body["proof"] = proof(token, t, "client").hex()
    send_frame(sock, AUTH, body, timeout=timeout)
    if token is None:
        channel = Channel(sock)
    else:
        c2s, s2c = session_keys(token, t)
        channel = Channel(sock, FrameMAC(c2s), FrameMAC(s2c))
    try:
        welcome = channel.recv(timeout=timeout, max_frame=1 << 20, expect=[WELCOME],
                               deadline=deadline, plain_error=True)
    except FrameAuthError as err:   # only the token's holder can make the WELCOME's MAC
        raise AuthenticationError(f"{where} could not prove it knows the token: it is not "
                                  f"the server you meant ({err})") from None
    if welcome.type == ERROR:
        raise raise_error(welcome.meta)
    if token is not None and not verify_proof(token, t, welcome.meta.get("proof"), "server"):
        raise AuthenticationError(f"{where} could not prove it knows the token: it is not "
                                  f"the server you meant")
    return channel, welcome.meta, meta, t
