"""The ``tilecraft`` commands, one module each.

A command module has ``DESCRIPTION`` (its ``--help`` text), ``add_arguments(parser)`` and
``run(args) -> int``; it imports what it needs at its top. ``tilecraft.cli`` imports only the
module of the command being run, so ``tilecraft rpc server`` on a board imports ``tilecraft.rpc``
and numpy, never LLVM, ONNX or XGBoost.
"""
