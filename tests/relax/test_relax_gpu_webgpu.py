"""relax.build for WebGPU: every operator family and the end-to-end models on the GPU VM, with
the default GPU schedules (within the WebGPU spec's limits), against numpy (lavapipe in CI, a
real GPU through Vulkan / Metal / D3D12 where there is one).

Each family is one Relax function with many operators, so one module covers it; every function
runs at two values of its symbolic batch dim.
"""
import numpy as np
import pytest

import gpu_testutil as gpu
import relax
import targets
from relax.vm import VirtualMachine

RNG = np.random.default_rng(11)


@pytest.fixture(scope="module")
def dev():
    from targets.webgpu_backend import WebGPUError, num_adapters
    try:
        if num_adapters() == 0:
            pytest.skip("no WebGPU adapter (install mesa-vulkan-drivers for lavapipe)")
    except WebGPUError as err:
        pytest.skip(f"no WebGPU runtime: {err}")
    return targets.webgpu(0)


TARGET = "webgpu"
BARRIER = "workgroupBarrier();"


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


def test_mlp_end_to_end_symbolic_batch(dev):
    gpu.mlp_symbolic_batch(dev, TARGET)


def test_exported_executable_runs_after_loading(dev, tmp_path):
    from benchmarks.models import mlp
    model = mlp(in_features=16, hidden=(32,), out_features=4, seed=2)
    path = str(tmp_path / "mlp.tcx")
    relax.build(model.mod, "webgpu").export_library(path)
    exe = relax.load_executable(path)           # the kernels: the WebGPU module's JSON
    x, = model.make_inputs(np.random.default_rng(3), batch=5)
    y = VirtualMachine(exe, dev)["main"](x)
    np.testing.assert_allclose(y.numpy(), model.reference(x), rtol=1e-4, atol=1e-4)


def test_transformer_block_end_to_end(dev):
    gpu.transformer_block(dev, TARGET)


def test_gpu_vm_errors(dev):
    gpu.vm_errors(dev, TARGET, "webgpu device")
