"""Fewer naga index clamps in the generated WGSL (issue 32, WebGPU in browsers).

A browser's WebGPU (naga, Tint) clamps every index into a workgroup array, and every index into
a vector, that is not a constant. An element of an ``array<vec4<f32>>`` workgroup array read at
``s[(i) >> 2u][(i) & 3i]`` costs two clamps, at ``s[q][2i]`` (a provably constant lane) one;
a workgroup array that no access reads or writes as a whole vector is a flat ``array<f32>``.
A workgroup element read several times between barriers is read once into a variable. The
counts are read from the WGSL here (the SPIR-V count, ``benchmarks/webgpu_spirv.py``, needs
system packages); every kernel also runs on the adapter (lavapipe in CI) against numpy.
"""
import re

import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.models import bert_encoder_layer
from tilecraft.models.resnet import resnet_bottleneck
from tilecraft.relax import VirtualMachine
from tilecraft.tensorir.expr import Var, const, floormod
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.stmt import Allocate, Buffer, BufferStore, For, IfThenElse, seq
from tilecraft.targets.webgpu_backend import wgsl as wgsl_codegen
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


def _reuse_func() -> PrimFunc:
    """64 invocations and a shared tile: each reads its neighbour's element twice after a
    barrier (one read, reused), adds 1 to its own, reads it inside a branch taken by half of
    them and after it (read again: the branch's read may not have run), adds 1 four times in
    a rolled loop (each iteration reads what the one before stored) and reads it last."""
    G = Buffer("G", (64,), "float32")
    O = Buffer("O", (5, 64), "float32")
    sh = Buffer("tile", (64,), "float32", scope="shared")
    tx, k = Var("tx"), Var("k")
    one = const(1.0, "float32")
    own_plus_one = BufferStore(sh, sh[tx] + one, [tx])
    body = seq(
        BufferStore(sh, G[tx], [tx]),
        BufferStore(O, sh[floormod(tx + 1, 64)], [0, tx]),
        BufferStore(O, sh[floormod(tx + 1, 64)] * const(2.0, "float32"), [1, tx]),
        own_plus_one,
        IfThenElse(floormod(tx, 2) == 0,
                   BufferStore(O, sh[tx] * const(3.0, "float32"), [2, tx])),
        BufferStore(O, sh[tx], [3, tx]),
        For(k, 0, 4, "serial", own_plus_one),
        BufferStore(O, sh[tx], [4, tx]))
    body = Allocate(sh, For(tx, 0, 64, "thread_binding", body, thread_tag="threadIdx.x"))
    handles = [Var(x.name, "handle") for x in (G, O)]
    return PrimFunc(handles, body, dict(zip(handles, (G, O))),
                    attrs={"global_symbol": "main", "tir.is_scheduled": True})


def test_workgroup_reads_are_reused_until_a_store_barrier_or_branch_end(dev, rng):
    """A workgroup element read twice between barriers is read once (naga clamps every read);
    a store to the array, a barrier or the end of a branch makes the next read read again."""
    mod = targets.build(_reuse_func(), "webgpu")
    src = mod.get_source()
    assert src.count("s_tile[((i32(tc_lid.x) + 1i) & 63i)]") == 1
    g = rng.standard_normal(64).astype("float32")
    out = targets.array(np.zeros((5, 64), "float32"), dev)
    mod["main"](targets.array(g, dev), out)
    want = np.zeros((5, 64), "float32")
    want[0] = np.roll(g, -1)
    want[1] = want[0] * 2
    want[2, ::2] = (g[::2] + 1) * 3
    want[3] = g + 1
    want[4] = g + 1 + 1 + 1 + 1 + 1
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6, atol=1e-6)


def test_reuse_switch_reads_every_access_again(dev, rng, monkeypatch):
    """``wgsl.WORKGROUP_READ_REUSE = False`` (the GPU A/B, ``gpu_models``' ``noreuse`` kinds):
    every read of a workgroup element is its own access again, and the kernel still computes
    the same."""
    monkeypatch.setattr(wgsl_codegen, "WORKGROUP_READ_REUSE", False)
    mod = targets.build(_reuse_func(), "webgpu")
    assert mod.get_source().count("s_tile[((i32(tc_lid.x) + 1i) & 63i)]") > 1
    g = rng.standard_normal(64).astype("float32")
    out = targets.array(np.zeros((5, 64), "float32"), dev)
    mod["main"](targets.array(g, dev), out)
    np.testing.assert_allclose(out.numpy()[3], g + 1, rtol=1e-6, atol=1e-6)
