"""Whole models through relax.build and the VM: the MLP, a (small) transformer encoder layer and a
ResNet bottleneck block of ``tilecraft.models``.

One build per model serves every batch size and sequence length; results are compared with the
builders' numpy references and with onnxruntime running the builders' ONNX graphs. The exported
executables are loaded and run in a fresh Python process that has numpy and this repository but
no LLVM (llvmlite blocked by a meta-path finder). A shape mismatch at run time raises a
ValueError naming the argument, and the VM keeps working.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tilecraft import relax
from tilecraft import targets
from benchmarks import gen_op_docs
from tilecraft.models import bert_encoder_layer, mlp, onnx_session, resnet_bottleneck
from tilecraft.relax.executable import load_executable
from tilecraft.relax.vm import VirtualMachine, VMArgumentError
from capabilities import import_or_require

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RTOL, ATOL = 1e-4, 1e-5

MLP_BATCHES = (1, 7, 64)
ENCODER_SIZES = [(1, 7), (2, 7), (1, 32), (2, 32)]      # (batch, seq_len)


def _close(actual, expected, what: str):
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL * max(1.0, np.abs(
        expected).max()), err_msg=what)


@pytest.fixture(scope="module")
def mlp_model():
    return mlp()   # 784-1024-1024-1024-10, the benchmark's model


@pytest.fixture(scope="module")
def encoder_model():
    return bert_encoder_layer(hidden=64, heads=4, ffn=256, seed=3)


@pytest.fixture(scope="module")
def mlp_exe(mlp_model):
    return relax.build(mlp_model.mod, "llvm", upper_bounds={"batch": 64})


@pytest.fixture(scope="module")
def encoder_exe(encoder_model):
    return relax.build(encoder_model.mod, "llvm")   # no bounds: storage from the pool


def test_mlp_one_build_every_batch(mlp_model, mlp_exe):
    vm = VirtualMachine(mlp_exe, targets.cpu(0))
    rng = np.random.default_rng(0)
    # fusion made one kernel per layer (matmul + bias + relu) out of 11 operators
    assert mlp_exe.stats()["main"]["kernel_calls"] == 4
    for batch in MLP_BATCHES:
        x, = mlp_model.make_inputs(rng, batch=batch)
        y = vm["main"](x)
        assert y.shape == (batch, 10)
        _close(y.numpy(), mlp_model.reference(x), f"mlp batch {batch}")


def test_encoder_one_build_every_batch_and_seq_len(encoder_model, encoder_exe):
    vm = VirtualMachine(encoder_exe)
    rng = np.random.default_rng(1)
    for batch, seq_len in ENCODER_SIZES + [(1, 7)]:     # and back to a size seen before
        x, = encoder_model.make_inputs(rng, batch=batch, seq_len=seq_len)
        y = vm["main"](x)
        assert y.shape == (batch, seq_len, 64)
        _close(y.numpy(), encoder_model.reference(x), f"encoder b{batch} s{seq_len}")


def test_run_time_shape_mismatch_names_the_argument(mlp_model, mlp_exe, encoder_model,
                                                    encoder_exe):
    rng = np.random.default_rng(2)
    vm = VirtualMachine(mlp_exe)
    with pytest.raises(ValueError, match=r"main: argument x: dimension 1 is 783, expected 784"):
        vm["main"](rng.standard_normal((3, 783)).astype("float32"))
    with pytest.raises(VMArgumentError, match=r"argument x has dtype float64, expected float32"):
        vm["main"](rng.standard_normal((3, 784)))
    with pytest.raises(ValueError, match=r"argument x"):
        vm["main"](rng.standard_normal((3, 784, 1)).astype("float32"))
    x, = mlp_model.make_inputs(rng, batch=3)
    _close(vm["main"](x).numpy(), mlp_model.reference(x), "mlp after errors")

    vm = VirtualMachine(encoder_exe)
    with pytest.raises(ValueError, match=r"argument x: dimension 2 is 63, expected 64"):
        vm["main"](rng.standard_normal((2, 5, 63)).astype("float32"))
    x, = encoder_model.make_inputs(rng, batch=2, seq_len=5)
    _close(vm["main"](x).numpy(), encoder_model.reference(x), "encoder after errors")


# The child process: numpy and the repository only. The finder refuses llvmlite (and the other
# compiler-side packages), so the test fails if loading or running an executable needs them.
CHILD = """
import sys
BLOCKED = ("llvmlite", "onnx", "onnxruntime", "scipy", "pyopencl", "wgpu", "xgboost")

class NoCompiler:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is not available on the board")
        return None

sys.meta_path.insert(0, NoCompiler())
sys.path.insert(0, {repo!r})
import numpy as np
from tilecraft.relax.executable import load_executable
from tilecraft.relax.vm import VirtualMachine
from tilecraft import targets

data = np.load({data!r})
for name in ("mlp", "encoder"):
    vm = VirtualMachine(load_executable(f"{tmp}/{{name}}.tcx"), targets.cpu(0))
    k = 0
    while f"{{name}}_x{{k}}" in data:
        x, want = data[f"{{name}}_x{{k}}"], data[f"{{name}}_y{{k}}"]
        got = vm["main"](x).numpy()
        np.testing.assert_allclose(got, want, rtol={rtol}, atol={atol} * max(1.0, abs(want).max()),
                                   err_msg=f"{{name}} input {{k}} {{x.shape}}")
        k += 1
    try:
        vm["main"](np.zeros((2, 3), "float32"))
    except ValueError as err:
        assert "argument x" in str(err), err
    else:
        raise AssertionError("a wrong shape was accepted")
    print(name, "ok", k)
assert not [m for m in sys.modules if m.split(".")[0] in BLOCKED], "a blocked module was imported"
"""


def test_export_and_run_in_fresh_process_without_llvm(mlp_model, mlp_exe, encoder_model,
                                                      encoder_exe, tmp_path):
    rng = np.random.default_rng(4)
    data = {}
    for name, model, exe, sizes in (
            ("mlp", mlp_model, mlp_exe, [{"batch": b} for b in MLP_BATCHES]),
            ("encoder", encoder_model, encoder_exe,
             [{"batch": b, "seq_len": s} for b, s in ENCODER_SIZES])):
        assert exe.export_library(str(tmp_path / f"{name}.tcx")) == str(tmp_path / f"{name}.tcx")
        for k, size in enumerate(sizes):
            x, = model.make_inputs(rng, **size)
            data[f"{name}_x{k}"], data[f"{name}_y{k}"] = x, model.reference(x)
    np.savez(tmp_path / "data.npz", **data)
    child = CHILD.format(repo=REPO, data=str(tmp_path / "data.npz"), tmp=str(tmp_path),
                         rtol=RTOL, atol=ATOL)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-I", "-c", textwrap.dedent(child)],
                          capture_output=True, text=True, timeout=120, env=env,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"mlp ok {len(MLP_BATCHES)}" in proc.stdout
    assert f"encoder ok {len(ENCODER_SIZES)}" in proc.stdout
    # the loaded executable runs here too, like the built one
    vm = VirtualMachine(load_executable(str(tmp_path / "mlp.tcx")))
    _close(vm["main"](data["mlp_x1"]).numpy(), data["mlp_y1"], "mlp reloaded")


def test_bottleneck_block_matches_onnxruntime():
    import_or_require("onnxruntime", "pip install 'tilecraft[bench]'")   # the oracle
    model = resnet_bottleneck(channels=32, width=8, height=12, image_width=11, seed=5)
    exe = relax.build(model.mod, "llvm")
    vm = VirtualMachine(exe)
    sess = onnx_session(model, threads=1)
    rng = np.random.default_rng(5)
    for batch in (1, 2):
        x, = model.make_inputs(rng, batch=batch)
        want = sess.run(None, {"x": x})[0]
        got = vm["main"](x).numpy()
        assert got.shape == (batch, 32, 12, 11)
        _close(got, want, f"bottleneck batch {batch} vs onnxruntime")
        _close(got, model.reference(x), f"bottleneck batch {batch} vs numpy")
    with pytest.raises(ValueError, match=r"argument x: dimension 2 is 13, expected 12"):
        vm["main"](rng.standard_normal((1, 32, 13, 11)).astype("float32"))


def test_onnx_graphs_match_the_numpy_references(mlp_model, encoder_model):
    """The benchmark compares against onnxruntime on these graphs: they compute the model."""
    import_or_require("onnxruntime", "pip install 'tilecraft[bench]'")   # the oracle
    rng = np.random.default_rng(6)
    for model, sizes in ((mlp_model, {"batch": 5}), (encoder_model, {"batch": 2, "seq_len": 9})):
        inputs = model.make_inputs(rng, **sizes)
        got = onnx_session(model, threads=1).run(None, dict(zip(model.input_names, inputs)))[0]
        _close(got, model.reference(*inputs), f"{model.name} onnxruntime vs numpy")


def test_operator_list_is_up_to_date():
    path = os.path.join(REPO, "docs", "relax-ops.md")
    with open(path, encoding="utf-8") as f:
        current = f.read()
    assert current == gen_op_docs.generate(), (
        "docs/relax-ops.md is out of date: run python -m benchmarks.gen_op_docs")
