"""The board side — ``tilecraft.rpc``'s server, ``tilecraft.targets``' runtime, loading and
running a relax executable — imports with numpy alone and is Python 3.9 code, the floor
pyproject.toml declares (``requires-python``): its modules parse with ``feature_version=(3, 9)``
and use no construct that parses on 3.9 but fails there when run (a ``X | Y`` annotation
evaluated without ``from __future__ import annotations``, ``isinstance(x, A | B)``,
``zip(strict=)``, ``dataclass(slots=)``)."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys

import pytest

from capabilities import REPO

BOARD_PYTHON = (3, 9)
# everything a board profile does not install (pyproject.toml: dependencies and extras)
COMPILER_SIDE = ("llvmlite", "onnx", "onnxruntime", "xgboost", "tqdm", "pyopencl", "wgpu",
                 "torch", "matplotlib", "scipy")
BOARD_MODULES = ("tilecraft.rpc.server", "tilecraft.rpc.worker", "tilecraft.targets",
                 "tilecraft.relax.rpc_plugin", "tilecraft.relax.executable", "tilecraft.relax.vm")

LIST_BOARD_MODULES = """
import sys, json, importlib, importlib.abc
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, NotInstalled())
for m in {modules!r}:
    importlib.import_module(m)
print(json.dumps(sorted(m.__file__ for name, m in list(sys.modules.items())
                        if name.split(".")[0] == "tilecraft" and getattr(m, "__file__", None))))
"""


@pytest.fixture(scope="module")
def board_files() -> list[str]:
    """The files of every tilecraft module the board side imports (from the checkout)."""
    code = LIST_BOARD_MODULES.format(blocked=COMPILER_SIDE, modules=BOARD_MODULES)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"the board side needs a compiler-side library:\n{proc.stderr}"
    return json.loads(proc.stdout)


def test_requires_python_is_the_board_sides_floor():
    text = open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8").read()
    m = re.search(r'^requires-python\s*=\s*"([^"]+)"', text, re.M)
    assert m and m.group(1) == ">=%d.%d" % BOARD_PYTHON, m and m.group(1)


def test_the_board_side_imports_with_numpy_alone(board_files):
    names = {os.path.relpath(f, REPO) for f in board_files}
    # the server, the runtime that loads kernel libraries, the relax VM and its loader
    assert {"rpc/server.py", "targets/runtime/__init__.py", "relax/vm.py",
            "relax/executable.py", "tilecraft/optional.py"} <= names, sorted(names)
    assert not any(n.startswith("targets/llvm/") for n in names), sorted(names)


def runtime_310_constructs(tree: ast.Module) -> list[tuple[int, str]]:
    """What parses as 3.9 but fails when 3.9 runs it."""
    future = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and
                 any(a.name == "annotations" for a in n.names) for n in tree.body)

    def has_union(node) -> bool:
        return node is not None and any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr)
                                        for n in ast.walk(node))

    bad = []
    for node in ast.walk(tree):
        if not future:
            annotations = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                annotations = [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs +
                               [a.vararg, a.kwarg] if x is not None] + [node.returns]
            elif isinstance(node, ast.AnnAssign):
                annotations = [node.annotation]
            if any(has_union(x) for x in annotations):
                bad.append((node.lineno, "an X | Y annotation without "
                                         "`from __future__ import annotations`"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("isinstance", "issubclass") and len(node.args) == 2 \
                    and has_union(node.args[1]):
                bad.append((node.lineno, f"{node.func.id}(x, A | B)"))
            if node.func.id == "zip" and any(k.arg == "strict" for k in node.keywords):
                bad.append((node.lineno, "zip(strict=...)"))
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name == "dataclass" and any(k.arg in ("slots", "kw_only") for k in node.keywords):
                bad.append((node.lineno, "dataclass(slots= / kw_only=)"))
    return bad


def test_the_board_side_is_python_3_9_code(board_files):
    problems = []
    for path in board_files:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        rel = os.path.relpath(path, REPO)
        try:
            tree = ast.parse(source, rel, feature_version=BOARD_PYTHON)
        except SyntaxError as err:
            problems.append(f"{rel}:{err.lineno}: not Python 3.9 syntax: {err.msg}")
            continue
        problems += [f"{rel}:{line}: {what} (Python >= 3.10 only)"
                     for line, what in runtime_310_constructs(tree)]
    assert not problems, "\n".join(problems)


def test_the_check_finds_what_3_9_cannot_run():
    tree = ast.parse("def f(x: int | None) -> None:\n    return isinstance(x, int | str)\n"
                     "y = zip([1], [2], strict=True)\n")
    assert sorted(runtime_310_constructs(tree)) == [
        (1, "an X | Y annotation without `from __future__ import annotations`"),
        (2, "isinstance(x, A | B)"), (3, "zip(strict=...)")]
    future = ast.parse("from __future__ import annotations\ndef f(x: int | None): pass\n")
    assert runtime_310_constructs(future) == []
