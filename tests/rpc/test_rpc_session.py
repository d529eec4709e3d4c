"""Sessions on a loopback server: uploads, modules, arrays, calls, timing, limits, tokens."""
import gc
import os
import socket
import tempfile
import threading

import numpy as np
import pytest

from tilecraft import rpc
from tilecraft import targets
from tilecraft.rpc import auth
from tilecraft.rpc.protocol import (AUTH, HELLO, VERSION, WELCOME, FrameMAC, recv_frame,
                                    send_frame)

from rpc_testutil import HOST, start_server


@pytest.fixture(scope="module")
def server():
    p = start_server("--max-upload-mb", "2", "--max-array-mb", "2", "--max-memory-mb", "5",
                     "--max-sessions", "3", key="session-test")
    yield p
    p.stop()


@pytest.fixture
def sess(server):
    with rpc.connect(HOST, server.port, timeout=10) as s:
        yield s


def test_kernel_runs_remotely_like_locally(sess, kernel_lib, rng):
    assert sess.upload(kernel_lib) == "axpb.so"
    mod = sess.load_module("axpb.so")
    assert mod.function_names == ["main"] and mod.entry_name == "main"
    assert mod.metadata["abi_version"] == 1
    local = targets.load_module(kernel_lib)
    dev = sess.cpu(0)
    for rows in (1, 3, 17, 64):
        x = rng.standard_normal((rows, 7)).astype("float32")
        c = float(rng.standard_normal())
        a = sess.array(x, dev)
        b = sess.empty((rows, 7), "float32", dev)
        assert (a.shape, a.dtype, b.shape) == ((rows, 7), "float32", (rows, 7))
        mod["main"](a, b, c)
        want = np.empty_like(x)
        local["main"](x, want, c)
        np.testing.assert_array_equal(b.numpy(), want)
        np.testing.assert_allclose(b.numpy(), x * 2 + np.float32(c), rtol=1e-6, atol=1e-6)
    mod(a, b, np.float32(0.5))  # the entry function, numpy scalars
    np.testing.assert_allclose(b.numpy(), x * 2 + 0.5, rtol=1e-6)


def test_time_evaluator_returns_board_seconds(sess, kernel_lib, rng):
    mod = sess.load_module(sess.upload(kernel_lib))
    x = rng.standard_normal((256, 7)).astype("float32")
    a, b = sess.array(x), sess.empty((256, 7), "float32")
    res = mod.time_evaluator("main", sess.cpu(0), number=20, repeat=4)(a, b, 1.0)
    assert isinstance(res, targets.BenchmarkResult)
    assert len(res.results) == 4 and all(0 < t < 0.1 for t in res.results)
    assert res.min <= res.median <= res.max
    np.testing.assert_allclose(b.numpy(), x * 2 + 1, rtol=1e-6)
    res = mod.time_evaluator("main", sess.cpu(0), number=1, repeat=1, min_repeat_ms=5)(a, b, 1.0)
    assert res.mean > 0
    with pytest.raises(ValueError, match="number and repeat"):
        mod.time_evaluator("main", sess.cpu(0), number=0)


def test_kernel_errors_come_back_as_value_errors_and_the_session_goes_on(sess, kernel_lib, rng):
    mod = sess.load_module(sess.upload(kernel_lib))
    a = sess.array(rng.standard_normal((5, 7)).astype("float32"))
    with pytest.raises(ValueError, match="argument B: dimension 0 has extent 4, expected n = 5"):
        mod["main"](a, sess.empty((4, 7), "float32"), 1.0)
    with pytest.raises(ValueError, match="dtype"):
        mod["main"](a, sess.empty((5, 7), "float64"), 1.0)
    with pytest.raises(ValueError, match="takes 3|num_args|argument"):
        mod["main"](a)
    with pytest.raises(rpc.RemoteError) as info:
        mod["main"](a, sess.empty((5,), "float32"), 1.0)  # wrong rank
    assert info.value.remote_type == "ValueError"
    with pytest.raises(TypeError, match="must be a remote array or a number"):
        mod["main"](a, b"raw", 1.0)
    with pytest.raises(TypeError, match="local numpy array"):
        mod["main"](a, np.zeros((5, 7), "float32"), 1.0)
    with pytest.raises(KeyError, match="no function 'nope'"):
        mod["nope"]
    b = sess.empty((5, 7), "float32")
    mod["main"](a, b, 0.0)  # still fine
    np.testing.assert_allclose(b.numpy(), a.numpy() * 2, rtol=1e-6)


def test_arrays_round_trip_and_copyfrom(sess, rng):
    for dtype in ("float32", "float64", "int8", "uint16", "int64", "bool", "float16"):
        x = (rng.standard_normal((3, 4)) * 50).astype(dtype)
        a = sess.array(x)
        np.testing.assert_array_equal(a.numpy(), x)
        y = (rng.standard_normal((3, 4)) * 50).astype(dtype)
        a.copyfrom(y)
        np.testing.assert_array_equal(a.numpy(), y)
    with pytest.raises(ValueError, match="shape"):
        a.copyfrom(np.zeros((2, 2), "float16"))
    with pytest.raises(ValueError, match="dtype"):
        a.copyfrom(np.zeros((3, 4), "float32"))
    empty = sess.array(np.zeros((0, 5), "float32"))
    assert empty.numpy().shape == (0, 5)
    with pytest.raises(ValueError, match="unknown device kind"):
        sess.device("tpu", 0)
    # the board's OpenCL runtime (PoCL here) serves remote device arrays; without a platform the
    # board says so
    try:
        import pyopencl
        have_opencl = bool(pyopencl.get_platforms())
    except Exception:
        have_opencl = False
    if have_opencl:
        remote = sess.array(x, sess.device("opencl", 0))
        np.testing.assert_array_equal(remote.numpy(), x)
    else:
        with pytest.raises((ValueError, RuntimeError), match="(?i)opencl"):
            sess.array(x, sess.device("opencl", 0))


def test_dropped_arrays_are_freed_on_the_board(sess):
    # 5 MiB of arrays may be held at once: dropping them must give the memory back
    for _ in range(8):
        a = sess.array(np.ones((1 << 18,), "float32"))  # 1 MiB
        del a
        gc.collect()
    keep = []
    with pytest.raises(MemoryError, match="limit is 5242880"):
        for _ in range(6):
            keep.append(sess.array(np.ones((1 << 18,), "float32")))
    assert len(keep) == 5
    assert sess.info()["machine"]


def test_uploads_stay_in_the_session_directory(sess, tmp_path):
    for name in ("../evil.so", "/tmp/evil.so", "a/b.so", "..", ".", ""):
        with pytest.raises(ValueError, match="plain file name"):
            sess.upload(b"data", name)
    assert not os.path.exists("/tmp/evil.so")
    with pytest.raises(FileNotFoundError, match="no uploaded file"):
        sess.load_module("missing.so")
    with pytest.raises(ValueError, match="plain file name"):
        sess.load_module("../../usr/lib/x86_64-linux-gnu/libm.so.6")
    with pytest.raises(ValueError, match="give a name"):
        sess.upload(b"data")
    p = tmp_path / "notes.txt"
    p.write_bytes(b"hello")
    assert sess.upload(str(p)) == "notes.txt"
    assert sess.upload(p, "renamed.txt") == "renamed.txt"
    workdir = sess.info()["workdir"]
    assert workdir.startswith("tilecraft-rpc-")


def test_large_uploads_travel_in_pieces_and_arrive_whole(sess, rng, monkeypatch):
    from tilecraft.rpc import client
    monkeypatch.setattr(client, "UPLOAD_PIECE", 300_000)
    data = rng.bytes(1_000_003)                       # 4 pieces, the last a short one
    assert sess.upload(data, "blob.bin") == "blob.bin"
    assert sess.upload(b"", "empty.bin") == "empty.bin"
    workdir = os.path.join(tempfile.gettempdir(), sess.info()["workdir"])
    with open(os.path.join(workdir, "blob.bin"), "rb") as f:
        assert f.read() == data
    assert os.path.getsize(os.path.join(workdir, "empty.bin")) == 0
    assert not [n for n in os.listdir(workdir) if n.endswith(".part")]
    # pieces out of order, or of a file larger than it says, are refused
    for meta, message in (({"offset": 10, "size": 20}, "no upload of it is under way"),
                          ({"offset": 0, "size": 2}, "does not fit"),
                          ({"offset": -1, "size": 20}, "does not fit")):
        with pytest.raises(ValueError, match=message):
            sess._request("upload", dict(meta, name="x.bin"), (b"abc",))
    sess._request("upload", {"name": "x.bin", "offset": 0, "size": 9}, (b"abc",))
    with pytest.raises(ValueError, match="3 bytes came so far"):
        sess._request("upload", {"name": "x.bin", "offset": 6, "size": 9}, (b"ghi",))
    assert sess.info()["machine"]


def test_uploading_again_under_the_same_name_loads_the_new_library(sess, kernel_lib, faulty_lib):
    first = sess.load_module(sess.upload(kernel_lib, "k.so"))
    again = sess.load_module(sess.upload(faulty_lib, "k.so"))
    assert first.function_names == ["main"]
    assert again.function_names == ["ok", "crash", "spin"]
    again["ok"]()
    a, b = sess.array(np.ones((1, 7), "float32")), sess.empty((1, 7), "float32")
    first["main"](a, b, 1.0)  # the first stays usable
    np.testing.assert_array_equal(b.numpy(), np.full((1, 7), 3, "float32"))


def test_limits_on_uploads_and_arrays(sess):
    with pytest.raises(ValueError, match="at most"):
        sess.upload(b"x" * (3 << 20), "big.bin")  # refused by the client before sending
    sess.limits["max_upload"] = 10 << 20  # pretend not to know: the server refuses it too
    with pytest.raises(ValueError, match="limit is 2097152"):
        sess.upload(b"x" * (5 << 19), "big.bin")
    with pytest.raises(ValueError, match="array limit"):
        sess.empty((1 << 20,), "float32")  # 4 MiB > 2 MiB
    with pytest.raises(ValueError, match="at most"):
        sess.array(np.zeros((1 << 20,), "float32"))  # refused before sending
    assert sess.info()["machine"]  # still serving
    with pytest.raises(ValueError, match="limit is 2097152"):   # sent in pieces, refused
        sess.upload(b"x" * (4 << 20), "huge.bin")
    assert sess.info()["machine"]
    # a frame over the server's frame limit is a protocol violation: the session ends
    with pytest.raises(rpc.SessionLost, match="exceeds the 3145728-byte limit"):
        sess._request("upload", {"name": "huge.bin"}, (b"x" * (4 << 20),))


def test_open_sessions_are_limited(server):
    sessions = [rpc.connect(HOST, server.port) for _ in range(3)]
    try:
        with pytest.raises(rpc.ServerBusy, match="3 sessions are open"):
            rpc.connect(HOST, server.port)
    finally:
        for s in sessions:
            s.close()
    # the slots come back as the sessions end
    from rpc_testutil import wait_until

    def can_connect():
        try:
            with rpc.connect(HOST, server.port):
                return True
        except rpc.ServerBusy:
            return False
    wait_until(can_connect, 10, "a free session slot")


def test_close_is_idempotent_and_closed_sessions_refuse_requests(server):
    s = rpc.connect(HOST, server.port)
    assert "open" in repr(s)
    s.close()
    s.close()
    assert s.closed
    with pytest.raises(rpc.SessionLost, match="closed"):
        s.info()


def test_sessions_are_isolated(server, kernel_lib):
    with rpc.connect(HOST, server.port) as s1, rpc.connect(HOST, server.port) as s2:
        s1.upload(kernel_lib)
        with pytest.raises(FileNotFoundError):
            s2.load_module("axpb.so")
        a = s1.array(np.ones(3, "float32"))
        mod = s1.load_module("axpb.so")
        with pytest.raises(ValueError, match="another session"):
            s2.upload(kernel_lib)
            s2.load_module("axpb.so")["main"](a, a, 1.0)
        assert s1.info()["workdir"] != s2.info()["workdir"]
        assert mod.session is s1


def test_a_session_can_be_shared_between_threads(sess, kernel_lib, rng):
    mod = sess.load_module(sess.upload(kernel_lib))
    errors = []

    def work(seed):
        try:
            r = np.random.default_rng(seed)
            for _ in range(10):
                x = r.standard_normal((4, 7)).astype("float32")
                a, b = sess.array(x), sess.empty((4, 7), "float32")
                mod["main"](a, b, 1.0)
                np.testing.assert_allclose(b.numpy(), x * 2 + 1, rtol=1e-6)
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors


# -- tokens -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text("tok-" + os.urandom(8).hex() + "\n")
    p = start_server("--token-file", str(path), key="secure")
    yield p, path.read_text().strip()
    p.stop()


def test_token_authentication(token_server):
    server, token = token_server
    with rpc.connect(HOST, server.port, token=token) as s:
        assert s.info()["machine"]
    with rpc.connect(HOST, server.port, token=token.encode()) as s:
        assert s.key == "secure"
    with pytest.raises(rpc.AuthenticationError, match="requires a token"):
        rpc.connect(HOST, server.port)
    with pytest.raises(rpc.AuthenticationError, match="authentication failed"):
        rpc.connect(HOST, server.port, token="wrong")
    with rpc.connect(HOST, server.port, token=token) as s:  # still serving
        assert s.info()["machine"]


def test_authenticated_sessions_run_kernels_and_report_crashes(token_server, faulty_lib,
                                                               kernel_lib, rng):
    """Every frame carries a MAC; when the session process dies, the server still tells the
    client why, in a frame that continues the session's sequence."""
    server, token = token_server
    with rpc.connect(HOST, server.port, token=token) as s:
        assert s.authenticated
        mod = s.load_module(s.upload(kernel_lib))
        x = rng.standard_normal((5, 7)).astype("float32")
        a, b = s.array(x), s.empty((5, 7), "float32")
        mod["main"](a, b, 0.5)
        np.testing.assert_allclose(b.numpy(), x * 2 + 0.5, rtol=1e-6)
        bad = s.load_module(s.upload(faulty_lib))
        for _ in range(3):
            bad["ok"]()
        with pytest.raises(rpc.SessionLost, match="segmentation fault"):
            bad["crash"]()
    with rpc.connect(HOST, server.port, token=token) as s:   # the server goes on
        assert s.info()["machine"]


def test_the_token_never_crosses_the_wire_and_servers_must_prove_it(token_server):
    """A fake server records what the client sends, and cannot answer the client's challenge:
    its WELCOME, with a made-up proof and a MAC under a guessed key, is refused."""
    token = "the-real-secret"
    listener = socket.create_server((HOST, 0))
    port = listener.getsockname()[1]
    seen = {}

    def fake_server():
        conn, _ = listener.accept()
        hello = {"server": "tilecraft-rpc", "protocol": VERSION, "key": "k",
                 "nonce": os.urandom(32).hex(), "auth": "hmac-sha256"}
        send_frame(conn, HELLO, hello)
        frame = recv_frame(conn, timeout=5)
        seen["auth"], seen["hello"] = frame, hello
        guess = FrameMAC(os.urandom(32))
        send_frame(conn, WELCOME, {"session": 1, "proof": "00" * 32}, mac=guess)
        conn.recv(100)
        conn.close()
    t = threading.Thread(target=fake_server)
    t.start()
    with pytest.raises(rpc.AuthenticationError, match="could not prove"):
        rpc.connect(HOST, port, token=token, timeout=5)
    t.join(10)
    listener.close()
    frame = seen["auth"]
    assert frame.type == AUTH
    wire = repr(frame.meta).encode()
    assert token.encode() not in wire and token.encode().hex().encode() not in wire
    t = auth.transcript(seen["hello"], frame.meta)
    assert auth.verify_proof(token.encode(), t, frame.meta["proof"], "client")
