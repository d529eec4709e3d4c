"""The command line's errors: a problem it reports in one line, and a missing install extra.

Nothing here imports more than the standard library: the dispatcher (``tilecraft.cli``) uses it
on a board where only numpy is installed.
"""
from __future__ import annotations

import importlib
from types import ModuleType


class CLIError(Exception):
    """A problem the command line reports in one line (``tilecraft: error: ...``, exit 1)."""


class MissingExtraError(CLIError):
    """A Python package of an install extra is not installed; the message says which extra
    to add (``pip install 'tilecraft[bench]'``)."""


# what each optional package comes with (pyproject.toml's [project.optional-dependencies])
EXTRAS = {"onnxruntime": "bench", "matplotlib": "bench", "torch": "torch",
          "pyopencl": "opencl", "wgpu": "webgpu"}
# dependencies of `pip install tilecraft` that a board's numpy-only install lacks
CORE = ("llvmlite", "onnx", "xgboost")


def require(module: str, who: str) -> ModuleType:
    """Import ``module`` (an optional dependency), or raise ``MissingExtraError`` naming the
    extra that installs it.

    Examples
    --------
    >>> ort = require("onnxruntime", "tilecraft zoo")                     # doctest: +SKIP
    >>> require("not_installed_pkg", "x")                                  # doctest: +SKIP
    Traceback (most recent call last):
    MissingExtraError: x needs not_installed_pkg, which is not installed
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(missing_message(module, who)) from None


def missing_message(module: str, who: str) -> str:
    """``"tilecraft zoo needs onnxruntime: pip install 'tilecraft[bench]'"``."""
    top = module.split(".")[0]
    if top in CORE:
        return (f"{who} needs {top}, which is not installed: install tilecraft with its "
                f"dependencies (pip install tilecraft); a board's numpy-only install runs "
                f"`tilecraft rpc` only")
    extra = EXTRAS.get(top)
    if extra is None:
        return f"{who} needs {module}, which is not installed"
    return f"{who} needs {top}: pip install 'tilecraft[{extra}]'"


def has_module(module: str) -> bool:
    """Whether ``module`` imports (an optional dependency that may be absent)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
