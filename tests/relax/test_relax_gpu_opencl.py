"""relax.build for OpenCL: every operator family and the end-to-end models on the GPU VM, with
the default GPU schedules, against numpy (PoCL in CI, a real GPU where there is one).

Each family is one Relax function with many operators, so one module (one OpenCL program, one
PoCL compile) covers it; every function runs at two values of its symbolic batch dim.
"""
import numpy as np
import pytest

import gpu_testutil as gpu
from tilecraft import relax
from tilecraft.relax.vm import VirtualMachine
from capabilities import opencl_device

RNG = np.random.default_rng(11)


@pytest.fixture(scope="module")
def dev():
    global TARGET
    # a CPU driver (PoCL in CI) gets the CPU variant of the default schedules
    device, TARGET = opencl_device()
    return device


TARGET = "opencl"
BARRIER = "barrier(CLK_LOCAL_MEM_FENCE)"


def test_elementwise_broadcast_and_reductions(dev):
    gpu.elementwise_broadcast_and_reductions(dev, TARGET, RNG)


def test_nn_activations_and_norms(dev):
    exe = gpu.nn_activations_and_norms(dev, TARGET, RNG)
    src = exe.kernel_module.get_source()
    assert BARRIER in src     # the rows reduce across threads


def test_linear_conv_and_pooling(dev):
    gpu.linear_conv_and_pooling(dev, TARGET, RNG)


def test_manipulation_indexing_and_image(dev):
    gpu.manipulation_indexing_and_image(dev, TARGET, RNG)


def test_mlp_end_to_end_symbolic_batch(dev, tmp_path):
    exe, model, rng = gpu.mlp_symbolic_batch(dev, TARGET)
    # one file with the OpenCL program inside, loaded and run again
    path = exe.export_library(str(tmp_path / "mlp_opencl.tcx"))
    vm2 = VirtualMachine(relax.load_executable(path), dev)
    x, = model.make_inputs(rng, batch=4)
    np.testing.assert_allclose(vm2["main"](x).numpy(), model.reference(x), rtol=1e-4, atol=1e-4)


def test_transformer_block_end_to_end(dev):
    gpu.transformer_block(dev, TARGET)


def test_gpu_vm_errors(dev):
    gpu.vm_errors(dev, TARGET, "run on an opencl device")
