"""The Relax VM: relax.build + VirtualMachine on small modules, checked against numpy."""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft import targets
from tilecraft.relax import (BlockBuilder, ExternFunc, If, PrimValue, RelaxError, SeqExpr, ShapeExpr,
                   ShapeStructInfo, TensorStructInfo, TupleStructInfo, Var, const)
from tilecraft.relax.build import build
from tilecraft.relax.expr import Call, Function, GlobalVar, Tuple, TupleGetItem
from tilecraft.relax.op.base import OpPattern, register_op
from tilecraft.relax.vm import ProfileReport, VirtualMachine, VMArgumentError
from tilecraft.tensorir import te
from tilecraft.tensorir.function import IRModule

RNG = np.random.default_rng(7)


def rand(*shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


# -- te kernels (no Relax operators needed) ------------------------------------------------------

def dense(x, w):
    k = te.reduce_axis((0, x.shape[1]), "k")
    return te.compute((x.shape[0], w.shape[1]),
                      lambda i, j: te.sum(x[i, k] * w[k, j], axis=k), "dense")


def bias_relu(x, b):
    return te.compute(x.shape, lambda i, j: te.max(x[i, j] + b[j], 0.0), "bias_relu")


def add(a, b):
    return te.compute(a.shape, lambda *i: a[i] + b[i], "add")


def scale(a, s):
    return te.compute(a.shape, lambda *i: a[i] * s, "scale")


def split_signs(a):
    pos = te.compute(a.shape, lambda *i: te.max(a[i], 0.0), "pos")
    neg = te.compute(a.shape, lambda *i: te.min(a[i], 0.0), "neg")
    return [pos, neg]


def mlp_module(w1, b1, w2, batch="n"):
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((batch, w1.shape[0]), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit_te(dense, x, const(w1))
            h = bb.emit_te(bias_relu, h, const(b1))
            o = bb.emit_te(dense, h, const(w2))
            gv = bb.emit_output(o)
        bb.emit_func_output(gv)
    return bb.get()


def mlp_ref(x, w1, b1, w2):
    return np.maximum(x @ w1 + b1, 0) @ w2


@pytest.fixture(scope="module")
def mlp():
    w1, b1, w2 = rand(64, 96), rand(96), rand(96, 40)
    exe = build(mlp_module(w1, b1, w2), "llvm")
    return exe, VirtualMachine(exe, targets.cpu(0)), (w1, b1, w2)


def test_mlp_symbolic_batch_one_build(mlp):
    exe, vm, (w1, b1, w2) = mlp
    assert exe.kernel_module is not None and len(exe.kernel_names) >= 2  # one library
    for n in (1, 7, 64):
        x = rand(n, 64)
        out = vm["main"](x)
        assert isinstance(out, targets.NDArray) and out.shape == (n, 40)
        np.testing.assert_allclose(out.numpy(), mlp_ref(x, w1, b1, w2), rtol=1e-4, atol=1e-4)
    # NDArray inputs work too, and a result is not overwritten by the next call
    x1, x2 = rand(3, 64), rand(3, 64)
    o1 = vm["main"](targets.array(x1))
    o2 = vm["main"](x2)
    np.testing.assert_allclose(o1.numpy(), mlp_ref(x1, w1, b1, w2), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(o2.numpy(), mlp_ref(x2, w1, b1, w2), rtol=1e-4, atol=1e-4)


def test_argument_errors_name_function_argument_dim(mlp):
    _, vm, (w1, b1, w2) = mlp
    with pytest.raises(VMArgumentError, match=r"main takes 1 argument\(s\) \(x\), got 2"):
        vm["main"](rand(2, 64), rand(2, 64))
    with pytest.raises(TypeError):        # a wrong count is also a TypeError
        vm["main"]()
    with pytest.raises(ValueError, match=r"main: argument x: dimension 1 is 65, expected 64"):
        vm["main"](rand(2, 65))
    with pytest.raises(ValueError, match=r"main: argument x has rank 3 .*expected rank 2"):
        vm["main"](rand(2, 64, 1))
    with pytest.raises(ValueError, match=r"main: argument x has dtype float64, expected float32"):
        vm["main"](rand(2, 64, dtype="float64"))
    with pytest.raises(ValueError, match=r"main: argument x must be a tensor"):
        vm["main"]([[1.0] * 64])
    # the VM is still usable
    x = rand(5, 64)
    np.testing.assert_allclose(vm["main"](x).numpy(), mlp_ref(x, w1, b1, w2), rtol=1e-4,
                               atol=1e-4)


def test_symbolic_dims_shared_between_arguments():
    bb = BlockBuilder()
    n = te.var("n")
    x = Var("x", TensorStructInfo((n, 8), "float32"))
    y = Var("y", TensorStructInfo((n, 8), "float32"))
    z = Var("z", TensorStructInfo(("m",), "float32"))
    with bb.function("main", [x, y, z]):
        s = bb.emit_te(add, x, y)
        bb.emit_func_output(Tuple([s, z]))
    vm = VirtualMachine(build(bb.get(), "llvm"))
    a, b, c = rand(4, 8), rand(4, 8), rand(3)
    s, zz = vm["main"](a, b, c)
    np.testing.assert_allclose(s.numpy(), a + b, rtol=1e-6)
    np.testing.assert_array_equal(zz.numpy(), c)
    with pytest.raises(ValueError, match=r"main: argument y: dimension 0 is 5, expected n = 4"):
        vm["main"](a, rand(5, 8), c)
    np.testing.assert_allclose(vm["main"](b, a, c)[0].numpy(), a + b, rtol=1e-6)


def test_tuple_output_and_tuple_get_item():
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((3, 5), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit_te(split_signs, x)
            neg = bb.emit(TupleGetItem(t, 1))
            doubled = bb.emit_te(add, neg, neg)
            gv = bb.emit_output(Tuple([TupleGetItem(t, 0), doubled]))
        bb.emit_func_output(gv)
    vm = VirtualMachine(build(bb.get(), "llvm"))
    a = rand(3, 5)
    pos, dneg = vm["main"](a)
    np.testing.assert_array_equal(pos.numpy(), np.maximum(a, 0))
    np.testing.assert_array_equal(dneg.numpy(), 2 * np.minimum(a, 0))


def test_constants_and_constant_output():
    c = rand(4, 4)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((4, 4), "float32"))
    with bb.function("main", [x]):
        y = bb.emit_te(add, x, const(c))
        bb.emit_func_output(Tuple([y, const(c)]))
    exe = build(bb.get(), "llvm")
    assert len(exe.constants) == 1  # the same constant once
    vm = VirtualMachine(exe)
    a = rand(4, 4)
    y, cc = vm["main"](a)
    np.testing.assert_allclose(y.numpy(), a + c, rtol=1e-6)
    np.testing.assert_array_equal(cc.numpy(), c)


def test_match_cast_binds_and_checks():
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(None, "float32", ndim=2))   # rank known, shape not
    with bb.function("main", [x]):
        xs = bb.match_cast(x, TensorStructInfo(("n", 4), "float32"))
        y = bb.emit_te(scale, xs, 3.0)
        bb.emit_func_output(y)
    vm = VirtualMachine(build(bb.get(), "llvm"))
    a = rand(6, 4)
    np.testing.assert_allclose(vm["main"](a).numpy(), 3 * a, rtol=1e-6)
    with pytest.raises(ValueError, match=r"main: match_cast lv: dimension 1 is 5, expected 4"):
        vm["main"](rand(6, 5))
    with pytest.raises(ValueError, match=r"main: argument x has rank 1"):
        vm["main"](rand(4))
    np.testing.assert_allclose(vm["main"](a[:2]).numpy(), 3 * a[:2], rtol=1e-6)


def _shape_func_module():
    """main(x) -> (shape_of(x), x * 2, ShapeExpr((n * 2, 3)), PrimValue(n + 1))"""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 3), "float32"))
    n = x.struct_info.shape[0]
    with bb.function("main", [x]):
        s = bb.emit(Call(ExternFunc("vm.builtin.shape_of"), [x],
                         struct_info=ShapeStructInfo(ndim=2)))
        y = bb.emit_te(scale, x, 2.0)
        bb.emit_func_output(Tuple([s, y, ShapeExpr((n * 2, 3)), PrimValue(n + 1)]))
    return bb.get()


def test_builtins_shapes_and_prim_values():
    vm = VirtualMachine(build(_shape_func_module(), "llvm"))
    a = rand(5, 3)
    shape, y, s2, p = vm["main"](a)
    assert shape == (5, 3) and s2 == (10, 3) and p == 6
    np.testing.assert_allclose(y.numpy(), 2 * a, rtol=1e-6)


def test_shape_of_operator_is_a_builtin():
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", "m"), "float32"))
    with bb.function("main", [x]):
        s = bb.emit(relax.op.shape_of(x))
        bb.emit_func_output(s)
    vm = VirtualMachine(build(bb.get(), "llvm"))
    assert vm["main"](rand(2, 9)) == (2, 9)


def test_if_with_scalar_condition_and_call_between_functions():
    bb = BlockBuilder()
    a = Var("a", TensorStructInfo(("n",), "float32"))
    with bb.function("double", [a]):
        bb.emit_func_output(bb.emit_te(add, a, a))
    mod = bb.get()
    x = Var("x", TensorStructInfo(("n",), "float32"))
    cond = Var("cond", TensorStructInfo((), "bool"))
    sinfo = TensorStructInfo(x.struct_info.shape, "float32")
    double = GlobalVar("double", mod["double"].struct_info)
    t = Var("t", sinfo)
    e = Var("e", sinfo)
    from tilecraft.relax.expr import BindingBlock, VarBinding
    body_if = If(cond,
                 SeqExpr([BindingBlock([VarBinding(t, Call(double, [x]))])], t),
                 SeqExpr([BindingBlock([VarBinding(e, x)])], e))
    r = Var("r", sinfo)
    main = Function([x, cond], SeqExpr([BindingBlock([VarBinding(r, body_if)])], r),
                    attrs={"global_symbol": "main"})
    funcs = dict(mod.functions)
    funcs["main"] = main
    vm = VirtualMachine(build(IRModule(funcs), "llvm"))
    v = rand(6)
    np.testing.assert_allclose(vm["main"](v, np.array(True)).numpy(), 2 * v, rtol=1e-6)
    np.testing.assert_array_equal(vm["main"](v, np.array(False)).numpy(), v)
    np.testing.assert_allclose(vm["double"](v).numpy(), 2 * v, rtol=1e-6)
    with pytest.raises(ValueError, match=r"main: argument cond has rank 1"):
        vm["main"](v, np.array([True, False]))


def test_profile_and_time_evaluator(mlp):
    exe, vm, _ = mlp
    x = rand(16, 64)
    report = vm.profile(x, number=2)
    assert isinstance(report, ProfileReport)
    names = [r["name"] for r in report.rows]
    calls = {r["name"]: r["calls"] for r in report.rows}
    kernels = set(exe.kernel_names)
    assert kernels <= set(names) and "(vm)" in names
    assert sum(calls[k] for k in kernels) == 2 * exe.stats()["main"]["kernel_calls"]
    assert abs(sum(r["percent"] for r in report.rows) - 100.0) < 1.0
    text = str(report)
    assert "calls" in text and "total ms" in text and "percent" in text
    for k in kernels:
        assert k in text
    t = vm.time_evaluator("main", targets.cpu(0), number=3, repeat=2)(x)
    assert len(t.results) == 2 and t.mean > 0


def test_operator_based_mlp_and_fusion():
    w1, b1, w2 = rand(32, 48), rand(48), rand(48, 10)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("batch", 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, const(w1)))
            h = bb.emit(relax.op.add(h, const(b1)))
            h = bb.emit(relax.op.nn.relu(h))
            o = bb.emit(relax.op.matmul(h, const(w2)))
            o = bb.emit(relax.op.nn.softmax(o, axis=-1))
            gv = bb.emit_output(o)
        bb.emit_func_output(gv)
    exe = build(bb.get(), "llvm")
    vm = VirtualMachine(exe)
    for n in (1, 9):
        a = rand(n, 32)
        logits = np.maximum(a @ w1 + b1, 0) @ w2
        ref = np.exp(logits - logits.max(-1, keepdims=True))
        ref /= ref.sum(-1, keepdims=True)
        np.testing.assert_allclose(vm["main"](a).numpy(), ref, rtol=1e-4, atol=1e-5)


def test_unlegalizable_operator_is_named():
    def infer(call):
        return call.args[0].struct_info
    register_op("test_vm.no_kernel", infer, None, OpPattern.OPAQUE)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((4,), "float32"))
    with bb.function("main", [x]):
        y = bb.emit(relax.op.call("test_vm.no_kernel", [x]))
        bb.emit_func_output(y)
    with pytest.raises(RelaxError, match=r"operator test_vm.no_kernel has no legalization and "
                                         r"is not a VM builtin"):
        build(bb.get(), "llvm")


def test_unbound_symbolic_var_is_a_build_error():
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n",), "float32"))
    with bb.function("main", [x]):
        m = te.var("m")
        bb.emit_func_output(ShapeExpr((m,)))
    with pytest.raises(RelaxError, match=r"symbolic variable m .*used before it is defined"):
        build(bb.get(), "llvm")


def test_kernel_error_names_function_and_kernel():
    # two symbolic dims assumed equal by the graph; the kernel's entry checks them at run time
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n",), "float32"))
    y = Var("y", TensorStructInfo(("m",), "float32"))
    with bb.function("main", [x, y]):
        y2 = bb.match_cast(y, TensorStructInfo(("m",), "float32"))
        ph = te.placeholder((te.var("k"),), "float32", "A")
        s = bb.emit(relax.call_tir(bb.add_func(te.create_prim_func(
            [ph, te.compute(ph.shape, lambda i: ph[i] + 1.0, "B")]), "plus_one"),
            [y2], TensorStructInfo(x.struct_info.shape, "float32")))
        bb.emit_func_output(s)
    vm = VirtualMachine(build(bb.get(), "llvm"))
    np.testing.assert_allclose(vm["main"](rand(3), np.ones(3, "float32")).numpy(), 2.0)
    with pytest.raises(ValueError, match=r"main: kernel plus_one: .*"):
        vm["main"](rand(3), np.ones(4, "float32"))
    np.testing.assert_allclose(vm["main"](rand(2), np.ones(2, "float32")).numpy(), 2.0)


def test_vm_rejects_other_devices_and_non_executables(mlp):
    exe, _, _ = mlp
    with pytest.raises(TypeError):
        VirtualMachine(object())
    with pytest.raises(ValueError, match="run on the CPU"):
        VirtualMachine(exe, targets.Device("opencl", 0))
    with pytest.raises(KeyError, match="no function 'nope'"):
        VirtualMachine(exe)["nope"]
