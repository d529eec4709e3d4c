"""The command line's errors: a problem it reports in one line, and a missing install extra.

Nothing here imports more than the standard library: the dispatcher (``tilecraft.cli``) uses it
on a board where only numpy is installed.
"""
from __future__ import annotations

from types import ModuleType

from .optional import MissingDependencyError, has_module, import_optional, install_hint


class CLIError(Exception):
    """A problem the command line reports in one line (``tilecraft: error: ...``, exit 1)."""


class MissingExtraError(CLIError):
    """A Python package of an install extra is not installed; the message says which extra
    to add (``pip install 'tilecraft[bench]'``)."""


def require(module: str, who: str) -> ModuleType:
    """Import ``module`` (an optional dependency), or raise ``MissingExtraError`` naming what to
    install (``tilecraft.optional`` knows which extra brings which library).

    Examples
    --------
    >>> ort = require("onnxruntime", "tilecraft zoo")                     # doctest: +SKIP
    """
    try:
        return import_optional(module, who)
    except MissingDependencyError as err:
        raise MissingExtraError(str(err)) from None


def missing_message(module: str, who: str) -> str:
    """``"tilecraft zoo needs onnxruntime, which is not installed: pip install
    'tilecraft[bench]'"``."""
    top = module.split(".")[0]
    return f"{who} needs {top}, which is not installed: {install_hint(top)}"
