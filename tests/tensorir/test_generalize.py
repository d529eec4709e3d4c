"""Shared kernels (``tensorir.generalize``): a family of kernels that differ in one moving
dimension, written as one kernel with that dimension symbolic, computes what each member does
(the interpreter is the oracle), on random inputs; a kernel whose output would move is not
shared."""
import numpy as np
import pytest

from tilecraft.tensorir import te
from tilecraft.tensorir.expr import IntImm, Var
from tilecraft.tensorir.generalize import loop_structure, share_kernels
from tilecraft.tensorir.interpret import interpret


def concat(c: int, name: str):
    """DenseNet's concatenation: ``c`` old channels and 4 new ones."""
    a = te.placeholder((c, 8), "float32", name="A")
    b = te.placeholder((4, 8), "float32", name="B")
    out = te.compute((c + 4, 8), lambda i, j: te.if_then_else(i < c, a[i, j], b[i - c, j]),
                     name="out")
    return te.create_prim_func([a, b, out]).with_attr("global_symbol", name)


def shifted_dot(c: int, name: str):
    """A reduction over ``c`` reading a second input of ``c + 4`` rows from row 4."""
    a = te.placeholder((c, 8), "float32", name="A")
    b = te.placeholder((c + 4, 8), "float32", name="B")
    r = te.reduce_axis((0, c), name="r")
    y = te.compute((8,), lambda j: te.sum(a[r, j] * b[r + 4, j], axis=[r]), name="y")
    return te.create_prim_func([a, b, y]).with_attr("global_symbol", name)


def matvec(k: int, name: str, rows: int = 6):
    """A reduction over ``k`` (a 1x1 convolution's input channels)."""
    x = te.placeholder((k,), "float32", name="x")
    w = te.placeholder((rows, k), "float32", name="w")
    r = te.reduce_axis((0, k), name="r")
    y = te.compute((rows,), lambda i: te.sum(w[i, r] * x[r], axis=[r]), name="y")
    return te.create_prim_func([x, w, y]).with_attr("global_symbol", name)


def _run(func, shapes, seed: int):
    """The arrays after running ``func`` on random ones (the output is the last)."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype("float32") for s in shapes]
    interpret(func, *arrays)
    return arrays


def _shapes(func):
    return [[d.value for d in b.shape] for b in func.buffers]


@pytest.mark.parametrize("make,sizes", [(shifted_dot, (8, 12, 16, 20)),
                                        (matvec, (16, 48, 32, 80))])
def test_shared_kernel_computes_each_member(make, sizes):
    funcs = [make(c, f"k{c}") for c in sizes]
    shared = share_kernels(funcs)
    assert len(shared) == 1
    s = shared[0]
    assert s.members == tuple(range(len(sizes))) and s.values == tuple(sizes)
    assert any(d is s.param for b in s.func.buffers for d in b.shape)
    for seed, f in enumerate(funcs):
        want = _run(f, _shapes(f), seed)
        got = _run(s.func, _shapes(f), seed)        # the shared kernel at the member's shapes
        np.testing.assert_array_equal(got[-1], want[-1])


def test_affine_offsets_are_kept():
    """``c + 4`` of the second input moves with ``c``: its shared dim is ``param + 4``."""
    s = share_kernels([shifted_dot(c, f"k{c}") for c in (8, 12, 16)])[0]
    b = s.func.buffers[1]
    assert not isinstance(b.shape[0], IntImm) and b.shape[1].value == 8
    assert "shared_dim + 4" in s.func.script()


def test_a_moving_output_is_not_shared():
    """A concatenation's output grows with its input: the loops a schedule splits and runs in
    parallel would be symbolic, so it is not shared."""
    assert share_kernels([concat(c, f"k{c}") for c in (8, 12, 16, 20)]) == []


def test_too_few_or_unrelated_kernels_are_not_shared():
    assert share_kernels([matvec(8, "a"), matvec(12, "b")]) == []          # two: not a family
    assert share_kernels([matvec(8, "a"), concat(8, "b"), matvec(12, "c")]) == []
    # sizes that are not on one line with the others: the family is the three that are
    shared = share_kernels([matvec(16, "a"), matvec(32, "b", rows=12), matvec(48, "c"),
                            matvec(64, "d")])
    assert [s.members for s in shared] == [(0, 2, 3)]


def test_two_dimensions_moving_independently_are_not_shared():
    funcs = [matvec(16, "a", rows=6), matvec(32, "b", rows=12), matvec(48, "c", rows=6),
             matvec(16, "d", rows=18)]
    assert share_kernels(funcs) == []


def test_symbolic_kernels_are_left_alone():
    n = Var("n", "int64")
    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: x[i] * 2.0, name="y")
    f = te.create_prim_func([x, y])
    assert share_kernels([f, f, f]) == []


def test_loop_structure_ignores_extents_only():
    a, b = matvec(16, "a"), matvec(48, "b")
    assert loop_structure(a) == loop_structure(b)
    assert loop_structure(a) != loop_structure(concat(8, "c"))


def _members(families):
    return [(f.members, f.values, f.func.script()) for f in families]


def test_the_cheap_sort_and_the_early_refusal_find_what_the_full_search_found(monkeypatch):
    """``share_kernels`` first sorts kernels by their parameters' dtypes and ranks and their
    outputs' shapes, and refuses a line whose output moves before making its kernel: the same
    families as hashing every kernel and making every candidate (a mix of families, moving
    outputs, lone kernels and kernels of one skeleton but another output, in shuffled order)."""
    from tilecraft.tensorir import generalize
    funcs = ([matvec(k, f"mv{k}") for k in (16, 24, 32, 40, 48)] +
             [matvec(k, f"mw{k}", rows=8) for k in (16, 24, 32)] +       # another output
             [concat(c, f"cat{c}") for c in (8, 16, 24, 32)] +           # the output moves
             [shifted_dot(c, f"sd{c}") for c in (8, 12, 16, 20)] +
             [matvec(k, f"lone{k}", rows=5) for k in (64,)])
    order = np.random.default_rng(5).permutation(len(funcs))
    funcs = [funcs[i] for i in order]
    fast = share_kernels(funcs)
    assert fast
    monkeypatch.setattr(generalize, "_family_key", lambda f: ())
    monkeypatch.setattr(generalize, "_written_dims", lambda *a: [])
    assert _members(share_kernels(funcs)) == _members(fast)
