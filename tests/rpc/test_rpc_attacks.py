"""An attacker on the network, an impostor board, a malicious client: what each gets (nothing)
and that honest sessions keep working and lose no tuning record. Loopback only.

One tracker with a token of its own and the boards' token of key "attacked", one board of that
key with both tokens, limits small enough to reach, and a plugin that bombs memory and disk.
The attacker plays the protocol by hand (``rpc.protocol`` / ``rpc.auth``): a greeting that offers
no authentication (a downgrade), registrations without the boards' token (a hijack), a relay
between a client and the board (the impostor that passes the board's nonce along), frames
injected, replayed and reordered on an authenticated session, JSON and size bombs before and
after authentication, a memory bomb in a session, thousands of half-open connections. The
flood comes from other loopback addresses (127.0.0.2, 127.0.0.3) than the honest clients, as
it would come from other hosts.
"""
import os
import resource
import secrets
import shutil
import socket
import struct
import sys
import threading
import time

import numpy as np
import pytest

from tilecraft import rpc
from tilecraft.rpc import auth
from tilecraft.rpc.protocol import (AUTH, ERROR, FLAG_MAC, HEADER, HELLO, MAGIC, PAYLOAD_HEAD,
                                    REQUEST, TRAILER_SIZE, VERSION, FrameMAC, parse_payload,
                                    recv_frame, send_frame)
from tilecraft.tensorir import te

from rpc_testutil import HOST, REPO, Proc, repo_env, start_tracker, wait_until

KEY = "attacked"
ATTACKER = "127.0.0.2"      # the flood's source addresses (the honest clients use 127.0.0.1)
ATTACKER_2 = "127.0.0.3"

BOMB_PLUGIN = '''
import os
import numpy as np
from tilecraft.rpc.worker import register_op


def allocate(ctx, args, arrays):
    """Allocate (and touch) step_mb at a time until total_mb: a memory bomb."""
    held = [np.ones(args["step_mb"] << 20, np.uint8)
            for _ in range(args["total_mb"] // args["step_mb"])]
    return {"held_mb": len(held) * args["step_mb"]}


def write(ctx, args, arrays):
    """Write mb MiB into one file of the session's directory: a disk bomb."""
    with open(os.path.join(ctx.workdir, "bomb.bin"), "wb") as f:
        for _ in range(args["mb"]):
            f.write(b"\\0" * (1 << 20))
    return {}


register_op("bomb.allocate", allocate)
register_op("bomb.write", write)
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Token files, the bomb plugin, and the board's session directory."""
    d = tmp_path_factory.mktemp("attacks")
    for name in ("board.token", "tracker.token", "other.token"):
        (d / name).write_text(secrets.token_hex(32))
    (d / "bomb_plugin.py").write_text(BOMB_PLUGIN)
    (d / "sessions").mkdir()
    return d


def token(site, name: str) -> str:
    return (site / name).read_text().strip()


@pytest.fixture(scope="module")
def tracker(site):
    """Key "attacked" needs the board token; any other key the "other" token."""
    p = start_tracker("--token-file", str(site / "tracker.token"),
                      "--board-token-file", f"{KEY}={site / 'board.token'}",
                      "--board-token-file", str(site / "other.token"),
                      "--ping-interval", "0.5", "--ping-timeout", "3", "--lease-timeout", "3")
    yield p
    p.stop()


@pytest.fixture(scope="module")
def board(site, tracker):
    env = repo_env(PYTHONPATH=f"{REPO}{os.pathsep}{site}")
    p = Proc([sys.executable, "-m", "tilecraft.rpc.server", "--host", HOST, "--port", "0",
              "--key", KEY, "-v", "--token-file", str(site / "board.token"),
              "--tracker", f"{HOST}:{tracker.port}", "--tracker-retry", "0.2",
              "--tracker-token-file", str(site / "tracker.token"),
              "--plugin", "bomb_plugin", "--work-dir", str(site / "sessions"),
              "--max-sessions", "4", "--handshake-timeout", "2", "--frame-timeout", "2",
              "--max-upload-mb", "8", "--max-array-mb", "8", "--max-memory-mb", "32",
              "--session-memory-mb", "192", "--max-disk-mb", "16"], env=env)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def client(site, tracker, board):
    c = rpc.connect_tracker(HOST, tracker.port, token=token(site, "tracker.token"))
    wait_until(lambda: c.summary()["queue_info"].get(KEY, {}).get("free") == 1, 20,
               "the board to register")
    return c


def honest_session(site, board, **kw) -> rpc.Session:
    return rpc.connect(HOST, board.port, token=token(site, "board.token"), timeout=10, **kw)


def assert_honest_work(site, client, board):
    """The board, directly and through the tracker, runs a kernel right; it is the only board
    of its key and the tracker holds no stray lease."""
    assert board.alive(), board.stderr()
    x = np.random.default_rng().standard_normal(6).astype("float32")
    with honest_session(site, board) as s:
        np.testing.assert_array_equal(s.array(x).numpy(), x)
    with client.request(KEY, timeout=20, token=token(site, "board.token")) as s:
        assert s.authenticated and s.key == KEY
        np.testing.assert_array_equal(s.array(x).numpy(), x)
    servers = [s for s in client.summary()["server_info"] if s["key"] == KEY]
    assert [(s["host"], s["port"]) for s in servers] == [(HOST, board.port)]


# -- frames by hand ---------------------------------------------------------------------------------
def frame_bytes(ftype: int, meta: dict, mac: FrameMAC | None = None) -> bytes:
    """What ``send_frame`` puts on the wire (``mac``'s sequence number advances)."""
    a, b = socket.socketpair()
    try:
        send_frame(a, ftype, meta, mac=mac)
        a.close()
        return b"".join(iter(lambda: b.recv(1 << 16), b""))
    finally:
        b.close()


def raw_meta_frame(ftype: int, meta: bytes, mac: FrameMAC | None = None) -> bytes:
    """A frame whose metadata are the given bytes (JSON no encoder would write)."""
    payload = PAYLOAD_HEAD.pack(len(meta), 0) + meta
    header = HEADER.pack(MAGIC, VERSION, ftype, FLAG_MAC if mac else 0, len(payload))
    if mac is None:
        return header + payload
    tag = mac.tag(header, [payload], mac.seq)
    seq, mac.seq = mac.seq, mac.seq + 1
    return header + payload + struct.pack("!Q", seq) + tag


def read_raw_frame(sock: socket.socket) -> bytes | None:
    """One whole frame off a stream, as bytes; None at the end of the stream."""
    def exact(n):
        data = b""
        while len(data) < n:
            try:
                chunk = sock.recv(n - len(data))
            except OSError:
                return None
            if not chunk:
                return None
            data += chunk
        return data
    head = exact(HEADER.size)
    if head is None:
        return None
    _, _, _, flags, length = HEADER.unpack(head)
    rest = exact(length + (TRAILER_SIZE if flags & FLAG_MAC else 0))
    return None if rest is None else head + rest


def frame_meta(data: bytes) -> tuple[int, dict]:
    """``(type, meta)`` of a frame's bytes, read as any onlooker can (frames are not secret)."""
    _, _, ftype, _, length = HEADER.unpack(data[:HEADER.size])
    return ftype, parse_payload(ftype, data[HEADER.size:HEADER.size + length]).meta


class Relay:
    """A man in the middle between one client and the board: it passes the board's HELLO (and
    nonce) to the client and the client's proof to the board, so the session is opened through
    it; it sees every frame, and can hold, inject, replay and reorder the client's."""

    def __init__(self, upstream: int):
        self.listener = socket.create_server((HOST, 0))
        self.port = self.listener.getsockname()[1]
        self.upstream = upstream
        self.to_board: list[bytes] = []     # frames of the client, as the relay saw them
        self.to_client: list[bytes] = []    # frames of the board
        self.hold = False
        self.held: list[bytes] = []
        self.up = None
        self.ready = threading.Event()
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        client, _ = self.listener.accept()
        self.up = socket.create_connection((HOST, self.upstream))
        self.ready.set()
        threading.Thread(target=self._pump_back, args=(client,), daemon=True).start()
        try:
            while (frame := read_raw_frame(client)) is not None:
                self.to_board.append(frame)
                if self.hold:
                    self.held.append(frame)
                else:
                    self.up.sendall(frame)
        except OSError:   # the board ended the session
            pass
        client.close()

    def _pump_back(self, client):
        try:
            while (frame := read_raw_frame(self.up)) is not None:
                self.to_client.append(frame)
                client.sendall(frame)
        except OSError:
            pass
        finally:
            self.done.set()
            try:
                client.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def inject(self, data: bytes) -> None:
        self.up.sendall(data)

    def board_said_after(self, n: int, timeout: float = 5.0) -> list[tuple[int, dict]]:
        """The frames the board sent after its first ``n``, once it closed the session."""
        assert self.done.wait(timeout), "the board did not end the session"
        return [frame_meta(f) for f in self.to_client[n:]]

    def close(self):
        self.listener.close()
        if self.up is not None:
            self.up.close()


# -- downgrades and impostors -----------------------------------------------------------------------
def fake_server(hello: dict, seen: list):
    """A server that greets with ``hello`` and records whatever the client sends."""
    listener = socket.create_server((HOST, 0))

    def serve():
        conn, _ = listener.accept()
        send_frame(conn, HELLO, hello)
        conn.settimeout(5)
        data = b""
        try:
            while chunk := conn.recv(1 << 16):
                data += chunk
        except OSError:
            pass
        seen.append(data)
        conn.close()
        listener.close()
    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def test_a_client_with_a_token_refuses_a_downgrade_and_sends_nothing(site, client, board):
    nonce = os.urandom(32).hex()
    for role, connect in (("tilecraft-rpc", lambda port: rpc.connect(
            HOST, port, token=token(site, "board.token"), timeout=5)),
                          ("tilecraft-tracker", lambda port: rpc.connect_tracker(
                              HOST, port, token=token(site, "tracker.token")).summary())):
        seen = []
        port = fake_server({"server": role, "protocol": VERSION, "key": KEY, "nonce": nonce,
                            "auth": "none"}, seen)
        with pytest.raises(rpc.AuthenticationError, match="does not authenticate"):
            connect(port)
        wait_until(lambda: seen, 5, "the fake server to finish")
        assert seen == [b""]          # the attacker got not even an AUTH frame
    # and the real ones refuse clients without their tokens
    with pytest.raises(rpc.AuthenticationError, match="requires a token"):
        rpc.connect(HOST, board.port, timeout=5)
    with pytest.raises(rpc.AuthenticationError, match="requires a token"):
        rpc.connect_tracker(HOST, client.port).summary()
    with pytest.raises(rpc.AuthenticationError, match="proof was missing or wrong"):
        rpc.connect_tracker(HOST, client.port, token="guess").summary()


def register_by_hand(tracker_port: int, tracker_token, meta: dict, board_token=None) -> dict:
    """An attacker's registration; returns the tracker's answer (an ERROR's metadata)."""
    s = socket.create_connection((HOST, tracker_port), timeout=5)
    try:
        channel, _, _, t = auth.client_handshake(
            s, auth.as_token(tracker_token), server="tilecraft-tracker", timeout=5,
            remote_error=lambda m: rpc.AuthenticationError(m.get("message")))
        if board_token is not None:
            meta = dict(meta, proof=auth.registration_proof(
                auth.as_token(board_token), t, meta["key"], meta["host"], meta["port"]).hex())
        channel.send(REQUEST, meta)
        frame = channel.recv(timeout=5)
        return {"frame": frame.type_name, **frame.meta}
    finally:
        s.close()


def test_an_impostor_cannot_register_a_key_or_take_a_boards_place(site, client, board, tracker):
    hijack = {"op": "register", "key": KEY, "host": HOST, "port": board.port, "slots": 1}
    # no tracker token: not even the handshake
    with pytest.raises(rpc.AuthenticationError, match="requires a token"):
        register_by_hand(tracker.port, None, hijack)
    with pytest.raises(rpc.AuthenticationError, match="proof was missing or wrong"):
        register_by_hand(tracker.port, "guess", hijack)
    # the tracker's token, but not the boards': no proof, a made-up proof, another key's token
    answers = [register_by_hand(tracker.port, token(site, "tracker.token"), hijack),
               register_by_hand(tracker.port, token(site, "tracker.token"),
                                dict(hijack, proof="ab" * 32)),
               register_by_hand(tracker.port, token(site, "tracker.token"), hijack,
                                board_token=token(site, "other.token")),
               register_by_hand(tracker.port, token(site, "tracker.token"),
                                dict(hijack, port=board.port + 1),
                                board_token=token(site, "other.token"))]
    for answer in answers:
        assert answer["frame"] == "ERROR" and answer["type"] == "AuthenticationError"
        assert "proof of the boards' token for key 'attacked' is missing or wrong" in \
            answer["message"]
    assert_honest_work(site, client, board)


def test_a_relay_gets_a_session_it_cannot_use(site, client, board):
    """The impostor passes the board's nonce to the client and the client's proof to the
    board: the session opens, but the relay holds no key, so the frame it injects is refused
    and it learns nothing but an ERROR."""
    relay = Relay(board.port)
    try:
        sess = rpc.connect(HOST, relay.port, token=token(site, "board.token"), timeout=10)
        assert sess.authenticated and sess.info()["machine"]
        seen = len(relay.to_client)
        relay.inject(raw_meta_frame(REQUEST, b'{"op":"upload","name":"evil.so"}',
                                    FrameMAC(os.urandom(32), 1)))
        said = relay.board_said_after(seen)
        assert [t for t, _ in said] == [ERROR]
        assert "failed authentication" in said[0][1]["message"]
        with pytest.raises(rpc.SessionLost, match="failed authentication"):
            sess.info()
    finally:
        relay.close()
    assert_honest_work(site, client, board)


@pytest.mark.parametrize("attack, message", [
    ("inject a frame without a MAC", "without a MAC on an authenticated connection"),
    ("replay the client's last frame", "out of sequence: number 1, expected 2"),
    ("replay a frame of another session", "failed authentication"),
    ("reorder two frames", "out of sequence: number 3, expected 2"),
])
def test_injected_replayed_and_reordered_frames_end_the_session(site, client, board, attack,
                                                                message):
    relay = Relay(board.port)
    try:
        sess = rpc.connect(HOST, relay.port, token=token(site, "board.token"), timeout=10)
        sess.info()
        sess.info()
        seen = len(relay.to_client)
        if attack == "inject a frame without a MAC":
            relay.inject(raw_meta_frame(REQUEST, b'{"op":"close"}'))
        elif attack == "replay the client's last frame":
            relay.inject(relay.to_board[-1])
        elif attack == "replay a frame of another session":
            other = Relay(board.port)
            with rpc.connect(HOST, other.port, token=token(site, "board.token"),
                             timeout=10) as s2:
                s2.info()
            other.close()
            relay.inject(other.to_board[1])   # its first request ([0] is its AUTH)
        else:   # the client pipelines two requests; the attacker swaps them
            relay.hold = True
            sess._channel.send(REQUEST, {"op": "info"})
            sess._channel.send(REQUEST, {"op": "free", "handles": []})
            wait_until(lambda: len(relay.held) == 2, 5, "both frames at the relay")
            relay.inject(relay.held[1] + relay.held[0])
        said = relay.board_said_after(seen)
        assert [t for t, _ in said] == [ERROR], said
        assert message in said[0][1]["message"]
    finally:
        relay.close()
    assert_honest_work(site, client, board)


# -- bombs ----------------------------------------------------------------------------------------
def hello_then(port: int, data: bytes, source: str | None = None) -> dict:
    """Read the HELLO, send ``data``; the server's answer: an ERROR's metadata (or "closed")."""
    s = socket.create_connection((HOST, port), timeout=5,
                                 source_address=(source, 0) if source else None)
    try:
        assert recv_frame(s, timeout=5).type == HELLO
        s.sendall(data)
        frame = recv_frame(s, timeout=5)
        assert frame.type == ERROR
        return frame.meta
    finally:
        s.close()


def test_json_and_size_bombs_before_authentication(site, client, board, tracker):
    nested = raw_meta_frame(AUTH, b'{"nonce":' + b"[" * 50_000 + b"}")     # the 50 KB
    number = raw_meta_frame(AUTH, b'{"nonce":' + b"7" * 60_000 + b"}")
    too_big = HEADER.pack(MAGIC, VERSION, AUTH, 0, 0xFFFFFFF0)
    for port in (board.port, tracker.port):
        assert "nests 50001 levels deep" in hello_then(port, nested)["message"]
        assert "more than 100 digits" in hello_then(port, number)["message"]
        t0 = time.monotonic()
        assert "exceeds" in hello_then(port, too_big)["message"]
        assert time.monotonic() - t0 < 2      # refused on its header, nothing allocated
    assert_honest_work(site, client, board)


def test_json_and_size_bombs_from_an_authenticated_client(site, client, board):
    with honest_session(site, board) as sess:
        mac = sess._channel.send_mac
        sess._channel.sock.sendall(raw_meta_frame(
            REQUEST, b'{"op":"info","x":' + b"[" * 20_000 + b"]" * 20_000 + b"}", mac))
        with pytest.raises(rpc.SessionLost, match="nests 20001 levels deep"):
            sess.info()
    with honest_session(site, board) as sess:
        header = HEADER.pack(MAGIC, VERSION, REQUEST, FLAG_MAC, 0xFFFFFFF0)
        sess._channel.sock.sendall(header)
        with pytest.raises(rpc.SessionLost, match="exceeds the"):
            sess.info()
    assert_honest_work(site, client, board)


def test_memory_and_disk_bombs_end_only_their_session(site, client, board):
    with honest_session(site, board) as sess:
        # within the session's limits: refused before allocating, and the session goes on
        kept = [sess.empty((1 << 20,), "float32") for _ in range(7)]      # 28 of 32 MiB
        with pytest.raises(MemoryError, match="limit is 33554432"):
            sess.empty((1 << 21,), "float32")
        with pytest.raises(MemoryError, match="session's files"):
            for i in range(3):
                sess.upload(b"\0" * (7 << 20), f"f{i}.bin")               # 21 > 16 MiB
        with pytest.raises(OSError, match="too large"):                  # EFBIG: RLIMIT_FSIZE
            sess.call_plugin("bomb.write", mb=24)
        del kept
        assert sess.info()["machine"]
        # past the address space limit (192 MiB): the session ends, saying why
        t0 = time.monotonic()
        with pytest.raises(rpc.SessionLost, match="ran out of memory.*192 MiB"):
            sess.call_plugin("bomb.allocate", total_mb=2048, step_mb=16)
        assert time.monotonic() - t0 < 20
    wait_until(lambda: not os.listdir(site / "sessions"), 10, "the session directories to go")
    assert_honest_work(site, client, board)


# -- floods ---------------------------------------------------------------------------------------
def _raise_fd_limit(want: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    return soft


def flood(port: int, count: int, source: str) -> list[socket.socket]:
    """``count`` connections from ``source`` that never finish a handshake (half of them send
    half a frame header)."""
    socks = []
    for i in range(count):
        s = socket.create_connection((HOST, port), timeout=5, source_address=(source, 0))
        socks.append(s)
        if i % 2:
            try:
                s.send(b"TCRP\x02")
            except OSError:
                pass
        s.setblocking(False)
    return socks


def first_words(socks: list[socket.socket], timeout: float = 10.0) -> dict:
    """What the server said first on each connection: ``{"refused": n, "greeted": n,
    "silent": n}`` (refused: an ERROR saying it is busy; greeted: a HELLO)."""
    out = {"refused": 0, "greeted": 0, "silent": 0}
    deadline = time.monotonic() + timeout
    for s in socks:
        data = b""
        while len(data) < HEADER.size and time.monotonic() < deadline:
            try:
                chunk = s.recv(1 << 16, socket.MSG_PEEK)
            except BlockingIOError:
                time.sleep(0.01)
                continue
            except OSError:
                break
            if not chunk:
                break
            data = chunk
        if len(data) < HEADER.size:
            out["silent"] += 1
        elif HEADER.unpack(data[:HEADER.size])[2] == HELLO:
            out["greeted"] += 1
        else:
            assert b"busy" in data, data[:200]
            out["refused"] += 1
    return out


def test_thousands_of_half_open_connections_lock_nobody_out(site, client, board, tracker):
    n = min(1500, (_raise_fd_limit(4096) - 200) // 2)
    held = []
    try:
        t0 = time.monotonic()
        at_board = flood(board.port, n, ATTACKER)
        held += at_board
        at_tracker = flood(tracker.port, n, ATTACKER_2)
        held += at_tracker
        # while they are open, honest clients are served, directly and through the tracker
        for _ in range(3):
            t1 = time.monotonic()
            assert_honest_work(site, client, board)
            assert time.monotonic() - t1 < 10
        assert time.monotonic() - t0 < 60
        # each server let a few of them start a handshake (8 at a time from one address,
        # each for at most the handshake timeout) and refused the rest at once
        for socks in (at_board, at_tracker):
            words = first_words(socks)
            assert words["refused"] >= n - 100 and words["silent"] == 0, words
    finally:
        for s in held:
            s.close()
    assert_honest_work(site, client, board)


# -- an honest tuning run under attack --------------------------------------------------------------
def gemm(n: int):
    A = te.placeholder((n, n), "float32", "A")
    B = te.placeholder((n, n), "float32", "B")
    k = te.reduce_axis((0, n), "k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    return te.create_prim_func([A, B, C])


def _attacker(site, board, tracker, stop: threading.Event, errors: list, counts: dict):
    """Every attack above, round after round, until ``stop``."""
    tracker_token = token(site, "tracker.token")
    hijack = {"op": "register", "key": KEY, "host": HOST, "port": board.port, "slots": 1}
    while not stop.is_set():
        try:
            answer = register_by_hand(tracker.port, tracker_token, hijack,
                                      board_token=token(site, "other.token"))
            assert answer["frame"] == "ERROR"
            for port in (board.port, tracker.port):
                assert "levels deep" in hello_then(
                    port, raw_meta_frame(AUTH, b'{"n":' + b"[" * 5000 + b"}"), ATTACKER)[
                    "message"]
            socks = flood(board.port, 40, ATTACKER)
            more = flood(tracker.port, 40, ATTACKER_2)
            time.sleep(0.2)
            for s in socks + more:
                s.close()
            counts["rounds"] = counts.get("rounds", 0) + 1
        except Exception as err:  # noqa: BLE001 - reported by the test
            errors.append(f"{type(err).__name__}: {err}")
            return


@pytest.mark.skipif(shutil.which("ld.lld") is None, reason="ld.lld not installed")
def test_an_honest_tuning_run_under_attack_loses_no_record(site, client, board, tracker,
                                                           tmp_path):
    from tilecraft.metaschedule import (AutoInline, LocalBuilder, MultiLevelTiling,
                                        ParallelVectorizeUnroll, SpaceGenerator, tune_tir)
    from tilecraft.metaschedule.rpc_runner import RPCRunner
    space = SpaceGenerator(rules=[AutoInline(), MultiLevelTiling("SSRSRS", max_innermost_factor=8),
                                  ParallelVectorizeUnroll(max_jobs_per_core=16,
                                                          max_vectorize_extent=8,
                                                          unroll_max_steps=(0, 8))])
    runner = RPCRunner((HOST, tracker.port), KEY, token=token(site, "board.token"),
                       tracker_token=token(site, "tracker.token"), timeout_sec=10, number=1,
                       repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False,
                       request_timeout=30)
    stop, errors, counts = threading.Event(), [], {}
    attacker = threading.Thread(target=_attacker,
                                args=(site, board, tracker, stop, errors, counts), daemon=True)
    attacker.start()
    try:
        with LocalBuilder(max_workers=1) as builder:
            db = tune_tir(gemm(32), "llvm", max_trials=4, work_dir=tmp_path,
                          num_trials_per_iter=2, builder=builder, runner=runner, space=space,
                          seed=3, progress=False, remeasure=0,
                          search={"population_size": 8, "genetic_num_iters": 1})
    finally:
        stop.set()
        attacker.join(30)
    assert not errors, errors
    assert counts.get("rounds", 0) >= 1
    records = db.get_all_tuning_records()
    assert len(records) == 4
    assert all(r.ok and r.checked for r in records), [(r.error, r.checked) for r in records]
    assert_honest_work(site, client, board)
