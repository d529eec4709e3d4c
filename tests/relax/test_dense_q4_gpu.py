"""The GPU int4 GEMV (relax.backend.gpu.dense_int4) and the pass that uses it
(relax.transform.LowerDenseQ4GEMV), on both GPU back ends (PoCL and lavapipe in CI), against
numpy: the dequantized weight in float64, so the only difference is float32 accumulation."""
import numpy as np
import pytest

from capabilities import gpu_device
from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Tuple, Var, const, op
from tilecraft.relax.backend.gpu.dense_int4 import (NIBBLES, Q4GemvSpec, dense_q4_gemv_kernel,
                                                    gemv_tile, pack_q4_words, vector_tile)
from tilecraft.relax.backend.gpu.gemv import GEMV_MIN_GROUPS
from tilecraft.relax.transform import LowerDenseQ4GEMV
from tilecraft.relax.transform.lower_dense_q4_gemv import gemv_operands
from tilecraft.relax.transform.quantize_int4 import dequantize_int4, quantize_weight_int4
from tilecraft.relax.vm import VirtualMachine
from tilecraft.targets import Target
from tilecraft.tensorir import IRModule
from tilecraft.tensorir import Var as TVar

KINDS = ["opencl", "webgpu"]


@pytest.fixture(scope="module", params=KINDS)
def gpu(request):
    """(device, target string) of each back end."""
    return gpu_device(request.param)


def _assert_close(got, ref, tol=2e-6):
    """float32 accumulation of K terms against float64: relative to the largest magnitude."""
    scale = max(np.abs(ref).max(), 1.0)
    err = np.abs(got.astype(np.float64) - ref).max() / scale
    assert err < tol, f"error {err} (relative to {scale})"


def test_pack_q4_words_puts_code_k_in_nibble_k_mod_8():
    rng = np.random.default_rng(0)
    for k in (8, 13, 64, 99):
        q = rng.integers(0, 16, (k, 5))
        codes = np.zeros((-(-k // 2), 5), np.uint8)
        codes[:] = (np.concatenate([q, np.zeros((k % 2, 5), q.dtype)])[0::2] |
                    (np.concatenate([q, np.zeros((k % 2, 5), q.dtype)])[1::2] << 4))
        words = pack_q4_words(codes, k)
        assert words.shape == (5, -(-k // NIBBLES)) and words.dtype == np.uint32
        back = np.array([[(int(words[j, kk // 8]) >> (4 * (kk % 8))) & 15 for j in range(5)]
                         for kk in range(k)])
        np.testing.assert_array_equal(back, q)
        used = k - 8 * (words.shape[1] - 1)      # codes in the last word: the rest are zero
        if used < 8:
            assert not (words[:, -1] >> np.uint32(4 * used)).any()


def test_gemv_tile_shares_long_reductions_among_more_threads():
    assert gemv_tile(Q4GemvSpec((1,), 768, 2304, 128)) == (1, 8, 32)
    # fewer columns a work-group until there are GEMV_MIN_GROUPS work-groups
    assert gemv_tile(Q4GemvSpec((1,), 3072, 768, 128)) == (1, 2, 64)
    assert gemv_tile(Q4GemvSpec((1,), 40, 8, 32)) == (1, 1, 8)
    assert gemv_tile(Q4GemvSpec((16,), 768, 768, 128)) == (4, 2, 32)
    assert gemv_tile(Q4GemvSpec((3,), 768, 768, 128)) == (2, 4, 32)
    assert gemv_tile(Q4GemvSpec((TVar("n"),), 768, 768, 128))[0] == 1


@pytest.mark.parametrize("k,n", [(768, 2304), (768, 768), (768, 3072), (3072, 768)])
def test_one_row_kernel_fills_the_gpu_and_loads_16_bytes(k, n):
    """GPT-2's shapes at one row (static or symbolic): GEMV_MIN_GROUPS work-groups (of a warp
    at least), 4 words (a uint4) and 32 activations (8 float4) per load step."""
    for lead in ((1,), (TVar("m"),)):
        spec = Q4GemvSpec(lead, k, n, 128)
        cols, split = vector_tile(spec)
        # (or work-groups of one warp: 768 x 768 gets 192 of 32 threads)
        assert -(-n // cols) >= GEMV_MIN_GROUPS or cols * split == 32
        assert -(-n // cols) >= 132 and (k // 32) % split == 0
        src = targets.build(IRModule({"dense_q4_gemv": dense_q4_gemv_kernel(
            spec, Target("opencl"))}), "opencl").source
        assert "uint4 vec" in src and "float4 vec" in src
    assert vector_tile(Q4GemvSpec((2,), 768, 768, 128)) is None     # rows share the words
    assert vector_tile(Q4GemvSpec((1,), 776, 768, 128)) is None     # K not a multiple of 32


def test_symmetric_offsets_are_dropped():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 6)).astype(np.float32)
    for sym, scale_dtype in ((True, "float32"), (True, "float16"), (False, "float32")):
        codes, s, o = quantize_weight_int4(w, 32, symmetric=sym, scale_dtype=scale_dtype)
        words, srows, orows = gemv_operands(codes, s, o, 64)
        assert (orows is None) == sym
        assert srows.shape == (6, 2) and srows.dtype == np.float32


# odd K (a partial word and a partial group), N not a multiple of the column block, a group
# that is not a whole number of words (34), rows symbolic and static (static: several rows a
# work-group, 5 not a multiple of the 4 of the tile), bias or not
CASES = [
    (768, 40, 128, True, True, 3, False),
    (770, 37, 32, False, True, 1, False),
    (100, 9, 34, True, False, 2, True),
    (37, 70, 32, False, False, 4, False),
    (3072, 24, 128, True, True, 2, True),
    (256, 33, 32, False, True, 5, True),
    (768, 20, 128, True, True, 16, True),
    # the one-row kernel (uint4 words, float4 activations): static 1 and symbolic; groups of
    # 32 (4 words) and 128; offsets; a runs count (1024 / 32 = 32) and 96 (3 x 32)
    (1024, 45, 32, False, True, 1, True),
    (3072, 19, 128, True, False, 3, False),
    (256, 8, 32, True, True, 1, False),
]


@pytest.mark.parametrize("k,n,group,sym,bias,rows,static", CASES)
def test_gemv_kernel_matches_numpy(gpu, k, n, group, sym, bias, rows, static):
    dev, target = gpu
    rng = np.random.default_rng(k + n)
    w = rng.standard_normal((k, n)).astype(np.float32)
    # extreme groups: all zero (scale 1), one huge value, all equal
    w[:min(group, k), 0] = 0.0
    w[min(group, k) - 1, 1] = 1e4
    codes, s, o = quantize_weight_int4(w, group, symmetric=sym)
    words, srows, orows = gemv_operands(codes, s, o, k)
    assert (orows is None) == sym
    m = rows if static else TVar("m")
    spec = Q4GemvSpec(lead=(m,), k=k, n=n, group_size=group, symmetric=sym, bias=bias)
    mod = targets.build(IRModule({"dense_q4_gemv": dense_q4_gemv_kernel(spec, Target(target))}),
                        target)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[0, :3] = [1e3, -1e3, 0.0]
    b = rng.standard_normal(n).astype(np.float32)
    args = [x, words, srows] + ([] if sym else [orows]) + ([b] if bias else [])
    y = targets.empty((rows, n), "float32", dev)
    mod["dense_q4_gemv"](*[targets.array(a, dev) for a in args], y)
    ref = x.astype(np.float64) @ dequantize_int4(codes, s, o, k, group).astype(np.float64)
    if bias:
        ref = ref + b
    _assert_close(y.numpy(), ref)


def _linear_module(k, n, n2, rows, bias=True):
    """``main(x)``: ``linear(x, W, b)`` then ``matmul(., W2)`` and a second use of the first
    result (so the bias-fused kernel and the plain one both run)."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    w2 = rng.standard_normal((n, n2)).astype(np.float32)
    x = Var("x", TensorStructInfo((rows, k), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.linear(x, const(w), const(b) if bias else None))
            z = bb.emit(op.matmul(y, const(w2)))
            gv = bb.emit_output(Tuple([y, z]))
        bb.emit_func_output(gv)
    return bb.get(), (w, b if bias else np.zeros(n, np.float32), w2)


def _reference(x, weights, group, symmetric=True, scale_dtype="float32"):
    w, b, w2 = weights
    k, n = w.shape[1], w.shape[0]
    c1, s1, o1 = quantize_weight_int4(w.T, group, symmetric, scale_dtype)
    c2, s2, o2 = quantize_weight_int4(w2, group, symmetric, scale_dtype)
    y = x.astype(np.float64) @ dequantize_int4(c1, s1, o1, k, group) + b
    return y, y @ dequantize_int4(c2, s2, o2, n, group)


def _ops(mod) -> set:
    names = set()
    for b in mod["main"].body.blocks:
        for binding in b.bindings:
            v = binding.value
            name = getattr(getattr(v, "op", None), "name", None)
            names.add(name)
            if name == "relax.call_tir":
                names.add(v.args[0].name_hint)
    return names


def test_pass_rewrites_dense_q4_and_fuses_the_bias():
    mod, _ = _linear_module(96, 20, 12, TVar("n"))
    q = relax.quantize(mod, "int4-g32")
    out = LowerDenseQ4GEMV(Target("opencl"))(q)
    ops = _ops(out)
    assert "relax.dense_q4" not in ops and "relax.add" not in ops
    kernels = [f for name, f in out.functions.items() if name.startswith("dense_q4_gemv")]
    assert len(kernels) == 2      # the bias-fused one and the plain one; the unfused one went
    assert sorted(len(f.params) for f in kernels) == [4, 5]   # x, words, scale[, bias], out
    # many static rows: a GEMM, left to the generic path
    big, _ = _linear_module(96, 20, 12, 64)
    assert "relax.dense_q4" in _ops(LowerDenseQ4GEMV(Target("opencl"))(
        relax.quantize(big, "int4-g32")))


@pytest.mark.parametrize("mode,group,symmetric,scale_dtype",
                         [("int4-g128", 128, True, "float32"), ("int4-g32", 32, True, "float32"),
                          ("int4-g32", 32, False, "float16")])
def test_quantized_linear_layers_build_and_match(gpu, mode, group, symmetric, scale_dtype):
    dev, target = gpu
    mod, weights = _linear_module(300, 50, 33, TVar("n"))
    q = relax.quantize(mod, mode, symmetric=symmetric, scale_dtype=scale_dtype)
    vm = VirtualMachine(relax.build(q, target), dev)
    rng = np.random.default_rng(11)
    for rows in (1, 5, 17):
        x = rng.standard_normal((rows, 300)).astype(np.float32)
        got = vm["main"](x)
        for g, r in zip(got, _reference(x, weights, group, symmetric, scale_dtype)):
            _assert_close(g.numpy(), r)


def test_static_rows_above_the_gemv_limit_take_the_generic_path(gpu):
    dev, target = gpu
    mod, weights = _linear_module(64, 24, 8, 20, bias=False)
    vm = VirtualMachine(relax.build(relax.quantize(mod, "int4-g32"), target), dev)
    x = np.random.default_rng(2).standard_normal((20, 64)).astype(np.float32)
    for g, r in zip(vm["main"](x), _reference(x, weights, 32)):
        _assert_close(g.numpy(), r)


def test_threads_past_the_last_column_or_row_read_in_bounds():
    """The tile's extra threads (columns past N, static rows past M) load nothing: the
    cross-thread reduction puts their reads under the tile's bounds test (they still write the
    identity to their slot of the tree), so the kernel's clamps are no longer needed."""
    from tilecraft.targets.opencl_backend.codegen import opencl_source
    from tilecraft.tensorir.transform import lower_device
    spec = Q4GemvSpec(lead=(5,), k=64, n=1100, group_size=32, symmetric=False, bias=True)
    rows, cols, _ = gemv_tile(spec)
    assert 5 % rows and 1100 % cols
    src = opencl_source(lower_device(dense_q4_gemv_kernel(spec, Target("opencl")),
                                     Target("opencl")).kernels)[0]
    update = src.index("dense_q4_gemv_in_thread[0] = (dense_q4_gemv_in_thread[0] +")
    guard = src.rindex("if (", 0, update)
    assert src.index("dense_q4_gemv_in_thread[0] = 0.0f;") < guard
    assert "< 5)" in src[guard:update] and "< 1100)" in src[guard:update]


@pytest.mark.parametrize("shape", [(64,), (2, 3, 64)])
def test_vector_and_several_lead_dims(gpu, shape):
    """A 1-D activation (no row dim) and two static lead dims fused into 6 rows (a row tile of
    4: the second tile's last two rows clamped, not stored)."""
    dev, target = gpu
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 10)).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    x = Var("x", TensorStructInfo(shape, "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(op.add(op.matmul(x, const(w)), const(b)))
        bb.emit_func_output(gv)
    q = relax.quantize(bb.get(), "int4-g32")
    assert "relax.dense_q4" not in _ops(LowerDenseQ4GEMV(Target(target))(q))
    vm = VirtualMachine(relax.build(q, target), dev)
    xv = rng.standard_normal(shape).astype(np.float32)
    c, s, o = quantize_weight_int4(w, 32)
    _assert_close(vm["main"](xv).numpy(),
                  xv.astype(np.float64) @ dequantize_int4(c, s, o, 64, 32) + b)
