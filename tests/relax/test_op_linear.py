"""relax.op.matmul / linear / einsum: struct-info inference (symbolic), errors, and the
legalized kernels against numpy on random data."""
import numpy as np
import pytest

from oputil import run_op
from tilecraft.relax import RelaxError, TensorStructInfo, Var, op
from tilecraft.relax.op import OpPattern

rng = np.random.default_rng(0)


def rand(*shape, dtype="float32"):
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-8, 8, size=shape).astype(dtype)


def tvar(name, shape, dtype="float32"):
    return Var(name, TensorStructInfo(shape, dtype))


# ---------------------------------------------------------------------------------------------
# matmul

MATMUL_SHAPES = [
    ((3, 5), (5, 4)),
    ((5,), (5, 4)),            # vector @ matrix
    ((3, 5), (5,)),            # matrix @ vector
    ((5,), (5,)),              # dot product: 0-d result
    ((2, 3, 5), (5, 4)),       # batch @ matrix
    ((5,), (2, 5, 3)),         # vector @ batch
    ((2, 1, 3, 5), (4, 5, 2)),  # broadcast batch dims
    ((1, 3, 5), (2, 5, 6)),
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
def test_matmul_numpy_semantics(sa, sb):
    a, b = rand(*sa), rand(*sb)
    out, si = run_op(lambda x, y: op.matmul(x, y), [a, b])
    ref = np.matmul(a, b)
    assert si.static_shape() == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sa,sb,sym", [
    ((3, 5), (5, 4), [True, False]),
    ((2, 3, 5), (2, 5, 4), True),
    ((2, 3, 5), (5, 4), [True, False]),
])
def test_matmul_symbolic(sa, sb, sym):
    a, b = rand(*sa), rand(*sb)
    out, si = run_op(lambda x, y: op.matmul(x, y), [a, b], symbolic=sym)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    assert si.ndim == len(np.matmul(a, b).shape)


def test_matmul_struct_info():
    x = tvar("x", ("n", 768))
    w = tvar("w", (768, 3072))
    assert repr(op.matmul(x, w).struct_info) == "Tensor((n, 3072), 'float32')"
    q = tvar("q", ("b", "h", "s", "d"))
    k = Var("k", TensorStructInfo((q.shape[0], q.shape[1], q.shape[3], q.shape[2]), "float32"))
    assert repr(op.matmul(q, k).struct_info) == "Tensor((b, h, s, s), 'float32')"
    v = tvar("v", (768,))
    mv = op.matmul(x, v).struct_info
    assert mv.ndim == 1 and mv.shape[0] is x.shape[0]
    assert op.get("relax.matmul").pattern == OpPattern.OUT_EWISE_FUSABLE


def test_matmul_reduction_mismatch():
    x = tvar("x", ("n", 768))
    w = tvar("w", (512, 3072))
    with pytest.raises(RelaxError, match=r"relax.matmul: the reduction dims differ: 768 vs 512"):
        op.matmul(x, w)
    # symbolic, but provably different: n vs n + 1
    a = tvar("a", (3, "n"))
    n = a.shape[1]
    with pytest.raises(RelaxError, match=r"relax.matmul: the reduction dims differ: n vs n \+ 1"):
        op.matmul(a, tvar("b", (n + 1, 4)))


def test_matmul_batch_and_dtype_errors():
    with pytest.raises(RelaxError, match=r"relax.matmul.*broadcast"):
        op.matmul(tvar("a", (2, 3, 4)), tvar("b", (3, 4, 5)))
    with pytest.raises(RelaxError, match=r"relax.matmul.*dtypes differ"):
        op.matmul(tvar("a", (3, 4)), tvar("b", (4, 5), "float16"))
    with pytest.raises(RelaxError, match=r"relax.matmul.*at least one dimension"):
        op.matmul(tvar("a", ()), tvar("b", (4, 5)))


def test_matmul_symbolic_reduction_checked_at_run_time():
    # the two reduction dims are different symbolic vars: assumed equal, checked by the kernel.
    # 5 < 6 keeps every load in bounds, so only the op's own check catches the mismatch (else
    # it would silently sum a prefix)
    a, b = rand(3, 5), rand(6, 4)
    with pytest.raises(Exception, match=r"relax.matmul: dimension d0_1 and dimension d1_0"):
        run_op(lambda x, y: op.matmul(x, y), [a, b], symbolic=True, check_interpret=False)
    # and when they do agree the kernel runs
    b = rand(5, 4)
    out, _ = run_op(lambda x, y: op.matmul(x, y), [a, b], symbolic=True)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_matmul_out_dtype():
    a, b = rand(4, 6, dtype="int8"), rand(6, 3, dtype="int8")
    out, si = run_op(lambda x, y: op.matmul(x, y, out_dtype="int32"), [a, b])
    assert si.dtype == "int32" and out.dtype == np.int32
    np.testing.assert_array_equal(out, a.astype(np.int32) @ b.astype(np.int32))


# ---------------------------------------------------------------------------------------------
# linear


@pytest.mark.parametrize("xs,bias", [((4, 6), True), ((2, 3, 6), True), ((6,), False),
                                     ((4, 6), False)])
def test_linear(xs, bias):
    x, w = rand(*xs), rand(5, 6)
    inputs = [x, w] + ([rand(5)] if bias else [])
    out, si = run_op(lambda *a: op.linear(*a), inputs, symbolic=[True, False, False][:len(inputs)])
    ref = x @ w.T + (inputs[2] if bias else 0)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert si.ndim == len(xs)


def test_linear_struct_info_and_errors():
    x = tvar("x", ("n", 768))
    w = tvar("w", (3072, 768))
    b = tvar("b", (3072,))
    assert repr(op.linear(x, w, b).struct_info) == "Tensor((n, 3072), 'float32')"
    with pytest.raises(RelaxError, match=r"relax.linear: the reduction dims differ: 768"):
        op.linear(x, tvar("w2", (3072, 512)))
    with pytest.raises(RelaxError, match=r"relax.linear: bias .* does not broadcast"):
        op.linear(x, w, tvar("b2", (10,)))
    with pytest.raises(RelaxError, match=r"relax.linear: weight must be 2-D"):
        op.linear(x, tvar("w3", (768,)))


# ---------------------------------------------------------------------------------------------
# einsum

EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),              # implicit output
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ijk->", [(2, 3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ii->i", [(4, 4)]),                      # diagonal
    ("ii", [(4, 4)]),                         # trace
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("ij,ij->ij", [(1, 3), (2, 3)]),          # size-1 broadcast
    ("ba,ab", [(2, 3), (3, 2)]),
]


@pytest.mark.parametrize("subscripts,shapes", EINSUM_CASES)
def test_einsum(subscripts, shapes):
    arrays = [rand(*s) for s in shapes]
    out, si = run_op(lambda *a: op.einsum(subscripts, *a), arrays)
    ref = np.einsum(subscripts, *arrays)
    assert si.static_shape() == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_einsum_symbolic_and_tvm_order():
    a, b = rand(2, 3, 4), rand(2, 4, 5)
    out, si = run_op(lambda x, y: op.einsum([x, y], "bij,bjk->bik"), [a, b], symbolic=[True, False])
    np.testing.assert_allclose(out, np.einsum("bij,bjk->bik", a, b), rtol=1e-5, atol=1e-5)
    x = tvar("x", ("b", 4, 8))
    y = tvar("y", ("b", 8, 5))
    assert repr(op.einsum("bij,bjk->bik", x, y).struct_info) == "Tensor((b, 4, 5), 'float32')"


def test_einsum_errors():
    x, y = tvar("x", (3, 4)), tvar("y", (5, 6))
    with pytest.raises(RelaxError, match=r"relax.einsum: label 'j' has size 4 .* 5"):
        op.einsum("ij,jk->ik", x, y)
    with pytest.raises(RelaxError, match=r"relax.einsum: .*name 2 operands but 1"):
        op.einsum("ij,jk->ik", x)
    with pytest.raises(RelaxError, match=r"relax.einsum: operand 0 has 2 dims"):
        op.einsum("ijk->i", x)
    with pytest.raises(RelaxError, match=r"relax.einsum: output label 'z'"):
        op.einsum("ij->z", x)
    with pytest.raises(RelaxError, match=r"relax.einsum: invalid character"):
        op.einsum("i1->i", x)


def test_kernel_buffer_names_do_not_clash_with_argument_names():
    # Relax variables named like the kernels' own stages still give valid PrimFuncs
    from tilecraft import targets
    from tilecraft.relax import BlockBuilder
    x, w = tvar("matmul", (2, 3)), tvar("linear_mm", (4, 3))
    bias, e = tvar("linear", (4,)), tvar("einsum", (2, 3))
    bb = BlockBuilder()
    with bb.function("main", [x, w, bias, e]):
        calls = [op.matmul(x, tvar("b", (3, 4))), op.linear(x, w, bias),
                 op.einsum("ij,kj->ik", e, w)]
        bb.emit_func_output([bb.emit(c.op.legalize(bb, c)) for c in calls])
    for name, func in bb.get().functions.items():
        if name != "main":
            targets.build(func, "llvm")
