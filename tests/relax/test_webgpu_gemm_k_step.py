"""WebGPU's GEMM k-step read from the target (issue 32): 16 (OpenCL's) where the target's
workgroup storage holds the two padded tiles of a step and the kernel's WGSL stays within the
generator's unroll budget, else 8 as under the spec's 16 KiB.

Built for the H100 adapter's limits (48 KiB) without a GPU; run on lavapipe with its own
adapter limits (32 KiB: the k-step 16 too) against numpy. Under the spec's limits the WGSL is
the old rule's (``GEMM_BK_WEBGPU_WIDE = 8``), character for character.
"""
import re
import warnings

import numpy as np
import pytest

import gpu_testutil as gpu
from tilecraft import relax, tensorir
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax import gpu_schedules as gs
from tilecraft.relax.backend.gpu import gemm
from tilecraft.relax.vm import VirtualMachine
from tilecraft.targets import Target
from tilecraft.targets.webgpu_backend import UnrollBudgetWarning, runtime, wgsl
from tilecraft.targets.webgpu_backend.build import compile_function
from tilecraft.tensorir.transform import lower_device
from capabilities import webgpu_device

# what targets.webgpu(0).target() reads from the H100 through NVIDIA's Vulkan driver
H100_ADAPTER = Target("webgpu -max-threads-per-block=1024 -max-shared-memory-per-block=49152 "
                      "-max-storage-buffers=16 -max-storage-buffer-binding-size=2147483644 "
                      "-max-buffer-size=2147483648")
K_LOOP = re.compile(r"for \(var v_k_0: i32 = 0i; v_k_0 < (\d+)i;")
RNG = np.random.default_rng(16)


def _k_steps(func, K):
    """The k-steps of the scheduled ``func``'s GEMM tiles: K over the k-step loop's extent."""
    return {K // lp.extent.value for lp in gs._loops_of(func) if lp.loop_var.name == "k_0"}


def _dense_module(rows, K, N, gelu=False, seed=0):
    """``main(x) = [gelu](x @ W + b)``, ``x: rows + (K,)`` (``rows`` over a symbolic ``n``)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((K, N)).astype("float32")
    b = rng.standard_normal(N).astype("float32")
    n = tensorir.var("n")
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(rows(n) + (K,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.add(bb.emit(op.matmul(x, const(w))), const(b)))
            if gelu:
                y = bb.emit(op.nn.gelu(y))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    return bb.get(), w, b


def _conv_module():
    w = RNG.standard_normal((64, 32, 1, 1)).astype("float32")
    n = tensorir.var("n")
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((n, 32, 28, 28), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(op.nn.relu(op.nn.conv2d(x, const(w)))))
        bb.emit_func_output(gv)
    return bb.get()


def _build(mod, target, bound=16):
    """``relax.build`` (a symbolic batch up to ``bound``); an ``UnrollBudgetWarning`` fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnrollBudgetWarning)
        return relax.build(mod, target, upper_bounds={"n": bound})


def _wgsl(exe) -> dict:
    return {k["name"]: k["wgsl"] for k in exe.kernel_module.kernels}


def test_k_step_reads_the_targets_workgroup_storage():
    """16 where two padded 128 x 16 tiles (16640 bytes) fit, 8 under the spec's 16 KiB."""
    assert gemm.padded_tiles_bytes(16, (16, 8), (16, 8)) == 16640
    assert gemm.webgpu_k_step(Target("webgpu")) == gemm.GEMM_BK_WEBGPU == 8
    assert gemm.webgpu_k_step(Target("webgpu -max-shared-memory-per-block=16640")) == 16
    assert gemm.webgpu_k_step(Target("webgpu-desktop")) == 16
    assert gemm.webgpu_k_step(H100_ADAPTER) == 16
    assert gemm.default_config(H100_ADAPTER)["k_step"] == 16
    assert gemm.default_config(Target("opencl"))["k_step"] == gemm.GEMM_BK


def test_dense_layer_gets_k_step_16_with_padded_rows_for_adapter_limits():
    """A BERT-like dense layer: its k-step loop runs K / 16 times, the transposed row tile's
    rows padded by 4 words (a multiple of 32 banks plus 4) as OpenCL's; under the spec's
    limits K / 8 (its rows padded too: the tiles of 8 fit the 16 KiB)."""
    from tilecraft.tensorir.transform import lower

    def padded(f, target):
        strides = re.findall(r"k_1 \* (\d+)", lower(f, target).script())
        return any(int(s) % 32 == 4 for s in strides)
    func = gpu.dense_func((2048,), 768, 768)
    adapter = gs.apply(func, H100_ADAPTER)
    assert _k_steps(adapter, 768) == {16}
    assert padded(adapter, H100_ADAPTER)
    spec = gs.apply(func, Target("webgpu"))
    assert _k_steps(spec, 768) == {8}
    assert padded(spec, Target("webgpu"))
    # the default schedule's tile decisions say so (the tuner's space starts there)
    assert gs.gemm_defaults(func, H100_ADAPTER)["k_step"] == 16
    assert gs.gemm_defaults(func, Target("webgpu"))["k_step"] == 8


@pytest.mark.parametrize("name", ["qkv", "ffn-gelu", "classifier", "conv1x1"])
def test_spec_limits_keep_the_old_wgsl(monkeypatch, name):
    """Under ``Target("webgpu")`` the WGSL of BERT-layer dense layers, a classifier and a
    convolution is the old rule's (k-step 8 for every target: ``GEMM_BK_WEBGPU_WIDE = 8``),
    character for character; for the adapter's limits it differs (the k-step 16)."""
    mod = {"qkv": lambda: _dense_module(lambda n: (n, 128), 768, 768)[0],
           "ffn-gelu": lambda: _dense_module(lambda n: (n, 128), 768, 3072, gelu=True)[0],
           "classifier": lambda: _dense_module(lambda n: (n,), 2048, 1000)[0],
           "conv1x1": _conv_module}[name]()
    new = _wgsl(_build(mod, Target("webgpu")))
    adapter = _wgsl(_build(mod, H100_ADAPTER))
    monkeypatch.setattr(gemm, "GEMM_BK_WEBGPU_WIDE", gemm.GEMM_BK_WEBGPU)
    old = _wgsl(_build(mod, Target("webgpu")))
    assert new == old
    old_adapter = _wgsl(_build(mod, H100_ADAPTER))
    assert adapter != old_adapter


def test_resnet50_classifier_keeps_k_step_8_where_16_leaves_the_unroll_budget():
    """ResNet-50's classifier ``(n, 2048) x (2048, 1000) + bias`` for the adapter's limits: its
    full 128-row tile over the symbolic rows, guarded per element, would leave the WGSL
    unroll budget at the k-step 16 (its register tile a dynamically indexed array), so that
    kernel keeps 8; the tile sized for a few rows takes 16. No ``UnrollBudgetWarning``."""
    mod, _, _ = _dense_module(lambda n: (n,), 2048, 1000)
    exe = _build(mod, H100_ADAPTER)
    steps = sorted(2048 // int(m) for src in _wgsl(exe).values() for m in K_LOOP.findall(src))
    assert 8 in steps and 16 in steps, steps
    # the reason: the full tile at 16 (the strategy the build took, its k-step forced) leaves
    # the budget, as predicted without generating and as the generator then warns
    func = gpu.dense_func((tensorir.var("n"),), 2048, 1000)
    sch = tensorir.schedule.Schedule(func)
    gs._schedule_best(sch, H100_ADAPTER, gemm_config={"k_step": 16})
    assert not gemm.wgsl_within_unroll_budget(lower_device(sch.func, H100_ADAPTER))
    with pytest.warns(UnrollBudgetWarning):
        compile_function("main", sch.func, H100_ADAPTER)
    full = gs.apply(func, H100_ADAPTER)
    assert 8 in _k_steps(full, 2048)


DEFAULT_BUDGET = wgsl.UNROLL_BODY_LIMIT


@pytest.mark.parametrize("limit", [256, 2048, DEFAULT_BUDGET])
@pytest.mark.parametrize("k_step", [8, 16])
@pytest.mark.parametrize("rows,cols", [("symbolic", 1000), (2048, 1000),
                                       (2048, 768)])
def test_budget_prediction_errs_towards_not_fitting(monkeypatch, limit, k_step, rows, cols):
    """``wgsl.unroll_budget_fits`` (no WGSL generated) against the generator: where it says a
    kernel fits, generating it gives no ``UnrollBudgetWarning``; where generating warns, it
    says the kernel does not fit. Dense layers with bias (1000 columns: a guard on every
    column of the register tile), at both k-steps, under smaller budgets too."""
    monkeypatch.setattr(wgsl, "UNROLL_BODY_LIMIT", limit)
    n = tensorir.var("n") if rows == "symbolic" else rows
    func = gpu.dense_func((n,), 512, cols)
    sch = tensorir.schedule.Schedule(func)
    gs._schedule_best(sch, H100_ADAPTER, gemm_config={"k_step": k_step}, split_k=False)
    predicted = gemm.wgsl_within_unroll_budget(lower_device(sch.func, H100_ADAPTER))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnrollBudgetWarning)
        compile_function("main", sch.func, H100_ADAPTER)
    warned = any(issubclass(w.category, UnrollBudgetWarning) for w in caught)
    assert not (predicted and warned)
    if (rows, cols) == (2048, 768):     # the full 8 x 8 tile, no guards
        if limit == 256:                # far below its unrolled k-steps (the generator may
            assert not predicted        # still scalarize the tile, unrolling inner loops)
        if limit == DEFAULT_BUDGET:     # the default budget holds it at either k-step
            assert predicted and not warned


def _adapter_target():
    """lavapipe's own limits (32 KiB of workgroup storage: the k-step 16 too)."""
    dev = webgpu_device()
    target = dev.target()
    if gemm.webgpu_k_step(target) != 16:
        pytest.skip(f"the adapter's {target.max_shared_memory_per_block} bytes of workgroup "
                    f"storage do not hold the k-step 16's padded tiles")
    # another test file of this process may have opened the device with the spec's limits
    runtime.note_target(target)
    runtime.close_device(dev.index)     # opened again with the target's limits
    return dev, target


def test_dense_layer_with_k_step_16_matches_numpy_on_webgpu():
    """A dense layer (static rows, so one kernel) at the k-step 16 on lavapipe, its WGSL that of
    the 48 KiB adapter's build, against numpy."""
    dev, target = _adapter_target()
    A = RNG.standard_normal((256, 384)).astype("float32")
    mod, w, b = _dense_module(lambda n: (256,), 384, 256, seed=3)
    exe = _build(mod, target)
    assert _wgsl(exe) == _wgsl(_build(mod, H100_ADAPTER))
    steps = {384 // int(m) for src in _wgsl(exe).values() for m in K_LOOP.findall(src)}
    assert steps == {16}, steps
    vm = VirtualMachine(exe, dev)
    want = A.astype(np.float64) @ w + b
    np.testing.assert_allclose(vm["main"](A).numpy(), want, rtol=1e-4, atol=1e-3)


def test_resnet50_classifier_matches_numpy_on_webgpu():
    """The classifier at lavapipe's adapter limits, each of its kernels (the GEMV of a few rows,
    the few-rows tile at 16, the full tile at 8), against numpy; no ``UnrollBudgetWarning``."""
    dev, target = _adapter_target()
    mod, w, b = _dense_module(lambda n: (n,), 2048, 1000, seed=4)
    vm = VirtualMachine(_build(mod, target, bound=128), dev)
    for n in (2, 16, 70):
        x = RNG.standard_normal((n, 2048)).astype("float32")
        np.testing.assert_allclose(vm["main"](x).numpy(), x.astype(np.float64) @ w + b,
                                   rtol=1e-4, atol=1e-3)
