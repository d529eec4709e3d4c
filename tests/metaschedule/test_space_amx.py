"""``MultiLevelTilingAMX``: int8 dense blocks on packed words (the ``dense_u8i8`` kernels of
``relax.backend.cpu.dense_int8``) tiled around the Intel AMX block product
(``amx_u8s8s32_{M}x{N}x{K}``) where the target has AMX. Candidates drawn from the default
space are tensorized (``RewriteTensorize``) and bit-exact against numpy in the interpreter
(any machine) and compiled (on an AMX CPU); a short tuning run on an AMX CPU keeps records
whose traces hold the AMX tensorize, replay, and compute the exact product."""
import numpy as np
import pytest

from tilecraft import metaschedule as ms
from tilecraft import targets
from tilecraft.metaschedule import AutoInline, LocalRunner, ParallelVectorizeUnroll, tune_tir
from tilecraft.metaschedule.schedule_rule import analysis as A
from tilecraft.metaschedule.schedule_rule.base import ANN_TENSORIZE
from tilecraft.metaschedule.schedule_rule.multi_level_tiling_amx import (AMX_FAMILY,
                                                                         MultiLevelTilingAMX,
                                                                         amx_operands)
from tilecraft.relax.backend.cpu.dense_int8 import dense_u8i8, dot4_u8i8
from tilecraft.tensorir import interpret, te
from tilecraft.tensorir.expr import AMX_U8I8, Call, Cast
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.structural import structural_equal
from tilecraft.targets.target import host_cpu_flags

SPR = targets.Target("llvm -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids")
HAS_AMX = {"amx_int8", "amx_tile"} <= host_cpu_flags()
needs_amx = pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX int8 tiles "
                               "(cpuinfo lacks amx_int8 / amx_tile)")
RNG = np.random.default_rng(11)


def words_dense(m, k_words, n, panel=None):
    """``dense_u8i8`` on words: activations ``(m, k_words)``, the weight in panels of
    ``panel`` columns ``[n / panel, k_words, panel]`` (or plain ``[k_words, n]``)."""
    x = te.placeholder((m, k_words), "int32", "x")
    if panel is None:
        w = te.placeholder((k_words, n), "int32", "w")
        k = te.reduce_axis((0, k_words), "k")
        out = te.compute((m, n), lambda i, j: te.sum(dot4_u8i8(x[i, k], w[k, j]), axis=k), "C")
    else:
        w = te.placeholder((n // panel, k_words, panel), "int32", "w")
        out = dense_u8i8(x, w, n)
    return te.create_prim_func([x, w, out])


def operands(m, k_words, n, panel=None):
    """Random words with the extreme bytes and the int64 product of their bytes."""
    x = RNG.integers(0, 256, (m, 4 * k_words)).astype(np.uint8)
    w = RNG.integers(-128, 128, (4 * k_words, n)).astype(np.int8)
    x[0], w[:, 0] = 255, -128
    xw = x.view("<i4").astype(np.int32)
    ww = w.reshape(k_words, 4, n).transpose(0, 2, 1).copy().view("<i4")[..., 0].astype(np.int32)
    if panel is not None:
        ww = ww.reshape(k_words, n // panel, panel).transpose(1, 0, 2).copy()
    return xw, ww, x.astype(np.int64) @ w.astype(np.int64)


def amx_calls(func) -> int:
    found = []
    post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, Call) and
                     n.op == AMX_U8I8 else None)
    return len(found)


def amx_samples(func, target, count, hints=None):
    space = ms.default_space(target)
    designs = [d for d in space.generate(func, target, shape_hints=hints)
               if any(dict(br.block.annotations).get(ANN_TENSORIZE) == AMX_FAMILY
                      for br in A.all_blocks(d.func))]
    assert designs, "no AMX design in the default space"
    out = []
    for n in range(count):
        sch = space.sample(designs[0], func, target, seed=n, shape_hints=hints)
        assert sch is not None, space.last_rejection
        out.append(sch)
    return out


def test_rule_recognizes_dense_on_words_only():
    def ops(func):
        name = next(br.block.name for br in A.all_blocks(func) if A.is_reduction(br.block))
        return amx_operands(A.find_block_info(func, name))
    o = ops(words_dense(40, 64, 128, panel=64))
    assert o is not None and (o.n, o.k_words, o.panel) == (128, 64, 64)
    o = ops(words_dense(te.var("m"), 32, 48))
    assert o is not None and o.m is None and o.panel is None
    assert ops(words_dense(8, 40, 32)) is None          # K not whole 64-byte tiles
    x = te.placeholder((4, 64), "uint8", "x")
    w = te.placeholder((64, 16), "int8", "w")
    k = te.reduce_axis((0, 64), "k")
    f = te.create_prim_func([x, w, te.compute((4, 16), lambda i, j: te.sum(
        Cast("int32", x[i, k]) * Cast("int32", w[k, j]), axis=k), "C")])
    assert amx_operands(A.find_block_info(f, "C")) is None   # bytes: the dot4 rule's


def test_rule_only_where_amx_is():
    def names(t):
        return [type(r).__name__ for r in ms.default_space(targets.Target(t)).rules]
    assert "MultiLevelTilingAMX" in names(str(SPR))
    assert "MultiLevelTilingAMX" not in names(str(SPR) + " -mattr=-amx-int8")
    assert "MultiLevelTilingAMX" not in names("llvm -mtriple=x86_64-linux-gnu "
                                              "-mcpu=icelake-server")
    with pytest.raises(ValueError, match="multiples of 16"):
        MultiLevelTilingAMX(cols=(24,))


@pytest.mark.parametrize("shape", [(40, 64, 128, 64), (20, 32, 48, None)])
def test_candidates_interpret_bit_exact(shape):
    """Sampled tiles (rows 16 / 32, K in one to four calls; ragged last rows) tensorized and
    run by the interpreter: no AMX hardware needed."""
    m, kw, n, panel = shape
    func = words_dense(m, kw, n, panel)
    x, w, want = operands(m, kw, n, panel)
    for sch in amx_samples(func, SPR, 3):
        assert amx_calls(sch.func) == 1
        out = np.zeros((m, n), np.int32)
        interpret(sch.func, x, w, out)
        np.testing.assert_array_equal(out, want)


@needs_amx
def test_candidates_compiled_bit_exact():
    func = words_dense(te.var("m"), 64, 128, panel=64)
    llvm = targets.Target("llvm")
    for sch in amx_samples(func, llvm, 2, hints={"m": 64}):
        lib = targets.build(sch.mod, llvm)
        assert "tdpbusd" in lib.get_source("asm")
        for m in (1, 33, 64):
            x, w, want = operands(m, 64, 128, 64)
            out = np.zeros((m, 128), np.int32)
            lib["main"](x, w, out)
            np.testing.assert_array_equal(out, want)


@needs_amx
def test_short_tune_keeps_amx_records_that_replay(tmp_path):
    """A few trials on this machine: records with the AMX tensorize in their traces ran and
    matched the unscheduled kernel (the tuner checks each); replayed on the kernel, such a
    trace gives the same function, which computes the exact product."""
    m, kw, n = 64, 64, 128
    func = words_dense(m, kw, n, panel=64)
    llvm = targets.Target("llvm")
    space = ms.SpaceGenerator(rules=[AutoInline(), MultiLevelTilingAMX(),
                                     ParallelVectorizeUnroll(max_jobs_per_core=16,
                                                             max_vectorize_extent=64,
                                                             unroll_max_steps=(0, 16))])
    runner = LocalRunner(number=2, repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False)
    db = tune_tir(func, llvm, max_trials=6, work_dir=tmp_path, num_trials_per_iter=3,
                  space=space, runner=runner, seed=0, progress=False, remeasure=0,
                  search={"population_size": 6, "genetic_num_iters": 1})
    records = [r for r in db.get_all_tuning_records()
               if r.ok and "amx_u8s8s32_" in str(r.trace)]
    assert records, [r.error for r in db.get_all_tuning_records()]
    assert all(r.checked for r in records)
    x, w, want = operands(m, kw, n, 64)
    for r in records[:2]:
        sch = Schedule(func)
        sch.replay(r.trace)
        again = Schedule(func)
        again.replay(r.trace)
        assert structural_equal(sch.func, again.func) and amx_calls(sch.func) == 1
        out = np.zeros((m, n), np.int32)
        targets.build(sch.mod, llvm)["main"](x, w, out)
        np.testing.assert_array_equal(out, want)
