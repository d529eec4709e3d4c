"""The Intel AMX int8 block product as a tensor intrinsic (``amx_u8s8s32_{M}x{N}x{K}``,
``intrinsics.amx_funcs``): its description and its implementation (the ``AMX_U8I8`` call)
agree in ``tensorir.interpret`` bit for bit; ``tensorize`` matches partial tiles
(``TensorIntrin.partial``: a ragged last block of rows passes its row count, a ragged panel of
columns is computed whole into padded scratch, never into a parameter); the trace replays; the
interpreter refuses a tile that overruns its rows. These run without AMX hardware (the
compiled kernels are in tests/relax/backend/cpu/test_dense_amx.py)."""
import numpy as np
import pytest

from tilecraft.tensorir import te
from tilecraft.tensorir.expr import AMX_U8I8, DOT4_U8I8, Call, IntImm, TIRError, call
from tilecraft.tensorir.functor import post_order_visit, substitute
from tilecraft.tensorir.interpret import interpret
from tilecraft.tensorir.schedule import Schedule, ScheduleError
from tilecraft.tensorir.schedule.index_map import IndexMap
from tilecraft.tensorir.schedule.intrinsics import (TensorIntrin, amx_funcs, amx_name,
                                                     available)
from tilecraft.tensorir.structural import structural_equal

RNG = np.random.default_rng(31)


def u8_words(x: np.ndarray, words: int) -> np.ndarray:
    """uint8 rows (M, K) as int32 words (M, words), four bytes each, zero-padded."""
    out = np.zeros((x.shape[0], 4 * words), np.uint8)
    out[:, :x.shape[1]] = x
    return out.view("<i4").astype(np.int32)


def vnni_words(w: np.ndarray, words: int) -> np.ndarray:
    """int8 (K, N) as words (words, N): word [kw, n] holds w[4 kw + p, n] in byte p."""
    k, n = w.shape
    out = np.zeros((4 * words, n), np.int8)
    out[:k] = w
    return out.reshape(words, 4, n).transpose(0, 2, 1).copy().view("<i4")[..., 0].astype(np.int32)


def bytes_(shape, dtype):
    lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
    a = RNG.integers(lo, hi, shape).astype(dtype)
    a.reshape(-1)[:2] = [lo, hi - 1]           # the extremes: 0 / 255, -128 / 127
    return a


def amx_calls(func) -> list:
    found = []
    post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, Call) and
                     n.op == AMX_U8I8 else None)
    return found


def dense_words(m, kw, n, w_cols=None):
    """``C[i, j] = sum_kw dot4_u8i8(x[i, kw], w[kw, j])`` on words (``w`` ``w_cols`` wide:
    zero-padded columns beyond ``n``)."""
    x = te.placeholder((m, kw), "int32", "x")
    w = te.placeholder((kw, w_cols or n), "int32", "w")
    k = te.reduce_axis((0, kw), "k")
    c = te.compute((m, n), lambda i, j: te.sum(call(DOT4_U8I8, x[i, k], w[k, j], dtype="int32"),
                                               axis=k), "C")
    return te.create_prim_func([x, w, c])


@pytest.mark.parametrize("M,N,K", [(32, 64, 256), (16, 16, 64), (5, 32, 128)])
def test_desc_and_impl_agree(M, N, K):
    desc, impl, rows = amx_funcs(M, N, K)
    impl = impl.replace(body=substitute(impl.body, {rows: IntImm(M, "int64")}))
    x, w = bytes_((M, K), "uint8"), bytes_((K, N), "int8")
    a, b = u8_words(x, K // 4), vnni_words(w, K // 4)
    c0 = RNG.integers(-1000, 1000, (M, N)).astype(np.int32)
    want = c0 + x.astype(np.int64) @ w.astype(np.int64)
    for f in (desc, impl):
        c = c0.copy()
        interpret(f, a, b, c)
        np.testing.assert_array_equal(c, want)


def test_family_names_and_bad_sizes():
    assert amx_name(32, 64, 768) == "amx_u8s8s32_32x64x768"
    intrin = TensorIntrin.get("amx_u8s8s32_16x32x128")
    assert intrin.isa == "amx" and set(intrin.partial) == {0, 1}
    for bad in ("amx_u8s8s32_33x64x64", "amx_u8s8s32_16x24x64", "amx_u8s8s32_16x16x32"):
        with pytest.raises(TIRError, match="AMX tile"):
            TensorIntrin.get(bad)


def test_available_only_with_amx():
    class SPR:
        arch, mattr, vector_width, amx_int8 = "x86_64", ("+avx512f",), 512, True

    class ICX:
        arch, mattr, vector_width, amx_int8 = "x86_64", ("+avx512f",), 512, False
    assert "amx_u8s8s32_32x64x64" in available(SPR())
    assert not any(n.startswith("amx_") for n in available(ICX()))


def _tile(sch, block, M, N):
    i, j, k = sch.get_loops(block)
    jo, ji = sch.split(j, [None, N])
    io, ii = sch.split(i, [None, M])
    sch.reorder(jo, io, ii, ji, k)
    return jo, io, ii


def test_symbolic_rows_are_a_partial_tile():
    """Blocks of 32 rows of a symbolic row count: the last block's call gets its row count
    ``min(32, m - 32 i_o)``; interpreted bit-exactly for 1..70 rows; the trace replays."""
    m = te.var("m")
    kw, n = 32, 64
    func = dense_words(m, kw, n)
    sch = Schedule(func)
    block = sch.get_block("C")
    acc = sch.cache_write(block, 0, "local")
    jo, io, ii = _tile(sch, block, 32, 64)
    sch.reverse_compute_at(acc, io)
    sch.decompose_reduction(block, ii)
    sch.tensorize(ii, amx_name(32, 64, 4 * kw))
    calls = amx_calls(sch.func)
    assert len(calls) == 1 and "m" in repr(calls[0].args[6])
    w = bytes_((4 * kw, n), "int8")
    for rows in (1, 17, 32, 70):
        x = bytes_((rows, 4 * kw), "uint8")
        out = np.zeros((rows, n), np.int32)
        interpret(sch.func, u8_words(x, kw), vnni_words(w, kw), out)
        np.testing.assert_array_equal(out, x.astype(np.int64) @ w.astype(np.int64))
    replayed = Schedule(func)
    replayed.replay(sch.trace)
    assert structural_equal(replayed.func, sch.func)


def _padded_acc(func, kw):
    sch = Schedule(func)
    block = sch.get_block("C")
    acc = sch.cache_write(block, 0, "local")
    jo, io, ii = _tile(sch, block, 16, 32)
    sch.reverse_compute_at(acc, io)
    sch.decompose_reduction(block, ii)
    sch.transform_layout(block, 0, IndexMap.from_func(lambda i, j: (i, j // 32, j % 32)))
    return sch, ii


def test_ragged_columns_need_padded_buffers():
    """48 columns in tiles of 32: the last tile is computed whole, so tensorize refuses it
    where it would write the output parameter or read past the weight's columns, and accepts
    it into a local accumulator padded to whole tiles (transform_layout) with a weight padded
    to 64 columns, bit-exact."""
    kw, n = 16, 48
    func = dense_words(40, kw, n, w_cols=64)
    sch = Schedule(func)
    block = sch.get_block("C")
    jo, io, ii = _tile(sch, block, 16, 32)
    sch.decompose_reduction(block, ii)
    with pytest.raises(ScheduleError, match="parameter buffer"):
        sch.tensorize(ii, amx_name(16, 32, 4 * kw))
    sch, ii = _padded_acc(dense_words(40, kw, n), kw)      # the weight only 48 wide
    with pytest.raises(ScheduleError, match="may leave the buffer"):
        sch.tensorize(ii, amx_name(16, 32, 4 * kw))

    sch, ii = _padded_acc(func, kw)
    sch.tensorize(ii, amx_name(16, 32, 4 * kw))
    assert amx_calls(sch.func)
    x, w = bytes_((40, 4 * kw), "uint8"), bytes_((4 * kw, 64), "int8")
    w[:, n:] = 0
    out = np.zeros((40, n), np.int32)
    interpret(sch.func, u8_words(x, kw), vnni_words(w, kw), out)
    np.testing.assert_array_equal(out, x.astype(np.int64) @ w[:, :n].astype(np.int64))


def test_other_predicates_do_not_match():
    """A predicate on the reduction (not a loop the intrinsic may cut short) is no match."""
    func = dense_words(32, 40, 32)          # 40 words: tiles of 16 leave a ragged K step
    sch = Schedule(func)
    block = sch.get_block("C")
    i, j, k = sch.get_loops(block)
    ko, ki = sch.split(k, [None, 16])
    sch.reorder(ko, i, j, ki)
    before = sch.func
    with pytest.raises(ScheduleError, match="partial tile|predicate"):
        sch.tensorize(i, amx_name(32, 32, 64))
    assert sch.func is before


def test_interpreter_refuses_an_overrunning_tile():
    """A C tile of 32 columns starting at column 16 of a 40-column buffer would spill into
    the next row: the interpreter raises instead of writing there."""
    func = dense_words(2, 16, 40)
    sch = Schedule(func)
    block = sch.get_block("C")
    c = sch.get(block).writes[0].buffer
    x = sch.get(block).reads[0].buffer
    w = sch.get(block).reads[1].buffer
    amx = Call("int32", AMX_U8I8, [c[0, 16], x[0, 0], w[0, 16], c[1, 16], x[1, 0], w[1, 16],
                                    2, 1, 2])
    from tilecraft.tensorir.stmt import Evaluate
    bad = func.replace(body=Evaluate(amx))
    with pytest.raises(TIRError, match="overruns"):
        interpret(bad, np.zeros((2, 16), np.int32), np.zeros((16, 40), np.int32),
                  np.zeros((2, 40), np.int32))
