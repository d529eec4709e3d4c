"""The VM's per-shape plans (relax/vm.py ``_Function``): the shape instructions run once per
distinct shape key, the kernels and the checks of a bad input on every call."""
import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, TupleGetItem, Var, const
from tilecraft.relax import vm as vm_module
from tilecraft.relax.build import build
from tilecraft.relax.vm import VirtualMachine, VMArgumentError
from tilecraft.tensorir import te

RNG = np.random.default_rng(11)


def rand(*shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


def dense(x, w):
    k = te.reduce_axis((0, x.shape[1]), "k")
    return te.compute((x.shape[0], w.shape[1]),
                      lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), "dense")


def add(a, b):
    return te.compute(a.shape, lambda *i: a[i] + b[i], "add")


def tanh_rows(a):
    return te.compute(a.shape, lambda i, j: te.tanh(a[i, j]), "tanh_rows")


def chain_module(w1, w2, upper_bounds=None):
    """x (n, 8) -> dense -> tanh -> dense -> + y: intermediates of a symbolic shape."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 8), "float32"))
    y = Var("y", TensorStructInfo(("n", 5), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            h = bb.emit_te(dense, x, const(w1))
            h = bb.emit_te(tanh_rows, h)
            h = bb.emit_te(dense, h, const(w2))
            gv = bb.emit_output(bb.emit_te(add, h, y))
        bb.emit_func_output(gv)
    return bb.get()


def ref(x, y, w1, w2):
    return np.tanh(x @ w1) @ w2 + y


@pytest.fixture(scope="module", params=[None, {"n": 32}], ids=["pool", "bound"])
def chain(request):
    w1, w2 = rand(8, 16), rand(16, 5)
    # no fusion: every operator a kernel call, the middle ones on planned intermediates only
    exe = build(chain_module(w1, w2), "llvm", pipeline=[], upper_bounds=request.param)
    return VirtualMachine(exe, targets.cpu(0)), (w1, w2)


def test_shapes_in_turn_give_the_reference(chain):
    vm, (w1, w2) = chain
    fn = vm["main"]
    # more distinct shapes than plans are kept: the oldest go and come back
    sizes = [1, 3, 7, 3, 1] + list(range(2, 3 + vm_module.MAX_PLANS)) + [7, 1, 40]
    outs = []
    for n in sizes:
        x, y = rand(n, 8), rand(n, 5)
        out = fn(x, y)
        outs.append((out, x, y))
        np.testing.assert_allclose(out.numpy(), ref(x, y, w1, w2), rtol=1e-5, atol=1e-5)
    # a result is the caller's: later calls (same shape included) did not overwrite it
    for out, x, y in outs:
        np.testing.assert_allclose(out.numpy(), ref(x, y, w1, w2), rtol=1e-5, atol=1e-5)
    assert len(fn._plans) <= vm_module.MAX_PLANS


def test_bad_inputs_are_caught_after_the_plan_exists(chain):
    vm, (w1, w2) = chain
    fn = vm["main"]
    x, y = rand(4, 8), rand(4, 5)
    fn(x, y)                                   # the plan of n = 4
    # n bound by x, y of another n: caught by the VM's match or the kernel entry's check
    with pytest.raises(ValueError, match=r"\by\b"):
        fn(x, rand(3, 5))
    with pytest.raises(VMArgumentError, match=r"argument x has dtype float64"):
        fn(x.astype("float64"), y)
    with pytest.raises(VMArgumentError, match=r"argument x has rank 1"):
        fn(rand(32), y)
    with pytest.raises(VMArgumentError, match=r"argument y: dimension 1 is 6, expected 5"):
        fn(x, rand(4, 6))
    with pytest.raises(VMArgumentError, match=r"takes 2 argument"):
        fn(x)
    np.testing.assert_allclose(fn(x, y).numpy(), ref(x, y, w1, w2), rtol=1e-5, atol=1e-5)


def test_plan_and_instruction_by_instruction_agree(chain):
    vm, _ = chain
    fn = vm["main"]
    assert fn._plans is not None and fn._fixed_kernels   # the program is planned
    for n in (2, 9, 2):
        x, y = rand(n, 8), rand(n, 5)
        planned = fn(x, y).numpy()
        each = fn._run_each([targets.array(x), targets.array(y)]).numpy()
        np.testing.assert_array_equal(planned, each)
        # and back to the plan after the unplanned run (its argument words are rewritten)
        np.testing.assert_array_equal(fn(x, y).numpy(), planned)


def test_upper_bound_exceeded_still_runs_and_checks():
    w1, w2 = rand(8, 16), rand(16, 5)
    vm = VirtualMachine(build(chain_module(w1, w2), "llvm", upper_bounds={"n": 4}))
    for n in (4, 9, 2, 9):     # 9 > the bound: storage from the pool, held by the plan
        x, y = rand(n, 8), rand(n, 5)
        np.testing.assert_allclose(vm["main"](x, y).numpy(), ref(x, y, w1, w2), rtol=1e-5,
                                   atol=1e-5)


def _runs(fn):
    """The body steps of ``fn`` that are runs of kernel calls (one sequence-runner call each)."""
    return [step for step in fn._body if type(step) is tuple]


def test_kernel_runs_are_one_native_call(chain):
    vm, (w1, w2) = chain
    fn = vm["main"]
    runs = _runs(fn)
    assert runs, "the chain's middle kernels read only planned intermediates: a run"
    native = vm.exe.kernel_module.call_sequence()
    assert native is not None
    assert all(step[0] is native for step in runs)
    assert sum(step[2] for step in runs) == len(fn._fixed_kernels)
    for n in (5, 1, 5):
        x, y = rand(n, 8), rand(n, 5)
        np.testing.assert_allclose(fn(x, y).numpy(), ref(x, y, w1, w2), rtol=1e-5, atol=1e-5)


def test_library_without_the_sequence_runner_calls_kernels_one_by_one(monkeypatch):
    w1, w2 = rand(8, 16), rand(16, 5)
    exe = build(chain_module(w1, w2), "llvm", pipeline=[])
    monkeypatch.setattr(exe.kernel_module, "call_sequence", lambda: None)   # an older library
    fn = VirtualMachine(exe)["main"]
    runs = _runs(fn)
    assert runs and all(step[0] is not None and step[1] == 0 for step in runs)
    for n in (3, 6, 3):
        x, y = rand(n, 8), rand(n, 5)
        np.testing.assert_allclose(fn(x, y).numpy(), ref(x, y, w1, w2), rtol=1e-5, atol=1e-5)


def _same_length_module():
    """x (n,), y (m,): x + 1 and y + 1 (each reads an argument), then, on planned intermediates
    only (one run), plus_one(x + 1) and a kernel whose entry requires its two inputs to have one
    length (the graph does not know n = m), then the output."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n",), "float32"))
    y = Var("y", TensorStructInfo(("m",), "float32"))

    def plus_one(a):
        return te.compute(a.shape, lambda i: a[i] + 1.0, "plus_one")

    k = te.var("k")
    a, b = te.placeholder((k,), "float32", "A"), te.placeholder((k,), "float32", "B")
    same = te.create_prim_func([a, b, te.compute((k,), lambda i: a[i] * b[i], "C")])
    with bb.function("main", [x, y]):
        with bb.dataflow():
            h1 = bb.emit_te(plus_one, x)
            h2 = bb.emit_te(plus_one, y)
            h3 = bb.emit_te(plus_one, h1)
            h4 = bb.emit(relax.call_tir(bb.add_func(same, "same_length"), [h3, h2],
                                        TensorStructInfo(x.struct_info.shape, "float32")))
            gv = bb.emit_output(bb.emit_te(plus_one, h4))
        bb.emit_func_output(gv)
    return bb.get()


def test_kernel_error_inside_a_run_names_its_kernel():
    exe = build(_same_length_module(), "llvm", pipeline=[])
    fn = VirtualMachine(exe)["main"]
    runs = _runs(fn)
    assert [step[2] for step in runs] == [2]     # plus_one(h1), same_length: one run of two
    x, y = rand(4), rand(4)
    np.testing.assert_allclose(fn(x, y).numpy(), (x + 2) * (y + 1) + 1, rtol=1e-6)
    with pytest.raises(ValueError, match=r"main: kernel same_length: "):
        fn(x, rand(3))
    # the failed call left nothing behind: the next calls give the reference
    for n in (4, 2):
        x, y = rand(n), rand(n)
        np.testing.assert_allclose(fn(x, y).numpy(), (x + 2) * (y + 1) + 1, rtol=1e-6)


def test_items_of_a_planned_tuple_are_planned():
    # a two-output kernel's tuple and its items are the plan's values: the kernels that read
    # the items join the run of planned calls instead of being called one by one
    def split2(a):
        return [te.compute((a.shape[0], 4), lambda i, j: a[i, j], "lo"),
                te.compute((a.shape[0], 4), lambda i, j: a[i, j + 4], "hi")]

    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit_te(tanh_rows, x)
            t = bb.emit_te(split2, h)
            lo, hi = bb.emit(TupleGetItem(t, 0)), bb.emit(TupleGetItem(t, 1))
            gv = bb.emit_output(bb.emit_te(add, bb.emit_te(tanh_rows, lo), hi))
        bb.emit_func_output(gv)
    fn = VirtualMachine(build(bb.get(), "llvm", pipeline=[]))["main"]
    # tanh_rows(x) reads the argument; split2 and tanh_rows(lo) only the plan's values
    assert [step[2] for step in _runs(fn)] == [2]
    for n in (3, 1, 3):
        xs = rand(n, 8)
        h = np.tanh(xs)
        np.testing.assert_allclose(fn(xs).numpy(), np.tanh(h[:, :4]) + h[:, 4:], rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_array_equal(fn._run_each([targets.array(xs)]).numpy(), fn(xs).numpy())


def causal_module():
    """``(x + causal_mask(n)) * 2 + arange(n)`` for ``x`` of shape ``(n, n)``: the mask and the
    positions depend on ``n`` alone (kernels with no tensor input), the rest on ``x``."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", "n"), "float32"))
    n = x.struct_info.shape[0]
    with bb.function("main", [x]):
        with bb.dataflow():
            mask = bb.emit_te(lambda: te.compute(
                (n, n), lambda i, j: te.if_then_else(j <= i, te.const(0.0, "float32"),
                                                     te.const(-1e4, "float32")), "causal"))
            pos = bb.emit_te(lambda: te.compute((n,), lambda i: i.astype("float32"), "pos"))
            rows = bb.emit_te(lambda p: te.compute((n, n), lambda i, j: p[j] * 0.5, "rows"), pos)
            h = bb.emit_te(add, x, mask)
            h = bb.emit_te(lambda a: te.compute(a.shape, lambda i, j: a[i, j] * 2.0, "twice"), h)
            gv = bb.emit_output(bb.emit_te(add, h, rows))
        bb.emit_func_output(gv)
    return bb.get()


@pytest.mark.parametrize("bounds", [None, {"n": 8}], ids=["pool", "bound"])
def test_values_of_the_shapes_alone_run_once_per_plan_switch(bounds):
    exe = build(causal_module(), "llvm", pipeline=[], upper_bounds=bounds)
    vm = VirtualMachine(exe, targets.cpu(0))
    fn = vm["main"]
    # the mask, the positions and the rows of positions: computed when the plan changes
    assert len(fn._shape_kernels) == 3
    for n in (3, 5, 3, 7, 7, 5, 1, 3):
        x = rand(n, n)
        want = (x + np.where(np.tril(np.ones((n, n))) > 0, 0, -1e4)) * 2 + \
            np.arange(n, dtype="float32")[None, :] * 0.5
        np.testing.assert_allclose(vm["main"](x).numpy(), want, rtol=1e-5, atol=1e-3)
    # a profile's calls after the warm-up run do not run them either
    names = {r["name"] for r in vm.profile(rand(4, 4), number=2).rows}
    assert not names & {"causal", "pos", "rows"} and "twice" in names, names
