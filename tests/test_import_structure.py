"""No import of a tilecraft module inside a function or method, in the five layer packages.

A function-level import hides an import cycle (or a layering violation) from the reader and from
``check_layers.py``; the fix is structural (move the shared piece down, or let the higher module
register itself with the lower one), not a lazy import. Every product module is parsed with
``ast`` (nothing is imported): an ``import`` / ``from ... import`` inside a ``def`` that names a
tilecraft module (``tilecraft.*``, a layer by its bare name, or any relative import) fails the
test, unless it is on one of the two allow-lists below. Imports of third-party modules
(llvmlite, pyopencl, wgpu, torch, onnx, xgboost...) are not tilecraft modules and are not
checked: optional back ends load their library when first used.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys

import pytest

LAYERS = ("tensorir", "targets", "rpc", "metaschedule", "relax")

# Lazily loaded optional back ends: tilecraft modules that import an optional third-party
# library at their top, imported where that library is first needed. (file, module): why.
OPTIONAL_BACKENDS = {
    ("targets/build_module.py", "tilecraft.targets.llvm.compiler"):
        "the LLVM code generator imports llvmlite, which the board side does not have",
}

def _package_dirs() -> dict[str, str]:
    """Each layer's folder, found without importing it (a checkout or an installed wheel)."""
    out = {}
    for layer in LAYERS:
        spec = importlib.util.find_spec(f"tilecraft.{layer}")
        assert spec is not None and spec.submodule_search_locations, f"tilecraft.{layer}"
        out[layer] = list(spec.submodule_search_locations)[0]
    return out


def _module_name(layer: str, rel: str) -> str:
    """``relax/op/base.py`` -> ``tilecraft.relax.op.base`` (a package's ``__init__`` -> itself)."""
    parts = [layer] + rel[:-3].split(os.sep)
    if parts[-1] == "__init__":
        parts.pop()
    return "tilecraft." + ".".join(parts)


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from`` import names (relative ones resolved against ``module``)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base[:len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_tilecraft(name: str) -> bool:
    return name == "tilecraft" or name.startswith("tilecraft.") or name.split(".")[0] in LAYERS


def function_level_imports() -> list[tuple[str, int, str]]:
    """(file relative to the layers' parent, line, imported module) for every tilecraft import
    inside a function or method of the five packages."""
    found = []
    for layer, root in _package_dirs().items():
        for dirpath, dirnames, files in os.walk(root):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                module = _module_name(layer, rel)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), path)
                shown = f"{layer}/{rel}".replace(os.sep, "/")
                for fn in ast.walk(tree):
                    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        continue
                    for node in ast.walk(fn):
                        if isinstance(node, ast.Import):
                            names = [a.name for a in node.names]
                        elif isinstance(node, ast.ImportFrom):
                            target = _resolve(node, module, name == "__init__.py")
                            # `from . import lowbit`, `from tilecraft import targets`: the
                            # names are modules
                            names = [target] if target != "tilecraft" and node.module else \
                                [f"{target}.{a.name}" for a in node.names]
                        else:
                            continue
                        for imported in names:
                            if _is_tilecraft(imported):
                                found.append((shown, node.lineno, imported))
    return sorted(set(found))


def test_no_tilecraft_imports_inside_functions():
    allowed = set(OPTIONAL_BACKENDS)
    bad = [f"{path}:{line}: imports {mod} inside a function"
           for path, line, mod in function_level_imports() if (path, mod) not in allowed]
    assert not bad, ("move these imports to the top of their module (and fix the import cycle "
                     "that made them lazy, if there is one):\n" + "\n".join(bad))


def test_allow_lists_are_still_needed():
    seen = {(path, mod) for path, _, mod in function_level_imports()}
    stale = sorted((set(OPTIONAL_BACKENDS)) - seen)
    assert not stale, f"no longer imported inside a function: remove from the allow-list: {stale}"


def test_the_check_sees_relative_and_qualified_imports(tmp_path, monkeypatch):
    # the scanner itself: a relative, a tilecraft-qualified and a bare-layer import inside
    # functions are found; a third-party one and a top-level one are not
    pkg = tmp_path / "relax"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(
        "from .expr import Var\n"
        "def f():\n"
        "    from .op import base\n"
        "    from tilecraft.tensorir import te\n"
        "    import numpy\n"
        "class C:\n"
        "    def g(self):\n"
        "        from .. import targets\n"
        "        import relax.printer\n")
    monkeypatch.setattr(sys.modules[__name__], "_package_dirs", lambda: {"relax": str(pkg)})
    got = [(line, mod) for _, line, mod in function_level_imports()]
    assert got == [(3, "tilecraft.relax.op"), (4, "tilecraft.tensorir"), (8, "tilecraft.targets"),
                   (9, "relax.printer")]


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_imports_on_its_own(layer):
    # with no lazy imports left, a cycle shows up as an ImportError when the layer is imported
    # first, in a fresh interpreter
    proc = subprocess.run([sys.executable, "-c", f"import tilecraft.{layer}"],
                          capture_output=True, text=True, cwd=os.getcwd())
    assert proc.returncode == 0, proc.stderr[-2000:]
