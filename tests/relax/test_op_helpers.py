"""relax.op.helpers: the one call_te (run-time checks and scalar parameters), axis normalization.

``call_te`` replaced two versions that differed: the broadcasting operators' put each check in a
statement of its own ahead of the loop nests and could not take scalar parameters; the
manipulation operators' wrapped the nests in the checks and could. The merged one wraps (so
``split_host_device`` keeps a check on the host: on a GPU a failed broadcast check raises before
any launch, with no one-thread check kernel and no error word read back) and takes scalars; it
keeps a repeated check once.
"""
import capabilities
import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, RelaxError, TensorStructInfo, Var, op
from tilecraft.relax.op.helpers import call_te, dim_checks, normalize_axis
from tilecraft.tensorir import te, var
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.stmt import AssertStmt, For, SeqStmt

RNG = np.random.default_rng(5)


def _rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def _add_exp(a, b):
    s = te.compute(a.shape, lambda i: a[i] + b[i], "s")
    return te.compute(a.shape, lambda i: te.exp(s[i]), "e")


def test_checks_enclose_the_loop_nests_once_each():
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n",), "float32"))
    y = Var("y", TensorStructInfo(("m",), "float32"))
    n, m = x.shape[0], y.shape[0]
    pairs = [(n, m), (n, m)]        # the same assumption twice, as two operands may give it
    call = call_te(bb, _add_exp, x, y, checks=dim_checks("relax.test", pairs) + [None],
                   primfunc_name_hint="add_exp")
    func = bb.get()[call.args[0].name_hint]
    body = func.body.block.body
    assert isinstance(body, AssertStmt) and "relax.test: dimension n and dimension m" in body.message
    assert isinstance(body.body, SeqStmt) and all(isinstance(s, For) for s in body.body.seq)

    # inlining the first nest (as the default schedules do after FuseTIR) keeps the check
    sch = Schedule(func)
    sch.compute_inline(sch.get_block("s"))
    f = targets.build(sch.func, "llvm")[call.args[0].name_hint]
    a, b, out = _rand(6), _rand(6), np.zeros(6, "float32")
    f(a, b, out)
    np.testing.assert_allclose(out, np.exp(a + b), rtol=1e-6)
    with pytest.raises(Exception, match=r"relax\.test: dimension n and dimension m must be equal"):
        f(a, _rand(5), out)


def test_scalars_become_kernel_parameters():
    # k is used by the body only: no buffer shape binds it, so it is passed as a scalar
    k = var("k")
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n",), "float32"))
    call = call_te(bb, lambda a: te.compute(a.shape, lambda i: a[i] * k.astype("float32"), "T"),
                   x, scalars=[k], checks=[(k > 0, "relax.test: k must be positive")],
                   primfunc_name_hint="scale")
    assert [v.name for v in call.args[2].values] == ["k"]
    f = targets.build(bb.get()[call.args[0].name_hint], "llvm")[call.args[0].name_hint]
    a, out = _rand(5), np.zeros(5, "float32")
    f(a, out, 3)
    np.testing.assert_allclose(out, a * 3, rtol=1e-6)
    with pytest.raises(Exception, match="k must be positive"):
        f(a, out, 0)


def test_broadcast_check_is_a_host_check_on_opencl():
    # a missing OpenCL driver fails under CI=true instead of skipping
    cpu_driver = capabilities.opencl_device()[1] == "opencl -device=cpu"
    from tilecraft.targets.runtime.host_program import DeviceKernelError
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 4), "float32"))
    y = Var("y", TensorStructInfo(("m", 4), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            gv = bb.emit_output(op.add(x, y))
        bb.emit_func_output(gv)
    exe = relax.build(bb.get(), "opencl -device=cpu" if cpu_driver else "opencl")
    # one kernel: the assumption n == m is checked by the host before the launch, not by a
    # kernel of its own
    assert exe.kernel_module.get_source().count("__kernel") == 1
    vm = relax.VirtualMachine(exe, targets.opencl(0))
    a, b = _rand(3, 4), _rand(3, 4)
    np.testing.assert_allclose(vm["main"](a, b).numpy(), a + b, rtol=1e-6)
    with pytest.raises(ValueError, match=r"relax\.add: dimension n and dimension m must be "
                                         r"equal") as info:
        vm["main"](a, _rand(5, 4))
    assert not isinstance(info.value, DeviceKernelError)


def test_normalize_axis():
    assert normalize_axis("relax.test", -1, 3) == 2
    assert normalize_axis("relax.test", np.int64(1), 3) == 1      # numpy integers
    assert normalize_axis("relax.test", 5, -1) == 5                # unknown rank
    x = Var("x", TensorStructInfo((2, 3), "float32"))
    with pytest.raises(RelaxError, match=r"relax\.test: axis 2 is out of range for a tensor of "
                                         r"rank 2 \(valid: \[-2, 2\)\)") as info:
        normalize_axis("relax.test", 2, 2, node=x)
    assert info.value.node is x
    with pytest.raises(RelaxError, match="start_dim must be an int"):
        normalize_axis("relax.test", 1.0, 2, "start_dim")
    with pytest.raises(RelaxError, match="needs a tensor of known rank"):
        normalize_axis("relax.test", -1, -1)
