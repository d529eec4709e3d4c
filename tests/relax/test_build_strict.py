"""``relax.build(..., strict=True)``: a kernel the default schedules cannot schedule is an
error, not a warning and a slow kernel; and the kernels the HF model zoo found unscheduled."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from tilecraft import relax, targets, tensorir
from tilecraft.relax import BlockBuilder, RelaxError, TensorStructInfo, Var
from tilecraft.relax import default_schedules
from tilecraft.relax import op as R


def _scalar_times_column():
    # (n, 1) * a 0-d tensor: a spatial kernel whose innermost loop has extent 1 and which reads
    # a 0-d buffer; the rule for such loops indexed the 0-d read's (missing) last index
    n = tensorir.var("n")
    x = Var("x", TensorStructInfo((n, 1), "float32"))
    s = Var("s", TensorStructInfo((), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x, s]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(R.multiply(x, s)))
        bb.emit_func_output(gv)
    return bb.get()


def test_kernel_reading_a_0d_tensor_is_scheduled():
    mod = _scalar_times_column()
    with warnings.catch_warnings():
        warnings.simplefilter("error", default_schedules.DefaultScheduleWarning)
        exe = relax.build(mod, "llvm", strict=True)
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    x = np.random.default_rng(1).standard_normal((6000, 1)).astype("float32")
    s = np.array(1.5, "float32")
    np.testing.assert_allclose(vm["main"](x, s).numpy(), x * s, rtol=1e-6)


def test_strict_build_raises_where_a_default_schedule_fails(monkeypatch):
    def broken(*args, **kwargs):
        raise IndexError("list index out of range")
    monkeypatch.setattr(default_schedules, "_schedule_spatial", broken)
    mod = _scalar_times_column()
    with pytest.warns(default_schedules.DefaultScheduleWarning, match="left unscheduled"):
        exe = relax.build(mod, "llvm")          # not strict: a warning, a correct slow kernel
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    x = np.ones((3, 1), "float32")
    np.testing.assert_allclose(vm["main"](x, np.array(2.0, "float32")).numpy(), x * 2)
    with pytest.raises(RelaxError, match=r"strict=True\): kernel \S*multiply\S* cannot be "
                                         r"scheduled by the default rules: .*IndexError"):
        relax.build(mod, "llvm", strict=True)
