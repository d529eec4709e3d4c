"""Authentication for RPC sessions: an HMAC-SHA256 challenge-response over a shared token.

The server sends a random nonce; the client answers ``HMAC-SHA256(token, b"client:" + nonce)``
and sends a nonce of its own, which the server answers the same way with ``b"server:"``, so
each side proves it knows the token without the token ever crossing the wire, and neither
answer can be replayed or reflected. Digests are compared in constant time.

A server that listens beyond loopback must have a token (``--token-file``) unless started with
``--insecure``: anyone who can reach an unauthenticated server can run code on it.

Examples
--------
>>> token = b"s3cret"
>>> nonce = new_nonce()
>>> verify(token, nonce, client_digest(token, nonce), "client")
True
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import socket

from .protocol import RPCError

NONCE_BYTES = 32


class AuthenticationError(RPCError):
    """The token was missing or wrong (on either side), or the server could not prove itself."""


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def _digest(token: bytes, role: str, nonce: bytes) -> bytes:
    return hmac.new(token, role.encode("ascii") + b":" + nonce, hashlib.sha256).digest()


def client_digest(token: bytes, nonce: bytes) -> bytes:
    """The client's answer to the server's challenge ``nonce``."""
    return _digest(token, "client", nonce)


def server_digest(token: bytes, nonce: bytes) -> bytes:
    """The server's answer to the client's challenge ``nonce``."""
    return _digest(token, "server", nonce)


def verify(token: bytes, nonce: bytes, answer, role: str) -> bool:
    """Whether ``answer`` (bytes or a hex string) is ``role``'s digest of ``nonce``."""
    if isinstance(answer, str):
        try:
            answer = bytes.fromhex(answer)
        except ValueError:
            return False
    if not isinstance(answer, (bytes, bytearray)):
        return False
    return hmac.compare_digest(_digest(token, role, nonce), bytes(answer))


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


def check_bind_security(host: str, token: bytes | None, insecure: bool) -> None:
    """Refuse (``AuthenticationError``) to serve beyond loopback without a token, unless insecure.

    Examples
    --------
    >>> check_bind_security("127.0.0.1", None, False)   # fine: loopback
    >>> check_bind_security("0.0.0.0", None, False)
    Traceback (most recent call last):
    ...
    rpc.auth.AuthenticationError: refusing to listen on 0.0.0.0 without a token: ...
    """
    if token is None and not insecure and not is_loopback(host):
        raise AuthenticationError(
            f"refusing to listen on {host} without a token: anyone who can reach it could run "
            f"code on this machine. Pass --token-file FILE (and give clients the same token), "
            f"or --insecure on a network you trust")
