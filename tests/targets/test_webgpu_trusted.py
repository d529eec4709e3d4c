"""Trusted shaders: ``Target("webgpu -trusted-shaders=1")`` builds the same WGSL as the portable
target, and its modules' pipelines are created without naga's run-time checks (index clamps,
loop bounding) through wgpu-native's ``wgpuDeviceCreateShaderModuleTrusted``. The kernels must
compute exactly what the checked ones do: their accesses are in bounds by construction (each
one proven by ``VerifyMemoryAccess`` at build time, or checked in the kernel), so the clamps
naga adds never change an index."""
import hashlib

import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.models import bert_encoder_layer
from tilecraft.relax.vm import VirtualMachine
from tilecraft.targets import Target, TargetError
from tilecraft.targets.webgpu_backend import runtime
from webgpu_testutil import gemm_shared, webgpu_device


@pytest.fixture(scope="module")
def dev():
    return webgpu_device()


def test_the_target_option_round_trips_and_is_webgpu_only():
    t = Target("webgpu -trusted-shaders=1")
    assert t.trusted_shaders and Target(str(t)) == t and Target(t.export()) == t
    assert not Target("webgpu").trusted_shaders
    assert Target("webgpu-desktop -trusted-shaders=true").trusted_shaders
    assert not Target("webgpu -trusted-shaders=0").trusted_shaders
    with pytest.raises(TargetError, match="trusted_shaders is for WebGPU targets only"):
        Target("opencl -trusted-shaders=1")
    with pytest.raises(TargetError, match="trusted_shaders must be 1/0 or true/false"):
        Target("webgpu -trusted-shaders=maybe")


def _pipeline_checked(dev, wgsl: str) -> set:
    """For each cached pipeline of ``wgsl`` on ``dev``: were naga's checks kept?"""
    digest = hashlib.sha256(wgsl.encode()).hexdigest()
    return {key[2] for key in runtime.context(dev.index)._pipelines if key[0] == digest}


def test_a_trusted_gemm_computes_what_the_checked_one_does(dev, rng):
    """A shared-memory GEMM (dynamically indexed workgroup tiles: what naga clamps), built both
    ways: identical WGSL, one pipeline each way, bit-identical results, numpy's values."""
    M, N, K = 64, 96, 40
    func = gemm_shared(M, N, K)
    checked = targets.build(func, "webgpu")
    trusted = targets.build(func, Target("webgpu -trusted-shaders=1"))
    assert trusted.get_source() == checked.get_source()
    assert trusted.metadata["trusted_shaders"] and not checked.metadata["trusted_shaders"]
    a = rng.standard_normal((M, K)).astype("float32")
    b = rng.standard_normal((K, N)).astype("float32")
    outs = []
    for mod in (checked, trusted):
        c = targets.empty((M, N), "float32", dev)
        mod["main"](targets.array(a, dev), targets.array(b, dev), c)
        outs.append(c.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[1], a @ b, rtol=1e-4, atol=1e-4)
    wgsl = checked.kernels[0]["wgsl"]
    assert _pipeline_checked(dev, wgsl) == {True, False}


def test_a_trusted_bert_layer_matches_the_checked_one(dev):
    """The default GPU schedules of a BERT layer (dense GEMMs, attention, layer norm) with a
    symbolic batch and sequence: the trusted build's outputs are the checked build's, bit for
    bit, at two shapes, and numpy's."""
    model = bert_encoder_layer(hidden=64, heads=2, ffn=128, seed=7)
    exe_checked = relax.build(model.mod, "webgpu")
    exe_trusted = relax.build(model.mod, "webgpu -trusted-shaders=1")
    assert exe_trusted.kernel_module.get_source() == exe_checked.kernel_module.get_source()
    vms = [VirtualMachine(e, dev) for e in (exe_checked, exe_trusted)]
    rng = np.random.default_rng(4)
    for batch, seq in ((1, 7), (3, 20)):
        x, = model.make_inputs(rng, batch=batch, seq_len=seq)
        got = [vm["main"](x).numpy() for vm in vms]
        np.testing.assert_array_equal(got[0], got[1])
        ref = model.reference(x)
        np.testing.assert_allclose(got[1], ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())
    for k in exe_trusted.kernel_module.kernels:
        assert False in _pipeline_checked(dev, k["wgsl"]), k["name"]


def test_the_flag_survives_export_and_load(dev, tmp_path, rng):
    func = gemm_shared(32, 32, 16)
    path = str(tmp_path / "gemm.json")
    targets.build(func, Target("webgpu -trusted-shaders=1")).export_library(path)
    loaded = targets.load_module(path)
    assert loaded.metadata["trusted_shaders"]
    a = rng.standard_normal((32, 16)).astype("float32")
    b = rng.standard_normal((16, 32)).astype("float32")
    c = targets.empty((32, 32), "float32", dev)
    loaded["main"](targets.array(a, dev), targets.array(b, dev), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)
    assert _pipeline_checked(dev, loaded.kernels[0]["wgsl"]) >= {False}
