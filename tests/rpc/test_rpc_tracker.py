"""The tracker on loopback: queues per key with priority, leases, health checks, restarts."""
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tilecraft import rpc
from tilecraft.rpc.auth import client_handshake
from tilecraft.rpc.protocol import ERROR, REQUEST

from rpc_testutil import HOST, REPO, repo_env, wait_until

FAST = ("--ping-interval", "0.5", "--ping-timeout", "0.5", "--lease-timeout", "1.5")


@pytest.fixture(scope="module")
def shared():
    """One tracker with servers for several tests: "cpu" x2, "solo", "secure" (token)."""
    import tempfile
    from rpc_testutil import start_server, start_tracker
    started = []
    try:
        tracker = start_tracker(*FAST)
        started.append(tracker)
        token_dir = tempfile.mkdtemp(prefix="rpc-token-")
        token_file = f"{token_dir}/token"
        with open(token_file, "w") as f:
            f.write("tracker-test-token\n")
        servers = {}
        for key, args in (("cpu", ()), ("cpu", ()), ("solo", ()),
                          ("secure", ("--token-file", token_file))):
            p = start_server(*args, key=key, tracker=tracker.port, wait=False)  # in parallel
            started.append(p)
            servers.setdefault(key, []).append(p)
        for p in started:
            p.ready()
        for key, ps in servers.items():
            wait_queue(tracker, key, total=len(ps), free=len(ps))
        yield tracker, servers
    finally:
        for p in started:
            p.stop()


def queue_info(tracker, key):
    return rpc.connect_tracker(HOST, tracker.port).summary()["queue_info"].get(
        key, {"free": 0, "pending": 0, "total": 0})


def wait_queue(tracker, key, timeout=10, **want):
    def ok():
        q = queue_info(tracker, key)
        return all(q[k] == v for k, v in want.items())
    wait_until(ok, timeout, f"{key}: {want} (now {queue_info(tracker, key)})")


def test_sessions_through_the_tracker_run_kernels(shared, kernel_lib, rng):
    tracker, _ = shared
    client = rpc.connect_tracker(HOST, tracker.port)
    with client.request("cpu", timeout=10) as s1:
        wait_queue(tracker, "cpu", free=1)
        with client.request("cpu", timeout=10) as s2:
            assert s1.address != s2.address  # one lease per server
            wait_queue(tracker, "cpu", free=0)
            for s in (s1, s2):
                mod = s.load_module(s.upload(kernel_lib))
                x = rng.standard_normal((9, 7)).astype("float32")
                a, b = s.array(x), s.empty((9, 7), "float32")
                mod["main"](a, b, -1.5)
                np.testing.assert_allclose(b.numpy(), x * 2 - 1.5, rtol=1e-6)
                assert mod.time_evaluator("main", s.cpu(0), number=5)(a, b, 0.0).mean > 0
    wait_queue(tracker, "cpu", free=2)  # closing returns the servers to the pool
    summary = client.summary()
    assert {s["key"] for s in summary["server_info"]} == {"cpu", "solo", "secure"}
    assert all(s["host"] == HOST and s["machine"] for s in summary["server_info"])


def test_queue_is_fifo_within_priority(shared):
    tracker, _ = shared
    wait_queue(tracker, "solo", free=1)
    client = rpc.connect_tracker(HOST, tracker.port)
    holder = client.request("solo", timeout=10)
    order, errors = [], []

    def want(name, priority):
        try:
            with client.request("solo", timeout=30, priority=priority):
                order.append(name)
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)
    threads = []
    for i, (name, priority) in enumerate([("low-1", 0), ("low-2", 0), ("high", 5), ("low-3", 0)]):
        threads.append(threading.Thread(target=want, args=(name, priority)))
        threads[-1].start()
        wait_queue(tracker, "solo", pending=i + 1)
    holder.close()
    for t in threads:
        t.join(30)
    assert not errors
    assert order == ["high", "low-1", "low-2", "low-3"]
    wait_queue(tracker, "solo", free=1)


def test_leases_come_back_when_clients_vanish_or_never_connect(shared):
    tracker, _ = shared
    wait_queue(tracker, "solo", free=1)
    client = rpc.connect_tracker(HOST, tracker.port)
    sess = client.request("solo", timeout=10)
    wait_queue(tracker, "solo", free=0)
    sess._channel.close()  # the client vanishes without closing the session
    wait_queue(tracker, "solo", free=1)
    lease = client._ask({"op": "request", "key": "solo", "timeout": 5}, 10)  # ... never connects
    assert set(lease) >= {"host", "port", "ticket"}
    wait_queue(tracker, "solo", free=0)
    wait_queue(tracker, "solo", free=1, timeout=8)  # lease timeout 1.5 s
    with pytest.raises(rpc.RPCError, match="lease"):  # the expired ticket is refused
        rpc.connect(lease["host"], lease["port"], ticket=lease["ticket"], timeout=10)
    with client.request("solo", timeout=10) as s:
        assert s.info()["machine"]
    wait_queue(tracker, "solo", free=1)


def test_requests_time_out_and_hang_ups_leave_the_queue(shared):
    tracker, _ = shared
    client = rpc.connect_tracker(HOST, tracker.port)
    t0 = time.monotonic()
    with pytest.raises(rpc.TrackerError, match="no server with key 'nobody'.*0 registered"):
        client.request("nobody", timeout=0.5)
    assert time.monotonic() - t0 < 5
    raw = socket.create_connection((HOST, tracker.port), timeout=5)
    channel, _, _, _ = client_handshake(raw, None, server="tilecraft-tracker", timeout=5)
    channel.send(REQUEST, {"op": "request", "key": "nobody", "timeout": 60})
    wait_queue(tracker, "nobody", pending=1)
    raw.close()
    wait_queue(tracker, "nobody", pending=0, timeout=5)


def test_health_checks_drop_hung_and_dead_servers(shared, procs):
    tracker, _ = shared
    hung = procs.server(key="h", tracker=tracker.port, wait=False)
    dead = procs.server(key="h", tracker=tracker.port, wait=False)
    hung.ready(), dead.ready()
    wait_queue(tracker, "h", total=2)
    hung.signal(signal.SIGSTOP)  # alive but not answering pings
    try:
        wait_queue(tracker, "h", total=1, timeout=10)
    finally:
        hung.signal(signal.SIGCONT)
    wait_queue(tracker, "h", total=2, timeout=10)  # back: it registers again by itself
    dead.signal(signal.SIGKILL)
    wait_queue(tracker, "h", total=1, timeout=10)
    with rpc.connect_tracker(HOST, tracker.port).request("h", timeout=10) as s:
        assert s.address[1] == hung.port


def test_servers_register_again_after_a_tracker_restart(procs, kernel_lib):
    tracker = procs.tracker(*FAST)
    port = tracker.port
    server = procs.server(key="r", tracker=port, wait=False)
    idle = procs.server(key="r", tracker=port, wait=False)
    server.ready(), idle.ready()
    wait_queue(tracker, "r", total=2, free=2)
    client = rpc.connect_tracker(HOST, port)
    sess = client.request("r", timeout=10)  # a session that outlives the tracker
    busy_port = sess.address[1]
    tracker.signal(signal.SIGKILL)
    tracker.stop()
    with pytest.raises((rpc.RPCError, OSError)):
        client.summary()
    assert sess.info()["machine"]  # sessions do not need the tracker
    tracker = procs.tracker(*FAST, port=port)
    wait_queue(tracker, "r", total=2, free=1, timeout=15)  # the busy one stays busy
    busy = [s for s in client.summary()["server_info"] if not s["free"]]
    assert [s["port"] for s in busy] == [busy_port]
    sess.close()
    wait_queue(tracker, "r", free=2)
    for _ in range(2):
        with client.request("r", timeout=10) as s:
            mod = s.load_module(s.upload(kernel_lib))
            assert mod.function_names == ["main"]
    assert server.alive() and idle.alive()


def test_summary_from_the_command_line(shared):
    tracker, _ = shared
    wait_queue(tracker, "cpu", free=2)
    cmd = [sys.executable, "-m", "tilecraft.rpc.tracker", "--host", HOST, "--port", str(tracker.port),
           "--summary"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=repo_env(), cwd=REPO,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert "cpu" in out.stdout and "secure" in out.stdout and "free" in out.stdout
    out = subprocess.run(cmd + ["--json"], capture_output=True, text=True, env=repo_env(),
                         cwd=REPO, timeout=30)
    data = json.loads(out.stdout)
    assert data["queue_info"]["cpu"] == {"free": 2, "pending": 0, "total": 2}


def test_tracker_survives_junk_and_bad_requests(shared):
    tracker, _ = shared
    for data in (b"junk" * 100, b"TCRP\x01\x04\x00\x00\xff\xff\xff\xff", b"TCRP\x01"):
        s = socket.create_connection((HOST, tracker.port), timeout=5)
        s.sendall(data)
        s.close()
    for meta in ({"op": "launch_missiles"}, {"op": "request", "key": 5},
                 {"op": "register", "key": "x", "port": -1},
                 {"op": "register", "key": "x", "port": 1, "host": ["x"]},
                 {"op": "request", "key": "x", "priority": "high"}):
        s = socket.create_connection((HOST, tracker.port), timeout=5)
        channel, _, _, _ = client_handshake(s, None, server="tilecraft-tracker", timeout=5)
        channel.send(REQUEST, meta)
        assert channel.recv(timeout=5).type == ERROR
        s.close()
    assert len(rpc.connect_tracker(HOST, tracker.port).summary()["server_info"]) >= 4


def test_token_servers_through_the_tracker(shared):
    tracker, _ = shared
    client = rpc.connect_tracker(HOST, tracker.port)
    with pytest.raises(rpc.AuthenticationError):
        client.request("secure", timeout=10)
    wait_queue(tracker, "secure", free=1)
    with client.request("secure", timeout=10, token="tracker-test-token") as s:
        assert s.key == "secure"
