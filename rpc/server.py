"""The board side of RPC: accept sessions, run each in its own process, register with a tracker.

    python -m tilecraft.rpc.server --host 0.0.0.0 --port 9090 --key rasp4 --token-file F
                         [--tracker HOST:PORT --tracker-token-file F2] [--plugin MODULE ...]
    python -m tilecraft.rpc.server --host 127.0.0.1 --port 9090 --key local --insecure-local

Process layout::

    server (main process)        accepts connections, authenticates them, talks to the tracker
      └─ launcher                forked at start-up, single-threaded: one child per session
           ├─ session 1          serves one client (rpc.worker): uploads, modules, arrays, calls
           └─ session 2

The main process never runs client code. A session process that dies — a kernel's segmentation
fault, a kernel killed for running past its time limit — is reported by the launcher, and the
main process sends the client an ``ERROR`` frame saying what happened (it keeps a copy of every
session's socket for this). Sessions are forked from the launcher rather than from the main
process because the main process has threads, and because a board's Python may not be able to
``exec`` a fresh interpreter (an emulated board under ``qemu-user`` cannot): the launcher is
forked before any thread starts and has numpy and the runtime already imported, so a session
starts in milliseconds.

Security (docs/rpc.md has the threat model): with ``--token-file`` every session is
authenticated both ways and every frame after the handshake carries a MAC and a sequence number
(``rpc.auth``); without a token the server listens on loopback only, and only when told
``--insecure-local``. Connections still authenticating are limited in number, per client address
too, so a flood of half-open connections from one address cannot lock others out. Each
session process is bounded in memory (``RLIMIT_AS``), files and sizes (``rpc.worker``). The
tracker link is authenticated with the tracker's own token (``--tracker-token-file``), and a
registration is proved with the boards' token, so nobody without it can register this key.

Only the standard library, numpy and ``targets.runtime`` are imported: no LLVM, no compiler.
``--plugin MODULE`` (repeatable) imports a module that adds session operations
(``rpc.worker.register_op``; ``relax.rpc_plugin`` runs Relax executables) in the main process
before the launcher is forked, so every session has them; nothing is imported unless asked for.
"""
from __future__ import annotations

import argparse
import json
import logging
import mmap
import os
import select
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback

from .auth import (AuthenticationError, ServerHandshake, check_bind_security, client_handshake,
                   load_token, registration_proof)
from .protocol import (ERROR, EVENT, PING, PONG, REPLY, REQUEST, Channel, ConnectionClosed,
                       FrameMAC, IdleTimeout, RPCError, send_frame)
from .worker import SessionLimits, load_plugins, platform_info, plugin_ops, run_session

log = logging.getLogger(__name__)

TRACKER_MAX_FRAME = 1 << 20
_SEQ_SLOT = struct.Struct("!Q")


def parse_hostport(text: str, default_port: int = 9190) -> tuple[str, int]:
    """``"HOST:PORT"`` (or ``"[v6]:PORT"``, or ``"HOST"``) -> (host, port)."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
    try:
        port = int(port) if port else default_port
    except ValueError:
        raise ValueError(f"bad address {text!r}: the port must be a number (HOST:PORT)") from None
    if not host or not 0 < port < 65536:
        raise ValueError(f"bad address {text!r}: expected HOST:PORT")
    return host, port


def describe_exit(status: dict) -> tuple[bool, str]:
    """(abnormal, words) for a session process's exit status from the launcher."""
    sig = status.get("signal")
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        if sig == signal.SIGALRM:
            return True, (f"the session process was killed ({name}): the call ran past its time "
                          f"limit")
        if sig == signal.SIGSEGV:
            return True, (f"the session process crashed with a segmentation fault ({name}): a "
                          f"kernel or library accessed invalid memory")
        if sig in (signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT):
            return True, f"the session process crashed ({name})"
        return True, f"the session process was killed by {name}"
    code = status.get("code", 0)
    if code:
        return True, f"the session process exited with code {code}"
    return False, "the session ended"


class _Reject(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class _SessionRecord:
    __slots__ = ("id", "conn", "addr", "ticket", "pid", "started", "slot", "keys")

    def __init__(self, sid, conn, addr, ticket, slot):
        self.id, self.conn, self.addr, self.ticket = sid, conn, addr, ticket
        self.slot = slot      # where its session process keeps its next sequence number
        self.keys = None      # (client to server, server to client), when authenticated
        self.pid = None
        self.started = time.monotonic()


class PendingLimit:
    """Connections still authenticating: at most ``total``, and ``per_host`` from one address,
    so that a flood of half-open connections from one place cannot lock everyone else out.

    Examples
    --------
    >>> lim = PendingLimit(total=3, per_host=2)
    >>> [lim.acquire("10.0.0.9") for _ in range(3)], lim.acquire("10.0.0.1")
    ([None, None, 'server busy: 2 connections from 10.0.0.9 are still authenticating'], None)
    """

    def __init__(self, total: int, per_host: int):
        if total < 1 or per_host < 1:
            raise ValueError(f"connection limits must be >= 1, got {total}, {per_host}")
        self.total, self.per_host = int(total), int(per_host)
        self._lock = threading.Lock()
        self._by_host: dict[str, int] = {}
        self._count = 0

    def acquire(self, host: str) -> str | None:
        """Take a place for a connection from ``host``; None, or why there is none."""
        with self._lock:
            if self._by_host.get(host, 0) >= self.per_host:
                return (f"server busy: {self.per_host} connections from {host} are still "
                        f"authenticating")
            if self._count >= self.total:
                return f"server busy: {self.total} connections are being authenticated"
            self._by_host[host] = self._by_host.get(host, 0) + 1
            self._count += 1
            return None

    def release(self, host: str) -> None:
        with self._lock:
            n = self._by_host.get(host, 0) - 1
            if n > 0:
                self._by_host[host] = n
            else:
                self._by_host.pop(host, None)
            self._count -= 1

    @property
    def count(self) -> int:
        with self._lock:
            return self._count


class RPCServer:
    """An RPC server: ``RPCServer(host, port, key).start()`` then ``serve_forever()``.

    Parameters
    ----------
    host, port : str, int
        Where to listen. Port 0 picks a free port (see ``.port`` after ``start()``).
    key : str
        The device key clients ask a tracker for (``"rasp4"``).
    tracker : (str, int), optional
        Register with this tracker, and again whenever the link is lost.
    token : bytes, optional
        The boards' shared secret: clients must prove they hold it, this server proves it back,
        and every frame after the handshake is authenticated with keys derived from it. It
        also proves this server's registration to the tracker.
    tracker_token : bytes, optional
        The tracker's own secret (the tracker's ``--token-file``), when it has one.
    insecure_local : bool
        Serve without a token: allowed on loopback only, and only with this flag.
    max_sessions : int
        Sessions open at once; more connections are refused with "server busy".
    max_pending, max_pending_per_host : int
        Connections still authenticating, in all and from one address; more are refused at
        once.
    limits : SessionLimits
        Per-session limits: upload and array sizes, memory, idle and call timeouts.
    plugins : sequence of str
        Modules to import in ``start()``, before the launcher is forked, so that the session
        operations they register (``rpc.worker.register_op``) exist in every session:
        ``plugins=["tilecraft.relax.rpc_plugin"]``.

    ``start()`` forks the session launcher, so call it before starting threads of your own.

    Examples
    --------
    >>> server = RPCServer("127.0.0.1", 0, "local", insecure_local=True)   # doctest: +SKIP
    >>> server.start(); server.port                    # doctest: +SKIP
    40123
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 9090, key: str = "default", *,
                 tracker: tuple[str, int] | None = None, token: bytes | None = None,
                 tracker_token: bytes | None = None, insecure_local: bool = False,
                 max_sessions: int = 4, max_pending: int = 64, max_pending_per_host: int = 8,
                 limits: SessionLimits | None = None, handshake_timeout: float = 10.0,
                 custom_addr: str | None = None, tracker_retry: float = 2.0,
                 work_root: str | None = None, plugins=()):
        if not isinstance(key, str) or not key or len(key) > 128:
            raise ValueError(f"key must be a non-empty string of at most 128 characters, "
                             f"got {key!r}")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.host, self.port, self.key = host, int(port), key
        self.tracker = tracker
        self.token = token
        self.tracker_token = tracker_token
        self.insecure_local = insecure_local
        self.max_sessions = int(max_sessions)
        self.pending = PendingLimit(max_pending, max_pending_per_host)
        self.limits = limits or SessionLimits()
        self.handshake_timeout = float(handshake_timeout)
        self.custom_addr = custom_addr
        self.tracker_retry = float(tracker_retry)
        self.work_root = work_root or tempfile.gettempdir()
        if isinstance(plugins, str):
            plugins = [plugins]
        self.plugins = list(plugins)
        self.info = platform_info()
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)   # sessions ending, leases arriving
        self._sessions: dict[int, _SessionRecord] = {}
        self._next_sid = 1
        # one slot per open session, shared with the session processes (mapped before the
        # launcher is forked): each session writes there the sequence number of its next frame,
        # so that this process can still send an authenticated ERROR if the session dies
        self._seq_slots = None
        self._tickets: dict[str, float] = {}     # pending tracker leases: ticket -> deadline
        self._stop = threading.Event()
        self._listen = None
        self._ctrl = None
        self._ctrl_wlock = threading.Lock()
        self._launcher_pid = None
        self._tracker_channel = None
        self._tracker_wlock = threading.Lock()
        self.registered = threading.Event()

    # -- life cycle -----------------------------------------------------------------------------
    def start(self) -> "RPCServer":
        """Bind, fork the launcher and start the tracker link; returns self.

        Call it from the main thread (the launcher installs signal handlers).
        """
        check_bind_security(self.host, self.token, self.insecure_local)
        # Plugins first: the launcher (and every session forked from it) inherits their
        # operations, and a plugin that does not import stops the server before it listens.
        load_plugins(self.plugins)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._listen = socket.create_server((self.host, self.port), family=family, backlog=1024)
        self.port = self._listen.getsockname()[1]
        self._listen.settimeout(0.5)
        ctrl, child_ctrl = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._seq_slots = mmap.mmap(-1, _SEQ_SLOT.size * self.max_sessions)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the launcher
            code = 1
            try:
                self._listen.close()
                ctrl.close()
                code = _launcher_main(child_ctrl, self.limits, self.work_root, self.info,
                                      self._seq_slots)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        child_ctrl.close()
        self._ctrl = ctrl
        self._launcher_pid = pid
        threading.Thread(target=self._ctrl_loop, name="rpc-launcher-link", daemon=True).start()
        if self.tracker is not None:
            threading.Thread(target=self._tracker_loop, name="rpc-tracker-link",
                             daemon=True).start()
        return self

    def serve_forever(self) -> None:
        """Accept connections until ``stop()`` (or SIGTERM / Ctrl-C in the command-line tool)."""
        while not self._stop.is_set():
            try:
                conn, addr = self._listen.accept()
            except socket.timeout:
                continue
            except OSError as err:
                if self._stop.is_set():
                    break
                log.warning("accept failed: %s", err)  # e.g. out of file descriptors: wait
                time.sleep(0.1)
                continue
            host = addr[0] if isinstance(addr, tuple) else str(addr)
            why = self.pending.acquire(host)
            if why is not None:
                log.info("refused a connection from %s: %s", host, why)
                _reject(conn, "ServerBusy", why)
                continue
            threading.Thread(target=self._handshake, args=(conn, addr), daemon=True,
                             name="rpc-handshake").start()

    def stop(self) -> None:
        """Stop accepting, end the launcher (which ends the sessions) and the tracker link."""
        self._stop.set()
        tracker = self._tracker_channel
        for s in (self._listen, self._ctrl, tracker.sock if tracker is not None else None):
            if s is not None:
                try:  # shutdown first: it wakes a thread blocked reading the socket
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                _close(s)
        if self._launcher_pid:
            deadline = time.monotonic() + 10.0  # the launcher ends its sessions, then itself
            try:
                while os.waitpid(self._launcher_pid, os.WNOHANG)[0] == 0:
                    if time.monotonic() > deadline:
                        os.kill(self._launcher_pid, signal.SIGKILL)
                        os.waitpid(self._launcher_pid, 0)
                        break
                    time.sleep(0.05)
            except (ChildProcessError, ProcessLookupError):
                pass
            self._launcher_pid = None

    @property
    def sessions_open(self) -> int:
        with self._lock:
            return len(self._sessions)

    # -- handshake ------------------------------------------------------------------------------
    def _handshake(self, conn: socket.socket, addr) -> None:
        sid = None
        ticket = None
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hs = ServerHandshake(conn, self.token, {"server": "tilecraft-rpc", "key": self.key},
                                 timeout=self.handshake_timeout)
            try:
                meta = hs.start()
            except AuthenticationError as err:
                log.warning("authentication failed from %s", addr[0])
                raise _Reject("AuthenticationError", str(err)) from None
            ticket = meta.get("ticket")
            if ticket is not None:
                self._claim_ticket(ticket, hs.deadline)
            with self._cv:
                # A session that just ended may not be reaped yet: wait a moment for its slot.
                wait_until = min(hs.deadline, time.monotonic() + 1.0)
                while len(self._sessions) >= self.max_sessions:
                    left = wait_until - time.monotonic()
                    if left <= 0:
                        raise _Reject("ServerBusy", f"server busy: {len(self._sessions)} sessions "
                                                    f"are open, the limit is {self.max_sessions}")
                    self._cv.wait(left)
                sid = self._next_sid
                self._next_sid += 1
                used = {r.slot for r in self._sessions.values()}
                slot = next(i for i in range(self.max_sessions) if i not in used)
                rec = _SessionRecord(sid, conn, addr, ticket, slot)
                rec.keys = hs.keys()
                self._sessions[sid] = rec
            _SEQ_SLOT.pack_into(self._seq_slots, slot * _SEQ_SLOT.size, 1)
            hs.welcome({"session": sid, "key": self.key, "platform": self.info,
                        "limits": self.limits.to_json(), "plugins": plugin_ops()})
            start = {"cmd": "start", "id": sid, "slot": slot,
                     "keys": None if rec.keys is None else [k.hex() for k in rec.keys]}
            with self._ctrl_wlock:
                socket.send_fds(self._ctrl, [json.dumps(start).encode()], [conn.fileno()])
            if ticket is not None:
                self._tracker_event({"event": "start", "ticket": ticket})
            log.info("session %d from %s:%d%s", sid, addr[0], addr[1],
                     f" (lease {ticket[:8]})" if ticket else "")
            sid = None  # the session owns the connection now
            ticket = None
        except _Reject as r:
            _reject(conn, r.kind, str(r))
        except (RPCError, OSError) as err:  # junk, half frames, vanished clients: drop them
            log.info("handshake with %s failed: %s", addr[0], err)
            if isinstance(err, RPCError) and not isinstance(err, ConnectionClosed):
                _reject(conn, type(err).__name__, f"handshake failed: {err}")
            else:
                _close(conn)
        except Exception as err:  # noqa: BLE001 - a bug must not leave the client hanging
            log.error("handshake with %s failed unexpectedly: %s: %s\n%s", addr[0],
                      type(err).__name__, err, traceback.format_exc())
            _reject(conn, "ProtocolError", f"handshake failed: {type(err).__name__}")
        finally:
            self.pending.release(addr[0] if isinstance(addr, tuple) else str(addr))
            with self._cv:
                if sid is not None:  # reserved but never handed to the launcher
                    self._sessions.pop(sid, None)
                    self._cv.notify_all()
            if ticket is not None:  # a claimed lease that did not become a session
                self._tracker_event({"event": "end", "ticket": ticket})

    def _claim_ticket(self, ticket, deadline: float) -> None:
        if not isinstance(ticket, str) or not 0 < len(ticket) <= 128:
            raise _Reject("LeaseError", "malformed lease ticket")
        # The tracker sends the lease to us just before it answers the client, so the client
        # can be here first: wait a little for it.
        wait_until = min(deadline, time.monotonic() + 2.0)
        with self._cv:
            while ticket not in self._tickets:
                left = wait_until - time.monotonic()
                if left <= 0:
                    raise _Reject("LeaseError", "unknown or expired lease ticket: ask the tracker "
                                                "again")
                self._cv.wait(left)
            del self._tickets[ticket]

    # -- the launcher link ----------------------------------------------------------------------
    def _ctrl_loop(self) -> None:
        while True:
            try:
                data = self._ctrl.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                if not self._stop.is_set():
                    log.error("the session launcher exited; stopping the server")
                    self._stop.set()
                    try:
                        self._listen.close()
                    except OSError:
                        pass
                return
            msg = json.loads(data)
            if msg.get("event") == "started":
                with self._lock:
                    rec = self._sessions.get(msg["id"])
                    if rec is not None:
                        rec.pid = msg["pid"]
            elif msg.get("event") in ("ended", "failed"):
                with self._cv:
                    rec = self._sessions.pop(msg["id"], None)
                    # read its sequence number before a new session may take the slot
                    seq = None if rec is None else \
                        _SEQ_SLOT.unpack_from(self._seq_slots, rec.slot * _SEQ_SLOT.size)[0]
                    self._cv.notify_all()
                if rec is None:
                    continue
                if msg["event"] == "failed":
                    abnormal, words = True, f"the server could not start a session: " \
                                            f"{msg.get('message')}"
                else:
                    abnormal, words = describe_exit(msg.get("status", {}))
                level = logging.WARNING if abnormal else logging.INFO
                log.log(level, "session %d ended after %.1f s: %s", rec.id,
                        time.monotonic() - rec.started, words)
                channel = Channel(rec.conn)
                if rec.keys is not None:   # speak where the session process stopped
                    c2s, s2c = rec.keys
                    channel = Channel(rec.conn, FrameMAC(s2c, seq), FrameMAC(c2s))
                threading.Thread(target=_finish_connection, args=(channel, abnormal, words),
                                 daemon=True).start()
                if rec.ticket is not None:
                    self._tracker_event({"event": "end", "ticket": rec.ticket})

    # -- the tracker link -----------------------------------------------------------------------
    def _tracker_event(self, meta: dict) -> None:
        with self._tracker_wlock:
            channel = self._tracker_channel
        if channel is None:
            return  # re-registration reports the current state instead
        try:
            channel.send(EVENT, meta, timeout=5.0)
        except (RPCError, OSError):
            pass

    def _active_tickets(self) -> list[str]:
        with self._lock:
            return [r.ticket for r in self._sessions.values() if r.ticket is not None]

    def _tracker_loop(self) -> None:
        host, port = self.tracker
        address = self.custom_addr or self.host
        announced = False
        while not self._stop.is_set():
            sock = None
            try:
                sock = socket.create_connection((host, port), timeout=5.0)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                where = f"the tracker at {host}:{port}"
                channel, _, _, transcript_hash = client_handshake(
                    sock, self.tracker_token, server="tilecraft-tracker", auth={"role": "board"},
                    timeout=10.0, where=where, remote_error=_tracker_refusal)
                register = {"op": "register", "key": self.key, "host": address,
                            "port": self.port, "slots": 1, "leases": self._active_tickets(),
                            "info": self.info}
                if self.token is not None:  # proof that this board holds the key's token
                    register["proof"] = registration_proof(self.token, transcript_hash,
                                                           self.key, address, self.port).hex()
                channel.send(REQUEST, register, timeout=5.0)
                reply = channel.recv(timeout=10.0, max_frame=TRACKER_MAX_FRAME, expect=[REPLY])
                if reply.type == ERROR:
                    raise RPCError(f"the tracker refused the registration: "
                                   f"{reply.meta.get('message')}")
                ping_interval = reply.meta.get("ping_interval", 5.0)
                if type(ping_interval) not in (int, float) or not 0 < ping_interval < 3600:
                    raise RPCError(f"the tracker's ping interval {ping_interval!r} is not a "
                                   f"number of seconds")
                with self._tracker_wlock:
                    self._tracker_channel = channel
                self.registered.set()
                log.info("registered with the tracker at %s:%d as %r%s", host, port, self.key,
                         " (authenticated)" if channel.authenticated else "")
                announced = False
                self._tracker_session(channel, float(ping_interval))
            except (RPCError, OSError) as err:
                if not self._stop.is_set() and not announced:
                    log.warning("tracker %s:%d: %s; retrying every %g s", host, port, err,
                                self.tracker_retry)
                    announced = True
            except Exception as err:  # noqa: BLE001 - a bad tracker must not end the link thread
                log.error("tracker %s:%d: unexpected %s: %s\n%s", host, port,
                          type(err).__name__, err, traceback.format_exc())
            finally:
                self.registered.clear()
                with self._tracker_wlock:
                    self._tracker_channel = None
                if sock is not None:
                    _close(sock)
            self._stop.wait(self.tracker_retry)

    def _tracker_session(self, channel: Channel, ping_interval: float) -> None:
        # The tracker pings every ping_interval; silence for much longer means it is gone
        # even if the connection looks open (a half-open link after a crash or a cable pull).
        silent_limit = 3 * ping_interval + 5.0
        last_heard = time.monotonic()
        while not self._stop.is_set():
            try:
                frame = channel.recv(timeout=10.0, idle_timeout=1.0, max_frame=TRACKER_MAX_FRAME)
            except IdleTimeout:
                self._expire_tickets()
                if time.monotonic() - last_heard > silent_limit:
                    raise RPCError(f"the tracker has been silent for {silent_limit:g} s")
                continue
            last_heard = time.monotonic()
            if frame.type == PING:
                channel.send(PONG, {"id": frame.meta.get("id")}, timeout=5.0)
            elif frame.type == EVENT and frame.meta.get("event") == "lease":
                ticket, ttl = frame.meta.get("ticket"), frame.meta.get("ttl", 10.0)
                if isinstance(ticket, str) and 0 < len(ticket) <= 128 and \
                        type(ttl) in (int, float) and 0 < ttl <= 3600:
                    with self._cv:
                        self._tickets[ticket] = time.monotonic() + float(ttl)
                        self._cv.notify_all()
            elif frame.type == ERROR:
                raise RPCError(f"the tracker says: {frame.meta.get('message')}")
            self._expire_tickets()

    def _expire_tickets(self) -> None:
        now = time.monotonic()
        with self._lock:
            gone = [t for t, d in self._tickets.items() if d < now]
            for t in gone:
                del self._tickets[t]
        for t in gone:
            self._tracker_event({"event": "expired", "ticket": t})


def _tracker_refusal(meta: dict) -> RPCError:
    kind, message = meta.get("type"), meta.get("message")
    if kind == "AuthenticationError":
        return AuthenticationError(f"the tracker refused this board: {message}")
    return RPCError(f"the tracker refused this board: {kind}: {message}")


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def _reject(conn: socket.socket, kind: str, message: str) -> None:
    """Tell a client why it is refused (best effort, never blocking long), then close."""
    try:
        send_frame(conn, ERROR, {"type": kind, "message": message}, timeout=1.0)
        conn.shutdown(socket.SHUT_WR)
    except (RPCError, OSError):
        pass
    _close(conn)


def _finish_connection(channel: Channel, abnormal: bool, words: str) -> None:
    """After a session process ended: report a crash to the client, then close our copy."""
    conn = channel.sock
    try:
        if abnormal:
            channel.send(ERROR, {"type": "SessionLost", "message": words}, timeout=2.0)
        conn.shutdown(socket.SHUT_WR)
        # Read what the client still sends until it hangs up (briefly), so that closing does not
        # reset the connection and destroy the error message before the client reads it.
        deadline = time.monotonic() + 2.0
        conn.settimeout(0.5)
        while time.monotonic() < deadline:
            if not conn.recv(1 << 16):
                break
    except (RPCError, OSError):
        pass
    _close(conn)


# -- the launcher (a forked, single-threaded process) ---------------------------------------------
def _launcher_main(ctrl: socket.socket, limits: SessionLimits, work_root: str, info: dict,
                   seq_slots: mmap.mmap) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the main process decides when to stop
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    children: dict[int, tuple[int, str]] = {}

    def tell(msg: dict) -> None:
        try:
            ctrl.send(json.dumps(msg).encode())
        except OSError:
            pass

    running = True
    kill_at = None  # when sessions still alive after SIGTERM get SIGKILL
    while running or children:
        if kill_at is not None and time.monotonic() > kill_at:
            for pid in children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            kill_at = float("inf")
        try:
            ready, _, _ = select.select([ctrl, wake_r] if running else [wake_r], [], [], 1.0)
        except InterruptedError:
            ready = []
        if wake_r in ready:
            try:
                while wake_r.recv(4096):
                    pass
            except (BlockingIOError, OSError):
                pass
        if running and ctrl in ready:
            try:
                data, fds, _, _ = socket.recv_fds(ctrl, 1 << 16, 4)
            except OSError:
                data, fds = b"", []
            if not data:  # the server is gone: end its sessions
                running = False
                kill_at = time.monotonic() + 5.0
                for pid in children:
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            else:
                msg = json.loads(data)
                sid = msg.get("id")
                if not fds:
                    tell({"event": "failed", "id": sid, "message": "no socket received"})
                else:
                    for extra in fds[1:]:
                        os.close(extra)
                    _fork_session(fds[0], msg, ctrl, wake_r, wake_w, limits, work_root, info,
                                  seq_slots, children, tell)
        # reap every session that ended
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            sid, workdir = children.pop(pid, (None, None))
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            if os.WIFSIGNALED(status):
                st = {"signal": os.WTERMSIG(status)}
            else:
                st = {"code": os.WEXITSTATUS(status)}
            if sid is not None:
                tell({"event": "ended", "id": sid, "pid": pid, "status": st})
    return 0


def _fork_session(fd, msg, ctrl, wake_r, wake_w, limits, work_root, info, seq_slots, children,
                  tell):
    sid = msg.get("id")
    try:
        keys = msg.get("keys")
        keys = None if keys is None else (bytes.fromhex(keys[0]), bytes.fromhex(keys[1]))
        offset = int(msg.get("slot", 0)) * _SEQ_SLOT.size

        def on_sent(seq: int) -> None:
            _SEQ_SLOT.pack_into(seq_slots, offset, seq)
    except (TypeError, ValueError, IndexError) as err:
        os.close(fd)
        tell({"event": "failed", "id": sid, "message": f"bad start message: {err}"})
        return
    try:
        workdir = tempfile.mkdtemp(prefix=f"tilecraft-rpc-{sid}-", dir=work_root)
        pid = os.fork()
    except OSError as err:
        os.close(fd)
        tell({"event": "failed", "id": sid, "message": str(err)})
        return
    if pid == 0:  # the session
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            for s in (ctrl, wake_r, wake_w):
                s.close()
            code = run_session(socket.socket(fileno=fd), workdir, limits, info, keys, on_sent)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(fd)
    children[pid] = (sid, workdir)
    tell({"event": "started", "id": sid, "pid": pid})


# -- command line ---------------------------------------------------------------------------------
def main(argv=None, prog: str = "python -m tilecraft.rpc.server") -> int:
    """The server's command line (also ``tilecraft rpc server``, with its ``prog``)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9090, help="port (0: any free port; default 9090)")
    p.add_argument("--key", default="default", help="device key, e.g. rasp4 (default 'default')")
    p.add_argument("--tracker", metavar="HOST:PORT", help="register with this tracker")
    p.add_argument("--custom-addr", metavar="HOST",
                   help="the address clients should use to reach this server (told to the "
                        "tracker; default: --host, or what the tracker sees)")
    p.add_argument("--token-file", metavar="FILE",
                   help="the boards' shared secret: clients must prove they hold it, and every "
                        "frame is authenticated with keys derived from it")
    p.add_argument("--tracker-token-file", metavar="FILE",
                   help="the tracker's own secret (its --token-file), if it has one")
    p.add_argument("--insecure-local", action="store_true",
                   help="serve without a token, on loopback only (any local user can then run "
                        "code as you)")
    p.add_argument("--insecure", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--max-sessions", type=int, default=4, help="sessions open at once (4)")
    p.add_argument("--max-upload-mb", type=float, default=256, help="largest upload (256 MiB)")
    p.add_argument("--max-array-mb", type=float, default=256, help="largest array (256 MiB)")
    p.add_argument("--max-memory-mb", type=float, default=1024,
                   help="arrays one session may hold in all (1024 MiB)")
    p.add_argument("--session-memory-mb", type=float, default=None,
                   help="address space a session process may add beyond its start, RLIMIT_AS "
                        "(default: --max-memory-mb + the largest frame + 512 MiB + 16 MiB per "
                        "core; 0: no limit)")
    p.add_argument("--max-disk-mb", type=float, default=None,
                   help="files in a session's directory, in all, and the largest file it may "
                        "write (default: 4x --max-upload-mb, at least 1024)")
    p.add_argument("--session-timeout", type=float, default=600,
                   help="end a session idle this many seconds (600)")
    p.add_argument("--frame-timeout", type=float, default=30,
                   help="give up on a frame whose data stops arriving for this long (30 s)")
    p.add_argument("--max-call-seconds", type=float, default=600,
                   help="kill a session whose kernel call runs longer (600 s)")
    p.add_argument("--handshake-timeout", type=float, default=10, help="(10 s)")
    p.add_argument("--tracker-retry", type=float, default=2.0,
                   help="seconds between attempts to reach the tracker (2)")
    p.add_argument("--work-dir", help="where session directories go (default: the system's "
                                      "temporary directory)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import MODULE, which adds session operations, before serving "
                        "(repeatable), e.g. --plugin tilecraft.relax.rpc_plugin")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")
    if args.insecure:
        p.error("--insecure is gone: a server without a token listens on loopback only "
                "(--insecure-local); anywhere else give it --token-file FILE")
    mib = 1 << 20
    try:
        token = load_token(args.token_file) if args.token_file else None
        tracker_token = load_token(args.tracker_token_file) if args.tracker_token_file else None
        if tracker_token is not None and args.tracker is None:
            raise ValueError("--tracker-token-file goes with --tracker HOST:PORT")
        tracker = parse_hostport(args.tracker) if args.tracker else None
        max_disk = args.max_disk_mb if args.max_disk_mb is not None else \
            max(4 * args.max_upload_mb, 1024)
        limits = SessionLimits(max_frame=int(max(args.max_upload_mb, args.max_array_mb) * mib)
                               + (1 << 20),
                               max_upload=int(args.max_upload_mb * mib),
                               max_disk=int(max_disk * mib),
                               max_array=int(args.max_array_mb * mib),
                               max_memory=int(args.max_memory_mb * mib),
                               idle_timeout=args.session_timeout,
                               frame_timeout=args.frame_timeout,
                               max_call_seconds=args.max_call_seconds,
                               max_session_memory=None if args.session_memory_mb is None else
                               int(args.session_memory_mb * mib))
        server = RPCServer(args.host, args.port, args.key, tracker=tracker, token=token,
                           tracker_token=tracker_token, insecure_local=args.insecure_local,
                           max_sessions=args.max_sessions, limits=limits,
                           handshake_timeout=args.handshake_timeout,
                           custom_addr=args.custom_addr, tracker_retry=args.tracker_retry,
                           work_root=args.work_dir, plugins=args.plugin)
        server.start()
    except (AuthenticationError, ValueError, OSError) as err:
        print(f"rpc.server: error: {err}", file=sys.stderr)
        return 2
    if token is None:
        print(f"rpc.server: warning: serving on {args.host} WITHOUT authentication "
              f"(--insecure-local): every user of this machine can run code here as you",
              file=sys.stderr)
    signal.signal(signal.SIGTERM, lambda signum, frame: server._stop.set())
    print(f"rpc server listening on {server.host}:{server.port} key={server.key}"
          f"{' auth=hmac' if token else ''}"
          f"{f' tracker={tracker[0]}:{tracker[1]}' if tracker else ''}"
          f"{' plugins=' + ','.join(args.plugin) if args.plugin else ''}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
