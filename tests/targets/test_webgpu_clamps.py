"""Fewer naga index clamps in the generated WGSL (issue 32, WebGPU in browsers).

A browser's WebGPU (naga, Tint) clamps every index into a workgroup array, and every index into
a vector, that is not a constant. An element of an ``array<vec4<f32>>`` workgroup array read at
``s[(i) >> 2u][(i) & 3i]`` costs two clamps, at ``s[q][2i]`` (a provably constant lane) one;
a workgroup array that no access reads or writes as a whole vector is a flat ``array<f32>``.
The counts are read from the WGSL here (the SPIR-V count, ``benchmarks/webgpu_spirv.py``,
needs system packages); every kernel also runs on the adapter (lavapipe in CI) against numpy.
"""
import re

import numpy as np
import pytest

from tilecraft import relax
from tilecraft.models import bert_encoder_layer
from tilecraft.models.resnet import resnet_bottleneck
from tilecraft.relax import VirtualMachine
from webgpu_testutil import webgpu_device


@pytest.fixture(scope="module")
def dev():
    return webgpu_device()


def _kernels(src: str) -> dict:
    """{kernel name: its WGSL} of a module's source."""
    return {chunk.split(":")[0]: chunk for chunk in src.split("// kernel ")[1:]}


def _vec4_workgroup(wgsl: str) -> list:
    return re.findall(r"var<workgroup> (\w+): array<vec4", wgsl)


def _dynamic_lanes(wgsl: str) -> int:
    """Element accesses of workgroup vec4 arrays at a lane the thread decides (two clamps)."""
    return len(re.findall(r"\bs_\w+\[[^;]*?\]\[\([^;]*?& 3i\]", wgsl))


def _constant_lanes(wgsl: str) -> int:
    """Element accesses of workgroup vec4 arrays at a constant lane of a dynamic vector."""
    return len(re.findall(r"\bs_\w+\[[^\[\];]*[a-z_][^\[\];]*\]\[[0-3]i\]", wgsl))


def _whole_vector_access(wgsl: str, name: str) -> bool:
    """Whether ``name`` (a vec4 workgroup array) is read or written as whole vectors."""
    # an index without brackets: not a component (``name[q][c]``)
    return bool(re.search(rf"= {name}\[[^\[\];]*\];|\b{name}\[[^\[\];]*\] = ", wgsl))


def test_bert_layer_gemms_index_constant_lanes(dev):
    """The GEMMs' workgroup tiles: every element access at a provably constant lane indexes
    the component by a constant (the FFN GEMM's weight tile had 4 ``& 3i`` lanes); only the
    attention's K / V tile stores keep a lane of the thread's. Every vec4 workgroup array is
    read as whole vectors somewhere (else it would be flat)."""
    model = bert_encoder_layer(hidden=64, heads=2, ffn=256, seed=7)
    exe = relax.build(model.mod, "webgpu")
    kernels = _kernels(exe.kernel_module.get_source())
    for name, wgsl in kernels.items():
        for arr in _vec4_workgroup(wgsl):
            assert _whole_vector_access(wgsl, arr), (name, arr)
        if "attention" not in name:
            assert _dynamic_lanes(wgsl) == 0, name
    ffn = [w for n, w in kernels.items() if "gelu" in n and _vec4_workgroup(w)]
    assert ffn and sum(_constant_lanes(w) for w in ffn) > 0
    attention = [w for n, w in kernels.items() if "attention" in n]
    assert attention and all(_dynamic_lanes(w) <= 2 for w in attention)
    x, = model.make_inputs(np.random.default_rng(5), batch=2, seq_len=24)
    y = VirtualMachine(exe, dev)["main"](x).numpy()
    ref = model.reference(x)
    np.testing.assert_allclose(y, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())


def test_conv3x3_window_is_a_flat_workgroup_array(dev):
    """A 3x3 convolution's padded input window (rows of 16 + 2, no aligned vector read) is a
    flat ``array<f32>``: one clamp per window read, where the vec4 view indexed a lane of the
    thread's for every one of them (74 such reads in this kernel)."""
    model = resnet_bottleneck(channels=64, width=16, height=16, batch=1, seed=3)
    exe = relax.build(model.mod, "webgpu")
    kernels = _kernels(exe.kernel_module.get_source())
    conv3 = [w for w in kernels.values() if "s_pad_shared" in w]
    assert conv3
    for wgsl in conv3:
        assert re.search(r"var<workgroup> s_pad_shared: array<f32, \d+>;", wgsl)
        assert _dynamic_lanes(wgsl) == 0
    for name, wgsl in kernels.items():
        assert _dynamic_lanes(wgsl) == 0, name
        for arr in _vec4_workgroup(wgsl):
            assert _whole_vector_access(wgsl, arr), (name, arr)
    x, = model.make_inputs(np.random.default_rng(2), batch=1)
    y = VirtualMachine(exe, dev)["main"](x).numpy()
    ref = model.reference(x)
    np.testing.assert_allclose(y, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())
