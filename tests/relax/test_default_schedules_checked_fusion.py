"""Default CPU schedules on fused kernels that carry run-time shape checks (concat / squeeze of
symbolic dims, sliced and fed to ``where``, as the torch and ONNX frontends produce): the
producer is inlined under its ``AssertStmt`` and the kernel is scheduled (it used to fail with
``NameError: Evaluate`` and stay unscheduled), results match numpy, the check still fires."""
import warnings

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.relax import BlockBuilder, op
from tilecraft.relax import default_schedules as ds
from tilecraft.relax.build import build, default_pipeline, schedule_kernels
from tilecraft.relax.expr import Var
from tilecraft.relax.struct_info import TensorStructInfo
from tilecraft.relax.vm import VirtualMachine
from tilecraft.targets import Target
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.stmt import AssertStmt, Block


def _module(kind):
    bb = BlockBuilder()
    if kind == "concat":
        x = Var("x", TensorStructInfo(("n", 3), "float32"))
        y = Var("y", TensorStructInfo(("k", 2), "float32"))
        z = Var("z", TensorStructInfo(("n", 4), "float32"))
        params = [x, y, z]
    else:
        x = Var("x", TensorStructInfo(("n", "one", 4), "float32"))
        z = Var("z", TensorStructInfo(("n", 4), "float32"))
        params = [x, z]
    with bb.function("main", params):
        with bb.dataflow():
            if kind == "concat":
                cat = bb.emit(op.concat([x, y], 1))                   # asserts n == k
                v = bb.emit(op.strided_slice(cat, [1], [1], [5]))     # (n, 4)
            else:
                v = bb.emit(op.squeeze(x, [1]))                      # asserts one == 1
            c = bb.emit(op.greater(z, v))
            gv = bb.emit_output(bb.emit(op.where(c, v, z)))
        bb.emit_func_output(gv)
    return bb.get()


def _ref(kind, x, *rest):
    z = rest[-1]
    v = np.concatenate([x, rest[0]], 1)[:, 1:5] if kind == "concat" else x[:, 0]
    return np.where(z > v, v, z)


@pytest.mark.parametrize("kind", ["concat", "squeeze"])
def test_fused_checked_kernel_is_scheduled_and_correct(kind):
    target = Target("llvm")
    fused = default_pipeline(target)(_module(kind))
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # "default schedule of ... failed"
        kernels = schedule_kernels(fused, target)
        exe = build(_module(kind), target)
    (where,) = [f for name, f in kernels.items() if "where" in name]
    # the producers were inlined under their checks: one block left, the asserts kept
    blocks, asserts = [], []
    post_order_visit(where.body, lambda n: blocks.append(n) if isinstance(n, Block) else
                     asserts.append(n) if isinstance(n, AssertStmt) else None)
    assert [b.name for b in blocks if b.name != "root"] == ["T_where"], where.script()
    assert any("relax." + kind in a.message for a in asserts), where.script()
    if kind == "concat":      # (the squeeze reads x through a symbolic reshape: stays scalar)
        assert ds.is_scheduled(where), where.script()
    vm = VirtualMachine(exe, targets.cpu(0))
    rng = np.random.default_rng(11)
    for n in (1, 7, 40):
        if kind == "concat":
            ins = [rng.standard_normal(s).astype("float32") for s in ((n, 3), (n, 2), (n, 4))]
        else:
            ins = [rng.standard_normal(s).astype("float32") for s in ((n, 1, 4), (n, 4))]
        np.testing.assert_array_equal(vm["main"](*ins).numpy(), _ref(kind, *ins))
    bad = ([rng.standard_normal(s).astype("float32") for s in ((5, 3), (4, 2), (5, 4))]
           if kind == "concat" else
           [rng.standard_normal(s).astype("float32") for s in ((5, 2, 4), (5, 4))])
    with pytest.raises(Exception, match="dimension"):
        vm["main"](*bad)
