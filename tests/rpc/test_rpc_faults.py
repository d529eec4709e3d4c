"""Bad input and faults: each is handled without losing the server (loopback only).

Junk bytes, absurd length prefixes, half-sent frames, a client vanishing mid-upload, corrupt
libraries, a kernel that segfaults, one that never returns, an idle client. After each, a fresh
session must still work, and no session slot or session directory may leak.
"""
import os
import socket
import struct
import time

import numpy as np
import pytest

from tilecraft import rpc
from tilecraft import targets
from tilecraft.rpc.auth import client_handshake
from tilecraft.rpc.protocol import (AUTH, ERROR, HEADER, HELLO, MAGIC, REQUEST, VERSION,
                                    encode_frame, recv_frame)

from rpc_testutil import HOST, axpb_func, start_server, wait_until


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("rpc-sessions")


@pytest.fixture(scope="module")
def server(workdir):
    p = start_server("--max-sessions", "2", "--handshake-timeout", "2", "--frame-timeout", "1",
                     "--session-timeout", "2", "--max-call-seconds", "20",
                     "--max-upload-mb", "4", "--work-dir", str(workdir), key="faults")
    yield p
    p.stop()


def assert_serving(server, workdir=None):
    """The server is alive, has a free slot for two sessions, and runs requests."""
    assert server.alive(), server.stderr()
    with rpc.connect(HOST, server.port, timeout=10) as s1, \
            rpc.connect(HOST, server.port, timeout=10) as s2:
        x = np.arange(6, dtype="float32")
        np.testing.assert_array_equal(s1.array(x).numpy(), x)
        assert s2.info()["machine"]
    if workdir is not None:  # every session directory is removed once its session is over
        wait_until(lambda: not os.listdir(workdir), 10, f"session directories in {workdir} to go")


def raw_session(port: int) -> socket.socket:
    """A session opened by hand (no token: the server is --insecure-local), as a socket."""
    s = socket.create_connection((HOST, port), timeout=5)
    client_handshake(s, None, server="tilecraft-rpc", auth={"ticket": None}, timeout=5)
    return s


def error_then_close(s: socket.socket, timeout: float = 5.0) -> str:
    """The server's ERROR frame, then the end of the connection; returns the message."""
    frame = recv_frame(s, timeout=timeout)
    assert frame.type == ERROR, frame
    s.settimeout(timeout)
    assert s.recv(100) == b""
    s.close()
    return frame.meta["message"]


def header(length: int, ftype: int = REQUEST) -> bytes:
    return HEADER.pack(MAGIC, VERSION, ftype, 0, length)


JUNK = b"GET / HTTP/1.1\r\nHost: board\r\n\r\n" + bytes(range(256))


def test_junk_bytes_in_the_handshake(server, workdir):
    s = socket.create_connection((HOST, server.port), timeout=5)
    assert recv_frame(s, timeout=5).type == HELLO
    s.sendall(JUNK)
    assert "bad frame magic" in error_then_close(s)
    s = socket.create_connection((HOST, server.port), timeout=5)  # junk before even reading
    s.sendall(os.urandom(5000))
    s.close()
    assert_serving(server, workdir)


def test_junk_bytes_in_a_session(server, workdir):
    s = raw_session(server.port)
    s.sendall(JUNK)
    assert "bad frame magic" in error_then_close(s)
    assert_serving(server, workdir)


def test_absurd_length_prefixes(server, workdir):
    t0 = time.monotonic()
    s = socket.create_connection((HOST, server.port), timeout=5)
    recv_frame(s, timeout=5)
    s.sendall(header(0xFFFFFFFF, AUTH))
    assert "exceeds" in error_then_close(s)
    s = raw_session(server.port)
    s.sendall(header(0xFFFFFFFF))
    assert "exceeds" in error_then_close(s)
    s = raw_session(server.port)
    s.sendall(header(5))  # shorter than any payload
    assert "shorter than" in error_then_close(s)
    s = raw_session(server.port)  # a payload whose inner lengths lie
    s.sendall(header(6 + 8) + struct.pack("!IHQ", 0, 1, 1 << 60))
    assert "do not add up" in error_then_close(s)
    assert time.monotonic() - t0 < 5  # refused at once, not after reading gigabytes
    assert_serving(server, workdir)


def test_half_sent_frames_time_out_without_blocking_others(server, workdir):
    stalled = socket.create_connection((HOST, server.port), timeout=5)
    recv_frame(stalled, timeout=5)
    frame = b"".join(encode_frame(AUTH, {"ticket": None}))
    stalled.sendall(frame[:7])  # half a header, then nothing
    in_session = raw_session(server.port)
    in_session.sendall(b"".join(encode_frame(REQUEST, {"op": "info"}))[:20])
    t0 = time.monotonic()
    with rpc.connect(HOST, server.port, timeout=5) as s:  # others are served meanwhile
        assert s.info()["machine"]
    assert time.monotonic() - t0 < 1.5
    assert "timed out" in error_then_close(stalled)      # the handshake timeout (2 s)
    assert "timed out" in error_then_close(in_session)   # the frame timeout (1 s)
    assert_serving(server, workdir)


def test_client_vanishing_mid_upload(server, workdir, kernel_lib):
    for sent in (0, 1000, 300_000):
        s = raw_session(server.port)
        pieces = encode_frame(REQUEST, {"op": "upload", "name": "big.so"}, [b"\x7fELF" * 250_000])
        data = b"".join(bytes(p) for p in pieces)
        s.sendall(data[:HEADER.size + sent])
        s.close()
    s = raw_session(server.port)  # a reset connection, not a clean close
    s.sendall(header(1_000_000))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    assert_serving(server, workdir)


def test_corrupt_library_uploads(server, workdir, kernel_lib, rng):
    with rpc.connect(HOST, server.port) as sess:
        sess.upload(rng.bytes(20_000), "random.so")
        with pytest.raises(rpc.RemoteError, match="cannot load kernel library") as info:
            sess.load_module("random.so")
        assert info.value.remote_type == "RuntimeError"
        sess.upload(b"\x7fELF" + rng.bytes(3000), "fake-elf.so")
        with pytest.raises(rpc.RPCError):
            sess.load_module("fake-elf.so")
        # a library for another machine is refused by its ELF header, before loading
        path = os.path.join(str(workdir), "..", "a64.so")
        targets.build(axpb_func(), "llvm -mtriple=aarch64-linux-gnu").export_library(path)
        sess.upload(path, "a64.so")
        with pytest.raises(rpc.RemoteError, match="cannot run on this machine"):
            sess.load_module("a64.so")
        sess.upload(b"", "empty.so")
        with pytest.raises(rpc.RemoteError):
            sess.load_module("empty.so")
        # the session is still good
        mod = sess.load_module(sess.upload(kernel_lib))
        a, b = sess.array(np.ones((2, 7), "float32")), sess.empty((2, 7), "float32")
        mod["main"](a, b, 1.0)
        np.testing.assert_array_equal(b.numpy(), np.full((2, 7), 3, "float32"))
    with rpc.connect(HOST, server.port) as sess:  # half a real library: may crash the loader
        with open(kernel_lib, "rb") as f:
            data = f.read()
        sess.upload(data[: len(data) // 2], "truncated.so")
        with pytest.raises(rpc.RPCError):
            sess.load_module("truncated.so")
    assert_serving(server, workdir)


def test_a_segfaulting_kernel_ends_the_session_not_the_server(server, workdir, faulty_lib):
    with rpc.connect(HOST, server.port) as sess:
        mod = sess.load_module(sess.upload(faulty_lib))
        mod["ok"]()
        with pytest.raises(rpc.SessionLost, match="segmentation fault"):
            mod["crash"]()
        assert sess.closed
        with pytest.raises(rpc.SessionLost):
            sess.info()
    with rpc.connect(HOST, server.port) as sess:  # timing a crashing kernel: the same
        mod = sess.load_module(sess.upload(faulty_lib))
        with pytest.raises(rpc.SessionLost, match="SIGSEGV"):
            mod.time_evaluator("crash", sess.cpu(0), number=3)()
    assert_serving(server, workdir)


def test_a_kernel_that_never_returns_is_killed_after_its_timeout(server, workdir, faulty_lib):
    with rpc.connect(HOST, server.port, call_timeout=30) as sess:
        mod = sess.load_module(sess.upload(faulty_lib))
        t0 = time.monotonic()
        with pytest.raises(rpc.SessionLost, match="time limit"):
            mod["spin"](timeout=0.5)
        assert time.monotonic() - t0 < 5
    with rpc.connect(HOST, server.port, call_timeout=0.5) as sess:
        mod = sess.load_module(sess.upload(faulty_lib))
        t0 = time.monotonic()
        with pytest.raises(rpc.SessionLost, match="time limit"):
            mod.time_evaluator("spin", sess.cpu(0))()
        assert time.monotonic() - t0 < 5
    assert_serving(server, workdir)


def test_idle_sessions_are_closed_by_the_server(server, workdir):
    sess = rpc.connect(HOST, server.port)
    assert sess.info()["machine"]
    time.sleep(2.6)  # the server's --session-timeout is 2 s
    with pytest.raises(rpc.SessionLost, match="idle"):
        sess.info()
    assert_serving(server, workdir)


def test_unknown_operations_and_bad_arguments_are_errors_not_crashes(server, workdir):
    with rpc.connect(HOST, server.port) as sess:
        for meta, message in [({"op": "format_disk"}, "unknown operation"),
                              ({"op": 42}, "unknown operation"),
                              ({"op": "call", "module": 999, "function": "main"}, "no module"),
                              ({"op": "get", "handle": "x"}, "no array"),
                              ({"op": "array", "dtype": "float32", "shape": [-3]}, "non-negative"),
                              ({"op": "time", "module": 1, "function": "f", "number": -1},
                               "no module"),
                              ({"op": "upload", "name": "a.so"}, "exactly one blob")]:
            with pytest.raises(rpc.RPCError, match=message):
                sess._request(meta.pop("op"), meta)
        arr = sess.array(np.ones(2, "float32"))
        with pytest.raises(rpc.RemoteError, match="not a module"):
            sess._request("call", {"module": arr.handle, "function": "main", "args": []})
        assert sess.info()["machine"]
    assert_serving(server, workdir)
