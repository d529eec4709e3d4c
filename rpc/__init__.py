"""rpc: run and time kernels on remote boards (Raspberry Pi, Jetson, phones) over TCP.

* ``python -m tilecraft.rpc.server --host 0.0.0.0 --port 9090 --key rasp4 --token-file F`` — the
  board side; it needs only Python >= 3.9 and numpy.
* ``python -m tilecraft.rpc.tracker --host 0.0.0.0 --port 9190 --token-file T --board-token-file F``
  — a queue of boards per key.
* ``rpc.connect(host, port, token=...) -> Session`` and
  ``rpc.connect_tracker(host, port, token=...).request(key, token=...) -> Session`` — the client.

Connections are authenticated both ways with a token (the boards' or the tracker's), and every
frame after the handshake carries a MAC and a sequence number (``rpc.auth``); without a token a
server or tracker serves on loopback only, with ``--insecure-local``.

A ``Session`` uploads files, loads kernel libraries, moves arrays and calls and times kernels
on the board: ``sess.upload(path)``, ``sess.load_module(name)``, ``sess.array(x, sess.cpu(0))``,
``mod["main"](*arrays)``, ``mod.time_evaluator("main", dev, number, repeat)(*arrays)``.
Plugins add session operations (``rpc.worker.register_op``, ``python -m tilecraft.rpc.server --plugin
MODULE``, ``sess.call_plugin(name, ...)``): ``relax.rpc_plugin`` runs Relax executables on a board.
See ``docs/rpc.md``.

Examples
--------
>>> import numpy as np
>>> from tilecraft import rpc                                     # doctest: +SKIP
>>> with rpc.connect("192.168.1.23", 9090, token=board_token) as sess:     # doctest: +SKIP
...     mod = sess.load_module(sess.upload("add.so"))
...     a = sess.array(np.arange(8, dtype="float32")); b = sess.empty((8,), "float32")
...     mod["main"](a, b)
...     b.numpy()
"""
from .protocol import (ConnectionClosed, FrameAuthError, IdleTimeout, ProtocolError, RPCError,
                       RPCTimeoutError, VERSION as PROTOCOL_VERSION)
from .auth import AuthenticationError
from .client import (PluginReply, RemoteDevice, RemoteError, RemoteFunction, RemoteModule,
                     RemoteNDArray, ServerBusy, Session, SessionLost, TrackerClient, TrackerError,
                     connect, connect_tracker)

__all__ = ["connect", "connect_tracker", "Session", "TrackerClient", "RemoteDevice",
           "RemoteNDArray", "RemoteModule", "RemoteFunction", "PluginReply", "RPCError",
           "ProtocolError", "FrameAuthError", "ConnectionClosed", "RPCTimeoutError", "IdleTimeout",
           "AuthenticationError", "RemoteError", "SessionLost", "ServerBusy", "TrackerError",
           "PROTOCOL_VERSION"]
