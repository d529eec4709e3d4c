"""When the WebGPU runtime submits: every ``submit_every`` recorded commands during a VM call
(so the GPU starts on the first kernels while the host records the rest) and at its end; and
``timing_kernels``, which times each dispatch on the GPU."""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft.models import mlp
from tilecraft.relax.vm import VirtualMachine
from tilecraft.targets.webgpu_backend import runtime
from webgpu_testutil import webgpu_device


@pytest.fixture(scope="module")
def dev():
    return webgpu_device()


@pytest.mark.parametrize("every", [1, 2, 1000])
def test_a_vm_call_submits_every_n_commands_and_computes_the_same(dev, monkeypatch, every):
    model = mlp(in_features=24, hidden=(40, 32, 16), out_features=8, seed=3)
    vm = VirtualMachine(relax.build(model.mod, "webgpu"), dev)
    x, = model.make_inputs(np.random.default_rng(5), batch=6)
    vm["main"](x)                            # pipelines and bind groups made
    ctx = runtime.context(dev.index)
    monkeypatch.setattr(ctx, "submit_every", every)
    sizes = []
    flush = ctx.flush

    def counting_flush():
        sizes.append(len(ctx.batch))
        flush()
    monkeypatch.setattr(ctx, "flush", counting_flush)
    y = vm["main"](x).numpy()
    np.testing.assert_allclose(y, model.reference(x), rtol=1e-4, atol=1e-4)
    recorded = [n for n in sizes if n]
    assert sum(recorded) >= 4                # one dispatch per layer at least
    assert all(n <= every for n in recorded[:-1])
    if every >= sum(recorded):
        assert len(recorded) == 1            # one submission, at the end of the call
    else:
        assert len(recorded) >= sum(recorded) // every


def test_the_environment_variable_sets_it(monkeypatch):
    monkeypatch.setenv("TILECRAFT_WEBGPU_SUBMIT_EVERY", "7")
    assert runtime.submit_every() == 7
    monkeypatch.setenv("TILECRAFT_WEBGPU_SUBMIT_EVERY", "0")
    with pytest.raises(ValueError, match="TILECRAFT_WEBGPU_SUBMIT_EVERY must be a positive"):
        runtime.submit_every()
    monkeypatch.delenv("TILECRAFT_WEBGPU_SUBMIT_EVERY")
    assert runtime.submit_every() == runtime.SUBMIT_EVERY


def test_timing_kernels_gives_each_kernel_its_gpu_time(dev):
    """``timing_kernels``: every dispatch of a VM call timed on the GPU, by kernel name; the
    outputs unchanged."""
    ctx = runtime.context(dev.index)
    if not ctx.has_timestamps:
        pytest.skip(f"{ctx.name} has no timestamp-query feature")
    model = mlp(in_features=24, hidden=(40, 32), out_features=8, seed=4)
    exe = relax.build(model.mod, "webgpu")
    vm = VirtualMachine(exe, dev)
    x, = model.make_inputs(np.random.default_rng(6), batch=5)
    with ctx.timing_kernels() as times:
        y = vm["main"](x).numpy()
        y2 = vm["main"](x).numpy()
    np.testing.assert_allclose(y, model.reference(x), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(y, y2)
    names = {k["name"] for k in exe.kernel_module.kernels}
    assert times and set(times) <= names
    for calls, seconds in times.values():
        assert calls % 2 == 0 and calls >= 2 and seconds > 0
    assert ctx.kernel_times is None          # off again: later calls are not timed
