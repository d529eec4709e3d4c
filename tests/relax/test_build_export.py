"""relax.build options, the Executable container: export, load in a fresh process (numpy only),
cross-compiled executables, tuning-database hook, errors."""
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Tuple, Var, const
from tilecraft.relax.build import build
from tilecraft.relax.executable import ExecutableFormatError, load_executable
from tilecraft.relax.vm import VirtualMachine
from tilecraft.targets.runtime.elf import read_elf_header
from tilecraft.tensorir import Schedule, te

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def dense(x, w):
    k = te.reduce_axis((0, x.shape[1]), "k")
    return te.compute((x.shape[0], w.shape[1]),
                      lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), "dense")


def tanh_add(x, b):
    return te.compute(x.shape, lambda i, j: te.tanh(x[i, j] + b[j]), "tanh_add")


W, B = rand(16, 24), rand(24)


def model():
    """main(x: (n, 16)) -> (tanh(x @ W + B), x @ W)"""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit_te(dense, x, const(W))
            y = bb.emit_te(tanh_add, h, const(B))
            gv = bb.emit_output(Tuple([y, h]))
        bb.emit_func_output(gv)
    return bb.get()


def ref(x):
    h = x @ W
    return np.tanh(h + B), h


@pytest.fixture(scope="module")
def exe():
    return build(model(), "llvm")


def test_export_writes_one_container(exe, tmp_path):
    path = str(tmp_path / "model.tcx")
    assert exe.export_library(path) == path
    assert sorted(os.listdir(tmp_path)) == ["model.tcx"]  # no temporary left behind
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        meta = json.loads(zf.read("executable.json"))
        program = json.loads(zf.read("program.json"))
        lib = zf.read("kernels.so")
        assert {"executable.json", "program.json", "kernels.so"} <= names
        assert meta["format"] == "tilecraft-relax-executable" and meta["abi_version"] == 1
        assert meta["target"] == str(exe.target) and meta["functions"] == ["main"]
        assert sorted(meta["kernels"]) == sorted(exe.kernel_names)
        for c, arr in zip(meta["constants"], exe.constants):
            raw = zf.read(c["file"])
            assert c["dtype"] == arr.dtype.name and tuple(c["shape"]) == arr.shape
            np.testing.assert_array_equal(np.frombuffer(raw, "<f4").reshape(arr.shape), arr)
    assert program["functions"]["main"]["params"] == ["x"]
    assert read_elf_header(lib[:64]).machine == targets.ELF_MACHINE["x86_64"]


def test_export_load_in_fresh_process_without_llvm(exe, tmp_path):
    path = str(tmp_path / "model.tcx")
    exe.export_library(path)
    x = rand(5, 16)
    np.save(tmp_path / "x.npy", x)
    child = f"""
import sys
sys.modules["llvmlite"] = None          # the board has no LLVM: importing it must not happen
sys.path.insert(0, {REPO!r})
import numpy as np
from tilecraft.relax.executable import load_executable
from tilecraft.relax.vm import VirtualMachine
from tilecraft import targets
exe = load_executable({path!r})
vm = VirtualMachine(exe, targets.cpu(0))
y, h = vm["main"](np.load({str(tmp_path / 'x.npy')!r}))
np.save({str(tmp_path / 'y.npy')!r}, y.numpy())
np.save({str(tmp_path / 'h.npy')!r}, h.numpy())
y1, _ = vm["main"](np.ones((1, 16), "float32"))
print("ok", y1.shape)
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=120, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "ok (1, 24)" in proc.stdout
    y_ref, h_ref = ref(x)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), y_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.load(tmp_path / "h.npy"), h_ref, rtol=1e-4, atol=1e-5)
    # and in this process: the loaded executable runs like the built one
    vm = VirtualMachine(load_executable(path))
    np.testing.assert_allclose(vm["main"](x)[0].numpy(), y_ref, rtol=1e-4, atol=1e-5)
    # re-export of a loaded executable gives the same program and library
    again = str(tmp_path / "again.tcx")
    load_executable(path).export_library(again)
    with zipfile.ZipFile(path) as a, zipfile.ZipFile(again) as b:
        assert a.read("program.json") == b.read("program.json")
        assert a.read("kernels.so") == b.read("kernels.so")


def test_cross_compiled_executable_for_the_board(tmp_path):
    exe = build(model(), "raspberry-pi/4b-aarch64")
    assert "aarch64" in exe.target
    with pytest.raises(RuntimeError, match="aarch64"):
        VirtualMachine(exe)
    path = str(tmp_path / "model-rpi4.tcx")
    exe.export_library(path)
    with zipfile.ZipFile(path) as zf:
        header = read_elf_header(zf.read("kernels.so")[:64])
        meta = json.loads(zf.read("executable.json"))
    assert header.machine == targets.ELF_MACHINE["aarch64"] and header.bits == 64
    assert header.type == 3  # a shared library
    assert meta["triple"].startswith("aarch64")
    loaded = load_executable(path)   # loads here for inspection ...
    assert loaded.function_names == ["main"]
    with pytest.raises(RuntimeError, match="aarch64 machine"):   # ... but runs on the board
        VirtualMachine(loaded)


def test_missing_linker_is_a_clear_error(exe, tmp_path, monkeypatch):
    path = tmp_path / "model.tcx"
    path.write_bytes(b"previous")
    fresh = build(model(), "llvm")   # nothing linked yet
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(targets.ToolchainError, match="ld.lld"):
        fresh.export_library(str(path))
    assert path.read_bytes() == b"previous"   # written atomically: the old file is intact


def test_bad_containers(tmp_path):
    bad = tmp_path / "bad.tcx"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ExecutableFormatError, match="not a tilecraft executable"):
        load_executable(str(bad))
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("executable.json", json.dumps({"format": "tilecraft-relax-executable",
                                                   "format_version": 99}))
        zf.writestr("program.json", "{}")
    with pytest.raises(ExecutableFormatError, match="rebuild it"):
        load_executable(str(bad))
    with pytest.raises(FileNotFoundError):
        load_executable(str(tmp_path / "missing.tcx"))


class _Database:
    """A tuning database stand-in: a hand schedule for the dense kernel."""

    def __init__(self):
        self.queries = []

    def query_schedule(self, func, target):
        self.queries.append(func.attr_dict.get("global_symbol"))
        if func.attr_dict.get("global_symbol", "").startswith("fused_dense"):
            sch = Schedule(func)
            blk = sch.get_block("dense")
            i, j, k = sch.get_loops(blk)
            sch.unroll(k)
            return sch
        return None


def test_database_hook_and_pipeline_option():
    db = _Database()
    exe = build(model(), "llvm", database=db)
    assert db.queries and all(isinstance(q, str) for q in db.queries)
    src = exe.kernel_module.get_source("ll-raw")
    assert src  # compiled
    x = rand(3, 16)
    y, h = VirtualMachine(exe)["main"](x)
    np.testing.assert_allclose(y.numpy(), ref(x)[0], rtol=1e-4, atol=1e-5)
    # a custom pipeline (here: none); LegalizeOps and memory planning still run
    exe2 = build(model(), "llvm", pipeline=[])
    assert len(exe2.kernel_names) == 2   # unfused: dense and tanh_add
    np.testing.assert_allclose(VirtualMachine(exe2)["main"](x)[1].numpy(), ref(x)[1],
                               rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match="query_schedule"):
        build(model(), "llvm", database=object())


def test_program_text_and_stats(exe):
    text = exe.as_text()
    assert "function main(x)" in text and "call_kernel" in text and "match" in text
    st = exe.stats()["main"]
    assert st["kernel_calls"] == len(exe.kernel_names)


def test_executable_without_kernels_round_trips(tmp_path):
    from tilecraft.relax import ShapeExpr
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", "m"), "float32"))
    n, m = x.struct_info.shape
    with bb.function("main", [x]):
        bb.emit_func_output(Tuple([x, ShapeExpr((m, n * 2))]))
    exe = build(bb.get(), "llvm")
    assert exe.kernel_module is None and exe.kernel_names == []
    path = str(tmp_path / "shapes.tcx")
    exe.export_library(path)
    with zipfile.ZipFile(path) as zf:
        assert "kernels.so" not in zf.namelist()
    a = rand(2, 3)
    same, shape = VirtualMachine(load_executable(path))["main"](a)
    np.testing.assert_array_equal(same.numpy(), a)
    assert shape == (3, 4)
