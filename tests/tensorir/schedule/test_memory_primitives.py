"""cache_read, cache_write, set_scope, storage_align, transform_layout, and IndexMap.

Every scheduled function is checked against the unscheduled one with the interpreter on random
data; printed text on key lines; traces through JSON; illegal requests raise ScheduleError naming
the primitive and the block, leaving the function unchanged.
"""
import json

import numpy as np
import pytest

from tilecraft.tensorir import arith, te, transform, var
from tilecraft.tensorir.expr import IntImm, TIRError
from tilecraft.tensorir.functor import substitute
from tilecraft.tensorir.interpret import interpret
from tilecraft.tensorir.schedule import Schedule, ScheduleError, Trace
from tilecraft.tensorir.schedule import tree
from tilecraft.tensorir.schedule.index_map import IndexMap
from tilecraft.tensorir.structural import structural_equal

RNG = np.random.default_rng(20240601)


def matmul(M=7, K=5, N=9, epilogue=False):
    A = te.placeholder((M, K), "float32", "A")
    B = te.placeholder((K, N), "float32", "B")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    if not epilogue:
        return te.create_prim_func([A, B, C])
    D = te.compute((M, N), lambda i, j: C[i, j] + 1.0, "D")
    return te.create_prim_func([A, B, D])


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def run(func, *arrays, **kw):
    """Copies of ``arrays`` after interpreting ``func`` on them."""
    arrays = [a.copy() for a in arrays]
    interpret(func, *arrays, **kw)
    return arrays


def assert_same(func_a, func_b, shapes, **kw):
    """Both functions compute the same outputs on the same random inputs."""
    arrays = [rand(*s) for s in shapes]
    out_a, out_b = run(func_a, *arrays, **kw), run(func_b, *arrays, **kw)
    for a, b in zip(out_a, out_b):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def round_trip(sch, orig):
    data = json.loads(json.dumps(sch.trace.to_json()))
    again = Trace.from_json(data).apply(orig)
    assert structural_equal(again.func, sch.func), again.func.script() + "\n---\n" + \
        sch.func.script()


def mm_shapes(M=7, K=5, N=9):
    return [(M, K), (K, N), (M, N)]


def block_names(func):
    return [br.block.name for br in tree.all_blocks(func)]


def alloc(func, name):
    return next(b for br in tree.all_blocks(func) for b in br.block.alloc_buffers if b.name == name)


# ---------------------------------------------------------------------------------------------
# cache_read / cache_write


@pytest.mark.parametrize("scope", ["global", "shared", "local"])
def test_cache_read_matmul_inputs(scope):
    f = matmul()
    sch = Schedule(f)
    c = sch.get_block("C")
    a = sch.cache_read(c, 0, scope)
    b = sch.cache_read(c, 1, scope)
    assert sch.get(a).name == f"A_{scope}" and sch.get(b).name == f"B_{scope}"
    # copies come before the consumer, in order, at the root
    assert block_names(sch.func) == ["root", f"A_{scope}", f"B_{scope}", "C"]
    assert alloc(sch.func, f"A_{scope}").scope == scope
    text = sch.func.script()
    assert f"A_{scope}[v0, v1] = A[v0, v1]" in text
    assert f"C[vi, vj] + A_{scope}[vi, vk] * B_{scope}[vk, vj]" in text
    if scope != "global":
        assert f'A_{scope} = T.alloc_buffer((7, 5), "float32", scope="{scope}")' in text
    assert_same(f, sch.func, mm_shapes())
    round_trip(sch, f)


@pytest.mark.parametrize("scope", ["global", "shared", "local"])
def test_cache_write_matmul_output(scope):
    f = matmul(epilogue=True)
    sch = Schedule(f)
    c = sch.get_block("C")
    wb = sch.cache_write(c, 0, scope)
    assert sch.get(wb).name == f"C_{scope}"
    assert block_names(sch.func) == ["root", "C", f"C_{scope}", "D"]
    text = sch.func.script()
    assert f"C_{scope}[vi, vj] = C_{scope}[vi, vj] + A[vi, vk] * B[vk, vj]" in text
    assert f"C[v0, v1] = C_{scope}[v0, v1]" in text
    assert "D[vi, vj] = C[vi, vj] + 1.0" in text
    assert_same(f, sch.func, mm_shapes())
    round_trip(sch, f)


def test_cache_write_of_parameter_output():
    f = matmul()
    sch = Schedule(f)
    sch.cache_write(sch.get_block("C"), 0, "local")
    assert [b.name for b in sch.func.buffers] == ["A", "B", "C"]
    assert_same(f, sch.func, mm_shapes())


def test_cache_read_consumer_blocks_only_redirects_those():
    A = te.placeholder((6, 4), "float32", "A")
    B = te.compute((6, 4), lambda i, j: A[i, j] * 2.0, "B")
    C = te.compute((6, 4), lambda i, j: A[i, j] + B[i, j], "C")
    f = te.create_prim_func([A, B, C])
    sch = Schedule(f)
    sch.cache_read(sch.get_block("C"), 0, "shared", consumer_blocks=[sch.get_block("C")])
    text = sch.func.script()
    assert "B[vi, vj] = A[vi, vj] * 2.0" in text
    assert "C[vi, vj] = A_shared[vi, vj] + B[vi, vj]" in text
    assert block_names(sch.func) == ["root", "B", "A_shared", "C"]
    assert_same(f, sch.func, [(6, 4), (6, 4), (6, 4)])
    round_trip(sch, f)
    # by default every consumer reads the cache, which goes before the first of them
    sch = Schedule(f)
    sch.cache_read(sch.get_block("C"), 0, "shared")
    assert block_names(sch.func) == ["root", "A_shared", "B", "C"]
    assert "B[vi, vj] = A_shared[vi, vj] * 2.0" in sch.func.script()
    assert_same(f, sch.func, [(6, 4), (6, 4), (6, 4)])


def test_cache_read_of_intermediate_goes_after_its_producer():
    f = matmul(epilogue=True)
    sch = Schedule(f)
    sch.cache_read(sch.get_block("D"), 0, "local")
    assert block_names(sch.func) == ["root", "C", "C_local", "D"]
    assert_same(f, sch.func, mm_shapes())


def test_cache_then_compute_at_narrows_the_copy():
    f = matmul(epilogue=True)
    sch = Schedule(f)
    c = sch.get_block("C")
    i, _, _ = sch.get_loops(c)
    a = sch.cache_read(c, 0, "shared")
    sch.compute_at(a, i)
    wb = sch.cache_write(c, 0, "local")
    sch.reverse_compute_at(wb, i)
    region = sch.get(a).writes[0].region
    assert [r.extent.value for r in region] == [1, 1]  # per-iteration block of one element
    assert_same(f, sch.func, mm_shapes())
    round_trip(sch, f)


def test_cache_inside_loops_shared_with_the_producer():
    f = matmul(epilogue=True)
    sch = Schedule(f)
    d = sch.get_block("D")
    i, _ = sch.get_loops(d)
    sch.compute_at(sch.get_block("C"), i)
    r = sch.cache_read(d, 0, "local")
    # the copy sits under i, between producer and consumer, and copies one row of C
    loop_i = sch.get(i)
    assert [br.block.name for br in tree.child_block_realizes(loop_i)] == ["C", "C_local", "D"]
    assert "v0 = T.axis.spatial(7, ax0 + i)" in sch.func.script()
    assert_same(f, sch.func, mm_shapes())
    w = sch.cache_write(sch.get_block("C"), 0, "local")
    assert [br.block.name for br in tree.child_block_realizes(sch.get(i))] == \
        ["C", sch.get(w).name, "C_local", "D"]
    assert_same(f, sch.func, mm_shapes())
    round_trip(sch, f)


def test_cache_read_symbolic_shape():
    n = var("n")
    A = te.placeholder((n, 3), "float32", "A")
    B = te.compute((n, 3), lambda i, j: A[i, j] * 3.0 + 1.0, "B")
    f = te.create_prim_func([A, B])
    sch = Schedule(f)
    sch.cache_read(sch.get_block("B"), 0, "local")
    sch.cache_write(sch.get_block("B"), 0, "local")
    assert_same(f, sch.func, [(11, 3), (11, 3)])
    round_trip(sch, f)


# ---------------------------------------------------------------------------------------------
# set_scope / storage_align


def test_set_scope_of_intermediate():
    f = matmul(epilogue=True)
    sch = Schedule(f)
    sch.set_scope(sch.get_block("C"), 0, "shared")
    assert alloc(sch.func, "C").scope == "shared"
    assert 'C = T.alloc_buffer((7, 9), "float32", scope="shared")' in sch.func.script()
    assert_same(f, sch.func, mm_shapes())
    round_trip(sch, f)


def test_storage_align_pads_the_stride():
    f = matmul(epilogue=True)
    sch = Schedule(f)
    c = sch.get_block("C")
    sch.storage_align(c, 0, axis=0, factor=8, offset=3)
    buf = alloc(sch.func, "C")
    assert [s.value for s in buf.strides] == [11, 1]   # 9 -> the next 8k + 3
    assert dict(sch.get(c).annotations)["buffer_dim_align"] == (((0, 8, 3),),)
    assert "strides=(11, 1)" in sch.func.script()
    assert_same(f, sch.func, mm_shapes())
    # lowering flattens with the strides
    low = transform.lower(sch.func)
    assert "i * 11 + j" in low.script()
    a, b = rand(7, 5), rand(5, 9)
    d = np.zeros((7, 9), "float32")
    interpret(low, a, b, d)
    np.testing.assert_allclose(d, a @ b + 1.0, rtol=1e-5, atol=1e-5)
    round_trip(sch, f)


def test_storage_align_two_axes_and_symbolic_shape():
    n = var("n")
    A = te.placeholder((4, n, 3), "float32", "A")
    B = te.compute((4, n, 3), lambda i, j, k: A[i, j, k] * 2.0, "B")
    C = te.compute((4, n, 3), lambda i, j, k: B[i, j, k] + 1.0, "C")
    f = te.create_prim_func([A, C])
    sch = Schedule(f)
    b = sch.get_block("B")
    sch.storage_align(b, 0, 1, 4, 0)     # stride of j: 3 -> 4
    sch.storage_align(b, 0, 0, 16, 1)    # stride of i: 4n -> next 16k + 1
    sch.storage_align(b, 0, 1, 8, 2)     # replaces the first request for axis 1: 3 -> 10
    strides = alloc(sch.func, "B").strides
    assert strides[2].value == 1 and strides[1].value == 10
    low = transform.lower(sch.func)
    for nv in (1, 5):
        a = rand(4, nv, 3)
        c = np.zeros((4, nv, 3), "float32")
        interpret(low, a, c)
        np.testing.assert_allclose(c, a * 2.0 + 1.0, rtol=1e-6)
        assert_same(f, sch.func, [(4, nv, 3), (4, nv, 3)])
    round_trip(sch, f)


# ---------------------------------------------------------------------------------------------
# transform_layout


def pack(b, block=16):
    """[k, n] -> [ceildiv(n, 16), k, 16], zero padding."""
    k, n = b.shape
    out = np.zeros(((n + block - 1) // block, k, block), b.dtype)
    for j in range(n):
        out[j // block, :, j % block] = b[:, j]
    return out


@pytest.mark.parametrize("N", [32, 37])
def test_transform_layout_packs_matmul_weight(N):
    f = matmul(M=6, K=5, N=N)
    sch = Schedule(f)
    sch.transform_layout(sch.get_block("C"), ("read", 1), lambda k, n: [n // 16, k, n % 16])
    B = sch.func.buffers[1]
    assert [s.value for s in B.shape] == [(N + 15) // 16, 5, 16]
    text = sch.func.script()
    assert "A[vi, vk] * B[vj // 16, vk, vj % 16]" in text
    assert "T.reads(A[vi, vk], B[vj // 16, vk, vj % 16])" in text
    a, b = rand(6, 5), rand(5, N)
    c = np.zeros((6, N), "float32")
    interpret(sch.func, a, pack(b), c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    round_trip(sch, f)


def test_transform_layout_symbolic_n():
    n = var("n")
    A = te.placeholder((6, 5), "float32", "A")
    B = te.placeholder((5, n), "float32", "B")
    k = te.reduce_axis((0, 5), "k")
    C = te.compute((6, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    f = te.create_prim_func([A, B, C])
    sch = Schedule(f)
    sch.transform_layout(sch.get_block("C"), 1, IndexMap.from_func(lambda k, n: [n // 16, k, n % 16]),
                         "read")
    assert "B: T.Buffer(((n + 15) // 16, 5, 16)" in sch.func.script()
    for N in (16, 23):
        a, b = rand(6, 5), rand(5, N)
        c = np.zeros((6, N), "float32")
        interpret(sch.func, a, pack(b), c, n=N)
        np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    round_trip(sch, f)


def test_transform_layout_of_intermediate_and_after_split():
    f = matmul(M=8, K=5, N=12, epilogue=True)
    sch = Schedule(f)
    c = sch.get_block("C")
    _, j, _ = sch.get_loops(c)
    sch.split(j, [None, 4])
    sch.transform_layout(c, 0, lambda i, j: [j // 4, i, j % 4])
    assert [s.value for s in alloc(sch.func, "C").shape] == [3, 8, 4]
    text = sch.func.script()
    # the consumer's accesses were rewritten too
    assert "D[vi, vj] = C[vj // 4, vi, vj % 4] + 1.0" in text
    assert_same(f, sch.func, [(8, 5), (5, 12), (8, 12)])
    round_trip(sch, f)


def test_transform_layout_pad_value_fills_the_padding():
    A = te.placeholder((7, 3), "float32", "A")
    B = te.compute((7, 3), lambda i, j: A[i, j] * 2.0, "B")
    f = te.create_prim_func([A, B])
    sch = Schedule(f)
    sch.transform_layout(sch.get_block("B"), 0, lambda i, j: [i // 4, j, i % 4], pad_value=-1.0)
    assert "B_pad" in block_names(sch.func)
    a = rand(7, 3)
    out = np.full((2, 3, 4), 123.0, "float32")
    interpret(sch.func, a, out)
    want = np.full((8, 3), -1.0, "float32")
    want[:7] = a * 2.0
    np.testing.assert_allclose(out, want.reshape(2, 4, 3).transpose(0, 2, 1))
    round_trip(sch, f)


def test_transform_layout_free_variable_survives_the_trace():
    n = var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] + 1.0, "B")
    f = te.create_prim_func([A, B])
    sch = Schedule(f)
    sch.transform_layout(sch.get_block("B"), ("read", 0), lambda i: [n - 1 - i])  # reversed
    a = rand(6)
    b = np.zeros(6, "float32")
    interpret(sch.func, a[::-1].copy(), b)
    np.testing.assert_allclose(b, a + 1.0)
    round_trip(sch, f)   # the map comes back with a new Var "n", matched by name


# ---------------------------------------------------------------------------------------------
# IndexMap


def test_index_map_shape_inverse_and_json():
    n = var("n")
    m = IndexMap.from_func(lambda i, j: [i // 16, j, i % 16])
    assert [i.name for i in m.initial_indices] == ["i", "j"]
    assert [s.value for s in m.map_shape([64, 8])] == [4, 8, 16]
    assert repr(m.map_shape([n, 8])[0]) == "(n + 15) // 16"
    assert [e.value for e in m.map_indices([37, 5])] == [2, 5, 5]
    inv = m.inverse([64, 8])
    for x in [(0, 0), (37, 5), (63, 7)]:
        y = [e.value for e in m.map_indices(x)]
        assert [e.value for e in inv.map_indices(y)] == list(x)
    with pytest.raises(TIRError, match="not a bijection"):
        m.inverse([40, 8])
    inv, pad = m.non_surjective_inverse([40, 8])
    for y0 in range(3):
        for y2 in range(16):
            is_pad = arith.simplify(substitute(
                pad, {inv.initial_indices[0]: IntImm(y0), inv.initial_indices[1]: IntImm(0),
                      inv.initial_indices[2]: IntImm(y2)}))
            assert bool(is_pad.value) == (y0 * 16 + y2 >= 40)
    fused = IndexMap.from_func(lambda i, j: [i * 8 + j])
    assert [e.value for e in fused.inverse([4, 8]).map_indices([27])] == [3, 3]
    assert IndexMap.from_func(lambda i, j: [j, i]).inverse([3, 5]).is_equivalent_to(
        IndexMap.from_func(lambda a, b: [b, a]))
    with pytest.raises(TIRError, match="cannot invert"):
        IndexMap.from_func(lambda i, j: [i + j]).inverse([4, 4])
    back = IndexMap.from_json(json.loads(json.dumps(m.to_json())))
    assert back.is_equivalent_to(m) and repr(back) == repr(m)


def test_index_map_rejects_bad_maps():
    with pytest.raises(TIRError, match="unbounded"):
        IndexMap.from_func(lambda i: [i // var("n")]).map_shape([8])
    with pytest.raises(TIRError, match="negative"):
        IndexMap.from_func(lambda i: [i - 4]).map_shape([8])
    with pytest.raises(TIRError, match="integer"):
        IndexMap.from_func(lambda i: [i.astype("float32")])
    with pytest.raises(ValueError, match="unknown expression"):
        IndexMap.from_json({"initial": [["i", "int64"]], "final": [["Bogus", 1]]})


# ---------------------------------------------------------------------------------------------
# errors: ScheduleError naming the primitive and block, schedule unchanged


def expect_error(sch, fn, *patterns):
    before = sch.func
    n = len(sch.trace)
    with pytest.raises(ScheduleError) as info:
        fn()
    msg = str(info.value)
    for p in patterns:
        assert p in msg, msg
    assert sch.func is before and structural_equal(sch.func, before)
    # the failed call is not recorded (queries made while building the call may be)
    assert all(inst.kind != patterns[0] for inst in sch.trace.instructions[n:])


def test_illegal_requests():
    f = matmul(epilogue=True)
    sch = Schedule(f)
    c, d = sch.get_block("C"), sch.get_block("D")
    expect_error(sch, lambda: sch.cache_read(c, 5, "shared"), "cache_read", "block C",
                 "out of range")
    expect_error(sch, lambda: sch.cache_write(c, 1, "local"), "cache_write", "block C",
                 "out of range")
    expect_error(sch, lambda: sch.cache_read(c, 0, "texture"), "cache_read", "block C",
                 "storage scope")
    expect_error(sch, lambda: sch.cache_read(c, 0, "shared", consumer_blocks=[d]),
                 "cache_read", "block C", "does not read A")
    expect_error(sch, lambda: sch.set_scope(d, 0, "shared"), "set_scope", "block D",
                 "cannot change the scope of an argument buffer")
    expect_error(sch, lambda: sch.set_scope(c, 3, "shared"), "set_scope", "block C",
                 "out of range")
    expect_error(sch, lambda: sch.storage_align(d, 0, 0, 8, 1), "storage_align", "block D",
                 "argument buffer")
    expect_error(sch, lambda: sch.storage_align(c, 0, 2, 8, 1), "storage_align", "block C",
                 "axis 2")
    expect_error(sch, lambda: sch.storage_align(c, 0, 0, 8, 8), "storage_align", "block C",
                 "offset")
    expect_error(sch, lambda: sch.transform_layout(c, 0, lambda i: [i]), "transform_layout",
                 "block C", "takes 1 indices")
    expect_error(sch, lambda: sch.transform_layout(c, ("read", 7), lambda i, j: [j, i]),
                 "transform_layout", "block C", "out of range")
    expect_error(sch, lambda: sch.transform_layout(c, 0, lambda i, j: [i - 1, j]),
                 "transform_layout", "block C", "negative")
    m = var("m")
    expect_error(sch, lambda: sch.transform_layout(c, 0, lambda i, j: [m - 1 - i, j]),
                 "transform_layout", "block C", "not a variable of the function")
    expect_error(sch, lambda: sch.transform_layout(c, 0, lambda i, j: [i + j, j], pad_value=0.0),
                 "transform_layout", "block C", "invertible")
    sch.storage_align(c, 0, 0, 8, 1)
    expect_error(sch, lambda: sch.transform_layout(c, 0, lambda i, j: [j, i]),
                 "transform_layout", "block C", "strides")


# ---------------------------------------------------------------------------------------------
# compiled


def test_compiled_packed_weight_matmul_matches_numpy():
    from tilecraft import targets
    f = matmul(M=16, K=12, N=40)
    sch = Schedule(f)
    c = sch.get_block("C")
    sch.transform_layout(c, ("read", 1), lambda k, n: [n // 16, k, n % 16])
    a_shared = sch.cache_read(c, 0, "global")
    i, j, k = sch.get_loops(c)
    sch.compute_at(a_shared, i)
    sch.decompose_reduction(c, j)
    mod = targets.build(sch.mod, "llvm")
    a, b = rand(16, 12), rand(12, 40)
    out = np.zeros((16, 40), "float32")
    mod["main"](a, pack(b), out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


def _half_matmul():
    A = te.placeholder((16, 8), "float16", "A")
    B = te.placeholder((8, 12), "float16", "B")
    k = te.reduce_axis((0, 8), "k")
    C = te.compute((16, 12), lambda i, j: te.sum(A[i, k].astype("float32") *
                                                 B[k, j].astype("float32"), axis=k), "C")
    D = te.compute((16, 8), lambda i, j: A[i, j] * A[i, j], "D")     # reads A unconverted
    return te.create_prim_func([A, B, C]), te.create_prim_func([A, D])


def test_cache_read_widening_converts_once_and_computes_the_same():
    func, _ = _half_matmul()
    sch = Schedule(func)
    blk = sch.get_block("C")
    sh = sch.cache_read(blk, 0, "shared", dtype="float32")
    cache = [b for b in sch.get(sch.get_block("root")).alloc_buffers
             if b.name == sch.get(sh).writes[0].buffer.name][0]
    assert cache.dtype == "float32" and cache.scope == "shared"
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 8)).astype("float16")
    b = rng.standard_normal((8, 12)).astype("float16")
    c = np.zeros((16, 12), "float32")
    interpret(sch.mod["main"], a, b, c)
    np.testing.assert_allclose(c, a.astype("float32") @ b.astype("float32"), rtol=1e-6,
                               atol=1e-6)
    replay = Trace.from_json(sch.trace.to_json()).apply(func)
    assert replay.mod["main"].script() == sch.mod["main"].script()


def test_cache_read_widening_refuses_a_lossy_dtype_or_an_unconverted_read():
    func, plain = _half_matmul()
    sch = Schedule(func)
    before = sch.mod["main"].script()
    with pytest.raises(ScheduleError, match="cannot convert float16 to float64"):
        sch.cache_read(sch.get_block("C"), 1, "shared", dtype="float64")
    sch2 = Schedule(plain)
    with pytest.raises(ScheduleError, match="other than converted to float32"):
        sch2.cache_read(sch2.get_block("D"), 0, "shared", dtype="float32")
    assert sch.mod["main"].script() == before
