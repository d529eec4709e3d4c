"""The GPU int4 GEMV (relax.backend.gpu.dense_int4) and the pass that uses it
(relax.transform.LowerDenseQ4GEMV), on both GPU back ends (PoCL and lavapipe in CI), against
numpy: bit-exactly where every product and partial sum is exact in float32 (integer
activations, power-of-two scales, integer zero points: any order of the float32 sums gives the
integer reference), else the dequantized weight in float64 (float32 accumulation the only
difference)."""
import numpy as np
import pytest

from capabilities import gpu_device
from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Tuple, Var, const, op
from tilecraft.relax.backend.gpu.dense_int4 import (NIBBLES, Q4_RUN_MIN_GROUPS, Q4GemvSpec,
                                                    RunTile, dense_q4_gemv_kernel, gemv_tile,
                                                    is_symmetric, kernel_operands, pack_q4_runs,
                                                    pack_q4_words, run_tile)
from tilecraft.relax.transform import LowerDenseQ4GEMV
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


def test_pack_q4_runs_puts_code_k_in_word_k_mod_32_div_8():
    rng = np.random.default_rng(3)
    k, n = 96, 5
    q = rng.integers(0, 16, (k, n))
    codes = (q[0::2] | (q[1::2] << 4)).astype(np.uint8)
    runs = pack_q4_runs(codes, k)
    assert runs.shape == (3, 5, 4) and runs.dtype == np.uint32 and runs.flags.c_contiguous
    back = np.array([[(int(runs[kk // 32, j, (kk % 32) // 8]) >> (4 * (kk % 8))) & 15
                      for j in range(n)] for kk in range(k)])
    np.testing.assert_array_equal(back, q)
    with pytest.raises(ValueError, match="multiple of 32"):
        pack_q4_runs(codes[:40], 80)


@pytest.mark.parametrize("k,n", [(768, 2304), (768, 768), (768, 3072), (3072, 768),
                                 (4096, 11008)])
def test_run_kernel_fills_the_gpu_and_loads_16_bytes(k, n):
    """GPT-2's shapes and 4096 x 11008 at one row (static or symbolic): Q4_RUN_MIN_GROUPS
    work-groups where 4 columns a work-group allow it, a warp a work-group at least, the split
    dividing the runs; a uint4 of codes and 8 float4 of activations per step (OpenCL), a
    vec4<u32> and vec4<f32> (WGSL)."""
    for lead in ((1,), (TVar("m"),)):
        spec = Q4GemvSpec(lead, k, n, 128)
        tile = run_tile(spec)
        assert tile.split * tile.steps == k // 32 and tile.threads >= 32
        assert -(-n // tile.cols) >= Q4_RUN_MIN_GROUPS or tile.cols == 4
        assert -(-n // tile.cols) >= 132
        mod = IRModule({"dense_q4_gemv": dense_q4_gemv_kernel(spec, Target("opencl"))})
        src = targets.build(mod, "opencl").source
        assert "uint4 vec" in src and "float4 vec" in src
        wgsl = targets.build(IRModule({"dense_q4_gemv": dense_q4_gemv_kernel(
            spec, Target("webgpu"))}), "webgpu").get_source()
        assert "array<vec4<u32>>" in wgsl and "vec4<u32> = b_words[" in wgsl
        assert "vec4<f32> = b_x[" in wgsl
    assert run_tile(Q4GemvSpec((1,), 4096, 11008, 128)) == RunTile(16, 16, 8)


def test_word_kernel_takes_what_runs_cannot():
    assert run_tile(Q4GemvSpec((5,), 768, 768, 128)) is None      # rows share the words
    assert run_tile(Q4GemvSpec((1,), 776, 768, 128)) is None      # K not a multiple of 32
    assert run_tile(Q4GemvSpec((1,), 768, 768, 16)) is None       # a run spans two groups
    assert run_tile(Q4GemvSpec((4,), 768, 768, 32)) is not None
    assert run_tile(Q4GemvSpec((TVar("m"),), 768, 768, 64)) is not None


def test_symmetric_offsets_are_dropped():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 6)).astype(np.float32)
    for sym, scale_dtype in ((True, "float32"), (True, "float16"), (False, "float32")):
        codes, s, o = quantize_weight_int4(w, 32, symmetric=sym, scale_dtype=scale_dtype)
        assert is_symmetric(s, o) == sym
        for lead, layout in (((1,), (2, 6)), ((7,), (6, 2))):     # run kernel, word kernel
            spec = Q4GemvSpec(lead, 64, 6, 32, symmetric=sym)
            ops = kernel_operands(spec, codes, s, o)
            assert len(ops) == (2 if sym else 3)
            assert ops[1].shape == layout and ops[1].dtype == np.float32


def test_operands_of_the_wrong_shape_are_named():
    spec = Q4GemvSpec((1,), 64, 6, 32)
    s = np.ones((2, 6), np.float32)
    with pytest.raises(ValueError, match=r"codes has shape \(32, 5\), expected \(32, 6\)"):
        kernel_operands(spec, np.zeros((32, 5), np.uint8), s, -8 * s)
    with pytest.raises(ValueError, match=r"scale has shape \(1, 6\), expected \(2, 6\)"):
        kernel_operands(spec, np.zeros((32, 6), np.uint8), s[:1], -8 * s[:1])


def _exact_weight(rng, k, n, group, symmetric, scale_dtype="float32"):
    """``relax.dense_q4``'s operands whose arithmetic is exact in float32: random codes with
    the extremes 0 and 15 in every case, power-of-two scales, integer zero points (offsets
    ``-z * s``; ``-8 * s`` where ``symmetric``), and the integer codes and zero points."""
    q = rng.integers(0, 16, (k, n))
    q[0, :] = 0
    q[-1, :] = 15
    q[:, 0] = 15
    qp = np.concatenate([q, np.zeros((k % 2, n), q.dtype)])      # odd K: a zero high nibble
    codes = (qp[0::2] | (qp[1::2] << 4)).astype(np.uint8)
    groups = -(-k // group)
    s = (2.0 ** rng.integers(-2, 2, (groups, n))).astype(scale_dtype)
    z = np.full((groups, n), 8) if symmetric else rng.integers(0, 16, (groups, n))
    if not symmetric:
        z[0, :2] = [0, 15]
    o = (-z * s.astype(np.float64)).astype(scale_dtype)
    return codes, s, o, q, z


def _exact_reference(x, q, z, s, group, bias=None):
    """``x @ W (+ bias)`` with ``W[k, n] = (q - z) * s``, in float64 (exact here)."""
    k = q.shape[0]
    g = np.arange(k) // group
    w = (q - z[g]) * s.astype(np.float64)[g]
    y = x.astype(np.float64) @ w
    return y if bias is None else y + bias


def _run(dev, target, spec, operands, x, bias=None):
    mod = targets.build(IRModule({"dense_q4_gemv": dense_q4_gemv_kernel(spec, Target(target))}),
                        target)
    y = targets.empty(x.shape[:-1] + (spec.n,), "float32", dev)
    args = [x] + list(operands) + ([bias] if bias is not None else [])
    mod["dense_q4_gemv"](*[targets.array(a, dev) for a in args], y)
    return y.numpy()


# (K, N, group, symmetric, bias, rows, static, scale dtype): K a multiple of the group only
# (96 = 3 groups of 32, 384 = 3 of 128, 3072), odd N (tails of the column block: 37, 45, 1,
# 23), rows 1 and 3 (static: a work-group row each; symbolic), g32 / g64 / g128, zero points or
# not, float16 scales; the last rows take the word kernel (ragged K, a group of 16, 5 rows)
EXACT = [
    (96, 37, 32, True, True, 1, True, "float32"),
    (96, 45, 32, False, False, 3, True, "float32"),
    (384, 37, 128, True, False, 1, False, "float16"),
    (384, 23, 128, False, True, 3, False, "float32"),
    (3072, 45, 128, False, True, 1, False, "float16"),
    (768, 1, 64, True, True, 3, True, "float32"),
    (1024, 70, 32, True, False, 4, False, "float32"),
    # launch shapes: 32 and 16 columns a work-group (a warp on one threadIdx.y), 11 runs a
    # thread loaded one at a time (11 is prime), 8 runs a thread prefetched together
    (64, 16896, 32, False, True, 1, True, "float32"),
    (32, 7, 32, False, True, 3, False, "float32"),          # one run: no split
    (256, 8449, 128, True, False, 1, False, "float32"),
    (4576, 9, 32, True, True, 1, True, "float32"),
    (8192, 5, 128, False, False, 2, False, "float16"),
    (100, 9, 34, True, True, 2, True, "float32"),
    (256, 33, 16, False, True, 1, False, "float16"),
    (768, 20, 128, False, False, 5, True, "float32"),
]


@pytest.mark.parametrize("k,n,group,sym,bias,rows,static,sdtype", EXACT)
def test_gemv_kernel_is_bit_exact(gpu, k, n, group, sym, bias, rows, static, sdtype):
    dev, target = gpu
    rng = np.random.default_rng(k * 7 + n)
    codes, s, o, q, z = _exact_weight(rng, k, n, group, sym, sdtype)
    x = rng.integers(-4, 5, (rows, k)).astype(np.float32)
    x[0, :2] = [4, -4]
    b = rng.integers(-50, 50, n).astype(np.float32) if bias else None
    spec = Q4GemvSpec((rows if static else TVar("m"),), k, n, group, symmetric=is_symmetric(s, o),
                      bias=bias)
    assert spec.symmetric == sym
    got = _run(dev, target, spec, kernel_operands(spec, codes, s, o), x, b)
    np.testing.assert_array_equal(got, _exact_reference(x, q, z, s, group, b).astype(np.float32))


@pytest.mark.parametrize("k,n,block,zero_points,rows", [(128, 37, 32, True, 1),
                                                        (256, 45, 128, False, 3),
                                                        (256, 9, 16, True, 1)])
def test_matmul_nbits_layout_is_bit_exact(gpu, k, n, block, zero_points, rows):
    """onnxruntime's MatMulNBits weight (codes [N, blocks, block/2], float16 scales, packed
    uint8 zero points or the default 8) through the importer's ``nbits_weight`` into the
    kernel, against MatMulNBits' own definition ``(q - zp) * scale``."""
    pytest.importorskip("onnx", reason="onnx is not installed (the importer's nbits_weight)")
    from tilecraft.relax.frontend.onnx.ops.quant import nbits_weight
    dev, target = gpu
    rng = np.random.default_rng(k + block)
    blocks = k // block
    q = rng.integers(0, 16, (n, k))
    q[:, 0], q[:, -1] = 0, 15
    b = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8).reshape(n, blocks, block // 2)
    scales = (2.0 ** rng.integers(-2, 2, n * blocks)).astype(np.float16)
    zp = rng.integers(0, 16, (n, blocks)) if zero_points else np.full((n, blocks), 8)
    packed = None
    if zero_points:
        zpad = np.zeros((n, 2 * -(-blocks // 2)), np.int64)
        zpad[:, :blocks] = zp
        packed = (zpad[:, 0::2] | (zpad[:, 1::2] << 4)).astype(np.uint8)
    codes, s, o = nbits_weight(b, scales, packed, k, n, block)
    spec = Q4GemvSpec((TVar("m"),), k, n, block, symmetric=is_symmetric(s, o))
    assert spec.symmetric == (not zero_points)
    x = rng.integers(-4, 5, (rows, k)).astype(np.float32)
    got = _run(dev, target, spec, kernel_operands(spec, codes, s, o), x)
    ref = _exact_reference(x, q.T, zp.T, scales.reshape(n, blocks).T, block)
    np.testing.assert_array_equal(got, ref.astype(np.float32))


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
    # the run kernel (uint4 words, float4 activations): static 1 and 3 and symbolic; groups
    # of 32 (a run) and 128; offsets; 32 runs (1024 / 32) and 96 (3072 / 32)
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
    assert is_symmetric(s, o) == sym
    m = rows if static else TVar("m")
    spec = Q4GemvSpec(lead=(m,), k=k, n=n, group_size=group, symmetric=sym, bias=bias)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[0, :3] = [1e3, -1e3, 0.0]
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    got = _run(dev, target, spec, kernel_operands(spec, codes, s, o), x, b)
    ref = x.astype(np.float64) @ dequantize_int4(codes, s, o, k, group).astype(np.float64)
    if bias:
        ref = ref + b
    _assert_close(got, ref)


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


@pytest.mark.parametrize("shape", [(64,), (2, 2, 64), (2, 3, 64)])
def test_vector_and_several_lead_dims(gpu, shape):
    """A 1-D activation (no row dim), two static lead dims fused into 4 rows (the run kernel: a
    row of work-groups each) and into 6 rows (the word kernel: a row tile of 4, the second
    tile's last two rows clamped, not stored)."""
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


@pytest.mark.parametrize("k,n,block,symmetric", [(96, 40, 32, True), (256, 33, 16, False),
                                                 (512, 45, 128, False)])
def test_matmul_nbits_onnx_model_runs_the_gemv(gpu, k, n, block, symmetric):
    """An ONNX model with onnxruntime's com.microsoft.MatMulNBits (and a bias Add) imported,
    built for the GPU target: its layer is the int4 GEMV (bias fused), and it matches
    onnxruntime running the same model at 1 and 3 rows (symbolic)."""
    pytest.importorskip("onnx", reason="onnx is not installed")
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    from onnx import TensorProto, helper, numpy_helper
    from tilecraft.relax.frontend.onnx import from_onnx
    from tilecraft.relax.frontend.onnx.lowbit import matmul_nbits_model
    dev, target = gpu
    rng = np.random.default_rng(k + n)
    w = rng.normal(size=(k, n)).astype(np.float32)
    b = rng.normal(size=n).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    q = matmul_nbits_model(model, block, symmetric)
    assert [nd.op_type for nd in q.graph.node] == ["MatMulNBits", "Add"]
    exe = relax.build(from_onnx(q), target)
    assert any("dense_q4_gemv" in name for name in exe.kernel_names), exe.kernel_names
    vm = VirtualMachine(exe, dev)
    sess = ort.InferenceSession(q.SerializeToString())
    for rows in (1, 3):
        x = rng.normal(size=(rows, k)).astype(np.float32)
        want = sess.run(None, {"x": x})[0]
        got = vm["main"](x).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
