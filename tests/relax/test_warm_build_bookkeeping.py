"""The bookkeeping of a warm build made cheaper without changing what it decides:

- the VM code generator's constant pool sorts constants by a sample of their elements and
  compares bytes (it hashed every weight's bytes): equal bytes are one constant, any
  difference (one element outside the sample, a signed zero, a NaN's payload) two;
- ``PrimFuncIndex`` compares a kernel with each one of a small group of the same parameter
  shapes instead of hashing them all: the same representatives as the hashed lookup;
- ``RewriteBuilder.fresh_name`` starts from the last suffix of a hint (it counted from 0):
  the same names;
- ``relax.build`` leaves the objects older than it out of the garbage collector's passes
  (``gc.freeze``) while it runs, and gives the collector back as it found it;
- the numpy folder of ``FoldConstant`` computes into arrays it made and no longer uses
  instead of new ones: the interpreter's bits;
- ``structural_hash`` / ``structural_equal`` dispatch on a value's type once: equal kernels
  hash alike, and kernels that differ in one constant, dtype or reused variable differ.
"""
import hashlib

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, VirtualMachine, const
from tilecraft.relax import block_builder
from tilecraft.relax.build import dedupe_kernels, vm_codegen
from tilecraft.tensorir import IRModule, te
from tilecraft.tensorir.structural import structural_equal, structural_hash

RNG = np.random.default_rng(3411)


def _add(x, y):
    return te.compute(x.shape, lambda *i: x[i] + y[i], "add")


def _chain(weights):
    """x + w0 + w1 + ... as one kernel call per weight."""
    shape = weights[0].shape
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(shape, str(weights[0].dtype)))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for w in weights:
                h = bb.emit_te(_add, h, const(w))
            gv = bb.emit_output(h)
        bb.emit_func_output(gv)
    return bb.get()


def _pool_by_sha1(weights):
    """The pool the code generator made before: one constant per (dtype, shape, SHA-1)."""
    seen, order = {}, []
    for w in weights:
        key = (w.dtype.str, w.shape, hashlib.sha1(np.ascontiguousarray(w).tobytes()).hexdigest())
        if key not in seen:
            seen[key] = len(order)
            order.append(w)
    return order, [seen[(w.dtype.str, w.shape,
                         hashlib.sha1(np.ascontiguousarray(w).tobytes()).hexdigest())]
                   for w in weights]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_constant_pool_stores_equal_bytes_once_and_every_difference_apart(dtype):
    base = (RNG.standard_normal((64, 130)) * 100).astype(dtype)
    off_sample = base.copy()
    off_sample.reshape(-1)[1] += 1          # the sample takes every 130th element: not this one
    weights = [base, base.copy(), off_sample, off_sample.copy(),
               np.asfortranarray(base),    # the same values in another memory order
               RNG.standard_normal((64, 130)).astype(dtype), base]
    if dtype != "int32":
        zero = np.zeros((64, 130), dtype)
        neg = zero.copy()
        neg[5, 7] = -0.0                    # equal as numbers, different bytes
        nan = np.full((64, 130), np.nan, dtype)
        other_nan = nan.copy()
        other_nan.view(np.uint32 if dtype == "float32" else np.uint64)[0, 0] ^= 1  # payload
        weights += [zero, neg, zero.copy(), nan, nan.copy(), other_nan]
    _, constants = vm_codegen(_chain(weights))
    expected, _ = _pool_by_sha1(weights)
    assert len(constants) == len(expected)
    for got, want in zip(constants, expected):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def test_constant_pool_of_empty_and_scalar_constants():
    weights = [np.zeros((0, 3), "float32"), np.zeros((0, 3), "float32")]
    _, constants = vm_codegen(_chain(weights))
    assert len(constants) == 1
    weights = [np.array(1.5, "float32"), np.array(1.5, "float32"), np.array(2.5, "float32")]
    _, constants = vm_codegen(_chain(weights))
    assert [float(c) for c in constants] == [1.5, 2.5]


def _kernel_module():
    """Kernels of a few parameter shapes, several of each equal (other objects, other buffer
    names) and some differing only deep inside (a constant, an operation)."""
    funcs = {}
    for r in range(40):
        n = (16, 32, 48)[r % 3]
        c = float((r // 3) % 4)
        funcs[f"k{r}"] = _func(n=n, c=c, input_name=f"x{r}", reuse=(r % 11 == 5)).with_attr(
            "global_symbol", f"k{r}")
    return IRModule(funcs)


@pytest.mark.parametrize("direct", [0, 2, 4, 100])
def test_prim_func_index_finds_what_hashing_finds(monkeypatch, direct):
    mod = _kernel_module()
    called = list(mod.functions)
    monkeypatch.setattr(block_builder.PrimFuncIndex, "COMPARE_DIRECTLY", -1)   # hash always
    hashed = dedupe_kernels(mod, called)
    monkeypatch.setattr(block_builder.PrimFuncIndex, "COMPARE_DIRECTLY", direct)
    assert dedupe_kernels(mod, called) == hashed
    # and what comparing every pair finds: the first equal kernel
    expected = {}
    for i, name in enumerate(called):
        expected[name] = next(other for other in called[:i + 1]
                              if structural_equal(
                                  mod[other].with_attr("global_symbol", ""),
                                  mod[name].with_attr("global_symbol", "")))
    assert hashed == expected
    assert 3 < len(set(hashed.values())) < len(called)


def _func(n=16, c=1.0, dtype="float32", name="y", reuse=False, input_name="a"):
    a = te.placeholder((n, 4), dtype, input_name)
    k = te.reduce_axis((0, 4), "k")
    b = te.compute((n,), lambda i: te.sum(a[i, k] * te.const(c, dtype), axis=k), name)
    if reuse:   # the same variable read in both places changes the structure
        b = te.compute((n,), lambda i: te.sum(a[i, k] * a[i, k], axis=k), name)
    return te.create_prim_func([a, b])


def test_structural_hash_and_equality_of_kernels():
    f = _func()
    same = [_func(), _func(input_name="b")]    # other objects, other buffer names: equal
    for g in same:
        assert structural_equal(f, g) and structural_hash(f) == structural_hash(g)
    for g in [_func(n=17), _func(c=2.0), _func(dtype="float64"), _func(reuse=True),
              _func(name="z")]:
        assert not structural_equal(f, g)
    nan = [_func(c=float("nan")), _func(c=float("nan"))]
    assert structural_equal(*nan) and structural_hash(nan[0]) == structural_hash(nan[1])
    # arrays: by value, the hash by their first bytes
    a = RNG.standard_normal(5000).astype("float32")
    assert structural_equal(a, a.copy()) and structural_hash(a) == structural_hash(a.copy())
    assert structural_hash(a) == structural_hash(np.asfortranarray(a))
    b = a.copy()
    b[-1] += 1
    assert not structural_equal(a, b)
    assert structural_hash(np.zeros((0, 2), "float32")) == \
        structural_hash(np.zeros((0, 2), "float32"))


def _fresh_name_reference(taken: set, hint: str) -> str:
    """What ``RewriteBuilder.fresh_name`` did before: the least free suffix, counted from 0."""
    hint = hint or "lv"
    name, k = hint, 0
    while name in taken:
        k += 1
        name = f"{hint}{k}"
    taken.add(name)
    return name


def test_fresh_names_are_the_least_free_ones():
    from tilecraft.relax.transform.base import RewriteBuilder
    rng = np.random.default_rng(7)
    bb, taken = RewriteBuilder(), set()
    for _ in range(3000):
        hint = str(rng.choice(["lv", "gv", "", "lv1", "x"]))
        if rng.random() < 0.2:          # a binding kept as it is takes its name too
            name = f"{hint or 'lv'}{int(rng.integers(0, 40))}"
            bb._taken.add(name)
            taken.add(name)
            continue
        assert bb.fresh_name(hint) == _fresh_name_reference(taken, hint)


def test_build_gives_the_garbage_collector_back_as_it_found_it(monkeypatch):
    """Objects older than the build are frozen while it runs, and only then."""
    import gc
    import importlib
    rb = importlib.import_module("tilecraft.relax.build")
    seen = []
    real = rb._build
    monkeypatch.setattr(rb, "_build", lambda *a, **k: seen.append(gc.get_freeze_count()) or
                        real(*a, **k))
    mod = _chain([np.ones((4, 4), "float32")])
    assert gc.isenabled() and gc.get_freeze_count() == 0
    exe = rb.build(mod, "llvm", cache=False, jobs=1)
    assert seen[-1] > 0 and gc.get_freeze_count() == 0 and gc.isenabled()
    vm = VirtualMachine(exe, targets.cpu(0))
    np.testing.assert_array_equal(vm["main"](np.zeros((4, 4), "float32")).numpy(),
                                  np.ones((4, 4), "float32"))
    gc.freeze()                  # the caller's frozen objects stay frozen
    try:
        frozen = gc.get_freeze_count()
        rb.build(mod, "llvm", cache=False, jobs=1)
        # (not unfrozen: a few frozen objects are freed during the build, the rest stay)
        assert seen[-1] == frozen and frozen * 0.9 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
    gc.disable()                 # and a collector turned off stays off
    try:
        rb.build(mod, "llvm", cache=False, jobs=1)
        assert seen[-1] == 0 and not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_numpy_folder_reuses_its_arrays_without_mixing_values(dtype):
    """A value tree whose every node makes a box-sized array (products, sums, quotients, a
    select of two such trees, a cast): the numpy folder's result is the interpreter's, bit
    for bit, with NaN, infinities and signed zeros among the inputs."""
    from tilecraft.relax.transform.fold_numpy_kernel import run_numpy_kernel
    from tilecraft.tensorir.interpret import interpret
    a = te.placeholder((64, 48), dtype, "a")
    b = te.placeholder((48, 64), dtype, "b")

    def f(i, j):
        x, y = a[i, j], b[j, i]
        left = (x * 2.0 + y * 3.0) * (x - y) / (y + 0.5)
        right = (x * x - y * y) * (x + 1.0) + (x / 3.0) * (y - 2.0)
        mixed = te.if_then_else(i % 3 == 1, left, right)
        if dtype == "float32":
            mixed = (mixed.astype("float64") * 1.5).astype("float32")
        return mixed * (left - right) + x

    out_t = te.compute((64, 48), f, "out")
    func = te.create_prim_func([a, b, out_t])
    xa = RNG.standard_normal((64, 48)).astype(dtype)
    xb = RNG.standard_normal((48, 64)).astype(dtype)
    xa.reshape(-1)[:5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    xb.reshape(-1)[3:8] = [-0.0, np.inf, np.nan, 0.0, -np.inf]
    got = np.empty((64, 48), dtype)
    assert run_numpy_kernel(func, [xa, xb], got)
    want = np.empty((64, 48), dtype)
    interpret(func, xa, xb, want)
    assert got.tobytes() == want.tobytes()
