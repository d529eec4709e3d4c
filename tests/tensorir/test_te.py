"""te: placeholders, computes, reductions and create_prim_func's TensorIR."""
import pytest

from tilecraft import tensorir as T
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import TIRError


def _blocks(func):
    out = []
    T.post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, T.Block) else None)
    return {b.name: b for b in out}


def test_matmul_prim_func_structure():
    n = te.var("n")
    A = te.placeholder((n, 64), "float32", "A")
    W = te.placeholder((64, 32), "float32", "W")
    k = te.reduce_axis((0, 64), "k")
    C = te.compute((n, 32), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    f = te.create_prim_func([A, W, C])
    assert [b.name for b in f.buffers] == ["A", "W", "C"]
    assert all(p.dtype == "handle" for p in f.params)
    blocks = _blocks(f)
    c = blocks["C"]
    assert [iv.kind for iv in c.iter_vars] == ["spatial", "spatial", "reduce"]
    assert c.init is not None and isinstance(c.init, T.BufferStore)
    assert c.init.value.value == 0.0
    assert {r.buffer.name for r in c.reads} == {"A", "W"}
    assert [w.buffer.name for w in c.writes] == ["C"]
    # loops: i (extent n), j, k
    loops = []
    T.post_order_visit(f.body, lambda x: loops.append(x) if isinstance(x, T.For) else None)
    assert [l.loop_var.name for l in reversed(loops)] == ["i", "j", "k"]
    assert loops[-1].extent is n


def test_intermediate_becomes_root_alloc_buffer():
    A = te.placeholder((16,), "float32", "A")
    B = te.compute((16,), lambda i: te.exp(A[i]), "B")
    C = te.compute((16,), lambda i: B[i] * 2.0, "C")
    f = te.create_prim_func([A, C])
    root = f.body.block
    assert [b.name for b in root.alloc_buffers] == ["B"]
    assert [s.block.name if isinstance(s, T.BlockRealize) else s.body.block.name
            for s in root.body.seq] == ["B", "C"]


def test_missing_placeholder_argument_is_an_error():
    A = te.placeholder((4,), "float32", "A")
    B = te.compute((4,), lambda i: A[i] + 1.0, "B")
    with pytest.raises(TIRError, match="placeholder A"):
        te.create_prim_func([B])


def test_reductions_and_identities():
    A = te.placeholder((8, 8), "float32", "A")
    k = te.reduce_axis((0, 8), "k")
    for fn, ident in [(te.sum, 0.0), (te.prod, 1.0), (te.max, float("-inf")),
                      (te.min, float("inf"))]:
        B = te.compute((8,), lambda i: fn(A[i, k], axis=k), "B")
        f = te.create_prim_func([A, B])
        assert _blocks(f)["B"].init.value.value == ident


def test_reduce_with_where_and_offset_axis():
    A = te.placeholder((10,), "float32", "A")
    k = te.reduce_axis((2, 10), "k")
    assert k.dom.min.value == 2 and k.dom.extent.value == 8
    B = te.compute((1,), lambda i: te.sum(A[k], axis=k, where=k < 6), "B")
    f = te.create_prim_func([A, B])
    body = _blocks(f)["B"].body
    assert isinstance(body.value.b, T.Select)


def test_nested_reduction_is_rejected():
    A = te.placeholder((8,), "float32", "A")
    k = te.reduce_axis((0, 8), "k")
    with pytest.raises(TIRError, match="whole body"):
        te.compute((1,), lambda i: te.sum(A[k], axis=k) + 1.0, "B")


def test_elementwise_max_min_and_math():
    x = te.placeholder((4,), "float32", "x")
    y = te.compute((4,), lambda i: te.max(x[i], 0.0) + te.min(x[i], 1.0), "y")
    assert isinstance(y.body.a, T.Max) and isinstance(y.body.b, T.Min)
    for fn in [te.exp, te.log, te.sqrt, te.rsqrt, te.tanh, te.sigmoid, te.erf, te.abs, te.floor,
               te.ceil, te.round, te.sin, te.cos]:
        assert fn(x[0]).dtype == "float32"
    assert te.pow(x[0], 2.0).op == "pow"
    i = te.var("i")
    assert isinstance(te.abs(i), T.Select)
    with pytest.raises(TIRError):
        te.exp(i)


def test_if_then_else_and_dtype_errors():
    A = te.placeholder((4,), "float32", "A")
    B = te.compute((4,), lambda i: te.if_then_else(i > 0, A[i - 1], 0.0), "B")
    assert B.body.op == "if_then_else"
    C = te.placeholder((4,), "float64", "C")
    with pytest.raises(TIRError, match="float32.*float64"):
        te.compute((4,), lambda i: A[i] + C[i], "D")


def test_scalar_params_and_zero_dim_output():
    A = te.placeholder((8,), "float32", "A")
    alpha = te.var("alpha", "float32")
    B = te.compute((8,), lambda i: A[i] * alpha, "B")
    f = te.create_prim_func([A, B, alpha])
    assert f.scalar_params == [alpha]
    k = te.reduce_axis((0, 8), "k")
    S = te.compute((), lambda: te.sum(A[k], axis=k), "S")
    g = te.create_prim_func([A, S])
    assert g.buffers[1].shape == ()


def test_duplicate_argument_names_rejected():
    A = te.placeholder((4,), "float32", "X")
    B = te.compute((4,), lambda i: A[i], "X")
    with pytest.raises(TIRError, match="named"):
        te.create_prim_func([A, B])


def test_create_prim_func_is_deterministic():
    def make():
        n = te.var("n")
        A = te.placeholder((n, 3), "float32", "A")
        B = te.compute((n, 3), lambda i, j: A[i, j] * 2.0, "B")
        return te.create_prim_func([A, B])
    f, g = make(), make()
    assert T.structural_equal(f, g)
    assert T.structural_hash(f) == T.structural_hash(g)
