"""fp16 GEMMs on WebGPU (lavapipe in CI, which has ``shader-f16``): ``relax.quantize(mod, "fp16")``
with float32 accumulation (the default) and float16 accumulation (``out_dtype="float16"``,
the accumulators in ``vec2<f16>`` pairs), the kernels' shared tiles read as ``vec4<f16>``
register fragments, against numpy; and the clear error where an adapter lacks
``shader-f16``."""
import numpy as np
import pytest

import capabilities
from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.tensorir import Var as TVar

M, K, N = 512, 768, 768    # a tile with register fragments (vec4 reads of the weight tile)


def _matmul_module(rows, seed=0):
    w = np.random.default_rng(seed).standard_normal((K, N)).astype(np.float32)
    x = Var("x", TensorStructInfo((rows, K), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(op.matmul(x, const(w)))
        bb.emit_func_output(gv)
    return bb.get(), w


@pytest.fixture(scope="module")
def f16_device():
    """``targets.webgpu(0)`` opened with ``shader-f16``, or a skip naming why not."""
    from tilecraft.targets.webgpu_backend import runtime
    capabilities.webgpu_device()   # a missing adapter fails under CI=true instead of skipping
    if "shader-f16" not in runtime.adapter_features(0):
        pytest.skip("the WebGPU adapter has no shader-f16: only the error path can run")
    runtime.close_device(0)        # reopened asking for shader-f16
    return targets.webgpu(0)


@pytest.mark.parametrize("out_dtype,tol,shared", [("float32", 2e-3, "float32"),
                                                   ("float32", 2e-3, "float16"),
                                                   ("float16", 1e-2, "float32")])
@pytest.mark.parametrize("rows", [M, TVar("n")])
def test_webgpu_fp16_gemm_matches_numpy(f16_device, out_dtype, tol, shared, rows, monkeypatch):
    monkeypatch.setenv("TILECRAFT_GEMM_HALF_SHARED", shared)
    mod, w = _matmul_module(rows)
    exe = relax.build(relax.quantize(mod, "fp16", out_dtype=out_dtype),
                      "webgpu -supports-float16=1", upper_bounds={"n": M})
    src = exe.kernel_module.get_source()
    assert "enable f16;" in src
    # the weights read from memory as vec4<f16>
    assert "array<vec4<f16>>" in src
    if isinstance(rows, int):
        if out_dtype == "float32" and shared == "float32":
            # the weight tile converted as it is fetched: float32 in workgroup memory, the
            # float32 kernel's fragments and multiply-adds
            assert "array<vec4<f16>, " not in src and "vec4<f32> = s_" in src
        else:
            # the weight tile in workgroup memory in f16, read as vec4<f16> fragments
            assert "array<vec4<f16>, " in src and "vec4<f16> = s_" in src
    # float16 accumulation: the register tile's columns in pairs, one vec2<f16> multiply-add
    assert ("vec2<f16>" in src) == (out_dtype == "float16")
    vm = relax.VirtualMachine(exe, f16_device)
    rng = np.random.default_rng(1)
    for m in ([M] if isinstance(rows, int) else [1, 37]):
        x = rng.standard_normal((m, K)).astype(np.float32)
        got = vm["main"](x).numpy()
        # the oracle: the float16-rounded weights (and inputs: with float32 accumulation the
        # kernel reads the float32 input itself, FoldCastIntoGEMM), multiplied in float64
        xr = x.astype(np.float16) if out_dtype == "float16" else x
        ref = xr.astype(np.float64) @ w.astype(np.float16).astype(np.float64)
        err = np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max()
        assert err < tol, f"{out_dtype} accumulation: error {err}"


def test_webgpu_fp16_on_an_adapter_without_shader_f16_is_a_clear_error():
    from tilecraft.targets.webgpu_backend import runtime
    capabilities.webgpu_device()
    adapters = runtime.list_adapters()
    without = [a["index"] for a in adapters if "shader-f16" not in a["features"]]
    if not without:
        pytest.skip("every WebGPU adapter here has shader-f16 (lavapipe's Vulkan one does): "
                    "no adapter to run the error path on")
    mod, _ = _matmul_module(8)
    exe = relax.build(relax.quantize(mod, "fp16"), "webgpu -supports-float16=1")
    index = without[0]
    with pytest.raises(runtime.WebGPUError, match="shader-f16.*does not have"):
        vm = relax.VirtualMachine(exe, targets.webgpu(index))
        vm["main"](np.zeros((8, K), np.float32))


def test_webgpu_fp16_accumulation_with_a_column_tail(f16_device):
    """A classifier's 1000 columns (no whole column tiles): the pairs only where the columns
    fill whole tiles, so no lane-dependent guard; every register array stays in registers (no
    unroll-budget warning), and the result matches numpy."""
    import warnings
    from tilecraft.targets.webgpu_backend.wgsl import UnrollBudgetWarning
    k = 2048      # ResNet-50's classifier: without the rule, the guarded pairs overflowed the
    w = np.random.default_rng(2).standard_normal((k, 1000)).astype(np.float32)   # budget
    x = Var("x", TensorStructInfo((TVar("n"), k), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(op.matmul(x, const(w)))
        bb.emit_func_output(gv)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnrollBudgetWarning)
        exe = relax.build(relax.quantize(bb.get(), "fp16", out_dtype="float16"),
                          "webgpu -supports-float16=1", upper_bounds={"n": 16})
    vm = relax.VirtualMachine(exe, f16_device)
    xs = np.random.default_rng(3).standard_normal((5, k)).astype(np.float32)
    ref = xs.astype(np.float16).astype(np.float64) @ w.astype(np.float16).astype(np.float64)
    got = vm["main"](xs).numpy().astype(np.float64)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-2
