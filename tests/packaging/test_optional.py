"""A missing optional library raises an ImportError naming the pip command that brings it
(``tilecraft.optional``): each case runs in a fresh interpreter whose import system says the
library is not installed, and does what first needs it."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from capabilities import REPO
from tilecraft.optional import INSTALL, MissingDependencyError, import_optional

NOT_INSTALLED = """
import sys, importlib.abc
class NotInstalled(importlib.abc.MetaPathFinder):
    # what the import system says of a library that is not installed
    def find_spec(self, name, path, target=None):
        if name == {blocked!r} or name.startswith({blocked!r} + "."):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, NotInstalled())
"""

TINY_KERNEL = """
from tilecraft.tensorir import te
A = te.placeholder((8,), "float32", "A")
func = te.create_prim_func([A, te.compute((8,), lambda i: A[i] * 2.0, "B")])
"""

# library -> (what first needs it, the message's start, the pip command)
CASES = {
    "llvmlite": (TINY_KERNEL + "from tilecraft import targets\ntargets.build(func, 'llvm')",
                 "compiling for a CPU", "pip install tilecraft"),
    "onnx": ("from tilecraft.relax.frontend import from_onnx",
             "the ONNX frontend", "pip install tilecraft"),
    "xgboost": ("from tilecraft.metaschedule import XGBModel\nXGBModel().load('model.npz')",
                "the XGBoost cost model", "pip install tilecraft"),
    "pyopencl": ("from tilecraft import targets\nassert not targets.opencl(0).exist\n"
                 "targets.empty((2,), 'float32', targets.opencl(0))",
                 "the OpenCL runtime", "pip install 'tilecraft[opencl]'"),
    "wgpu": ("from tilecraft import targets\nassert not targets.webgpu(0).exist\n"
             "targets.empty((2,), 'float32', targets.webgpu(0))",
             "the WebGPU runtime", "pip install 'tilecraft[webgpu]'"),
    "torch": ("from tilecraft.relax.frontend import from_torch\nfrom_torch(None)",
              "relax.frontend.from_torch", "pip install 'tilecraft[torch]'"),
    "matplotlib": ("import tempfile\nfrom tilecraft.metaschedule import plot_tuning_curve\n"
                   "plot_tuning_curve(tempfile.mkdtemp())",
                   "plot_tuning_curve", "pip install 'tilecraft[bench]'"),
}


def run_without(blocked: str, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` from the checkout in a fresh interpreter where ``blocked`` (a module, and
    its submodules) is not installed."""
    script = NOT_INSTALLED.format(blocked=blocked) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def last_line(proc: subprocess.CompletedProcess) -> str:
    return (proc.stderr.strip().splitlines() or [""])[-1]


@pytest.mark.parametrize("library", sorted(CASES))
def test_a_missing_library_names_the_pip_command(library):
    code, purpose, install = CASES[library]
    proc = run_without(library, code)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = last_line(proc)
    assert line.startswith(f"tilecraft.optional.MissingDependencyError: {purpose}"), proc.stderr
    assert line.endswith(f" needs {library}, which is not installed: {install}"), proc.stderr


def test_the_error_is_a_module_not_found_error_with_the_name_and_the_command():
    proc = run_without("onnxruntime", """
        from tilecraft.optional import import_optional
        try:
            import_optional("onnxruntime", "tilecraft bench --compare onnxruntime")
        except ModuleNotFoundError as err:
            print(type(err).__name__, err.name, err.install, sep="|")
            print(err)
    """)
    assert proc.returncode == 0, proc.stderr
    kind, rest = proc.stdout.splitlines()
    assert kind == "MissingDependencyError|onnxruntime|pip install 'tilecraft[bench]'"
    assert rest == ("tilecraft bench --compare onnxruntime needs onnxruntime, which is not "
                    "installed: pip install 'tilecraft[bench]'")


def test_every_optional_library_has_an_install_command_of_pyproject():
    # the base dependencies are the compiler's; the others are extras
    assert {k for k, v in INSTALL.items() if v == "pip install tilecraft"} == \
        {"llvmlite", "onnx", "xgboost", "tqdm"}
    extras = {v.split("[")[1].rstrip("]'") for v in INSTALL.values() if "[" in v}
    assert extras == {"opencl", "webgpu", "torch", "bench"}


def test_an_installed_but_broken_library_keeps_its_own_error():
    # llvmlite is there, its binding submodule is not: a broken install, not "pip install"
    proc = run_without("llvmlite.binding", TINY_KERNEL + textwrap.dedent("""
        from tilecraft import targets
        from tilecraft.optional import MissingDependencyError
        try:
            targets.build(func, "llvm")
        except MissingDependencyError as err:
            print("disguised:", err)
        except ModuleNotFoundError as err:
            print("kept:", err.name)
    """))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "kept: llvmlite.binding"


def test_an_installed_library_is_returned():
    import json
    assert import_optional("json", "the example") is json
    with pytest.raises(MissingDependencyError, match=r"^the example needs "
                                                     r"no_such_library_xyz, which"):
        import_optional("no_such_library_xyz.sub", "the example")
