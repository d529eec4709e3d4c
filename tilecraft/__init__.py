"""tilecraft: a multi-target tensor compiler stack (TensorIR, LLVM / OpenCL / WebGPU code
generation, MetaSchedule auto-tuning, RPC to boards, Relax models with symbolic shapes).

Its packages live in this one namespace, as Apache TVM's live in ``tvm``::

    from tilecraft import relax, targets             # graph level; code generation and runtime
    from tilecraft.tensorir import te                # loop level
    from tilecraft import metaschedule, rpc          # the tuner; boards

Importing ``tilecraft`` itself imports none of them (the board side loads ``tilecraft.rpc`` and
``tilecraft.targets``' runtime with numpy alone). The ``tilecraft`` command (``tilecraft
--help``, docs/cli.md) lives in ``tilecraft.cli``. ``tilecraft.TilecraftError`` is the root of
every exception the packages define (``tilecraft.error_root``, which imports nothing;
``tilecraft.errors`` adds the command line's errors).
"""
import os as _os
import re as _re

from .error_root import TilecraftError

_HERE = _os.path.dirname(_os.path.abspath(__file__))
_CHECKOUT = _os.path.dirname(_HERE)

# In a source checkout the five layers sit beside this folder, at the repository's top level
# (relax/, tensorir/, ...); a wheel installs them inside it (setup.py maps the folders). Adding
# the checkout to __path__ makes ``tilecraft.relax`` the same files in both cases, with or without
# `pip install -e`, so tests, benchmarks, the GPU machine and an emulated board (PYTHONPATH=the
# checkout) import exactly what a wheel would hold.
IN_CHECKOUT = (not _os.path.isdir(_os.path.join(_HERE, "relax"))
               and _os.path.isfile(_os.path.join(_CHECKOUT, "relax", "__init__.py")))
if IN_CHECKOUT:
    __path__.append(_CHECKOUT)


def _version() -> str:
    """The version in pyproject.toml (the one place it is written)."""
    if IN_CHECKOUT:
        try:
            with open(_os.path.join(_CHECKOUT, "pyproject.toml"), encoding="utf-8") as f:
                m = _re.search(r'^version\s*=\s*"([^"]+)"', f.read(), _re.M)
            if m:
                return m.group(1)
        except OSError:
            pass
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("tilecraft")
    except PackageNotFoundError:
        return "unknown"


__version__ = _version()
