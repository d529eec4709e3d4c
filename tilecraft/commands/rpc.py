"""``tilecraft rpc server|tracker``: the board side, with the arguments of
``python -m tilecraft.rpc.server`` and ``python -m tilecraft.rpc.tracker``.

This imports ``tilecraft.rpc`` (and numpy) only: it runs on a board installed with
``pip install --no-deps tilecraft numpy``.
"""
from __future__ import annotations

import argparse

from tilecraft.rpc import server, tracker

DESCRIPTION = """\
The board side of RPC (docs/rpc.md), with the same arguments as python -m tilecraft.rpc.server
and python -m tilecraft.rpc.tracker (`tilecraft rpc server --help` lists them). A board needs
only numpy: pip install --no-deps tilecraft numpy. To run Relax executables sent by
`tilecraft run` / `tilecraft bench --rpc-...`, start the server with
--plugin tilecraft.relax.rpc_plugin.

examples:
  tilecraft rpc tracker --host 0.0.0.0 --port 9190 --token-file ~/.tilecraft-tracker-token \\
      --board-token-file ~/.tilecraft-token
  tilecraft rpc server --host 0.0.0.0 --port 9090 --key rasp4 --tracker 192.168.1.10:9190 \\
      --token-file ~/.tilecraft-token --tracker-token-file ~/.tilecraft-tracker-token \\
      --plugin tilecraft.relax.rpc_plugin
  tilecraft rpc tracker --port 9190 --token-file ~/.tilecraft-tracker-token --summary
  tilecraft rpc server --port 9090 --key local --insecure-local      # loopback, no token"""

MAINS = {"server": server.main, "tracker": tracker.main}


def add_arguments(p) -> None:
    p.add_argument("role", choices=sorted(MAINS), help="server (on a board) or tracker")
    p.add_argument("arguments", nargs=argparse.REMAINDER,
                   help="the server's or the tracker's own arguments (see their --help)")


def run(args) -> int:
    return MAINS[args.role](args.arguments, prog=f"tilecraft rpc {args.role}")
