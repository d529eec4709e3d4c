"""The launch path shared by the GPU back ends (targets.runtime.host_program): expressions,
argument binding, the compiled host program, deferred kernel-error words — first without a
device (a recording back end), then the same plan code on OpenCL and WebGPU."""
import numpy as np
import pytest

from tilecraft import targets
from tilecraft.targets.runtime.device_module import DeviceFunction
from tilecraft.targets.runtime.host_program import (ERROR_SLOT, DeviceArgumentError, DeviceKernelError,
                                          HostPlan, KernelErrorLog, ParamSpec, compile_expr,
                                          eval_expr)
from tilecraft.tensorir import Schedule, te

from opencl_testutil import opencl_device_and_target
from webgpu_testutil import webgpu_device

RNG = np.random.default_rng(5)


# -- without a device ----------------------------------------------------------------------------

class _Word:
    def __init__(self):
        self.value = 0
        self.size = 1


class _Arr(targets.NDArray):
    """A stand-in device array: what HostPlan.bind looks at."""

    def __init__(self, shape, dtype="float32", kind="opencl"):
        self._device = targets.Device(kind, 0)
        self._shape, self._dtype, self._buffer = tuple(shape), dtype, object()
        self._data, self._ptr = None, 0

    shape = property(lambda self: self._shape)
    dtype = property(lambda self: self._dtype)
    size = property(lambda self: int(np.prod(self._shape)))


class _Recorder:
    """A back end that records launches; kernel "k1" sets its error word to 1 when told."""

    def __init__(self):
        self.launches, self.temps, self.fail = [], 0, set()
        self.reads = 0
        self.errors = KernelErrorLog(self._read, self._clear)

    def _read(self, words):
        self.reads += 1
        return [w.value for w in words]

    @staticmethod
    def _clear(word):
        word.value = 0

    def launcher(self, key):
        def launch(arrays, scalars, grid, sink, memo):
            self.launches.append((key, len(arrays), list(scalars), tuple(grid)))
            if key in self.fail:
                arrays[-1].value = 1
        return launch

    def alloc_temp(self, dtype, size, what):
        self.temps += 1
        return _Word()

    def alloc_error_word(self, key):
        return _Word()


def _plan():
    n = ["var", "n"]
    params = [ParamSpec("A", "buffer", "float32", [n, 4]), ParamSpec("B", "buffer", "float32",
                                                                       [n, 4], written=True)]
    body = ("seq", [
        ("assert", ["ge", n, 0], "n must be non-negative", ("seq", [])),
        ("alloc", 2, "float32", ["mul", n, 4], "T", ("seq", [
            ("launch", "k0", [0, 2], [(n, "i32")], [["floordiv", ["add", n, 63], 64], 1, 1]),
            ("launch", "k1", [2, 1, ERROR_SLOT], [(n, "i32")], [n, 1, 1]),
            ("launch", "k2", [1, ERROR_SLOT], [], [1, 1, 1]),
        ])),
    ])
    kernels = {"k0": {"name": "k0", "error_messages": []},
               "k1": {"name": "k1", "error_messages": ["index of k1 out of bounds"]},
               "k2": {"name": "k2", "error_messages": ["k2 failed"]}}
    return HostPlan("main", params, body, kernels, "opencl")


def test_expressions_match_python_semantics():
    env = {"n": -7, "m": 3}
    for e, want in [(["floordiv", ["var", "n"], 2], -4), (["floormod", ["var", "n"], 2], 1),
                    (["div", ["var", "n"], 2], -3), (["mod", ["var", "n"], 2], -1),
                    (["select", ["lt", ["var", "n"], 0], ["var", "m"], 9], 3),
                    (["max", ["mul", ["var", "m"], 4], ["add", ["var", "n"], 100]], 93),
                    (["not", ["and", 1, ["eq", ["var", "m"], 3]]], 0)]:
        assert compile_expr(e)(env) == want == eval_expr(e, env)
    with pytest.raises(ValueError, match="division by zero"):
        compile_expr(["floordiv", 1, ["var", "m"]])({"m": 0})
    with pytest.raises(ValueError, match="variable q is not bound"):
        compile_expr(["var", "q"])({})


def test_plan_binds_runs_and_caches_temporaries():
    plan, be = _plan(), _Recorder()
    args = (_Arr((100, 4)), _Arr((100, 4)))
    device, arrays, env = plan.bind(args)
    assert env == {"n": 100} and device == targets.Device("opencl", 0)
    plan.run(be, arrays, env, None)
    assert be.launches == [("k0", 2, [100], (2, 1, 1)), ("k1", 3, [100], (100, 1, 1)),
                           ("k2", 2, [], (1, 1, 1))]
    plan.run(be, arrays, dict(env), None)
    assert be.temps == 1                      # the temporary is reused by the next call
    be.errors.check()                         # no word set: nothing raised, one read
    assert be.reads == 1 and not be.errors
    # an empty dimension launches nothing: k1's grid is n = 0
    be.launches.clear()
    _, arrays, env = plan.bind((_Arr((0, 4)), _Arr((0, 4))))
    plan.run(be, arrays, env, None)
    assert [k for k, *_ in be.launches] == ["k2"]


def test_plan_argument_errors():
    plan = _plan()
    with pytest.raises(DeviceArgumentError, match="takes 2 argument"):
        plan.bind((_Arr((3, 4)),))
    with pytest.raises(TypeError, match="takes 2 argument"):   # also a TypeError
        plan.bind(())
    with pytest.raises(ValueError, match="argument B: dimension 0 is 4, expected n = 3"):
        plan.bind((_Arr((3, 4)), _Arr((4, 4))))
    with pytest.raises(ValueError, match="argument A: dimension 1 is 5, expected 4"):
        plan.bind((_Arr((3, 5)), _Arr((3, 4))))
    with pytest.raises(ValueError, match="argument A is in host memory"):
        plan.bind((np.zeros((3, 4), "float32"), _Arr((3, 4))))
    with pytest.raises(ValueError, match="has dtype int32, expected float32"):
        plan.bind((_Arr((3, 4), "int32"), _Arr((3, 4))))
    with pytest.raises(ValueError, match="rank 1"):
        plan.bind((_Arr((3,)), _Arr((3, 4))))
    a = _Arr((3, 4))
    with pytest.raises(ValueError, match="are the same array"):
        plan.bind((a, a))
    with pytest.raises(ValueError, match="must be an array on a opencl device"):
        plan.bind((_Arr((3, 4), kind="webgpu"), _Arr((3, 4))))


def test_kernel_errors_are_read_once_and_the_first_failure_wins():
    plan, be = _plan(), _Recorder()
    be.fail = {"k1", "k2"}
    _, arrays, env = plan.bind((_Arr((8, 4)), _Arr((8, 4))))
    plan.run(be, arrays, env, None)
    plan.run(be, arrays, dict(env), None)     # two calls, one check: words noted once
    assert be.reads == 0
    with pytest.raises(DeviceKernelError, match=r"^main: kernel k1: index of k1 out of bounds$"):
        be.errors.check()
    assert be.reads == 1 and not be.errors
    be.fail = set()
    plan.run(be, arrays, dict(env), None)     # the words were cleared: a good call is clean
    be.errors.check()


def test_bind_cached_skips_checks_only_for_the_same_objects():
    plan, be = _plan(), _Recorder()
    a, b = _Arr((5, 4)), _Arr((5, 4))
    first = plan.bind_cached((a, b))
    again = plan.bind_cached((a, b))
    assert [x is y for x, y in zip(again[1], first[1])] == [True, True]
    assert again[2] == first[2] and again[2] is not first[2]
    assert again[3] is first[3]                # the site's memo
    other = plan.bind_cached((b, a))           # another call site: its own memo
    assert other[3] is not first[3]
    with pytest.raises(ValueError, match="dimension 0 is 6"):
        plan.bind_cached((a, _Arr((6, 4))))
    plan.run(be, first[1], first[2], None, first[3])
    assert len(first[3]) == 3                  # one entry per launch of the program
    # the cache holds no array alive: once the arrays are gone the site is a miss
    import gc
    import weakref
    ref = weakref.ref(a)
    del a, first, again, other
    gc.collect()
    assert ref() is None


# -- the same plan on both back ends ---------------------------------------------------------------

def _opencl():
    return opencl_device_and_target()


def _webgpu():
    return webgpu_device(), "webgpu"


@pytest.fixture(scope="module", params=["opencl", "webgpu"])
def backend(request):
    return _opencl() if request.param == "opencl" else _webgpu()


def _gather_then_scale():
    """Two kernels in one function: G = A[idx] (an in-kernel bounds check), B = G * 2."""
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n,), "float32", "A")
    idx = te.placeholder((m,), "int64", "idx")
    G = te.compute((m,), lambda i: A[idx[i]], "G")
    B = te.compute((m,), lambda i: G[i] * 2.0, "B")
    sch = Schedule(te.create_prim_func([A, idx, B]))
    for name in ("G", "B"):
        bx, tx = sch.split(sch.get_loops(sch.get_block(name))[0], [None, 32])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    return sch.mod


def test_both_back_ends_share_the_plan_and_report_kernel_errors(backend):
    dev, target = backend
    mod = targets.build(_gather_then_scale(), target)
    fn = mod["main"]
    assert isinstance(fn.plan, HostPlan) and fn.plan.has_kernel_checks
    assert len(fn.plan.kernels) == 2
    x = RNG.standard_normal(50).astype("float32")
    for m in (7, 40):
        ind = RNG.integers(-0, 50, m)
        a, i = targets.array(x, dev), targets.array(ind, dev)
        out = targets.empty((m,), "float32", dev)
        fn(a, i, out)
        np.testing.assert_allclose(out.numpy(), x[ind] * 2.0)
    bad = targets.array(np.array([1, 50, 2], "int64"), dev)
    out = targets.empty((3,), "float32", dev)
    with pytest.raises(DeviceKernelError, match=r"main: kernel main_kernel0: .*out of bounds"):
        fn(a, bad, out)
    good = targets.array(np.array([4, 0, 49], "int64"), dev)
    fn(a, good, out)                                    # the error word was cleared
    np.testing.assert_allclose(out.numpy(), x[[4, 0, 49]] * 2.0)


def test_enqueue_defers_the_check_to_sync(backend):
    dev, target = backend
    fn = targets.build(_gather_then_scale(), target)["main"]
    a = targets.array(np.arange(10, dtype="float32"), dev)
    bad = targets.array(np.array([0, 11], "int64"), dev)
    out = targets.empty((2,), "float32", dev)
    fn.enqueue(a, bad, out)              # nothing read back here
    with pytest.raises(DeviceKernelError, match="out of bounds"):
        dev.sync()
    dev.sync()                           # reported once


def test_opencl_function_is_a_device_function():
    dev, target = _opencl()
    fn = targets.build(_gather_then_scale(), target)["main"]
    assert isinstance(fn, DeviceFunction)


def test_freed_buffers_are_reused_and_views_keep_theirs(backend):
    """``targets.empty`` takes the buffer of a freed array of the same byte size (the VM's
    per-call results); a buffer still seen through a view is not given out again, and the
    kernel writing into a reused buffer gives the right answer."""
    import gc
    dev, target = backend
    fn = targets.build(_gather_then_scale(), target)["main"]
    x = RNG.standard_normal(50).astype("float32")
    a = targets.array(x, dev)
    first = targets.empty((24,), "float32", dev)
    buf = first.buffer
    view = first._view((4, 6))
    del first
    gc.collect()
    other = targets.empty((24,), "float32", dev)
    assert other.buffer is not buf                     # the view still holds it
    del view
    gc.collect()
    again = targets.empty((6, 4), "float32", dev)      # same bytes, another shape
    assert again.buffer is buf
    ind = RNG.integers(0, 50, 24)
    fn(a, targets.array(ind, dev), again._view((24,)))
    np.testing.assert_allclose(again.numpy().reshape(-1), x[ind] * 2.0)
