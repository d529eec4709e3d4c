"""Kernels on symbolic extents run tiles of exactly their rows and keep their accumulators in
one register tile (``default_schedules.split_row_tails``, ``unmask_tile_lanes``): a dense layer
whose rows are ``batch * seq``, attention scores ``q @ k^T`` over a symbolic sequence (rows
and columns), a layer norm and a softmax over symbolic rows. Each is checked on the scheduled
IR (no row test left on a tile, accumulators allocated at a constant size) and against numpy
on random inputs at sizes around the tile height and the vector width."""
import re

import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax import default_schedules as ds
from tilecraft.relax.transform import get_pipeline
from tilecraft.targets import Target
from tilecraft.tensorir.transform import lower

RNG = np.random.default_rng(31)
AVX512 = Target("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512")


def _kernels(mod, name_part: str):
    lowered = get_pipeline(target=AVX512)(mod)
    return [f for gv, f in lowered.functions.items() if name_part in str(gv)]


def _tile_allocs(func) -> list[str]:
    return re.findall(r'_local = T.allocate\(\(([^)]*)\),', lower(func).script())


def dense_3d_module(k: int, n_out: int):
    """``relu(x @ W + b)`` on ``x`` of shape ``(batch, seq, k)``: the dense layer's rows are
    ``batch * seq``."""
    w = RNG.standard_normal((k, n_out)).astype("float32")
    b = RNG.standard_normal(n_out).astype("float32")
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("batch", "seq", k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.add(bb.emit(op.matmul(x, const(w))), const(b)))
            gv = bb.emit_output(bb.emit(op.nn.relu(y)))
        bb.emit_func_output(gv)
    return bb.get(), w, b


def test_dense_rows_of_two_dims_take_exact_tiles():
    mod, _, _ = dense_3d_module(40, 96)
    dense = _kernels(mod, "dense")
    assert dense
    text = ds.apply(dense[0], AVX512).script()
    # a whole tile of 6 rows and tails of 1 to 5 rows of batch * seq, none with a row test
    assert ">= 6:" in text and all(f"== {r}:" in text for r in range(1, 5))
    assert not re.search(r"T\.where\([^)]*< batch \* seq\)", text)
    allocs = _tile_allocs(ds.apply(dense[0], AVX512))
    assert allocs and all(a.rstrip(",").isdigit() for a in allocs), allocs


def test_dense_rows_of_two_dims_match_numpy():
    mod, w, b = dense_3d_module(40, 96)
    exe = relax.build(mod, "llvm", upper_bounds={"batch": 4, "seq": 16})
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    for batch, seq in ((1, 1), (1, 2), (1, 5), (1, 8), (2, 3), (3, 5), (1, 13), (4, 16)):
        x = RNG.standard_normal((batch, seq, 40)).astype("float32")
        np.testing.assert_allclose(vm["main"](x).numpy(), np.maximum(x @ w + b, 0),
                                   rtol=1e-4, atol=1e-4)


def attention_module(heads: int = 2, dim: int = 24):
    """``softmax(q @ k^T + mask)`` for ``q`` ``(batch, heads, seq, dim)``, ``kt``
    ``(batch, heads, dim, seq)`` and ``mask`` ``(batch, 1, seq, seq)``."""
    bb = BlockBuilder()
    q = Var("q", TensorStructInfo(("batch", heads, "seq", dim), "float32"))
    kt = Var("kt", TensorStructInfo(("batch", heads, dim, "seq"), "float32"))
    mask = Var("mask", TensorStructInfo(("batch", 1, "seq", "seq"), "float32"))
    with bb.function("main", [q, kt, mask]):
        with bb.dataflow():
            scores = bb.emit(op.add(bb.emit(op.matmul(q, kt)), mask))
            gv = bb.emit_output(bb.emit(op.nn.softmax(scores, axis=-1)))
        bb.emit_func_output(gv)
    return bb.get()


def test_attention_scores_tile_has_no_lane_or_row_test():
    scores = _kernels(attention_module(), "matmul")
    assert scores
    g = ds.apply(scores[0], AVX512)
    text = g.script()
    # the accumulators' updates read under the lane mask, the tile itself is not masked
    assert "T.if_then_else(" in text
    assert ">= 6:" in text
    allocs = _tile_allocs(g)
    assert allocs and all(a.rstrip(",").isdigit() for a in allocs), allocs


@pytest.mark.parametrize("seq", [1, 2, 5, 6, 7, 8, 13, 16, 17, 31, 32, 33, 40])
def test_attention_symbolic_seq_matches_numpy(seq):
    exe = _attention_exe()
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    for batch in (1, 2):
        q = RNG.standard_normal((batch, 2, seq, 24)).astype("float32")
        kt = RNG.standard_normal((batch, 2, 24, seq)).astype("float32")
        mask = np.where(RNG.random((batch, 1, seq, seq)) < 0.3, -1e4, 0).astype("float32")
        s = q @ kt + mask
        e = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(vm["main"](q, kt, mask).numpy(), e / e.sum(-1, keepdims=True),
                                   rtol=1e-4, atol=1e-5)


_EXE = {}


def _attention_exe():
    if "attention" not in _EXE:
        _EXE["attention"] = relax.build(attention_module(), "llvm",
                                        upper_bounds={"batch": 2, "seq": 40})
    return _EXE["attention"]


def test_layer_norm_symbolic_rows_match_numpy():
    gamma = RNG.standard_normal(48).astype("float32")
    beta = RNG.standard_normal(48).astype("float32")
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("batch", "seq", 48), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(op.nn.layer_norm(x, const(gamma), const(beta), axes=[-1])))
        bb.emit_func_output(gv)
    mod = bb.get()
    norm = _kernels(mod, "layer_norm")
    assert norm
    text = ds.apply(norm[0], AVX512).script()
    assert ">= 6:" in text and not re.search(r"T\.where\([^)]*< seq\)", text)
    vm = relax.VirtualMachine(relax.build(mod, "llvm", upper_bounds={"batch": 2, "seq": 16}),
                              targets.cpu(0))
    for batch, seq in ((1, 1), (1, 5), (1, 8), (2, 7), (2, 16)):
        v = RNG.standard_normal((batch, seq, 48)).astype("float32")
        mean = v.mean(-1, keepdims=True)
        ref = (v - mean) / np.sqrt(v.var(-1, keepdims=True) + 1e-5) * gamma + beta
        np.testing.assert_allclose(vm["main"](v).numpy(), ref, rtol=1e-4, atol=1e-4)


def softmax_module(heads: int = 4):
    """``softmax(x)`` over the last axis of ``x`` ``(batch, heads, seq, seq)``."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("batch", heads, "seq", "seq"), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(op.nn.softmax(x, axis=-1)))
        bb.emit_func_output(gv)
    return bb.get()


def test_softmax_parallel_loops_are_outermost():
    # the stages over (batch, 4, seq, seq) ran the constant head loop in parallel inside the
    # serial batch loop: one parallel launch per batch element. The four stages are one pass
    # over groups of rows now (relax/backend/cpu/softmax.py): one parallel loop, outermost
    sm = _kernels(softmax_module(), "softmax")
    assert sm
    text = lower(ds.apply(sm[0], AVX512)).script()
    par = [line for line in text.splitlines() if "T.parallel(" in line]
    assert len(par) >= 1, text
    for line in par:
        assert line.startswith("    for ") and not line.startswith("     "), line


@pytest.mark.parametrize("batch,seq", [(1, 1), (1, 5), (1, 8), (2, 7), (3, 16), (2, 33)])
def test_softmax_symbolic_matches_numpy(batch, seq):
    if "softmax" not in _EXE:
        _EXE["softmax"] = relax.build(softmax_module(), "llvm",
                                      upper_bounds={"batch": 4, "seq": 40})
    vm = relax.VirtualMachine(_EXE["softmax"], targets.cpu(0))
    x = RNG.standard_normal((batch, 4, seq, seq)).astype("float32") * 4
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(vm["main"](x).numpy(), e / e.sum(-1, keepdims=True),
                               rtol=1e-5, atol=1e-6)
