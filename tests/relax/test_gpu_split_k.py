"""Split-K in the GPU GEMM family (``relax.backend.gpu.split_k``): the rule (which GEMM-like
kernels are split, in how many parts), where the default GPU schedules use it (static shapes at
build time; a symbolic batch below ``GEMM_SPLITK_BATCH``, chosen per call on the host), and the
results against float64 numpy on OpenCL (PoCL in CI) and WebGPU (lavapipe in CI) with the GPU
tile: dense layers with bias, residual and GELU epilogues, a symbolic batch at 1 and 2 (split)
and above the threshold (not), a 1x1 and a padded 3x3 stride-2 convolution. Split-K changes the summation order, so
the comparisons have a tolerance."""
import math
import re

import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax import gpu_schedules as gs
from tilecraft.relax.backend.gpu import split_k
from tilecraft.relax.vm import VirtualMachine
from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.schedule import Schedule, ScheduleError
from tilecraft.tensorir.transform import lower_device
from capabilities import gpu_device
from gpu_testutil import dense_func

RNG = np.random.default_rng(3232)


_dense = dense_func


def _reference(a, w, b, r, epilogue):
    y = a.astype("float64") @ w.astype("float64") + b
    if epilogue == "residual":
        return y + r
    if epilogue == "gelu":
        return y * (np.vectorize(math.erf, otypes=["float64"])(y * 0.70710677) + 1.0) * 0.5
    return y


def _factor(rows, K, N, target="opencl", **sizing):
    """The part count the rule gives ``(rows..., K) x (K, N)``."""
    sch = Schedule(_dense(rows, K, N))
    return split_k.split_factor(sch, sch.get_block("C"), Target(target), **sizing)


def _has_partials(func) -> bool:
    return "C_rf" in func.script()


# -- the rule ---------------------------------------------------------------------------------

@pytest.mark.parametrize("K, N, parts", [
    (3072, 768, 6),    # BERT's FFN output at batch 1: 24 tiles of 64 x 64 -> 144 work-groups
    (768, 768, 6),     # BERT's 768 -> 768: 6 parts of 128
    (768, 3072, 1),    # the FFN input: 96 tiles of 64 x 64, enough
    (768, 2304, 1),    # GPT-2's query / key / value: 72 tiles
    (384, 768, 1),     # a reduction below GEMM_SPLITK_MIN_K
])
def test_rule_at_bert_shapes_batch_1(K, N, parts):
    assert _factor((128,), K, N) == parts
    assert _factor((128,), K, N, "webgpu") == parts      # (k-step 8: the same parts)


def test_rule_splits_batch_2_not_batch_3():
    """A 768-wide layer: batch 2 (256 rows, 48 tiles) splits in 3 parts; batch 3 (72) not."""
    assert _factor((256,), 3072, 768) == 3
    assert _factor((384,), 3072, 768) == 1
    n = te.var("n")
    assert _factor((n, 128), 3072, 768, nominal_batch=1) == 6
    assert _factor((n, 128), 3072, 768) == 1         # sized for GEMM_NOMINAL_BATCH


def test_rule_not_for_cpu_targets_or_when_off(monkeypatch):
    assert _factor((128,), 3072, 768, "opencl -device=cpu") == 1
    assert _factor((128,), 3072, 768, "llvm") == 1
    monkeypatch.setenv("TILECRAFT_GPU_SPLITK", "0")
    assert _factor((128,), 3072, 768) == 1


def test_parts_divide_the_reduction_into_whole_k_steps():
    # K = 1072 = 67 steps of 16 (a prime): no part count gives whole steps
    assert _factor((128,), 1072, 768) == 1
    # K = 1536: parts of whole steps, >= 128: 2, 3, 4, 6, 12 -> 24 tiles x 6 = 144
    assert _factor((128,), 1536, 768) == 6


def test_static_shapes_decide_at_build_time():
    split = gs.apply(_dense((128,), 3072, 768, "residual"), Target("opencl"))
    assert _has_partials(split)
    kernels = lower_device(split, Target("opencl")).kernels
    assert len(kernels) == 2           # the partials, then the sum with the epilogue
    assert kernels[0].grid == (12, 2, 6)          # 64 x 64 tiles, 6 parts on blockIdx.z
    assert kernels[1].block == (split_k.THREADS, 1, 1)
    assert not _has_partials(gs.apply(_dense((2048,), 3072, 768), Target("opencl")))


def test_symbolic_batch_gets_the_split_variant_below_the_threshold():
    n = te.var("n")
    g = gs.apply(_dense((n, 128), 3072, 768, "residual"), Target("webgpu"))
    text = g.script()
    assert _has_partials(g)
    assert f"if n < {split_k.GEMM_SPLITK_BATCH}" in text
    assert f"if n < {gs.GEMM_SMALL_BATCH}" in text     # the batch-1 tile from 3 to 4


def test_symbolic_batch_off(monkeypatch):
    monkeypatch.setenv("TILECRAFT_GPU_SPLITK", "0")
    n = te.var("n")
    g = gs.apply(_dense((n, 128), 3072, 768, "residual"), Target("opencl"))
    assert not _has_partials(g)


def test_the_sum_reads_each_parts_partials_as_one_vector():
    g = gs.apply(_dense((128,), 3072, 768, "residual"), Target("opencl"))
    src = targets.build(g, Target("opencl")).get_source()
    assert "(__global const float4*)(C_rf" in src
    g = gs.apply(_dense((128,), 3072, 768, "residual"), Target("webgpu"))
    src = targets.build(g, Target("webgpu")).get_source()
    assert "b_C_rf: array<vec4<f32>>" in src


# -- results on the devices -------------------------------------------------------------------

def _run(kind, func, inputs, out_shape):
    dev, _ = gpu_device(kind)
    mod = targets.build(func, Target(kind))
    out = targets.empty(out_shape, "float32", dev)
    mod[mod.entry_name](*[targets.array(x, dev) for x in inputs], out)
    return out.numpy()


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
@pytest.mark.parametrize("epilogue", ["bias", "residual", "gelu"])
def test_static_split_dense_matches_numpy(kind, epilogue):
    """``(128, 512) x (512, 64)``: one 64 x 64 tile per 64 rows, split in 4 parts of 128."""
    M, K, N = 128, 512, 64
    func = _dense((M,), K, N, epilogue)
    sch = Schedule(func)
    assert split_k.split_factor(sch, sch.get_block("C"), Target(kind)) == 4
    g = gs.apply(func, Target(kind))
    assert _has_partials(g)
    a = RNG.standard_normal((M, K)).astype("float32")
    w = RNG.standard_normal((K, N)).astype("float32")
    b = RNG.standard_normal((N,)).astype("float32")
    r = RNG.standard_normal((M, N)).astype("float32")
    got = _run(kind, g, [a, w, b] + ([r] if epilogue == "residual" else []), (M, N))
    np.testing.assert_allclose(got, _reference(a, w, b, r, epilogue), rtol=1e-4, atol=1e-3)


def _dense_module(K, N, seq, w, b, residual):
    """``x @ W + b (+ r)`` over ``x: (n, seq, K)`` as the ONNX importer emits it."""
    x = Var("x", TensorStructInfo(("n", seq, K), "float32"))
    params = [x]
    if residual:
        params.append(Var("r", TensorStructInfo(("n", seq, N), "float32")))
    bb = BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(op.add(bb.emit(op.matmul(x, const(w))), const(b)))
            if residual:
                y = bb.emit(op.add(y, params[1]))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_symbolic_batch_dense_matches_numpy(kind):
    """``(n, 32, 512) x (512, 64) + bias + residual`` through ``relax.build``: split-K at batch
    1 and 2, the batch-1 tile at 3, the nominal tile at 5, all against numpy."""
    K, N, seq = 512, 64, 32
    w = (RNG.standard_normal((K, N)) / math.sqrt(K)).astype("float32")
    b = RNG.standard_normal((N,)).astype("float32")
    mod = _dense_module(K, N, seq, w, b, residual=True)
    exe = relax.build(mod, kind)
    assert re.search(r"\b\w+_rf\b", exe.kernel_module.get_source())    # the partials
    dev, _ = gpu_device(kind)
    vm = VirtualMachine(exe, dev)
    for n in (1, 2, 3, 5):
        x = RNG.standard_normal((n, seq, K)).astype("float32")
        r = RNG.standard_normal((n, seq, N)).astype("float32")
        got = vm["main"](x, r).numpy()
        np.testing.assert_allclose(got, _reference(x, w, b, r, "residual"), rtol=1e-4,
                                   atol=1e-3, err_msg=f"n={n}")


def _conv(C, O, H, k, stride, pad):
    """A convolution ``(1, C, H, H) x (O, C, k, k)`` with its padding a block of its own, as
    the legalization writes it."""
    x = te.placeholder((1, C, H, H), "float32", "x")
    w = te.placeholder((O, C, k, k), "float32", "w")
    src = x
    if pad:
        Hp = H + 2 * pad
        src = te.compute((1, C, Hp, Hp), lambda n, c, h, v: te.if_then_else(
            te.all(h >= pad, h < H + pad, v >= pad, v < H + pad), x[n, c, h - pad, v - pad],
            0.0), "pad")
    Ho = (H + 2 * pad - k) // stride + 1
    rc = te.reduce_axis((0, C), "rc")
    ry = te.reduce_axis((0, k), "ry")
    rx = te.reduce_axis((0, k), "rx")
    y = te.compute((1, O, Ho, Ho), lambda n, o, h, v: te.sum(
        src[n, rc, h * stride + ry, v * stride + rx] * w[o, rc, ry, rx], axis=[rc, ry, rx]),
        "C")
    return te.create_prim_func([x, w, y])


def _conv_reference(x, w, stride, pad):
    xp = np.pad(x.astype("float64"), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    k = w.shape[2]
    Ho = (xp.shape[2] - k) // stride + 1
    out = np.zeros((1, w.shape[0], Ho, Ho))
    for dy in range(k):
        for dx in range(k):
            win = xp[:, :, dy:dy + stride * Ho:stride, dx:dx + stride * Ho:stride]
            out += np.einsum("nchw,oc->nohw", win, w[:, :, dy, dx].astype("float64"))
    return out


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
@pytest.mark.parametrize("C, O, H, k, stride, pad", [
    (512, 128, 7, 1, 1, 0),      # a 1x1 over a 7 x 7 image (ResNet-50's late layers' kind)
    (128, 512, 8, 3, 2, 1),      # a padded 3x3 stride 2: whole input channels a part
])
def test_split_convolution_matches_numpy(kind, C, O, H, k, stride, pad):
    """Convolutions at batch 1 whose output tiles are few: the input channels split in
    parts, the padding inlined into the partials' window fetch."""
    g = gs.apply(_conv(C, O, H, k, stride, pad), Target(kind))
    assert _has_partials(g)
    xs = RNG.standard_normal((1, C, H, H)).astype("float32")
    ws = RNG.standard_normal((O, C, k, k)).astype("float32")
    want = _conv_reference(xs, ws, stride, pad)
    got = _run(kind, g, [xs, ws], want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_a_failing_split_falls_back_to_the_gemm_tile(monkeypatch):
    """Where split-K does not apply after all (a primitive refuses, a limit), the kernel gets
    the same strategy's GEMM tile, not the next fallback."""
    def refuse(*args, **kwargs):
        raise ScheduleError("split-K", "refused for the test", None)
    monkeypatch.setattr(gs, "schedule_split_k", refuse)
    g = gs.apply(_dense((128,), 3072, 768, "residual"), Target("opencl"))
    assert not _has_partials(g)
    bound = {(lp.thread_tag, lp.extent.value) for lp in gs._loops_of(g)
             if lp.kind == "thread_binding"}
    assert ("threadIdx.x", 16) in bound and ("threadIdx.y", 16) in bound   # the GEMM tile
