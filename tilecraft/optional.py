"""Optional dependencies: import one where it is first needed, or say what to install.

tilecraft installs in profiles (README, "Install"): the board side with numpy alone
(``pip install --no-deps tilecraft numpy``), the CPU compiler (``pip install tilecraft``: adds
llvmlite, onnx, xgboost, tqdm) and extras for the rest. A library that the running profile lacks
raises ``MissingDependencyError``, a ``ModuleNotFoundError`` whose message names the pip command
that brings it, instead of a bare "No module named 'llvmlite'".

Every layer uses this module, so it imports nothing but the standard library.

Examples
--------
>>> from tilecraft.optional import import_optional
>>> json = import_optional("json", "the example")          # any module; returns it
>>> import_optional("wgpu", "WebGPU")          # doctest: +SKIP
Traceback (most recent call last):
  ...
tilecraft.optional.MissingDependencyError: WebGPU needs wgpu, which is not installed: pip ...
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType

__all__ = ["MissingDependencyError", "import_optional", "has_module", "install_hint", "INSTALL"]

COMPILER = "pip install tilecraft"

# The top-level module of each optional library -> the command that installs it.
INSTALL = {
    # the CPU compiler (tilecraft's own dependencies), absent on a board profile
    "llvmlite": COMPILER,
    "onnx": COMPILER,
    "xgboost": COMPILER,
    "tqdm": COMPILER,
    # extras
    "pyopencl": "pip install 'tilecraft[opencl]'",
    "wgpu": "pip install 'tilecraft[webgpu]'",
    "torch": "pip install 'tilecraft[torch]'",
    "onnxruntime": "pip install 'tilecraft[bench]'",
    "matplotlib": "pip install 'tilecraft[bench]'",
}

# llvmlite >= 0.44 (pyproject.toml) has no release for Python 3.9, which runs the board side only
COMPILER_PYTHON = (3, 10)


class MissingDependencyError(ModuleNotFoundError):
    """An optional library is not installed; the message names the pip command to run.

    Attributes
    ----------
    name : str
        The missing library's top-level module (``"wgpu"``).
    install : str
        The command that installs it (``"pip install 'tilecraft[webgpu]'"``).
    """

    def __init__(self, message: str, name: str, install: str):
        super().__init__(message, name=name)
        self.install = install


def install_hint(library: str) -> str:
    """The pip command that installs ``library`` (a top-level module name), with a note where
    this Python is too old for the compiler."""
    command = INSTALL.get(library, f"pip install {library}")
    if command == COMPILER and sys.version_info[:2] < COMPILER_PYTHON:
        need = ".".join(map(str, COMPILER_PYTHON))
        command += (f" (the compiler needs Python >= {need}; this is "
                    f"{sys.version_info[0]}.{sys.version_info[1]}, which runs the board side only)")
    return command


def import_optional(module: str, purpose: str) -> ModuleType:
    """Import ``module`` (``"llvmlite.binding"``), or raise ``MissingDependencyError`` naming the
    pip command that installs its library.

    Parameters
    ----------
    module : str
        The module to import; its top-level name picks the install command (``INSTALL``).
    purpose : str
        What needs it, for the message: ``"compiling for a CPU"``.

    Returns
    -------
    ModuleType
        The imported module.

    Raises
    ------
    MissingDependencyError
        When the library is not installed. A library that is installed but fails to import
        (a missing submodule or dependency of its own, a broken build) raises its own error
        unchanged.

    Examples
    --------
    >>> llvm = import_optional("llvmlite.binding", "compiling for a CPU")  # doctest: +SKIP
    """
    library = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != library:   # installed but broken: say what is really wrong
            raise
        install = install_hint(library)
        raise MissingDependencyError(f"{purpose} needs {library}, which is not installed: "
                                     f"{install}", name=library, install=install) from None


def has_module(module: str) -> bool:
    """Whether ``module`` (an optional dependency that may be absent) imports."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
