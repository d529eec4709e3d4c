"""One exception root: every exception class of the five packages derives from
``tilecraft.TilecraftError`` and keeps its standard base."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

import tilecraft
from tilecraft.errors import TilecraftError

LAYERS = ("tensorir", "targets", "rpc", "metaschedule", "relax")


def _product_modules():
    """Every module of the five packages, imported; and those that need a third-party package
    this machine lacks (name -> the missing package)."""
    # the root's own modules: the command line's errors and the optional-dependency error
    modules = [importlib.import_module(f"tilecraft.{m}") for m in ("error_root", "errors",
                                                                    "optional")]
    missing = {}
    for layer in LAYERS:
        pkg = importlib.import_module(f"tilecraft.{layer}")
        modules.append(pkg)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"tilecraft.{layer}."):
            try:
                modules.append(importlib.import_module(info.name))
            except ModuleNotFoundError as err:
                if err.name and not err.name.startswith("tilecraft"):
                    missing[info.name] = err.name
                else:
                    raise
    return modules, missing


def test_every_exception_class_derives_from_tilecraft_error():
    modules, missing = _product_modules()
    classes = {}
    for mod in modules:
        for _, obj in inspect.getmembers(mod, inspect.isclass):
            # warning categories (DefaultScheduleWarning) are not errors
            if issubclass(obj, BaseException) and not issubclass(obj, Warning) and \
                    obj.__module__ == mod.__name__:
                classes[f"{obj.__module__}.{obj.__qualname__}"] = obj
    assert len(classes) >= 40, sorted(classes)     # the walk found them (51 when written)
    bad = sorted(name for name, cls in classes.items() if not issubclass(cls, TilecraftError))
    assert not bad, f"exception classes outside TilecraftError: {bad}"
    if missing:
        pytest.skip(f"modules not checked, a third-party package is missing: {missing}")


def test_standard_bases_are_kept():
    # callers' `except ValueError` and friends still work (documented bases)
    from tilecraft.relax import RelaxError
    from tilecraft.relax.vm import VMArgumentError
    from tilecraft.rpc.protocol import ConnectionClosed, RPCError, RPCTimeoutError
    from tilecraft.targets import TargetError
    from tilecraft.targets.runtime.host_program import DeviceKernelError
    from tilecraft.tensorir import ScheduleError
    from tilecraft.tensorir.expr import TIRError
    from tilecraft.metaschedule import TuneError
    assert issubclass(ScheduleError, TIRError) and issubclass(RelaxError, TIRError)
    assert issubclass(TargetError, ValueError) and issubclass(DeviceKernelError, ValueError)
    assert issubclass(VMArgumentError, ValueError) and issubclass(VMArgumentError, TypeError)
    assert issubclass(RPCError, RuntimeError) and issubclass(ConnectionClosed, ConnectionError)
    assert issubclass(RPCTimeoutError, TimeoutError) and issubclass(TuneError, RuntimeError)
    for cls in (ScheduleError, TargetError, DeviceKernelError, VMArgumentError, RPCError,
                TuneError):
        assert issubclass(cls, TilecraftError), cls


def test_one_except_clause_catches_them():
    from tilecraft.targets import Target
    with pytest.raises(tilecraft.TilecraftError, match="no-such-kind"):
        Target("no-such-kind")


def test_tilecraft_reexports_the_root_and_stays_light():
    assert tilecraft.TilecraftError is TilecraftError
    # importing tilecraft imports no layer (the board side loads only what it needs): only the
    # module of the root class, which imports nothing
    code = ("import sys, tilecraft; tilecraft.TilecraftError; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('tilecraft.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert set(out.stdout.split()) <= {"tilecraft.error_root"}, out.stdout


def test_command_line_and_dependency_errors_are_beneath_the_root():
    from tilecraft.errors import CLIError, MissingExtraError, require
    from tilecraft.optional import MissingDependencyError, import_optional
    assert issubclass(CLIError, TilecraftError) and issubclass(MissingExtraError, CLIError)
    assert issubclass(MissingDependencyError, TilecraftError)
    assert issubclass(MissingDependencyError, ModuleNotFoundError)   # `except ImportError` works
    with pytest.raises(TilecraftError, match="pip install"):
        import_optional("no_such_library_xyz", "the test")
    with pytest.raises(MissingExtraError, match="no_such_library_xyz"):
        require("no_such_library_xyz", "the test")
