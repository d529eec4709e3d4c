"""The tracker: a queue of RPC servers per device key, handing out sessions by lease.

    python -m tilecraft.rpc.tracker --host 0.0.0.0 --port 9190 --token-file tracker.token \
                                    --board-token-file board.token
    python -m tilecraft.rpc.tracker --host 127.0.0.1 --port 9190 --insecure-local   # loopback
    python -m tilecraft.rpc.tracker --port 9190 --token-file tracker.token --summary  # ask one

Servers register (``python -m tilecraft.rpc.server --tracker HOST:PORT --key rasp4``) and keep their
connection open; the tracker pings each one every ``ping_interval`` seconds and drops a server
that does not answer within ``ping_timeout`` or whose connection closes. A server that loses
the tracker (a tracker restart) registers again by itself.

Clients ask for a key (``rpc.connect_tracker(host, port).request("rasp4")``). Requests wait in
one queue per key, highest ``priority`` first and first come first served within a priority.
When a server of that key is free, the tracker grants a *lease*: a random ticket sent to the
server and to the client, which then connects to the server directly and presents it. A server
holds one lease at a time (a board measures one thing at a time). The lease ends, and the
server returns to the pool, when the session ends — the client closed it or vanished, or the
session idled out — or, if the client never shows up, ``lease_timeout`` seconds after it was
granted.

Security. The tracker has a token of its own (``--token-file``), separate from the boards':
every connection begins with the handshake of ``rpc.auth`` (the tracker's HELLO, the peer's
proof, the tracker's proof) and every frame after it carries a MAC, so nobody without the
tracker's token can ask for a board, read the summary, register, or inject a lease. A board's
registration is also proved with the boards' token (``--board-token-file``, per key with
``KEY=FILE``), bound to the connection and to the address it registers, so whoever holds only
the tracker's token still cannot register a key, take over a board's address or evict it.
A lease's ticket reaches the board over its authenticated link, and the board accepts a session
with that ticket only from a client that holds the boards' token: a session is bound to the
board the tracker matched. Without a token the tracker serves on loopback only, and only with
``--insecure-local``. Connections still authenticating are limited, per address too.

Protocol: the frames of ``rpc.protocol``; after the handshake (``"server":
"tilecraft-tracker"``) the first frame is a ``REQUEST`` whose ``op`` is ``register`` (a
server), ``request`` or ``summary`` (a client).
"""
from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import secrets
import select
import signal
import socket
import sys
import threading
import time
import traceback

from .auth import (AuthenticationError, ServerHandshake, check_bind_security, load_token,
                   registration_proof)
from .client import TrackerClient
from .protocol import (ERROR, EVENT, PING, PONG, REPLY, REQUEST, Channel, ConnectionClosed,
                       IdleTimeout, RPCError, error_meta, send_frame)
from .server import PendingLimit

log = logging.getLogger(__name__)

_FIRST_FRAME_MAX = 1 << 20
_GRACE = 2.0   # seconds a reserved lease outlives its ttl here, so the server's expiry comes first


class _Lease:
    __slots__ = ("ticket", "server", "state", "granted", "deadline")

    def __init__(self, ticket, server, state, deadline):
        self.ticket, self.server, self.state = ticket, server, state
        self.granted = time.monotonic()
        self.deadline = deadline


class _Server:
    def __init__(self, sid, key, host, port, slots, channel, info, proved):
        self.id, self.key, self.host, self.port = sid, key, host, port
        self.slots = slots
        self.channel = channel
        self.info = info
        self.proved = proved       # registered with a proof of the boards' token
        self.leases: dict[str, _Lease] = {}
        self.registered = time.monotonic()
        self.last_assigned = 0.0
        self.alive = True

    @property
    def free(self) -> bool:
        return self.alive and len(self.leases) < self.slots

    def send(self, ftype: int, meta: dict) -> bool:
        try:
            self.channel.send(ftype, meta, timeout=5.0)
            return True
        except (RPCError, OSError):
            return False


class _Request:
    __slots__ = ("key", "priority", "seq", "created", "lease")

    def __init__(self, key, priority, seq):
        self.key, self.priority, self.seq = key, priority, seq
        self.created = time.monotonic()
        self.lease = None


class Tracker:
    """A tracker serving on ``host:port`` (port 0: any free port, see ``.port``).

    Parameters
    ----------
    token : bytes, optional
        The tracker's own secret: every client and board must prove it holds it.
    board_tokens : dict, optional
        The boards' tokens, ``{key: token}`` (``None`` as the key: every other key). A board
        registering a key must prove it holds that key's token. Required with ``token``.
    insecure_local : bool
        Serve without a token: allowed on loopback only, and only with this flag.
    ping_interval, ping_timeout : float
        Health checks: each server is pinged every ``ping_interval`` seconds and dropped if it
        does not answer within ``ping_timeout``.
    lease_timeout : float
        How long a granted lease waits for its client to connect to the server.
    max_connections : int
        Connections handled at once (servers plus waiting clients).
    max_pending, max_pending_per_host : int
        Connections still authenticating, in all and from one address.

    Examples
    --------
    >>> tracker = Tracker("0.0.0.0", 9190, token=tracker_token,
    ...                   board_tokens={None: board_token}).start()   # doctest: +SKIP
    >>> tracker.summary()["queue_info"]               # doctest: +SKIP
    {}
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 9190, *, token: bytes | None = None,
                 board_tokens: dict | None = None, insecure_local: bool = False,
                 ping_interval: float = 5.0, ping_timeout: float = 5.0,
                 lease_timeout: float = 10.0, max_connections: int = 512,
                 max_pending: int = 64, max_pending_per_host: int = 8,
                 handshake_timeout: float = 10.0):
        self.host, self.port = host, int(port)
        self.token = token
        self.board_tokens = dict(board_tokens or {})
        self.insecure_local = insecure_local
        self.pending = PendingLimit(max_pending, max_pending_per_host)
        self.handshake_timeout = float(handshake_timeout)
        self.ping_interval = float(ping_interval)
        self.ping_timeout = float(ping_timeout)
        self.lease_timeout = float(lease_timeout)
        self.max_connections = int(max_connections)
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._servers: dict[int, _Server] = {}
        self._queue: list[_Request] = []
        self._seq = 0
        self._next_id = 1
        self._connections = 0
        self._stop = threading.Event()
        self._listen = None

    # -- life cycle -----------------------------------------------------------------------------
    def start(self) -> "Tracker":
        check_bind_security(self.host, self.token, self.insecure_local, what="tracker")
        if self.token is not None and not self.board_tokens:
            raise AuthenticationError(
                "a tracker with a token needs the boards' token too (--board-token-file FILE, "
                "or KEY=FILE per key): registrations are proved with it, or anyone holding the "
                "tracker's token could register any key and take boards' places")
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._listen = socket.create_server((self.host, self.port), family=family, backlog=1024)
        self.port = self._listen.getsockname()[1]
        self._listen.settimeout(0.5)
        threading.Thread(target=self._accept_loop, name="tracker-accept", daemon=True).start()
        threading.Thread(target=self._housekeeping, name="tracker-housekeeping",
                         daemon=True).start()
        return self

    def serve_forever(self) -> None:
        while not self._stop.wait(0.5):
            pass

    def stop(self) -> None:
        self._stop.set()
        if self._listen is not None:
            self._listen.close()
        with self._lock:
            servers = list(self._servers.values())
        for s in servers:
            s.channel.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, addr = self._listen.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            host = addr[0] if isinstance(addr, tuple) else str(addr)
            with self._lock:
                why = "tracker busy: too many connections" \
                    if self._connections >= self.max_connections else None
                if why is None:
                    why = self.pending.acquire(host)
                if why is None:
                    self._connections += 1
            if why is not None:
                log.info("refused a connection from %s: %s", host, why)
                try:
                    send_frame(conn, ERROR, {"type": "TrackerBusy", "message": why}, timeout=1.0)
                    conn.shutdown(socket.SHUT_WR)
                except (RPCError, OSError):
                    pass
                conn.close()
                continue
            threading.Thread(target=self._handle, args=(conn, addr), daemon=True,
                             name="tracker-conn").start()

    def _housekeeping(self) -> None:
        while not self._stop.wait(0.5):
            now = time.monotonic()
            with self._cv:
                changed = False
                for s in self._servers.values():
                    for t, lease in list(s.leases.items()):
                        if lease.state == "reserved" and now > lease.deadline + _GRACE:
                            log.info("lease %s on %s:%d expired unused", t[:8], s.host, s.port)
                            del s.leases[t]
                            changed = True
                if changed:
                    self._dispatch_locked()

    # -- matching -------------------------------------------------------------------------------
    def _dispatch_locked(self) -> None:
        """Grant leases: for each waiting request in (priority, arrival) order, the free server
        of its key that has waited longest."""
        for req in sorted(self._queue, key=lambda r: (-r.priority, r.seq)):
            free = [s for s in self._servers.values() if s.key == req.key and s.free]
            if not free:
                continue
            server = min(free, key=lambda s: (s.last_assigned, s.id))
            ticket = secrets.token_hex(16)
            lease = _Lease(ticket, server, "reserved", time.monotonic() + self.lease_timeout)
            server.leases[ticket] = lease
            server.last_assigned = time.monotonic()
            req.lease = lease
            self._queue.remove(req)
        self._cv.notify_all()

    def _release_locked(self, lease: _Lease) -> None:
        lease.server.leases.pop(lease.ticket, None)
        self._dispatch_locked()

    # -- connections ----------------------------------------------------------------------------
    def _handle(self, conn: socket.socket, addr) -> None:
        host = addr[0] if isinstance(addr, tuple) else str(addr)
        pending = True
        channel = Channel(conn)
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hs = ServerHandshake(conn, self.token, {"server": "tilecraft-tracker", "key": None},
                                 timeout=self.handshake_timeout)
            hs.start()
            channel = hs.welcome({})
            frame = channel.recv(timeout=10.0, max_frame=_FIRST_FRAME_MAX, expect=[REQUEST],
                                 deadline=hs.deadline)
            self.pending.release(host)   # authenticated: no longer a half-open connection
            pending = False
            op = frame.meta.get("op")
            if op == "register":
                self._serve_server(channel, addr, frame.meta, hs.transcript)
            elif op == "request":
                self._serve_request(channel, frame.meta)
            elif op == "summary":
                channel.send(REPLY, self.summary(), timeout=5.0)
            else:
                channel.send(ERROR, {"type": "ValueError",
                                     "message": f"unknown tracker operation {op!r}; known: "
                                                f"register, request, summary"}, timeout=5.0)
        except (RPCError, OSError, ValueError, TypeError) as err:
            level = logging.WARNING if isinstance(err, AuthenticationError) else logging.INFO
            log.log(level, "connection from %s: %s", host, err)
            self._tell(channel, err)
        except Exception as err:  # noqa: BLE001 - nothing escapes a connection's handler
            log.error("connection from %s: unexpected %s: %s\n%s", host, type(err).__name__,
                      err, traceback.format_exc())
            self._tell(channel, err)
        finally:
            if pending:
                self.pending.release(host)
            channel.close()
            with self._lock:
                self._connections -= 1

    @staticmethod
    def _tell(channel: Channel, err: BaseException) -> None:
        """The ERROR frame about ``err``, best effort (not for a vanished peer)."""
        if isinstance(err, (ConnectionClosed, OSError)):
            return
        try:
            channel.send(ERROR, error_meta(err), timeout=1.0)
        except (RPCError, OSError):
            pass

    def _check_registration(self, meta: dict, transcript: bytes, key: str, host: str,
                            port: int) -> bool:
        """Whether the registration proves the boards' token of ``key`` (raises
        ``AuthenticationError`` when it must and does not); False: there is nothing to prove
        it with (a tracker without board tokens, on loopback)."""
        token = self.board_tokens.get(key, self.board_tokens.get(None))
        if token is None:
            if self.board_tokens:
                raise AuthenticationError(f"register: this tracker has no board token for key "
                                          f"{key!r}, so it takes no board of that key")
            return False
        answer = meta.get("proof")
        try:
            answer = bytes.fromhex(answer) if isinstance(answer, str) else b""
        except ValueError:
            answer = b""
        if not hmac.compare_digest(registration_proof(token, transcript, key, host, port),
                                   answer):
            raise AuthenticationError(f"register: the proof of the boards' token for key "
                                      f"{key!r} is missing or wrong")
        return True

    def _serve_server(self, channel: Channel, addr, meta: dict, transcript: bytes) -> None:
        key, host, port = meta.get("key"), meta.get("host"), meta.get("port")
        slots, leases = meta.get("slots", 1), meta.get("leases", [])
        if not isinstance(key, str) or not 0 < len(key) <= 128:
            raise ValueError(f"register: bad key {key!r}")
        if type(port) is not int or not 0 < port < 65536:
            raise ValueError(f"register: bad port {port!r}")
        if type(slots) is not int or not 0 < slots <= 64:
            raise ValueError(f"register: bad slots {slots!r}")
        if not isinstance(leases, list) or not all(isinstance(t, str) and len(t) <= 128
                                                   for t in leases):
            raise ValueError("register: leases must be a list of tickets")
        if not isinstance(host, str) or len(host) > 255:
            raise ValueError(f"register: bad host {host!r}")
        proved = self._check_registration(meta, transcript, key, host, port)
        if host in ("", "0.0.0.0", "::"):
            host = addr[0]
        info = meta.get("info") if isinstance(meta.get("info"), dict) else {}
        with self._cv:
            for old in [s for s in self._servers.values() if (s.host, s.port) == (host, port)]:
                self._drop_locked(old, "registered again")
            server = _Server(self._next_id, key, host, port, slots, channel, info, proved)
            self._next_id += 1
            for t in leases[:slots]:  # sessions that outlived a tracker restart
                server.leases[t] = _Lease(t, server, "active", float("inf"))
            self._servers[server.id] = server
        log.info("server %s:%d registered as %r%s", host, port, key,
                 " (proved)" if proved else "")
        channel.send(REPLY, {"ok": True, "ping_interval": self.ping_interval}, timeout=5.0)
        with self._cv:
            self._dispatch_locked()
        reason = "connection closed"
        try:
            reason = self._watch_server(server)
        except (RPCError, OSError) as err:
            reason = str(err)
        finally:
            with self._cv:
                self._drop_locked(server, reason)

    def _watch_server(self, server: _Server) -> str:
        """Read the server's events and ping it; return why it is being dropped."""
        next_ping = time.monotonic() + self.ping_interval
        ping_sent = None
        ping_id = 0
        while not self._stop.is_set() and server.alive:
            now = time.monotonic()
            wake = ping_sent + self.ping_timeout if ping_sent is not None else next_ping
            try:
                frame = server.channel.recv(timeout=10.0, idle_timeout=max(wake - now, 0.01),
                                            max_frame=_FIRST_FRAME_MAX)
            except IdleTimeout:
                if ping_sent is not None:
                    return f"no answer to a ping within {self.ping_timeout:g} s"
                ping_id += 1
                if not server.send(PING, {"id": ping_id}):
                    return "ping could not be sent"
                ping_sent = time.monotonic()
                continue
            except ConnectionClosed:
                return "connection closed"
            ping_sent = None
            next_ping = time.monotonic() + self.ping_interval
            if frame.type == EVENT:
                self._server_event(server, frame.meta)
            elif frame.type == ERROR:
                return f"server error: {frame.meta.get('message')}"
        return "tracker stopping"

    def _server_event(self, server: _Server, meta: dict) -> None:
        event, ticket = meta.get("event"), meta.get("ticket")
        with self._cv:
            lease = server.leases.get(ticket)
            if event == "start":
                if lease is not None:
                    lease.state = "active"
            elif event in ("end", "expired"):
                if lease is not None:
                    log.info("lease %s on %s:%d ended (%s)", str(ticket)[:8], server.host,
                             server.port, event)
                    self._release_locked(lease)

    def _drop_locked(self, server: _Server, reason: str) -> None:
        if self._servers.pop(server.id, None) is not None:
            log.warning("dropped server %s:%d (%r): %s", server.host, server.port, server.key,
                        reason)
        server.alive = False
        server.leases.clear()
        try:
            server.channel.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _serve_request(self, conn: Channel, meta: dict) -> None:
        key, priority, timeout = meta.get("key"), meta.get("priority", 0), meta.get("timeout", 60)
        if not isinstance(key, str) or not key:
            raise ValueError(f"request: bad key {key!r}")
        if type(priority) is not int:
            raise ValueError(f"request: priority must be an integer, got {priority!r}")
        if type(timeout) not in (int, float) or not timeout > 0:
            raise ValueError(f"request: timeout must be a positive number, got {timeout!r}")
        deadline = time.monotonic() + min(float(timeout), 24 * 3600.0)
        with self._cv:
            self._seq += 1
            req = _Request(key, priority, self._seq)
        while True:
            with self._cv:
                req.lease = None
                self._queue.append(req)  # (again, in its place, if a granted server failed)
                self._dispatch_locked()
            lease = self._wait_for_lease(conn, req, deadline)
            if lease is None:
                return
            # Tell the server first, so the ticket is known there when the client arrives.
            if lease.server.send(EVENT, {"event": "lease", "ticket": lease.ticket,
                                         "ttl": self.lease_timeout}):
                break
            with self._cv:
                self._drop_locked(lease.server, "lease could not be sent")
        try:
            conn.send(REPLY, {"key": key, "host": lease.server.host, "port": lease.server.port,
                              "ticket": lease.ticket, "ttl": self.lease_timeout}, timeout=5.0)
        except (RPCError, OSError):
            with self._cv:
                self._release_locked(lease)
            raise

    def _wait_for_lease(self, conn: Channel, req: _Request, deadline: float):
        """Wait for ``req`` to be granted; None (request withdrawn) on timeout or hang-up."""
        while True:
            with self._cv:
                if req.lease is not None:
                    return req.lease
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    self._queue.remove(req)
                    total = sum(1 for s in self._servers.values() if s.key == req.key)
                    break
                self._cv.wait(min(left, 0.25))
            if _peer_closed(conn.sock):
                with self._cv:
                    if req.lease is not None:
                        self._release_locked(req.lease)
                    else:
                        self._queue.remove(req)
                log.info("a client waiting for %r hung up", req.key)
                return None
        conn.send(ERROR, {"type": "TimeoutError",
                          "message": f"no server with key {req.key!r} became free in time "
                                     f"({total} registered)"}, timeout=5.0)
        return None

    # -- reporting ------------------------------------------------------------------------------
    def summary(self) -> dict:
        """Servers and queues: ``{"queue_info": {key: {"free", "pending", "total"}},
        "server_info": [...], "pending_requests": [...]}``."""
        now = time.monotonic()
        with self._lock:
            queue_info: dict[str, dict] = {}
            servers = []
            for s in sorted(self._servers.values(), key=lambda s: (s.key, s.id)):
                q = queue_info.setdefault(s.key, {"free": 0, "pending": 0, "total": 0})
                q["total"] += 1
                q["free"] += int(s.free)
                servers.append({"key": s.key, "host": s.host, "port": s.port, "free": s.free,
                                "leases": [{"state": l.state, "age_s": round(now - l.granted, 3)}
                                           for l in s.leases.values()],
                                "registered_s": round(now - s.registered, 3),
                                "machine": s.info.get("machine"), "python": s.info.get("python")})
            pending = []
            for r in sorted(self._queue, key=lambda r: (-r.priority, r.seq)):
                q = queue_info.setdefault(r.key, {"free": 0, "pending": 0, "total": 0})
                q["pending"] += 1
                pending.append({"key": r.key, "priority": r.priority,
                                "waiting_s": round(now - r.created, 3)})
        return {"queue_info": queue_info, "server_info": servers, "pending_requests": pending}


def _peer_closed(conn: socket.socket) -> bool:
    try:
        ready, _, _ = select.select([conn], [], [], 0)
        if not ready:
            return False
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def format_summary(summary: dict) -> str:
    """The summary as a small text table (what ``--summary`` prints)."""
    lines = ["key                 total  free  pending"]
    for key, q in sorted(summary["queue_info"].items()):
        lines.append(f"{key:<20}{q['total']:>5}{q['free']:>6}{q['pending']:>9}")
    if summary["server_info"]:
        lines.append("")
        lines.append("server                        key                 state    machine")
        for s in summary["server_info"]:
            state = "free" if s["free"] else ",".join(l["state"] for l in s["leases"]) or "busy"
            lines.append(f"{s['host'] + ':' + str(s['port']):<30}{s['key']:<20}{state:<9}"
                         f"{s.get('machine') or ''}")
    return "\n".join(lines)


def main(argv=None, prog: str = "python -m tilecraft.rpc.tracker") -> int:
    """The tracker's command line (also ``tilecraft rpc tracker``, with its ``prog``)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9190, help="port (0: any free port; default 9190)")
    p.add_argument("--summary", action="store_true",
                   help="ask the tracker running at --host:--port for its summary and exit")
    p.add_argument("--json", action="store_true", help="with --summary: print JSON")
    p.add_argument("--ping-interval", type=float, default=5.0, help="health-check period (5 s)")
    p.add_argument("--ping-timeout", type=float, default=5.0,
                   help="drop a server that does not answer a ping within this (5 s)")
    p.add_argument("--lease-timeout", type=float, default=10.0,
                   help="return a leased server to the pool if its client does not connect "
                        "within this (10 s)")
    p.add_argument("--token-file", metavar="FILE",
                   help="the tracker's own secret: clients and boards must prove they hold it "
                        "(with --summary: the token to ask with)")
    p.add_argument("--board-token-file", metavar="[KEY=]FILE", action="append", default=[],
                   help="the boards' token, which a board's registration must prove; KEY=FILE "
                        "for the boards of one key (repeatable). Required with --token-file")
    p.add_argument("--insecure-local", action="store_true",
                   help="serve without a token, on loopback only (any local user can then "
                        "register boards or take them)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")
    try:
        token = load_token(args.token_file) if args.token_file else None
        board_tokens = {}
        for spec in args.board_token_file:
            # FILE (every key), or KEY=FILE; a file whose name has a "=" is named as it is
            key, sep, path = (None, "", spec) if os.path.isfile(spec) else spec.partition("=")
            board_tokens[key if sep else None] = load_token(path if sep else spec)
    except (OSError, ValueError) as err:
        print(f"rpc.tracker: error: {err}", file=sys.stderr)
        return 2
    if args.summary:
        try:
            summary = TrackerClient(args.host, args.port, token=token).summary()
        except (RPCError, OSError) as err:
            print(f"rpc.tracker: cannot get a summary from {args.host}:{args.port}: {err}",
                  file=sys.stderr)
            return 1
        print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
        return 0
    try:
        tracker = Tracker(args.host, args.port, token=token, board_tokens=board_tokens,
                          insecure_local=args.insecure_local, ping_interval=args.ping_interval,
                          ping_timeout=args.ping_timeout, lease_timeout=args.lease_timeout).start()
    except (AuthenticationError, OSError) as err:
        print(f"rpc.tracker: error: {err}", file=sys.stderr)
        return 2
    if token is None:
        print(f"rpc.tracker: warning: serving on {args.host} WITHOUT authentication "
              f"(--insecure-local): every user of this machine can register boards and take "
              f"them", file=sys.stderr)
    signal.signal(signal.SIGTERM, lambda signum, frame: tracker._stop.set())
    print(f"rpc tracker listening on {tracker.host}:{tracker.port}"
          f"{' auth=hmac' if token else ''}", flush=True)
    try:
        tracker.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        tracker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
