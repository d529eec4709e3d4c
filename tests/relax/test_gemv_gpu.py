"""The float32 GPU GEMV (relax.backend.gpu.gemv) and its dispatch in the default GPU schedules
(relax.gpu_schedules), on both GPU back ends (PoCL and lavapipe in CI), against numpy in
float64 and, for a GPT-2 block at one token, onnxruntime."""
import math

import numpy as np
import pytest

from capabilities import gpu_device
from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Tuple, Var, const, op
from tilecraft.relax import gpu_schedules as gs
from tilecraft.relax.backend.gpu import gemv
from tilecraft.relax.backend.gpu.gemv import GemvLayout, gemv_layout, gemv_tile
from tilecraft.relax.op import nn
from tilecraft.relax.vm import VirtualMachine
from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.schedule import Schedule

KINDS = ["opencl", "webgpu"]
GPT2_SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]


@pytest.fixture(scope="module", params=KINDS)
def gpu(request):
    """(device, target string) of each back end."""
    return gpu_device(request.param)


def _dense(rows, k, n, weight="KN"):
    """The PrimFunc of ``(rows, k) x W``, ``W`` stored ``(k, n)`` or ``(n, k)``."""
    A = te.placeholder((rows, k), "float32", "A")
    W = te.placeholder((k, n) if weight == "KN" else (n, k), "float32", "W")
    r = te.reduce_axis((0, k), "r")
    C = te.compute((rows, n), lambda i, j: te.sum(
        A[i, r] * (W[r, j] if weight == "KN" else W[j, r]), axis=r), "C")
    return te.create_prim_func([A, W, C])


def _thread_extents(func, tag):
    return {int(lp.extent.value) for lp in gs._loops_of(func)
            if lp.kind == "thread_binding" and lp.thread_tag == tag and
            hasattr(lp.extent, "value")}


@pytest.mark.parametrize("k,n", GPT2_SHAPES + [(4096, 11008)])
@pytest.mark.parametrize("weight", ["KN", "NK"])
def test_tiles_fill_the_gpu_and_load_vectors(k, n, weight):
    """GPT-2's shapes at one row get at least GEMV_MIN_GROUPS work-groups (the GEMM rule gave
    them one work-group per output, or 16-thread work-groups), float4 weight loads, at most
    256 threads and a K each thread's share divides."""
    tile = gemv_tile(GemvLayout(1, k, n, weight))
    assert -(-n // tile.cols) >= gemv.GEMV_MIN_GROUPS or tile.col_threads == 1
    assert tile.vector == 4 and tile.threads <= gemv.GEMV_THREADS
    assert k % (tile.split * (tile.vector if weight == "NK" else 1)) == 0
    f = gs.apply(_dense(1, k, n, weight), Target("opencl"))
    assert max(_thread_extents(f, "blockIdx.x")) == -(-n // tile.cols)


def test_layout_recognizes_the_gemv_and_its_limits():
    sch = Schedule(_dense(3, 40, 24, "NK"))
    assert gemv_layout(sch, sch.get_block("C")) == GemvLayout(3, 40, 24, "NK")
    sch = Schedule(_dense(5, 40, 24))
    assert gemv_layout(sch, sch.get_block("C")) is None            # above GEMV_MAX_ROWS
    assert gemv_layout(sch, sch.get_block("C"), max_rows=None) == GemvLayout(5, 40, 24, "KN")
    n = te.var("n")
    A = te.placeholder((n, 64), "float32", "A")
    W = te.placeholder((64, 8), "float32", "W")
    r = te.reduce_axis((0, 64), "r")
    C = te.compute((n, 8), lambda i, j: te.sum(A[i, r] * W[r, j], axis=r), "C")
    sch = Schedule(te.create_prim_func([A, W, C]))
    assert gemv_layout(sch, sch.get_block("C")) == GemvLayout(None, 64, 8, "KN")
    # a batch matmul (a weight per batch) is no GEMV
    A = te.placeholder((2, 1, 64), "float32", "A")
    B = te.placeholder((2, 64, 8), "float32", "B")
    C = te.compute((2, 1, 8), lambda b, i, j: te.sum(A[b, i, r] * B[b, r, j], axis=r), "C")
    sch = Schedule(te.create_prim_func([A, B, C]))
    assert gemv_layout(sch, sch.get_block("C")) is None


def test_switch_off_gives_the_gemm_rule(monkeypatch):
    monkeypatch.setattr(gemv, "GEMV_MAX_ROWS", 0)
    f = gs.apply(_dense(1, 768, 2304), Target("opencl"))
    assert "_rf" not in f.script()
    monkeypatch.undo()
    f = gs.apply(_dense(1, 768, 2304), Target("opencl"))
    assert "_rf" in f.script()


def _module(rows, k, n, n2, epilogues=True):
    """``main(x, res)``: ``linear(x, W1, b1)`` ((N, K) weight, bias) -> gelu, ``matmul(x, W2)``
    ((K, N) weight) + residual, and ``matmul(y, W3)`` plain; ``rows`` a number or a name."""
    rng = np.random.default_rng(k * n)
    w1 = rng.standard_normal((n, k)).astype(np.float32) / math.sqrt(k)
    b1 = rng.standard_normal(n).astype(np.float32)
    w2 = rng.standard_normal((k, n)).astype(np.float32) / math.sqrt(k)
    w3 = rng.standard_normal((n, n2)).astype(np.float32) / math.sqrt(n)
    x = Var("x", TensorStructInfo((rows, k), "float32"))
    res = Var("res", TensorStructInfo((rows, n), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x, res]):
        with bb.dataflow():
            y = bb.emit(nn.gelu(op.linear(x, const(w1), const(b1))))
            z = bb.emit(op.add(op.matmul(x, const(w2)), res))
            u = bb.emit(op.matmul(y, const(w3)))
            gv = bb.emit_output(Tuple([y, z, u]))
        bb.emit_func_output(gv)

    def ref(xv, rv):
        x64 = xv.astype(np.float64)
        h = x64 @ w1.T.astype(np.float64) + b1
        yv = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
        return [yv, x64 @ w2 + rv, yv @ w3]
    return bb.get(), ref


# odd K (scalar loads, a K with no power-of-two split), N not a multiple of the column block,
# the float4 path, static rows 1 and 3 and a symbolic row count (run at 1, 3 and 7: 7 takes the
# GEMM side of the dispatch)
CASES = [
    (1, 64, 40, 24),
    (3, 37, 29, 13),
    (1, 130, 66, 9),
    (2, 256, 100, 64),
    ("m", 96, 52, 20),
]


@pytest.mark.parametrize("rows,k,n,n2", CASES)
def test_dense_layers_with_epilogues_match_numpy(gpu, rows, k, n, n2):
    dev, target = gpu
    mod, ref = _module(rows, k, n, n2)
    vm = VirtualMachine(relax.build(mod, target), dev)
    rng = np.random.default_rng(1)
    for m in ((1, 3, 7) if isinstance(rows, str) else (rows,)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        res = rng.standard_normal((m, n)).astype(np.float32)
        outs = vm["main"](x, res)
        for i, (got, want) in enumerate(zip(outs, ref(x, res))):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4,
                                       err_msg=f"output {i} rows {m}")


@pytest.mark.parametrize("weight", ["KN", "NK"])
def test_kernel_tails_match_numpy(gpu, weight):
    """The scheduled kernel alone: K with a tail neither a vector nor a power of two divides
    (3 x 37), N with a column-block tail; and a GPT-2 shape."""
    dev, target = gpu
    rng = np.random.default_rng(2)
    for rows, k, n in ((2, 111, 45), (1, 768, 768)):
        f = gs.apply(_dense(rows, k, n, weight), Target(target))
        assert "_rf" in f.script()
        mod = targets.build(f, target)
        a = rng.standard_normal((rows, k)).astype(np.float32)
        w = rng.standard_normal((k, n) if weight == "KN" else (n, k)).astype(np.float32)
        c = targets.empty((rows, n), "float32", dev)
        mod[mod.entry_name](targets.array(a, dev), targets.array(w, dev), c)
        want = a.astype(np.float64) @ (w if weight == "KN" else w.T).astype(np.float64)
        np.testing.assert_allclose(c.numpy(), want, rtol=1e-4, atol=1e-4)


def test_gpt2_block_at_one_token_matches_onnxruntime(gpu):
    """A GPT-2 block (d 64, 4 heads) exported from PyTorch with a symbolic batch and sequence,
    at one token (batch 1 and 3: its dense layers run as the GEMV), against onnxruntime."""
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    from tilecraft.relax.frontend import from_onnx
    from tilecraft.zoo.models import _export, _torch_modules
    dev, target = gpu
    torch.manual_seed(0)
    block = _torch_modules()["GPT2Small"](vocab=50, d=64, layers=1, max_len=40).h[0]
    block.__init__(d=64, heads=4, max_len=40)
    axes = {"input": {0: "batch", 1: "seq"}, "output": {0: "batch", 1: "seq"}}
    model = _export(block.eval(), [torch.randn(1, 9, 64)], ["input"], dynamic_axes=axes)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    vm = VirtualMachine(relax.build(from_onnx(model), target), dev)
    for b in (1, 3):
        x = np.random.default_rng(b).standard_normal((b, 1, 64)).astype(np.float32)
        want = sess.run(None, {"input": x})[0]
        got = vm["main"](x)
        got = (got[0] if isinstance(got, tuple) else got).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"batch {b}")


def test_vector_activation_has_no_row_loop(gpu):
    """``x (K,) @ W (K, N)``: no row loop at all (no ``blockIdx.y``)."""
    dev, target = gpu
    rng = np.random.default_rng(3)
    w = rng.standard_normal((96, 40)).astype(np.float32)
    x = Var("x", TensorStructInfo((96,), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(Tuple([bb.emit(op.matmul(x, const(w)))]))
        bb.emit_func_output(gv)
    vm = VirtualMachine(relax.build(bb.get(), target), dev)
    xv = rng.standard_normal(96).astype(np.float32)
    np.testing.assert_allclose(vm["main"](xv)[0].numpy(), xv.astype(np.float64) @ w,
                               rtol=1e-4, atol=1e-4)
