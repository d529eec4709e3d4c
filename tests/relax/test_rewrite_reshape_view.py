"""RewriteReshapeView: a reshape kernel no fusion took becomes ``vm.builtin.reshape`` (a view of
its input, no copy kernel); fused reshapes stay in their kernels; results match numpy at several
symbolic sizes on the CPU and on OpenCL, including where memory planning could otherwise reuse
the viewed storage too early."""
import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Tuple, Var, op
from tilecraft.relax.analysis import get_var2val
from tilecraft.relax.expr import ExternFunc
from tilecraft.relax.transform import RewriteReshapeView, get_pipeline
from tilecraft.relax.transform.rewrite_reshape_view import RESHAPE_BUILTIN
from tilecraft.relax.vm import VirtualMachine
from tilecraft.tensorir import te

from capabilities import opencl_device


def _module(body, shapes):
    bb = BlockBuilder()
    vs = [Var(f"x{i}", TensorStructInfo(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", vs):
        with bb.dataflow():
            outs = body(bb, *vs)
            gv = bb.emit_output(Tuple(outs))
        bb.emit_func_output(gv)
    return bb.get()


def _calls(mod):
    """(kernels called, builtins called) by ``main`` after the default CPU pipeline."""
    built = get_pipeline(target="llvm", check=True)(mod)
    kernels, builtins = [], []
    for v in get_var2val(built["main"]).values():
        if getattr(getattr(v, "op", None), "name", None) == "relax.call_tir":
            kernels.append(v.args[0].name_hint)
        elif isinstance(getattr(v, "op", None), ExternFunc):
            builtins.append(v.op.global_symbol)
    return kernels, builtins


def _dense_reshape_dense(bb, x, w1, w2):
    """(n, 8, 64) @ w1 -> view (n * 8, 64) -> @ w2, and the input viewed as (n, 512)."""
    n = x.struct_info.shape[0]
    y = bb.emit(op.matmul(x, w1))
    z = bb.emit(op.reshape(y, (n * 8, 64)))
    # a kernel of its own between the view and its use: its output must not take y's storage
    t = bb.emit(op.exp(x))
    u = bb.emit(op.matmul(z, w2))
    flat = bb.emit(op.reshape(x, (n, 512)))
    return [u, flat, t]


def _reference(x, w1, w2):
    n = x.shape[0]
    return [(x @ w1).reshape(n * 8, 64) @ w2, x.reshape(n, 512), np.exp(x)]


def _shapes():
    n = te.var("n")
    return [(n, 8, 64), (64, 64), (64, 32)]


def test_unfused_reshapes_become_views():
    mod = _module(_dense_reshape_dense, _shapes())
    kernels, builtins = _calls(mod)
    assert not [k for k in kernels if "reshape" in k], kernels
    assert builtins.count(RESHAPE_BUILTIN) == 2


def test_fused_reshape_stays_in_its_kernel():
    def body(bb, x):
        n = x.struct_info.shape[0]
        y = bb.emit(op.exp(x))
        z = bb.emit(op.reshape(y, (n * 8, 64)))
        return [bb.emit(op.permute_dims(z, (1, 0)))]
    kernels, builtins = _calls(_module(body, [(te.var("n"), 8, 64)]))
    assert len(kernels) == 1 and "reshape" in kernels[0] and RESHAPE_BUILTIN not in builtins


def test_squeeze_with_a_runtime_check_keeps_its_kernel():
    n, m = te.var("n"), te.var("m")

    def body(bb, x):
        return [bb.emit(op.squeeze(x, 1))]
    mod = _module(body, [(n, m, 4)])
    kernels, builtins = _calls(mod)
    assert RESHAPE_BUILTIN not in builtins and len(kernels) == 1
    exe = relax.build(mod, "llvm")
    vm = VirtualMachine(exe, targets.cpu(0))
    with pytest.raises(Exception, match="must be 1"):
        vm["main"](np.zeros((3, 2, 4), "float32"))


def test_pass_alone_leaves_other_calls():
    mod = get_pipeline(target="llvm")(_module(_dense_reshape_dense, _shapes()))
    again = RewriteReshapeView()(mod)
    assert str(get_var2val(again["main"])) == str(get_var2val(mod["main"]))


def _run(target, dev):
    rng = np.random.default_rng(0)
    exe = relax.build(_module(_dense_reshape_dense, _shapes()), target)
    vm = VirtualMachine(exe, dev)
    w1 = rng.standard_normal((64, 64)).astype("float32")
    w2 = rng.standard_normal((64, 32)).astype("float32")
    for n in (1, 3, 5):
        x = rng.standard_normal((n, 8, 64)).astype("float32")
        outs = vm["main"](targets.array(x, dev), targets.array(w1, dev), targets.array(w2, dev))
        for got, want in zip(outs, _reference(x, w1, w2)):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def test_views_compute_the_reshapes_cpu():
    _run("llvm", targets.cpu(0))


def test_views_compute_the_reshapes_opencl():
    dev, target = opencl_device()
    _run(target, dev)
