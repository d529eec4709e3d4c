"""tilecraft's errors: the root of every exception it defines, and the command line's own.

* ``TilecraftError``: every exception class of the five packages (tensorir, targets, rpc,
  metaschedule, relax) derives from it, and keeps the standard base it had (``ValueError``,
  ``TypeError``, ``RuntimeError``...), so ``except ValueError`` still catches a
  ``ScheduleError`` and ``except tilecraft.TilecraftError`` catches anything tilecraft raises
  on purpose::

      class TargetError(TilecraftError, ValueError): ...

* ``MissingDependencyError`` (``tilecraft.optional``): an optional library is not installed.
* ``CLIError`` (a problem the command line reports in one line) and ``MissingExtraError`` (a
  missing install extra), with ``require`` and ``missing_message``.

``TilecraftError`` itself is defined in ``tilecraft.error_root``, below both this module and
``tilecraft.optional`` (this module uses ``tilecraft.optional``, whose ``MissingDependencyError``
derives from the root). Nothing here imports more than the standard library: every layer imports
this module, and the dispatcher (``tilecraft.cli``) uses it on a board where only numpy is
installed.

Examples
--------
>>> import tilecraft
>>> from tilecraft.targets import Target
>>> try:
...     Target("no-such-kind")
... except tilecraft.TilecraftError as err:
...     print(type(err).__name__, isinstance(err, ValueError))
TargetError True
"""
from __future__ import annotations

from types import ModuleType

from .error_root import TilecraftError
from .optional import MissingDependencyError, has_module, import_optional, install_hint

__all__ = ["TilecraftError", "CLIError", "MissingExtraError", "MissingDependencyError", "require",
           "missing_message"]


class CLIError(TilecraftError):
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
