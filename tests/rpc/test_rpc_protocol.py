"""The wire protocol and the security helpers, over socket pairs (no server process)."""
import hashlib
import hmac
import json
import os
import socket
import struct
import threading

import numpy as np
import pytest

from tilecraft.rpc import auth, protocol
from tilecraft.rpc.protocol import (ERROR, HEADER, MAGIC, REPLY, REQUEST, VERSION, Channel,
                                    ConnectionClosed, FrameMAC, IdleTimeout, ProtocolError,
                                    RPCTimeoutError, decode_array, encode_array, encode_frame,
                                    recv_frame, send_frame)
from tilecraft.rpc.server import describe_exit, parse_hostport
from tilecraft.rpc.worker import check_file_name


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def raw_frame(ftype=REQUEST, meta=b"{}", blobs=(), magic=MAGIC, version=VERSION, flags=0,
              length=None, nblobs=None):
    body = struct.pack("!IH", len(meta), len(blobs) if nblobs is None else nblobs)
    body += b"".join(struct.pack("!Q", len(b)) for b in blobs) + meta + b"".join(blobs)
    return HEADER.pack(magic, version, ftype, flags, len(body) if length is None else length) \
        + body


def test_frames_round_trip_with_random_metadata_and_blobs(pair, rng):
    a, b = pair
    for trial in range(20):
        meta = {"op": f"op{trial}", "values": rng.integers(-2**40, 2**40, 5).tolist(),
                "x": float(rng.standard_normal()), "nested": {"s": "é∂", "l": [1, [2, None]]}}
        blobs = [rng.bytes(int(n)) for n in rng.integers(0, 5000, int(rng.integers(0, 4)))]
        if trial == 3:
            blobs.append(rng.bytes(300_000))  # large: sent without joining
        t = threading.Thread(target=send_frame, args=(a, REPLY, meta, blobs))
        t.start()
        frame = recv_frame(b, timeout=5.0)
        t.join()
        assert frame.type == REPLY and frame.meta == meta
        assert [bytes(x) for x in frame.blobs] == blobs


@pytest.mark.parametrize("dtype", protocol.ARRAY_DTYPES)
def test_arrays_travel_as_raw_bytes_with_dtype_and_shape(pair, rng, dtype):
    a, b = pair
    shape = tuple(int(s) for s in rng.integers(0, 6, int(rng.integers(0, 4))))
    if dtype == "bool":
        x = rng.random(shape) > 0.5
    elif dtype.startswith("float"):
        x = rng.standard_normal(shape).astype(dtype)
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    meta, blob = encode_array(x)
    assert meta == {"dtype": dtype, "shape": list(shape)} and blob.nbytes == x.nbytes
    send_frame(a, REPLY, meta, [blob])
    frame = recv_frame(b, timeout=5.0)
    y = decode_array(frame.meta, frame.blobs[0])
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_array_equal(y, x)


def test_big_endian_and_strided_arrays_are_sent_in_wire_order(rng):
    x = rng.standard_normal((4, 6)).astype(">f8")[:, ::2]
    meta, blob = encode_array(x)
    y = decode_array(meta, memoryview(blob).cast("B"))
    assert y.dtype == np.float64 and y.dtype.isnative
    np.testing.assert_array_equal(y, x)
    assert bytes(memoryview(blob).cast("B")) == np.ascontiguousarray(x, "<f8").tobytes()


def test_no_pickle_or_eval_anywhere_in_the_protocol():
    import inspect
    from tilecraft import rpc
    import tilecraft.rpc.client
    from tilecraft import rpc
    import tilecraft.rpc.server
    from tilecraft import rpc
    import tilecraft.rpc.tracker
    from tilecraft import rpc
    import tilecraft.rpc.worker
    for mod in (protocol, rpc.client, rpc.server, rpc.tracker, rpc.worker, auth):
        src = inspect.getsource(mod)
        for word in ("import pickle", "pickle.", "eval(", "exec(", "marshal"):
            assert word not in src, f"{mod.__name__} uses {word}"


@pytest.mark.parametrize("data, message", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "bad frame magic"),
    (raw_frame(version=VERSION + 1), f"protocol version {VERSION + 1}"),
    (raw_frame(ftype=200), "unknown frame type 200"),
    (raw_frame(flags=6), "unknown frame flags"),
    (raw_frame(flags=protocol.FLAG_MAC), "carries a MAC on a connection without a key"),
    (raw_frame(meta=b"[" * 50_000), "nests 50000 levels deep"),
    (raw_frame(meta=b'{"a":' + b"[" * 40 + b"]" * 40 + b"}"), "nests 41 levels deep"),
    (raw_frame(meta=b'{"n": ' + b"9" * 5000 + b"}"), "more than 100 digits"),
    (raw_frame(length=0xFFFFFFFF), "exceeds the"),
    (raw_frame(length=2), "shorter than its payload header"),
    (raw_frame(meta=b"{not json"), "not valid JSON"),
    (raw_frame(meta=b"[1, 2]"), "must be a JSON object"),
    (raw_frame(meta=b"\xff\xfe"), "not valid JSON"),
    (raw_frame(nblobs=1000), "blobs; the limit"),
    (raw_frame(blobs=[b"abc"], nblobs=2), "blob table"),
])
def test_malformed_frames_raise_protocol_errors(pair, data, message):
    a, b = pair
    a.sendall(data)
    with pytest.raises(ProtocolError, match=message):
        recv_frame(b, timeout=2.0, max_frame=1 << 20)


def test_lengths_that_do_not_add_up_are_refused(pair):
    a, b = pair
    good = raw_frame(meta=b'{"a":1}', blobs=[b"xyz"])
    # one byte more than the blob table and meta account for, then the frame is complete
    bad = HEADER.pack(MAGIC, VERSION, REQUEST, 0, len(good) - HEADER.size + 1) + \
        good[HEADER.size:] + b"!"
    a.sendall(bad)
    with pytest.raises(ProtocolError, match="do not add up"):
        recv_frame(b, timeout=2.0)


def test_half_sent_frame_times_out_and_closed_peer_is_reported(pair):
    a, b = pair
    frame = raw_frame(meta=json.dumps({"op": "x" * 100}).encode())
    a.sendall(frame[:30])
    with pytest.raises(RPCTimeoutError, match="30 of|18 of|bytes received"):
        recv_frame(b, timeout=0.3)
    c, d = socket.socketpair()
    c.sendall(frame[:20])
    c.close()
    with pytest.raises(ConnectionClosed, match="in the middle"):
        recv_frame(d, timeout=2.0)
    d.close()


def test_idle_timeout_and_deadline(pair):
    a, b = pair
    with pytest.raises(IdleTimeout):
        recv_frame(b, timeout=5.0, idle_timeout=0.2)
    import time
    a.sendall(raw_frame(meta=b"{}")[:5])  # trickles in: the deadline still ends the wait
    with pytest.raises(RPCTimeoutError):
        recv_frame(b, timeout=5.0, deadline=time.monotonic() + 0.3)


def test_unexpected_frame_type(pair):
    a, b = pair
    send_frame(a, REPLY, {})
    with pytest.raises(ProtocolError, match="expected a REQUEST"):
        recv_frame(b, timeout=1.0, expect=[REQUEST])
    send_frame(a, ERROR, {"type": "X", "message": "y"})  # an ERROR is always handed back
    assert recv_frame(b, timeout=1.0, expect=[REQUEST]).type == ERROR


def test_encode_refuses_oversized_metadata_and_unknown_types():
    with pytest.raises(ValueError, match="metadata"):
        encode_frame(REQUEST, {"x": "a" * (protocol.MAX_META + 1)})
    with pytest.raises(ValueError, match="unknown frame type"):
        encode_frame(99, {})
    with pytest.raises(ValueError, match="cannot be sent"):
        encode_array(np.zeros(3, "complex64"))


@pytest.mark.parametrize("meta, message", [
    ({"dtype": "object", "shape": [1]}, "not supported"),
    ({"dtype": "float32", "shape": [-1]}, "non-negative"),
    ({"dtype": "float32", "shape": [1.5]}, "non-negative"),
    ({"dtype": "float32", "shape": "3"}, "list"),
    ({"dtype": "float32", "shape": [1] * 40}, "at most 32"),
    ({"dtype": "float32", "shape": [2]}, "needs 8 bytes"),
])
def test_array_descriptions_are_checked(meta, message):
    with pytest.raises(ValueError, match=message):
        decode_array(meta, b"abc")


def test_array_size_limit_is_checked_before_allocating():
    with pytest.raises(ValueError, match="exceeds the 1000-byte array limit"):
        decode_array({"dtype": "float64", "shape": [10 ** 9, 10 ** 9]}, b"", max_bytes=1000)


# -- authenticated frames -------------------------------------------------------------------------
def mac_pair(pair):
    """Two ends of an authenticated channel (keys as a handshake would derive them)."""
    a, b = pair
    k1, k2 = os.urandom(32), os.urandom(32)
    return Channel(a, FrameMAC(k1), FrameMAC(k2)), Channel(b, FrameMAC(k2), FrameMAC(k1))


def test_authenticated_frames_round_trip_small_and_large(pair, rng):
    left, right = mac_pair(pair)
    for trial in range(6):
        meta = {"op": f"op{trial}", "v": rng.integers(0, 99, 4).tolist()}
        blobs = [rng.bytes(int(n)) for n in rng.integers(0, 3000, 2)]
        if trial == 3:
            blobs.append(rng.bytes(9 << 20))   # hashed and sent in pieces
        t = threading.Thread(target=left.send, args=(REQUEST, meta, blobs))
        t.start()
        frame = right.recv(timeout=5.0)
        t.join()
        assert frame.meta == meta and [bytes(x) for x in frame.blobs] == blobs
    assert left.send_mac.seq == right.recv_mac.seq == 6


def captured(channel, ftype, meta, blobs=()):
    """The bytes ``channel`` sends for one frame (its MAC's sequence number advances)."""
    a, b = socket.socketpair()
    try:
        send_frame(a, ftype, meta, blobs, mac=channel.send_mac)
        a.close()
        data = b""
        while chunk := b.recv(1 << 16):
            data += chunk
        return data
    finally:
        b.close()


@pytest.mark.parametrize("attack, message", [
    ("flip a payload byte", "failed authentication"),
    ("flip a MAC byte", "failed authentication"),
    ("replay the first frame", "out of sequence: number 0, expected 1"),
    ("send the second frame first", "out of sequence: number 1, expected 0"),
    ("inject a plain frame", "without a MAC"),
    ("reflect the sender's own frame", "failed authentication"),
    ("a frame of another session", "failed authentication"),
])
def test_tampered_replayed_reordered_and_injected_frames_are_refused(pair, attack, message):
    left, right = mac_pair(pair)
    first = captured(left, REQUEST, {"op": "info", "n": 1})
    second = captured(left, REQUEST, {"op": "info", "n": 2})
    if attack == "flip a payload byte":
        data = first[:20] + bytes([first[20] ^ 1]) + first[21:]
    elif attack == "flip a MAC byte":
        data = first[:-1] + bytes([first[-1] ^ 0x80])
    elif attack == "replay the first frame":
        data = first + first
    elif attack == "send the second frame first":
        data = second
    elif attack == "inject a plain frame":
        data = raw_frame(meta=b'{"op":"close"}')
    elif attack == "reflect the sender's own frame":   # back to the side that made it
        data = captured(right, REPLY, {"x": 1})
    else:
        other, _ = mac_pair(socket.socketpair())
        data = captured(other, REQUEST, {"op": "info"})
    a, b = pair
    if attack == "replay the first frame":
        a.sendall(data)
        assert right.recv(timeout=2.0).meta == {"op": "info", "n": 1}
    else:
        a.sendall(data)
    with pytest.raises(protocol.FrameAuthError, match=message):
        right.recv(timeout=2.0)


def test_a_plain_error_is_accepted_only_where_asked(pair):
    left, right = mac_pair(pair)
    a, b = pair
    send_frame(a, ERROR, {"type": "ServerBusy", "message": "busy"})
    assert right.recv(timeout=2.0, plain_error=True).meta["type"] == "ServerBusy"
    send_frame(a, ERROR, {"type": "SessionLost", "message": "forged"})
    with pytest.raises(protocol.FrameAuthError, match="without a MAC"):
        right.recv(timeout=2.0)


def test_metadata_bombs_are_refused_before_decoding():
    protocol.check_meta(b'{"op": "x", "s": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\""}')
    protocol.check_meta(b'{"a": ' + b"[" * 31 + b"]" * 31 + b"}")   # 32 levels: the limit
    for bomb in (b"[" * 50_000, b'{"a":' * 33 + b"1" + b"}" * 33):
        with pytest.raises(ProtocolError, match="levels deep"):
            protocol.parse_payload(REQUEST, struct.pack("!IH", len(bomb), 0) + bomb)


# -- authentication -------------------------------------------------------------------------------
def test_proofs_are_bound_to_the_transcript_and_the_role():
    token = b"correct horse"
    hello = {"server": "tilecraft-rpc", "key": "k", "nonce": auth.new_nonce().hex()}
    body = {"nonce": auth.new_nonce().hex(), "ticket": None}
    t = auth.transcript(hello, body)
    p = auth.proof(token, t, "client")
    assert p == hmac.new(token, b"client proof\0" + t, hashlib.sha256).digest()
    assert auth.verify_proof(token, t, p.hex(), "client")
    assert auth.verify_proof(token, t, p, "client")
    assert auth.transcript(hello, dict(body, proof=p.hex())) == t   # the proof is not in it
    assert not auth.verify_proof(token, t, p, "server")                    # no reflection
    assert not auth.verify_proof(b"wrong", t, p, "client")
    for other in (dict(hello, nonce=auth.new_nonce().hex()),                # no replay
                  dict(hello, key="other")):                                # no relay to
        assert not auth.verify_proof(token, auth.transcript(other, body), p, "client")
    assert not auth.verify_proof(token, auth.transcript(hello, dict(body, ticket="t")), p,
                                 "client")
    for junk in (None, "", "zz", 42, "ab" * 100):
        assert not auth.verify_proof(token, t, junk, "client")
    c2s, s2c = auth.session_keys(token, t)
    assert c2s != s2c and auth.session_keys(token, auth.transcript(hello, body)) == (c2s, s2c)
    assert auth.session_keys(b"wrong", t) != (c2s, s2c)


def test_token_files(tmp_path):
    p = tmp_path / "token"
    p.write_text("  s3cret\n")
    assert auth.load_token(str(p)) == b"s3cret"
    p.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        auth.load_token(str(p))
    assert auth.as_token("abc") == b"abc" and auth.as_token(None) is None


def test_serving_without_a_token_needs_loopback_and_insecure_local():
    for host in ("127.0.0.1", "127.8.0.1", "::1", "localhost"):
        auth.check_bind_security(host, None, True)
        with pytest.raises(auth.AuthenticationError, match="--insecure-local"):
            auth.check_bind_security(host, None, False)
    for host in ("0.0.0.0", "::", "192.168.1.20", "10.0.0.1"):
        for insecure_local in (False, True):
            with pytest.raises(auth.AuthenticationError, match="without a token"):
                auth.check_bind_security(host, None, insecure_local)
        auth.check_bind_security(host, b"t", False)


def test_server_refuses_to_start_without_a_token_unless_local_and_asked():
    # The check runs before anything is bound; the server object is never started here.
    from tilecraft.rpc.server import RPCServer
    with pytest.raises(auth.AuthenticationError, match="--token-file"):
        RPCServer("0.0.0.0", 0, "k").start()
    with pytest.raises(auth.AuthenticationError, match="--insecure-local"):
        RPCServer("127.0.0.1", 0, "k").start()
    from tilecraft.rpc.tracker import Tracker
    with pytest.raises(auth.AuthenticationError, match="--insecure-local"):
        Tracker("127.0.0.1", 0).start()
    with pytest.raises(auth.AuthenticationError, match="--board-token-file"):
        Tracker("127.0.0.1", 0, token=b"t").start()


@pytest.mark.parametrize("name", ["../x.so", "..", ".", "/etc/passwd", "a/b.so", "a\\b",
                                  "", "x\x00.so", ".hidden", "a" * 300, 5, None])
def test_upload_names_may_not_escape(name):
    with pytest.raises(ValueError, match="plain file name"):
        check_file_name(name)


def test_plain_upload_names():
    for name in ("kernel.so", "k-1.2_x+y.so", "A"):
        assert check_file_name(name) == name


def test_host_port_parsing_and_exit_descriptions():
    assert parse_hostport("127.0.0.1:9190") == ("127.0.0.1", 9190)
    assert parse_hostport("[::1]:80") == ("::1", 80)
    assert parse_hostport("tracker.local") == ("tracker.local", 9190)
    for bad in ("host:port", ":9", "h:0", "h:70000"):
        with pytest.raises(ValueError):
            parse_hostport(bad)
    assert describe_exit({"code": 0}) == (False, "the session ended")
    assert "segmentation fault" in describe_exit({"signal": 11})[1]
    assert "time limit" in describe_exit({"signal": 14})[1]
    assert describe_exit({"code": 3})[0]
