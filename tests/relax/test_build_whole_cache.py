"""relax.build's whole-build cache (relax.build_cache): an executable from it is the one the
build stored (same program, constants, object code, outputs bit for bit); any change to the
input module or the options is a miss; a corrupt entry is rebuilt; off without a cache."""
import os

import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, build_cache, op
from tilecraft.relax.frontend import from_onnx
from tilecraft.targets import kernel_cache
from tilecraft.zoo import models


def _outputs(exe, inputs):
    out = relax.VirtualMachine(exe, targets.cpu(0))["main"](*inputs)
    return [o.numpy() for o in (out if isinstance(out, tuple) else [out])]


def _block_module(seed=0, n="n"):
    rng = np.random.default_rng(seed)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((n, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((32, 16)).astype("float32"))
            b = relax.const(rng.standard_normal((16,)).astype("float32"))
            out = bb.emit_output(op.nn.relu(op.add(op.matmul(x, w), b)))
        bb.emit_func_output(out)
    return bb.get()


def _same_executable(a, b):
    assert a.program == b.program
    assert len(a.constants) == len(b.constants)
    for x, y in zip(a.constants, b.constants):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
    assert a.kernel_module.objects() == b.kernel_module.objects()


@pytest.mark.parametrize("name", ["mlp", "squeezenet"])
def test_a_hit_is_the_executable_the_build_made(name, tmp_path):
    z = models.ZOO[name]()
    mod = from_onnx(z.onnx_model)
    inputs = list(z.inputs.values())
    kw = dict(upper_bounds=z.upper_bounds, cache=str(tmp_path), whole_build_cache=True)
    plain = relax.build(mod, "llvm", upper_bounds=z.upper_bounds, cache=False, jobs=1)
    cold = relax.build(mod, "llvm", **kw)
    warm = relax.build(mod, "llvm", **kw)
    assert not cold.build_stats.whole_build_hit and warm.build_stats.whole_build_hit
    assert list(warm.build_stats.phases) == ["whole-build cache"]
    assert warm.build_stats.kernels == cold.build_stats.kernels
    assert warm.build_stats.distinct == cold.build_stats.distinct
    assert "the whole executable from the cache" in warm.build_stats.summary()
    _same_executable(plain, warm)
    expected = _outputs(plain, inputs)
    for got, want in zip(_outputs(warm, inputs), expected):
        np.testing.assert_array_equal(got, want)
    import onnxruntime as ort
    sess = ort.InferenceSession(z.onnx_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    ref = sess.run(None, z.inputs)
    scale = np.abs(ref[-1]).max()
    np.testing.assert_allclose(expected[-1], ref[-1], rtol=1e-3, atol=1e-4 * scale)
    # and it exports and loads like any executable
    path = warm.export_library(str(tmp_path / "exe.tcx"))
    for got, want in zip(_outputs(relax.load_executable(path), inputs), expected):
        np.testing.assert_array_equal(got, want)


def test_any_change_of_input_or_options_is_a_miss(tmp_path):
    x = np.random.default_rng(5).standard_normal((7, 32)).astype("float32")
    kw = dict(cache=str(tmp_path), whole_build_cache=True)
    base = relax.build(_block_module(0), "llvm", upper_bounds={"n": 8}, **kw)
    assert not base.build_stats.whole_build_hit
    # other weights (the same structure), other bounds, strict, another symbolic name
    for mod, bounds, strict in [(_block_module(1), {"n": 8}, False),
                                (_block_module(0), {"n": 16}, False),
                                (_block_module(0), {"n": 8}, True),
                                (_block_module(0, n="m"), {"m": 8}, False)]:
        exe = relax.build(mod, "llvm", upper_bounds=bounds, strict=strict, **kw)
        assert not exe.build_stats.whole_build_hit
        fresh = relax.build(mod, "llvm", upper_bounds=bounds, strict=strict, cache=False)
        np.testing.assert_array_equal(_outputs(exe, [x])[0], _outputs(fresh, [x])[0])
    again = relax.build(_block_module(0), "llvm", upper_bounds={"n": 8}, **kw)
    assert again.build_stats.whole_build_hit
    _same_executable(base, again)


def test_a_corrupt_entry_is_rebuilt(tmp_path):
    mod = _block_module(2)
    store = kernel_cache.KernelCache(str(tmp_path))
    relax.build(mod, "llvm", cache=store, whole_build_cache=True)
    key = build_cache.executable_key(mod, targets.Target("llvm"), None, False)
    path = store._path(key)
    with open(path, "r+b") as f:          # one flipped byte in the payload
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    rebuilt = relax.build(mod, "llvm", cache=store, whole_build_cache=True)
    assert not rebuilt.build_stats.whole_build_hit
    assert relax.build(mod, "llvm", cache=store, whole_build_cache=True).build_stats \
        .whole_build_hit


def test_off_without_a_cache_a_database_or_a_pipeline(tmp_path, monkeypatch):
    mod = _block_module(3)
    monkeypatch.setenv(kernel_cache.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(kernel_cache.ENV_SWITCH, "0")
    for _ in range(2):
        exe = relax.build(mod, "llvm", whole_build_cache=True)
        assert not exe.build_stats.whole_build_hit
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs]
    monkeypatch.delenv(kernel_cache.ENV_SWITCH)
    for _ in range(2):
        assert not relax.build(mod, "llvm", cache=False, whole_build_cache=True) \
            .build_stats.whole_build_hit
        assert not relax.build(mod, "llvm", cache=str(tmp_path), whole_build_cache=True,
                               pipeline=relax.get_pipeline()).build_stats.whole_build_hit
        # off by default
        assert not relax.build(mod, "llvm", cache=str(tmp_path)).build_stats.whole_build_hit


def test_code_from_outside_tilecraft_is_not_cached():
    """An operator registered here (its legalization is this file's code, which the key does
    not cover) makes the module uncacheable; the zoo's modules are cacheable."""
    from tilecraft.relax.op.base import register_op

    def infer(call):
        return call.args[0].struct_info

    user_op = register_op("test_whole_cache.identity", infer, lambda bb, call: call.args[0])
    x = Var("x", TensorStructInfo((4,), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.Call(user_op, [x]))
        bb.emit_func_output(out)
    target = targets.Target("llvm")
    assert build_cache.executable_key(bb.get(), target, None, False) is None
    assert build_cache.executable_key(_block_module(), target, None, False) is not None
    mod = from_onnx(models.ZOO["squeezenet"]().onnx_model)
    assert build_cache.executable_key(mod, target, None, False) is not None
