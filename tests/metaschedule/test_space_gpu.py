"""GPU design spaces built and run on the CI's software drivers (PoCL for OpenCL, lavapipe for
WebGPU) against numpy, symbolic rows included; skipped with the reason when a driver is
missing (under CI=true: failed)."""
import numpy as np
import pytest

from tilecraft import metaschedule as ms
from tilecraft import targets
from capabilities import gpu_device
from space_workloads import WORKLOADS, inputs_of, symbolic_matmul


def device(kind):
    return gpu_device(kind)[0]


def sample(space, design, func, target, seed):
    """A sample with its unroll depth set to 0: software drivers compile unrolled shaders
    slowly (the unroll postprocessor has CPU tests)."""
    sch = space.sample(design, func, target, seed)
    if sch is None:
        return None
    trace = sch.trace.without_postproc()
    for n, inst in enumerate(trace.instructions):
        if inst.kind == "sample_categorical" and inst.inputs[0][:2] == [0, 16]:
            trace = trace.with_decision(n, 0)
    return space.finish(trace, func, target)


def run_on(dev, lib, inputs, out_shape, *scalars):
    arrays = [targets.array(np.ascontiguousarray(x), dev) for x in inputs]
    out = targets.empty(out_shape, "float32", dev)
    lib["main"](*arrays, out, *scalars)
    return out.numpy()


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
@pytest.mark.parametrize("workload", ["gemm_small", "softmax", "row_sum"])
def test_gpu_samples_run_correctly(kind, workload):
    dev = device(kind)
    target = targets.Target(kind)
    space = ms.default_space(target)
    func = WORKLOADS[workload][0]()
    ins = inputs_of(workload)
    expected = WORKLOADS[workload][2](*ins)
    ran = 0
    # one sample per design (software drivers compile a shader in seconds, the interpreter
    # tests of test_space_rules.py check many more samples)
    for n, design in enumerate(space.generate(func, target)):
        sch = sample(space, design, func, target, seed=n + 1)
        if sch is None:
            continue
        lib = targets.build(sch.mod, target)
        got = run_on(dev, lib, ins, expected.shape)
        np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4)
        ran += 1
    assert ran >= 1, space.last_rejection


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_gpu_symbolic_rows(kind):
    dev = device(kind)
    target = targets.Target(kind)
    space = ms.default_space(target)
    f = symbolic_matmul(N=16, K=8)
    [design] = space.generate(f, target, shape_hints={"n": 64})
    sch = sample(space, design, f, target, seed=3)
    assert sch is not None, space.last_rejection
    lib = targets.build(sch.mod, target)
    rng = np.random.default_rng(0)
    for n in (1, 7, 64, 100):
        a = rng.uniform(-1, 1, (n, 8)).astype("float32")
        b = rng.uniform(-1, 1, (8, 16)).astype("float32")
        np.testing.assert_allclose(run_on(dev, lib, [a, b], (n, 16)), a @ b,
                                   rtol=2e-4, atol=2e-4)
