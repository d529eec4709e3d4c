"""The VM's per-shape plans (relax/vm.py ``_Function``): the shape instructions run once per
distinct shape key, the kernels and the checks of a bad input on every call."""
import numpy as np
import pytest

from tilecraft import targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const
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
