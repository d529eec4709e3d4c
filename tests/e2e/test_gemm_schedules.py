"""The hand-written GEMM schedules of benchmarks/schedules/gemm.py, compiled == numpy.

Odd sizes (tails in every tiled dimension), symbolic M, every loop-order / packing option, the
fused bias + GELU epilogue, B given transposed, and the two code-generator properties the fast
kernel relies on: the accumulator tile is allocated per tile and promoted to registers, and the
update is a fused multiply-add.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.tensorir import Buffer, BufferStore, For, IfThenElse, Schedule, Trace, te, var
from tilecraft.tensorir.expr import BufferLoad, IntImm
from tilecraft.tensorir.interpret import interpret
from tilecraft.tensorir.stmt import Allocate, seq
from tilecraft.tensorir.structural import structural_equal

from benchmarks.schedules.gemm import (GemmConfig, default_config, matmul_bias_gelu_func,
                                       matmul_func, schedule_gemm, schedule_gemm_bias_gelu)
from tilecraft.tensorir.transform.compact_local import compact_local_allocations

CONFIGS = [
    None,                                           # the target's default tile
    GemmConfig(mr=4, nr=64),
    GemmConfig(mr=6, nr=32, pack_a=True),
    GemmConfig(mr=5, nr=16, mc=15),
    GemmConfig(mr=3, nr=32, order="mn", pack_a=True),
    GemmConfig(mr=8, nr=16, parallel=False, pack_b="root"),
]


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def _inputs(rng, m, n, k, transpose_b=False):
    a = rng.standard_normal((m, k)).astype("float32")
    b = rng.standard_normal((n, k) if transpose_b else (k, n)).astype("float32")
    return a, b


def _config_id(c):
    if c is None:
        return "default"
    return (f"{c.mr}x{c.nr}{'-mc' if c.mc else ''}{'-packA' if c.pack_a else ''}-{c.order}"
            f"-packB-{c.pack_b}")


@pytest.mark.parametrize("config", CONFIGS, ids=_config_id)
def test_gemm_odd_sizes(config, rng):
    M, N, K = 67, 45, 33
    sch = Schedule(matmul_func(M, N, K))
    gs = schedule_gemm(sch, "C", "llvm", config)
    if (config or default_config()).parallel:
        assert sch.get(gs.outer).kind == "parallel"
    mod = targets.build(sch.mod, "llvm")
    a, b = _inputs(rng, M, N, K)
    c = np.full((M, N), np.nan, "float32")
    mod["main"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("config", [None, GemmConfig(mr=4, nr=16, mc=8, order="mn")],
                         ids=["default", "4x16-mc-mn"])
def test_gemm_symbolic_m(config, rng):
    m = te.var("m")
    sch = Schedule(matmul_func(m, 45, 33))
    schedule_gemm(sch, "C", "llvm", config)
    mod = targets.build(sch.mod, "llvm")
    for rows in (1, 12, 13, 67):
        a, b = _inputs(rng, rows, 45, 33)
        c = np.zeros((rows, 45), "float32")
        mod["main"](a, b, c)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_gemm_transposed_b_and_interpreter(rng):
    """B[N, K] (a dense / linear layer's weight) packs into the same panels; the scheduled
    function also agrees with the interpreter (the schedule is a legal transformation)."""
    M, N, K = 13, 20, 7
    f = matmul_func(M, N, K, transpose_b=True)
    sch = Schedule(f)
    schedule_gemm(sch, "C", "llvm", GemmConfig(mr=4, nr=16, pack_a=True))
    a, b = _inputs(rng, M, N, K, transpose_b=True)
    c = np.zeros((M, N), "float32")
    interpret(sch.func, a, b, c)
    np.testing.assert_allclose(c, a @ b.T, rtol=1e-5, atol=1e-5)
    c[:] = 0
    targets.build(sch.mod, "llvm")["main"](a, b, c)
    np.testing.assert_allclose(c, a @ b.T, rtol=1e-4, atol=1e-4)


def test_gemm_trace_replays(rng):
    f = matmul_func(var("m"), 40, 24)
    sch = Schedule(f)
    schedule_gemm(sch, "C", "llvm", GemmConfig(mr=6, nr=32, pack_a=True, mc=12))
    data = json.loads(json.dumps(sch.trace.to_json()))
    replayed = Trace.from_json(data).apply(f)
    assert structural_equal(replayed.func, sch.func)


@pytest.mark.parametrize("M,config", [(67, None), ("m", GemmConfig(mr=4, nr=32))],
                         ids=["67-default", "m-4x32"])
def test_gemm_bias_gelu(M, config, rng):
    N, K = 45, 33
    sym = M == "m"
    sch = Schedule(matmul_bias_gelu_func(te.var("m") if sym else M, N, K))
    schedule_gemm_bias_gelu(sch, "C", "D", "llvm", config)
    # the GEMM's output is never stored: the epilogue reads the accumulators
    assert "C[" not in sch.func.script().replace("C_local[", "")
    mod = targets.build(sch.mod, "llvm")
    for rows in ((5, 67) if sym else (67,)):
        a, b = _inputs(rng, rows, N, K)
        bias = rng.standard_normal(N).astype("float32")
        d = np.zeros((rows, N), "float32")
        mod["main"](a, b, bias, d)
        np.testing.assert_allclose(d, gelu(a @ b + bias), rtol=1e-4, atol=1e-4)


def test_gemm_bad_block_is_rejected():
    A = te.placeholder((8, 8), "float32", "A")
    B = te.compute((8, 8), lambda i, j: A[i, j] * 2.0, "B")
    sch = Schedule(te.create_prim_func([A, B]))
    with pytest.raises(Exception, match="schedule_gemm: block B"):
        schedule_gemm(sch, "B", "llvm")


@pytest.mark.parametrize("M", [64, 70, "m"])
def test_micro_kernel_keeps_the_tile_in_registers_with_fma(M):
    """The tile is allocated per (i, j) tile -- also with a row tail (which lowering may turn
    into an ``if i_0 < 11 ... else`` with ``i_0`` substituted) and symbolic rows -- SROA
    promotes it (no float array is left on the stack or the heap) and the k loop's update is
    one FMA per vector."""
    host = targets.Target("llvm")
    sch = Schedule(matmul_bias_gelu_func(te.var("m") if M == "m" else M, 64, 16))
    schedule_gemm_bias_gelu(sch, "C", "D", host, GemmConfig(mr=6, nr=max(4, host.vector_width // 32)))
    ir = targets.build(sch.mod, host).get_source("ll")
    assert re.search(r"@llvm\.fma\.v\d+f32", ir)
    assert not re.search(r'%"?C_local[\w.]*"? = alloca', ir)   # promoted to registers ...
    assert "for buffer C_local" not in ir                  # ... and never on the heap


# -- compact_local_allocations on hand-built lowered code ----------------------------------------

def _loop(v, n, body, kind="serial"):
    return For(v, 0, n, kind, body)


def test_compaction_moves_a_tile_buffer_into_its_loop():
    i, ii, j = var("i"), var("ii"), var("j")
    acc = Buffer("acc", (64,), "float32", scope="local")   # an 8 x 8 "output" ...
    out = Buffer("out", (64,), "float32")
    # ... used tile by tile: for i: for ii < 2, j < 8: acc[i*16 + ii*8 + j]
    idx = i * 16 + ii * 8 + j
    body = _loop(i, 4, seq(
        _loop(ii, 2, _loop(j, 8, BufferStore(acc, IntImm(0, "int64").astype("float32"), [idx]))),
        _loop(ii, 2, _loop(j, 8, BufferStore(out, BufferLoad(acc, [idx]), [idx])))))
    new = compact_local_allocations(Allocate(acc, body))
    assert isinstance(new, For) and isinstance(new.body, Allocate)
    assert new.body.buffer.shape[0].value == 16


def test_compaction_leaves_values_that_flow_between_iterations():
    i = var("i")
    acc = Buffer("acc", (1,), "float32", scope="local")
    a = Buffer("a", (8,), "float32")
    out = Buffer("out", (1,), "float32")
    zero = IntImm(0, "int64")
    # every iteration of i reads what the previous one wrote: acc[0] must stay outside
    body = _loop(i, 8, seq(
        IfThenElse(i == 0, BufferStore(acc, a[zero] * 0.0, [zero])),
        BufferStore(acc, BufferLoad(acc, [zero]) + BufferLoad(a, [i]), [zero]),
        IfThenElse(i == 7, BufferStore(out, BufferLoad(acc, [zero]), [zero]))))
    s = Allocate(acc, body)
    assert compact_local_allocations(s) is s
    # overlapping windows (acc[i + k]) are left alone too
    k = var("k")
    acc2 = Buffer("acc2", (9,), "float32", scope="local")
    body2 = _loop(i, 8, _loop(k, 2, BufferStore(acc2, BufferLoad(acc2, [i + k]) + 1.0, [i + k])))
    s2 = Allocate(acc2, body2)
    assert compact_local_allocations(s2) is s2
