"""Boards for the command line: which board the ``--rpc-*`` options name, a session on it, and a
Relax executable uploaded and loaded there (``tilecraft.relax.rpc_plugin``).

A board is reached through a tracker (``--rpc-tracker HOST:PORT --rpc-key KEY``: any free board
of that key) or directly (``--rpc-host HOST --rpc-port PORT``: one server, no tracker);
``--rpc-token-file FILE`` holds the servers' shared secret when they require one,
``--rpc-tracker-token-file FILE`` the tracker's own (its ``--token-file``). The board's
server must run the Relax plugin: ``tilecraft rpc server --plugin tilecraft.relax.rpc_plugin``.

Examples
--------
>>> board = board_from_args(args)                                        # doctest: +SKIP
>>> with board.connect() as sess:                                        # doctest: +SKIP
...     check_runs_on(exe.target, exe.triple, sess, board, "model.tcx", "rebuild it")
...     vm = load_remote(sess, "model.tcx", exe.target, 0, board)
...     y = vm["main"](x)
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from tilecraft import rpc
from tilecraft.relax.rpc_plugin import RemoteVirtualMachine
from tilecraft.rpc.auth import load_token
from tilecraft.targets import TAGS, Target
from tilecraft.targets.target import TargetError, arch_of_triple

from .devices import device_kind
from .errors import CLIError

PLUGIN = "tilecraft.relax.rpc_plugin"


def add_rpc_arguments(parser: argparse.ArgumentParser, direct: bool = True) -> None:
    """The ``--rpc-*`` options; ``direct``: also ``--rpc-host`` / ``--rpc-port`` (a server
    without a tracker)."""
    g = parser.add_argument_group("boards (RPC; see docs/rpc.md)")
    g.add_argument("--rpc-tracker", metavar="HOST:PORT",
                   help="a tracker: use a free board of --rpc-key from it")
    g.add_argument("--rpc-key", metavar="KEY", help="the boards' key at the tracker (rasp4)")
    if direct:
        g.add_argument("--rpc-host", metavar="HOST",
                       help="a server to use directly, without a tracker")
        g.add_argument("--rpc-port", metavar="PORT", type=int, help="its port")
    g.add_argument("--rpc-token-file", metavar="FILE",
                   help="the servers' shared secret (their --token-file)")
    g.add_argument("--rpc-tracker-token-file", metavar="FILE",
                   help="the tracker's own secret (its --token-file)")
    g.add_argument("--rpc-timeout", metavar="SECONDS", type=float, default=60.0,
                   help="how long to wait for a free board (default 60)")


@dataclass
class Board:
    """Where the ``--rpc-*`` options point: a tracker and key, or a server's host and port."""

    tracker: tuple[str, int] | None = None
    key: str | None = None
    host: str | None = None
    port: int | None = None
    token: bytes | None = None
    tracker_token: bytes | None = None
    timeout: float = 60.0

    def describe(self) -> str:
        if self.tracker is not None:
            return f"board {self.key!r} at the tracker {self.tracker[0]}:{self.tracker[1]}"
        return f"the server {self.host}:{self.port}"

    def connect(self, call_timeout: float = 600.0) -> rpc.Session:
        """A session on the board; ``CLIError`` naming the board when it cannot be had."""
        try:
            if self.tracker is not None:
                tracker = rpc.connect_tracker(*self.tracker, token=self.tracker_token)
                return tracker.request(self.key, timeout=self.timeout, token=self.token,
                                       call_timeout=call_timeout)
            return rpc.connect(self.host, self.port, self.token, timeout=self.timeout,
                               call_timeout=call_timeout)
        except rpc.AuthenticationError as err:
            which = "--rpc-token-file, --rpc-tracker-token-file" if self.tracker is not None \
                else "--rpc-token-file"
            raise CLIError(f"{self.describe()}: {err} ({which})") from None
        except rpc.TrackerError as err:
            raise CLIError(f"{self.describe()}: {err}") from None
        except (OSError, rpc.RPCError) as err:
            what = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            raise CLIError(f"cannot reach {self.describe()}: {what}") from None


def _hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CLIError(f"--rpc-tracker {text}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def board_from_args(args) -> Board | None:
    """The board the ``--rpc-*`` options name, or None (run here)."""
    tracker, key = args.rpc_tracker, args.rpc_key
    host, port = getattr(args, "rpc_host", None), getattr(args, "rpc_port", None)
    tracker_token_file = getattr(args, "rpc_tracker_token_file", None)
    if tracker is None and key is None and host is None and port is None:
        if tracker_token_file:
            raise CLIError("--rpc-tracker-token-file is for a tracker: give --rpc-tracker and "
                           "--rpc-key")
        if args.rpc_token_file:
            raise CLIError("--rpc-token-file is for a board: give --rpc-tracker and --rpc-key"
                           + (" (or --rpc-host and --rpc-port)" if hasattr(args, "rpc_host")
                              else ""))
        return None
    if tracker is not None and host is not None:
        raise CLIError("--rpc-tracker and --rpc-host: give one (a tracker, or a server "
                       "without one)")
    if tracker is not None or key is not None:
        if tracker is None:
            raise CLIError("--rpc-key needs --rpc-tracker HOST:PORT")
        if not key:
            raise CLIError("--rpc-tracker needs --rpc-key (the key the boards registered with)")
        board = Board(tracker=_hostport(tracker), key=key)
    else:
        if host is None or port is None:
            raise CLIError("--rpc-host and --rpc-port go together (a server without a tracker)")
        if not 0 < port < 65536:
            raise CLIError(f"--rpc-port {port}: not a port number")
        board = Board(host=host, port=port)
        if tracker_token_file:
            raise CLIError("--rpc-tracker-token-file is for a tracker (--rpc-tracker), not a "
                           "server reached directly")
    if args.rpc_timeout <= 0:
        raise CLIError(f"--rpc-timeout {args.rpc_timeout}: must be > 0")
    board.timeout = args.rpc_timeout
    if args.rpc_token_file:
        try:
            board.token = load_token(args.rpc_token_file)
        except (OSError, ValueError) as err:
            raise CLIError(f"--rpc-token-file: {err}") from None
    if tracker_token_file:
        try:
            board.tracker_token = load_token(tracker_token_file)
        except (OSError, ValueError) as err:
            raise CLIError(f"--rpc-tracker-token-file: {err}") from None
    return board


def check_runs_on(target: str, triple: str | None, session: rpc.Session, board: Board,
                  what: str, fix: str) -> None:
    """Raise ``CLIError`` when kernels built for ``target`` (``triple``) cannot run on the
    board of ``session`` (another CPU architecture): ``"{what} is for aarch64, but ... is
    x86_64: {fix}"``."""
    if device_kind(target) != "cpu" or not triple:
        return
    machine = str(session.platform.get("machine", ""))
    try:
        want, have = arch_of_triple(triple), arch_of_triple(machine)
    except TargetError:      # an architecture we cannot name: let the board decide
        return
    if want != have:
        example = [tag for tag in TAGS if Target(tag).kind == "llvm" and Target(tag).arch == have]
        hint = f" (for {have}: {', '.join(example)})" if example else ""
        raise CLIError(f"{what} is for {want}, but {board.describe()} is {machine}: "
                       f"{fix}{hint}")


def load_remote(session: rpc.Session, path: str, target: str, device: int,
                board: Board) -> RemoteVirtualMachine:
    """Upload the executable at ``path`` and load it on the board's device of ``target``'s
    kind (CPU, OpenCL, WebGPU) numbered ``device``."""
    kind = device_kind(target)
    if session.plugins is not None and "relax.load_executable" not in session.plugins:
        raise CLIError(f"{board.describe()} cannot run Relax executables: start its server "
                       f"with --plugin {PLUGIN} (tilecraft rpc server --plugin {PLUGIN} ...)")
    if kind == "cpu" and device != 0:
        raise CLIError(f"--device {device}: kernels built for {target} run on the CPU "
                       f"(device 0)")
    dev = None if kind == "cpu" else session.device(kind, device)
    name = session.upload(path)
    try:
        return RemoteVirtualMachine(session, name, dev)
    except (rpc.RemoteError, ValueError, RuntimeError) as err:
        raise CLIError(f"{board.describe()} cannot load {path}: {err}") from None


def board_name(session: rpc.Session) -> str:
    """``"aarch64 (Linux, 4 cores)"``: the board, as its server describes it."""
    p = session.platform
    cores = p.get("cpu_count")
    return (f"{p.get('machine', '?')} ({p.get('system', '?')}"
            + (f", {cores} cores" if cores else "") + ")")

