"""The wheel, built from this tree and installed into fresh virtual environments outside the
checkout — the way users install tilecraft, without the network.

* The wheel holds the ``tilecraft`` package alone (its RECORD), every module of the tree, the
  metadata of the profiles and the console script.
* The compiler profile (``pip install tilecraft``): a venv with the wheel whose dependencies are
  the ones already installed here (a ``.pth`` file pointing at a folder of links to exactly the
  distributions its requirements name, and theirs): ``import tilecraft`` from elsewhere, the
  ``tilecraft`` command, ``tilecraft compile`` of a tiny ONNX model and ``tilecraft run``.
* The board profile (``pip install --no-deps tilecraft numpy``): a venv with the wheel and numpy
  alone loads a kernel library and a relax executable compiled by the first, serves both with
  ``python -m tilecraft.rpc.server``, and says ``pip install tilecraft`` when asked to compile.
  ``TILECRAFT_BOARD_PYTHON=/path/to/python3.9`` (a Python with numpy and pip) makes that venv
  from another interpreter, with that one's numpy: e.g. the oldest the board side supports.
"""
from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import textwrap
import zipfile
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from capabilities import LLD, REPO, import_or_require, requires

LAYERS = ("tensorir", "targets", "rpc", "metaschedule", "relax")
VERSION = re.search(r'^version\s*=\s*"([^"]+)"',
                    Path(REPO, "pyproject.toml").read_text(encoding="utf-8"), re.M).group(1)
BOARD_PYTHON = os.environ.get("TILECRAFT_BOARD_PYTHON")


# -- fresh environments ------------------------------------------------------------------------

def clean_env() -> dict:
    """This process's environment without anything that points Python at other packages."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP",
                        "PYTHONUSERBASE")}
    env["PYTHONNOUSERSITE"] = "1"      # no ~/.local site-packages either
    return env


class Venv:
    """A virtual environment in ``root``; its programs run from ``cwd`` (outside the checkout)."""

    def __init__(self, root: Path, cwd: Path):
        self.root, self.cwd = root, cwd

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    def run(self, *argv: str, timeout: float = 300, check: bool = True):
        proc = subprocess.run(list(argv), cwd=self.cwd, env=clean_env(), capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n"
                                 f"{proc.stderr}")
        return proc

    def python_code(self, code: str, **kw):
        return self.run(self.python, "-c", textwrap.dedent(code), **kw)

    def site_packages(self) -> Path:
        out = self.python_code("import sysconfig; print(sysconfig.get_paths()['purelib'])")
        return Path(out.stdout.strip())


def make_venv(root: Path, cwd: Path, wheel: str, python: str = sys.executable) -> Venv:
    """A venv of ``python``'s base interpreter with the wheel installed by ``python``'s pip
    (``pip --python VENV``), no dependencies."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(root)], check=True,
                   env=clean_env(), capture_output=True, timeout=120)
    venv = Venv(root, cwd)
    venv.run(python, "-m", "pip", "--python", venv.python, "install", "--quiet", "--no-deps",
             "--no-index", "--no-warn-script-location", wheel)
    return venv


def dependency_closure(requirements: list[str]) -> list[str]:
    """The names of the installed distributions ``requirements`` name, and theirs (no
    extras)."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(requirements)
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in found:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            requires(f"{req.name} installed beside the tests (a dependency of the wheel)", False,
                     "pip install -e '.[dev]'")
        assert req.specifier.contains(dist.version, prereleases=True), \
            f"{req.name} {dist.version} here does not satisfy the wheel's {req}"
        found[name] = dist
        todo += dist.requires or []
    return [d.metadata["Name"] for d in found.values()]


TOP_LEVEL_FILES = """
import json, os, sys
from importlib import metadata
out = []
for name in sys.argv[1:]:
    dist = metadata.distribution(name)
    if not dist.files:
        sys.exit(f"{name} has no RECORD: cannot tell its files")
    base = str(dist.locate_file(""))
    tops = {str(f).replace(os.sep, "/").split("/")[0] for f in dist.files}
    out += [os.path.join(base, t) for t in sorted(tops - {"..", "__pycache__"})]
print(json.dumps(out))
"""


def see_dependencies(venv: Venv, names: list[str], folder: Path,
                     python: str = sys.executable) -> None:
    """Let ``venv`` import the distributions ``names`` installed for ``python`` through a
    ``.pth`` file naming ``folder``, a folder of links to their top-level files (packages,
    modules, ``.dist-info``, bundled ``.libs``) as their site-packages holds them."""
    out = subprocess.run([python, "-c", TOP_LEVEL_FILES, *names], capture_output=True,
                         text=True, env=clean_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    folder.mkdir(parents=True, exist_ok=True)
    for path in json.loads(out.stdout):
        link = folder / os.path.basename(path)
        if os.path.exists(path) and not link.exists():
            link.symlink_to(path)
    (venv.site_packages() / "_test_dependencies.pth").write_text(f"{folder}\n")


def wheel_requirements(wheel: str) -> list[str]:
    """The wheel's ``Requires-Dist`` lines without an extra: ``pip install tilecraft``'s."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"tilecraft-{VERSION}.dist-info/METADATA").decode()
    return [line.split(":", 1)[1].strip() for line in meta.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """Where the venvs' programs run: a folder outside the checkout."""
    cwd = tmp_path_factory.mktemp("elsewhere")
    assert not str(cwd.resolve()).startswith(str(Path(REPO).resolve()) + os.sep)
    return cwd


@pytest.fixture(scope="module")
def compiler_venv(tilecraft_wheel, tmp_path_factory, outside) -> Venv:
    """``pip install tilecraft``: the wheel and the distributions its requirements need."""
    root = tmp_path_factory.mktemp("compiler-venv")
    venv = make_venv(root / "venv", outside, tilecraft_wheel)
    see_dependencies(venv, dependency_closure(wheel_requirements(tilecraft_wheel)),
                     root / "deps")
    return venv


@pytest.fixture(scope="module")
def board_venv(tilecraft_wheel, tmp_path_factory, outside) -> Venv:
    """``pip install --no-deps tilecraft numpy``: the wheel and numpy alone."""
    root = tmp_path_factory.mktemp("board-venv")
    python = BOARD_PYTHON or sys.executable
    venv = make_venv(root / "venv", outside, tilecraft_wheel, python)
    see_dependencies(venv, ["numpy"], root / "deps", python)
    return venv


# -- the wheel itself ----------------------------------------------------------------------------

def test_the_wheel_holds_the_tilecraft_package_alone(tilecraft_wheel):
    with zipfile.ZipFile(tilecraft_wheel) as z:
        record = z.read(f"tilecraft-{VERSION}.dist-info/RECORD").decode()
        meta = z.read(f"tilecraft-{VERSION}.dist-info/METADATA").decode()
        entry_points = z.read(f"tilecraft-{VERSION}.dist-info/entry_points.txt").decode()
    files = [line.rsplit(",", 2)[0] for line in record.splitlines() if line]
    assert {f.split("/")[0] for f in files} == {"tilecraft", f"tilecraft-{VERSION}.dist-info"}
    # every module of the tree, in its place in the namespace, and nothing else
    in_tree = {"tilecraft/" + str(p.relative_to(REPO)) for layer in LAYERS
               for p in Path(REPO, layer).rglob("*.py") if "__pycache__" not in p.parts}
    in_tree |= {str(p.relative_to(REPO)) for p in Path(REPO, "tilecraft").rglob("*.py")
                if "__pycache__" not in p.parts}
    in_wheel = {f for f in files if f.endswith(".py")}
    assert in_wheel == in_tree, (sorted(in_tree - in_wheel)[:20], sorted(in_wheel - in_tree)[:20])
    assert "Requires-Python: >=3.9" in meta.splitlines()
    extras = {line.split(":", 1)[1].strip() for line in meta.splitlines()
              if line.startswith("Provides-Extra:")}
    assert extras == {"opencl", "webgpu", "torch", "bench", "all", "dev"}
    assert {canonicalize_name(Requirement(r).name) for r in wheel_requirements(tilecraft_wheel)} \
        == {"numpy", "llvmlite", "onnx", "xgboost-cpu", "tqdm"}
    assert re.search(r"^tilecraft = tilecraft\.cli:main$", entry_points, re.M)


# -- the compiler profile -----------------------------------------------------------------------

def test_tilecraft_imports_from_the_installed_wheel(compiler_venv):
    out = compiler_venv.python_code("""
        import json, sys
        import tilecraft
        from tilecraft import relax, targets
        from tilecraft import metaschedule, rpc, tensorir
        from tilecraft.tensorir import te
        print(json.dumps({"file": tilecraft.__file__, "relax": relax.__file__,
                          "in_checkout": tilecraft.IN_CHECKOUT, "path": sys.path,
                          "version": tilecraft.__version__}))
    """)
    info = json.loads(out.stdout)
    site = str(compiler_venv.site_packages())
    assert info["file"] == os.path.join(site, "tilecraft", "__init__.py")
    assert info["relax"] == os.path.join(site, "tilecraft", "relax", "__init__.py")
    assert info["in_checkout"] is False and info["version"] == VERSION
    repo = str(Path(REPO).resolve())
    assert not [p for p in info["path"] if p and str(Path(p).resolve()).startswith(repo)]


def test_the_console_script_runs(compiler_venv):
    out = compiler_venv.run(str(compiler_venv.root / "bin" / "tilecraft"), "--help")
    assert "compile" in out.stdout and "run" in out.stdout


def test_the_console_script_prints_the_version(compiler_venv):
    out = compiler_venv.run(str(compiler_venv.root / "bin" / "tilecraft"), "--version")
    assert VERSION in out.stdout


RNG = np.random.default_rng(27)
W = RNG.standard_normal((8, 4)).astype("float32")
B = RNG.standard_normal(4).astype("float32")


def tiny_model_reference(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W + B, 0)


@pytest.fixture(scope="module")
def compiled_model(compiler_venv, outside) -> Path:
    """``tilecraft compile tiny.onnx -o tiny.tcx``: y = relu(x @ W + B), a symbolic batch."""
    requires(*LLD)   # exporting links the kernels
    onnx = import_or_require("onnx", "pip install tilecraft")
    from onnx import TensorProto, helper, numpy_helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Add", ["h", "B"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [x], [y], [numpy_helper.from_array(W, "W"),
                                                       numpy_helper.from_array(B, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(outside / "tiny.onnx"))
    tilecraft = str(compiler_venv.root / "bin" / "tilecraft")
    compiler_venv.run(tilecraft, "-q", "compile", "tiny.onnx", "-o", "tiny.tcx")
    return outside / "tiny.tcx"


def test_tilecraft_compile_and_run_a_tiny_onnx_model(compiler_venv, compiled_model, outside):
    tilecraft = str(compiler_venv.root / "bin" / "tilecraft")
    for batch in (1, 5):
        x = RNG.standard_normal((batch, 8)).astype("float32")
        np.save(outside / "x.npy", x)
        compiler_venv.run(tilecraft, "-q", "run", compiled_model.name, "--input", "x.npy",
                          "--output", "y.npy")
        np.testing.assert_allclose(np.load(outside / "y.npy"), tiny_model_reference(x),
                                   rtol=1e-5, atol=1e-5)


# -- the board profile ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kernel_library(compiler_venv, outside) -> Path:
    """``B = A * 2 + c`` over (n, 7), exported by the compiler profile."""
    requires(*LLD)
    compiler_venv.python_code("""
        from tilecraft import targets
        from tilecraft.tensorir import te
        n, c = te.var("n"), te.var("c", "float32")
        A = te.placeholder((n, 7), "float32", "A")
        B = te.compute((n, 7), lambda i, j: A[i, j] * 2.0 + c, "B")
        targets.build(te.create_prim_func([A, B, c]), "llvm").export_library("axpb.so")
    """)
    return outside / "axpb.so"


def test_the_board_profile_has_numpy_alone(board_venv):
    out = board_venv.python_code("""
        import importlib.util, json
        print(json.dumps({m: importlib.util.find_spec(m) is not None for m in
                          ("numpy", "tilecraft", "llvmlite", "onnx", "xgboost", "tqdm")}))
    """)
    assert json.loads(out.stdout) == {"numpy": True, "tilecraft": True, "llvmlite": False,
                                      "onnx": False, "xgboost": False, "tqdm": False}


def test_the_board_profile_runs_a_kernel_library_and_a_relax_executable(
        board_venv, kernel_library, compiled_model, outside):
    a = RNG.standard_normal((6, 7)).astype("float32")
    x = RNG.standard_normal((3, 8)).astype("float32")
    np.savez(outside / "board-in.npz", a=a, x=x)
    out = board_venv.python_code(f"""
        import sys
        import numpy as np
        from tilecraft import relax, targets
        data = np.load("board-in.npz")
        lib = targets.load_module({kernel_library.name!r})
        b = np.empty_like(data["a"])
        lib["main"](data["a"], b, 0.5)
        vm = relax.VirtualMachine(relax.load_executable({compiled_model.name!r}), targets.cpu(0))
        y = vm["main"](data["x"]).numpy()
        np.savez("board-out.npz", b=b, y=y)
        print(sys.version_info[0], sys.version_info[1],
              sorted(m for m in sys.modules if m.split(".")[0] in
                     ("llvmlite", "onnx", "xgboost", "tqdm", "scipy")))
    """)
    got = np.load(outside / "board-out.npz")
    np.testing.assert_allclose(got["b"], a * 2 + 0.5, rtol=1e-6)
    np.testing.assert_allclose(got["y"], tiny_model_reference(x), rtol=1e-5, atol=1e-5)
    assert out.stdout.split(" ", 2)[2].strip() == "[]"


def test_the_board_profile_says_how_to_get_the_compiler(board_venv):
    out = board_venv.python_code("""
        from tilecraft import targets
        from tilecraft.optional import MissingDependencyError
        from tilecraft.tensorir import te
        A = te.placeholder((4,), "float32", "A")
        func = te.create_prim_func([A, te.compute((4,), lambda i: A[i] + 1.0, "B")])
        for what in ("targets.build(func, 'llvm')", "__import__('tilecraft.relax.frontend')"):
            try:
                eval(what)
            except MissingDependencyError as err:
                print(err)
    """)
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stdout
    assert lines[0].startswith("compiling for a CPU") and \
        "needs llvmlite, which is not installed: pip install tilecraft" in lines[0]
    assert lines[1].startswith("the ONNX frontend") and \
        "needs onnx, which is not installed: pip install tilecraft" in lines[1]


def start_board_server(venv: Venv, timeout: float = 60) -> tuple[subprocess.Popen, int]:
    """``python -m tilecraft.rpc.server`` of ``venv`` on a free loopback port, with the relax
    plugin; returns the process and the port (from its "listening on HOST:PORT" line)."""
    proc = subprocess.Popen([venv.python, "-m", "tilecraft.rpc.server", "--host", "127.0.0.1",
                             "--port", "0", "--key", "board-profile", "--insecure-local", "--plugin",
                             "tilecraft.relax.rpc_plugin"], cwd=venv.cwd, env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    line = proc.stdout.readline() if sel.select(timeout) else ""
    sel.close()
    if "listening on" not in line:
        stop(proc)
        raise AssertionError(f"the board profile's server did not start: {line!r}\n"
                             f"{proc.stderr.read()}")
    return proc, int(line.split("listening on ", 1)[1].split()[0].rsplit(":", 1)[1])


def stop(proc: subprocess.Popen) -> None:
    """Kill the server's process group (it and its sessions)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def test_the_board_profiles_server_serves_what_the_compiler_profile_built(
        board_venv, compiler_venv, kernel_library, compiled_model):
    server, port = start_board_server(board_venv)
    try:
        out = compiler_venv.python_code(f"""
            import numpy as np
            from tilecraft import rpc
            from tilecraft.relax.rpc_plugin import RemoteVirtualMachine
            W = np.array({W.tolist()!r}, "float32")
            B = np.array({B.tolist()!r}, "float32")
            rng = np.random.default_rng(3)
            with rpc.connect("127.0.0.1", {port}, timeout=30, call_timeout=60) as sess:
                lib = sess.load_module(sess.upload({kernel_library.name!r}))
                a = rng.standard_normal((9, 7)).astype("float32")
                dev = sess.cpu(0)
                ra, rb = sess.array(a, dev), sess.empty((9, 7), "float32", dev)
                lib["main"](ra, rb, -1.5)
                np.testing.assert_allclose(rb.numpy(), a * 2 - 1.5, rtol=1e-6)
                vm = RemoteVirtualMachine(sess, sess.upload({compiled_model.name!r}))
                for batch in (1, 4):
                    x = rng.standard_normal((batch, 8)).astype("float32")
                    np.testing.assert_allclose(vm["main"](x), np.maximum(x @ W + B, 0),
                                               rtol=1e-5, atol=1e-5)
                print("served", sess.platform["python"])
        """)
        board_python = board_venv.python_code("import platform; print(platform.python_version())")
        assert out.stdout.split() == ["served", board_python.stdout.strip()], out.stdout
    finally:
        stop(server)


# -- tilecraft demo, zoo and rpc: what the CLI ships ----------------------------------------------

@pytest.fixture(scope="module")
def bench_venv(tilecraft_wheel, tmp_path_factory, outside) -> Venv:
    """``pip install 'tilecraft[bench]'``: the compiler and onnxruntime / matplotlib."""
    root = tmp_path_factory.mktemp("bench-venv")
    venv = make_venv(root / "venv", outside, tilecraft_wheel)
    see_dependencies(venv, dependency_closure(wheel_requirements(tilecraft_wheel)
                                              + ["onnxruntime", "matplotlib"]), root / "deps")
    return venv


def test_the_installed_demo_runs_a_small_model_against_onnxruntime(bench_venv):
    requires(*LLD)
    out = bench_venv.run(str(bench_venv.root / "bin" / "tilecraft"), "-q", "demo", "--model",
                         "mlp", "--rounds", "1")
    assert "matches onnxruntime" in out.stdout and "ratio" in out.stdout, out.stdout


def test_the_installed_zoo_lists_its_models(bench_venv):
    out = bench_venv.run(str(bench_venv.root / "bin" / "tilecraft"), "zoo", "--list")
    assert "resnet50" in out.stdout and "mlp" in out.stdout, out.stdout


def test_the_compiler_profile_names_the_bench_extra_for_the_demo(compiler_venv):
    out = compiler_venv.run(str(compiler_venv.root / "bin" / "tilecraft"), "demo", "--model",
                            "mlp", check=False)
    assert out.returncode == 1 and "tilecraft[bench]" in out.stderr, (out.stdout, out.stderr)


def test_the_board_profile_runs_the_rpc_commands(board_venv):
    tilecraft = str(board_venv.root / "bin" / "tilecraft")
    assert "--tracker" in board_venv.run(tilecraft, "rpc", "server", "--help").stdout
    assert "--port" in board_venv.run(tilecraft, "rpc", "tracker", "--help").stdout
    assert VERSION in board_venv.run(tilecraft, "--version").stdout
