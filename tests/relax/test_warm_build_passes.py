"""The graph passes of a warm build made cheaper without changing what they make:

- ``FoldConstant`` runs data-movement and elementwise IEEE kernels of any size (the weight
  packing of ``AlterLayout``) in ``tensorir.interpret`` instead of compiling them: the same
  constants, bit for bit, as the compiled path;
- ``BlockBuilder.call_te`` reuses the kernel it made for the same te function on tensors of
  the same shapes, dtypes and names: the same module as making it again;
- the default pipeline folds ``ConvertLayout``'s reshapes and transposes of constants right
  after it (numpy) instead of legalizing them into kernels: the same kernels and outputs (the
  kernels' numbering differs), and onnxruntime's outputs.
"""
import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, Constant, Function, TensorStructInfo, Var, op
from tilecraft.relax import block_builder
from tilecraft.relax.analysis import post_order_visit
from tilecraft.relax.frontend import from_onnx
from tilecraft.relax.transform import (ConvertLayout, FoldConstant, Sequential, get_pipeline)
from tilecraft.relax.transform import fold_constant as fold
from tilecraft.relax.transform import fold_numpy_kernel
from tilecraft.targets import kernel_cache
from tilecraft.tensorir import te
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.structural import structural_hash
from tilecraft.zoo import models

RNG = np.random.default_rng(3406)


def _pipeline_result(mod, monkeypatch, *patches):
    """The default pipeline's module and its constants, with ``patches`` (module, attribute,
    value) applied while it runs."""
    for patch in patches:
        monkeypatch.setattr(*patch)
    try:
        with kernel_cache.use(False):
            out = get_pipeline(target="llvm")(mod)
    finally:
        monkeypatch.undo()
    found = []
    for f in out.functions.values():
        if isinstance(f, Function):
            post_order_visit(f, lambda n: found.append(n.data) if isinstance(n, Constant)
                             else None)
    return out, found


def _assert_same(a, b):
    (mod_a, consts_a), (mod_b, consts_b) = a, b
    assert mod_a.script() == mod_b.script()
    assert len(consts_a) == len(consts_b) > 0
    for x, y in zip(consts_a, consts_b):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


@pytest.fixture(scope="module")
def resnet50():
    return from_onnx(models.ZOO["resnet50"]().onnx_model)


def test_weight_packing_without_compiling_has_the_compiled_bits(resnet50, monkeypatch):
    """ResNet-50's weight packing (NCHW, NHWC, Winograd with its arithmetic, dense with its
    zero rows) run with numpy on strided views, interpreted, and compiled at -O0: the same
    module, the same constants."""
    strided = _pipeline_result(resnet50, monkeypatch)
    interpreted = _pipeline_result(resnet50, monkeypatch,
                                   (fold, "run_numpy_kernel", lambda *a: False))
    compiled = _pipeline_result(resnet50, monkeypatch,
                                (fold, "run_numpy_kernel", lambda *a: False),
                                (fold, "_exact_in_interpreter", lambda func: False))
    _assert_same(strided, compiled)
    _assert_same(interpreted, compiled)


def test_call_te_reuse_makes_the_same_module(resnet50, monkeypatch):
    reused = _pipeline_result(resnet50, monkeypatch)
    remade = _pipeline_result(resnet50, monkeypatch,
                              (block_builder, "_call_te_key", lambda *a: None))
    _assert_same(reused, remade)


@pytest.mark.parametrize("name", ["squeezenet", "densenet121"])
def test_call_te_reuse_makes_the_same_module_on_more_models(name, monkeypatch):
    """SqueezeNet's 1x1 NHWC convolutions carry the prefetch annotation; DenseNet-121 makes
    the most kernels in LegalizeOps (its concatenations, BN multiplies and adds)."""
    mod = from_onnx(models.ZOO[name]().onnx_model)
    reused = _pipeline_result(mod, monkeypatch)
    remade = _pipeline_result(mod, monkeypatch, (block_builder, "_call_te_key", lambda *a: None))
    _assert_same(reused, remade)


def _count_made(monkeypatch):
    made = []
    create = te.create_prim_func
    monkeypatch.setattr(te, "create_prim_func", lambda *a, **k: made.append(1) or create(*a, **k))
    return made


def test_legalize_ops_reuses_kernels_of_equal_shapes(monkeypatch):
    """Operators on differently named tensors of the same shape and dtype get one kernel,
    made once: relu (a closure per call holding the call's attributes), permute_dims (a
    closure holding the permutation), add through ``helpers.call_te``; another permutation
    or dtype is another kernel."""
    from tilecraft.relax.transform import LegalizeOps
    xs = [Var(f"x{i}", TensorStructInfo((4, 6, 8), "float32")) for i in range(3)]
    h = Var("h", TensorStructInfo((4, 6, 8), "float16"))
    bb = BlockBuilder()
    with bb.function("main", xs + [h]):
        with bb.dataflow():
            r = [bb.emit(op.nn.relu(x)) for x in xs]
            t = [bb.emit(op.permute_dims(v, [2, 0, 1])) for v in r]
            t.append(bb.emit(op.permute_dims(r[0], [1, 0, 2])))
            s = [bb.emit(op.add(a, b)) for a, b in ((xs[0], xs[1]), (r[1], r[2]))]
            hr = bb.emit(op.nn.relu(h))
            out = bb.emit_output(relax.Tuple(t + s + [hr]))
        bb.emit_func_output(out)
    mod = bb.get()
    made = _count_made(monkeypatch)
    legal = LegalizeOps()(mod)
    prims = {n for n, f in legal.functions.items() if isinstance(f, PrimFunc)}
    assert len(prims) == 5 == len(made)     # relu, 2 permutations, add, float16 relu
    monkeypatch.undo()
    monkeypatch.setattr(block_builder, "_call_te_key", lambda *a: None)
    remade_mod = LegalizeOps()(mod)
    monkeypatch.undo()
    assert legal.script() == remade_mod.script()
    ins = [RNG.standard_normal((4, 6, 8)).astype("float32") for _ in xs]
    ins.append(RNG.standard_normal((4, 6, 8)).astype("float16"))
    exe = relax.build(legal, "llvm")
    got = _outputs(exe, ins)
    rel = [np.maximum(x, 0) for x in ins[:3]]
    want = [v.transpose(2, 0, 1) for v in rel] + [rel[0].transpose(1, 0, 2)]
    want += [ins[0] + ins[1], rel[1] + rel[2], np.maximum(ins[3], 0)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_call_te_does_not_reuse_a_kernel_named_after_its_input():
    """A te function that names its output after its input's name (``helpers.out_name``
    makes ``T_double_1`` for an input named ``T_double``) is not reused by shapes alone."""
    from tilecraft.relax.op.helpers import out_name

    def double(x):
        return te.compute(x.shape, lambda *i: x[i] * 2.0, out_name("T_double", x))

    a = Var("a", TensorStructInfo((4, 8), "float32"))
    b = Var("T_double", TensorStructInfo((4, 8), "float32"))
    c = Var("c", TensorStructInfo((4, 8), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [a, b, c]):
        with bb.dataflow():
            calls = [bb.call_te(double, v) for v in (a, b, c)]
            out = bb.emit_output(bb.emit(calls[0]))
        bb.emit_func_output(out)
    names = [call.args[0].name_hint for call in calls]
    assert names[0] == names[2] != names[1]
    body = bb.get()[names[1]].script()
    assert "T_double_1" in body


def test_closures_are_keyed_by_what_they_hold():
    def make(scale, held=None):
        def f(x):
            return te.compute(x.shape, lambda *i: x[i] * (scale + len(held or ())), "scaled")
        return f

    c = relax.const(np.ones((4, 8), "float32"))
    key = block_builder._call_te_key
    assert key(make(2.0), (c,), {}) == key(make(2.0), (c,), {})
    assert key(make(2.0), (c,), {}) != key(make(3.0), (c,), {})
    assert key(make(2.0, held=[1, 2]), (c,), {}) == key(make(2.0, held=[1, 2]), (c,), {})
    assert key(make(2.0, held=[1, 2]), (c,), {}) != key(make(2.0, held=[1, 3]), (c,), {})

    def holding(v):
        def f(x):
            return te.compute(x.shape, lambda *i: x[i] + v.data.numpy().item(0), "plus")
        return f
    # a closure holding a Relax expression is not keyed by value (it may read anything of it)
    assert key(holding(c), (c,), {}) is None


def _kernel(fn, *tensors):
    return te.create_prim_func(list(tensors) + [fn(*tensors)])


def test_which_kernels_the_interpreter_runs_exactly():
    a = te.placeholder((64, 96), "float32", "a")
    b = te.placeholder((96, 64), "float32", "b")
    h = te.placeholder((64, 96), "float16", "h")
    exact = [
        _kernel(lambda x: te.compute((96, 64), lambda i, j: x[j, i], "t"), a),
        _kernel(lambda x: te.compute((64, 96), lambda i, j: te.if_then_else(
            i < 60, x[i, j] * 2.0 + 1.0, 0.0), "pad"), a),
        _kernel(lambda x, y: te.compute((64, 96), lambda i, j: x[i, j] / y[j, i], "div"), a, b),
    ]
    k = te.reduce_axis((0, 96), "k")
    inexact = [
        _kernel(lambda x: te.compute((64,), lambda i: te.sum(x[i, k], axis=k), "sum"), a),
        _kernel(lambda x: te.compute((64, 96), lambda i, j: te.exp(x[i, j]), "exp"), a),
        _kernel(lambda x: te.compute((64, 96), lambda i, j: x[i, j] + x[i, j], "h2"), h),
        _kernel(lambda x: te.compute((64, 96), lambda i, j: x[i, j].astype("int32"), "i"), a),
        # an intermediate read by a second loop nest: the interpreter might not vectorize it
        _kernel(lambda x: (lambda y: te.compute((64, 96), lambda i, j: y[i, j] + 1.0, "z"))(
            te.compute((64, 96), lambda i, j: x[i, j] * 2.0, "y")), a),
    ]
    assert all(fold._exact_in_interpreter(f) for f in exact)
    assert not any(fold._exact_in_interpreter(f) for f in inexact)
    # and they give the compiled kernel's bits, on random inputs with zeros and negatives
    for f in exact:
        ins = [RNG.standard_normal([int(d.value) for d in buf.shape]).astype(buf.dtype)
               for buf in f.buffers[:-1]]
        for x in ins:
            x.flat[:2] = (0.0, -0.0)
        shape = [int(d.value) for d in f.buffers[-1].shape]
        got, want = np.empty(shape, "float32"), np.empty(shape, "float32")
        from tilecraft.tensorir.interpret import interpret
        interpret(f, *ins, got)
        targets.build(f, fold._FOLD_TARGET)[f.attr_dict.get("global_symbol", "main")](
            *ins, want)
        assert got.tobytes() == want.tobytes()


def test_call_te_reuses_a_kernel_only_for_the_same_inputs():
    def double(x):
        return te.compute(x.shape, lambda *i: x[i] * 2.0, "double")

    bb = BlockBuilder()
    c1 = relax.const(np.ones((4, 8), "float32"))
    c2 = relax.const(np.zeros((4, 8), "float32"))
    c3 = relax.const(np.zeros((8, 4), "float32"))
    n = Var("n", TensorStructInfo(("n", 8), "float32"))
    with bb.function("main", [n]):
        with bb.dataflow():
            calls = [bb.call_te(double, c) for c in (c1, c2, c3)]
            calls.append(bb.call_te(double, n))
            calls.append(bb.call_te(double, n))
            out = bb.emit_output(bb.emit(calls[0]))
        bb.emit_func_output(out)
    names = [c.args[0].name_hint for c in calls]
    assert names[0] == names[1] != names[2]          # the same shape: one kernel
    assert calls[1].args[1].fields[0] is c2          # ... called on its own argument
    assert names[3] == names[4]                      # symbolic: found again by add_func
    prims = [f for f in bb.get().functions.values() if isinstance(f, PrimFunc)]
    assert len(prims) == 3
    # what cannot stand for itself by value is no key
    assert block_builder._call_te_key(double, (object(),), {}) is None
    assert block_builder._call_te_key(double, (n,), {}) is None
    assert block_builder._call_te_key(double, (c1, 0.0), {}) != \
        block_builder._call_te_key(double, (c1, -0.0), {})
    assert block_builder._call_te_key(double, (c1, 1), {}) != \
        block_builder._call_te_key(double, (c1, True), {})


def _outputs(exe, inputs):
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    out = vm["main"](*inputs)
    return [o.numpy() for o in (out if isinstance(out, tuple) else [out])]


def test_folding_after_convert_layout_changes_no_kernel_or_output(tmp_path):
    """The default pipeline against the same passes without the FoldConstant after
    ConvertLayout: the same kernels (up to their numbering), the same constants and the same
    outputs, bit for bit; and onnxruntime's."""
    z = models.ZOO["squeezenet"]()
    mod = from_onnx(z.onnx_model)
    new = get_pipeline(target="llvm")
    at = [i for i, p in enumerate(new.passes) if isinstance(p, ConvertLayout)][0]
    assert isinstance(new.passes[at + 1], FoldConstant)
    old = Sequential(new.passes[:at + 1] + new.passes[at + 2:])
    with kernel_cache.use(False):
        a, b = new(mod), old(mod)
    hashes = [sorted(structural_hash(f.replace(attrs={})) for f in m.functions.values()
                     if isinstance(f, PrimFunc)) for m in (a, b)]
    assert hashes[0] == hashes[1]
    exe_new = relax.build(mod, "llvm", pipeline=new, cache=str(tmp_path))
    exe_old = relax.build(mod, "llvm", pipeline=old, cache=str(tmp_path))
    inputs = list(z.inputs.values())
    got, want = _outputs(exe_new, inputs), _outputs(exe_old, inputs)
    for x, y in zip(got, want):
        np.testing.assert_array_equal(x, y)
    import onnxruntime as ort
    sess = ort.InferenceSession(z.onnx_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    ref = sess.run(None, z.inputs)
    np.testing.assert_allclose(got[-1], ref[-1], rtol=1e-3, atol=1e-4 * np.abs(ref[-1]).max())


def _compiled(f, ins):
    shape = [int(d.value) for d in f.buffers[-1].shape]
    want = np.empty(shape, f.buffers[-1].dtype)
    targets.build(f, fold._FOLD_TARGET)[f.attr_dict.get("global_symbol", "main")](*ins, want)
    return want


def _packing_kernels():
    from tilecraft.relax.backend.cpu import conv2d_nchw, conv2d_nhwc, dense, winograd
    w = te.placeholder((40, 24, 3, 3), "float32", "w")
    w_hwio = te.placeholder((3, 3, 24, 40), "float32", "w")
    w64 = te.placeholder((64, 24, 3, 3), "float32", "w")
    d = te.placeholder((100, 48), "float32", "d")
    made = [
        (w, conv2d_nchw.pack_conv2d_nchw_weight(w, "OIHW", 8)),
        (w, conv2d_nhwc.pack_conv2d_nhwc_weight(w, "OIHW", 32)),
        (w_hwio, conv2d_nhwc.pack_conv2d_nhwc_weight(w_hwio, "HWIO", 16)),
        (w64, winograd.pack_winograd_weight(w64, "OIHW", 32)),
        (d, dense.pack_dense_weight(d, 64)),                           # zero rows 100..127
        (d, dense.pack_dense_weight(d, 16, transpose=True)),
    ]
    return [te.create_prim_func([src, out]) for src, out in made]


@pytest.mark.parametrize("pieces", [False, True])
@pytest.mark.parametrize("k", range(6))
def test_numpy_kernels_have_the_compiled_bits(k, pieces, monkeypatch):
    """The packing kernels of every family, on random weights with zeros, negative zeros, inf
    and nan: numpy on strided views gives the compiled kernel's bytes, whole and evaluated
    piece by piece (pieces of 64 elements here; the values that read no weight are kept
    across pieces)."""
    if pieces:
        monkeypatch.setattr(fold_numpy_kernel, "_CHUNK_ELEMENTS", 64)
    f = _packing_kernels()[k]
    x = RNG.standard_normal([int(d.value) for d in f.buffers[0].shape]).astype("float32")
    x.flat[:4] = (0.0, -0.0, np.inf, np.nan)
    got = np.empty([int(d.value) for d in f.buffers[-1].shape], "float32")
    assert fold.run_numpy_kernel(f, [x], got)
    assert got.tobytes() == _compiled(f, [x]).tobytes()


def test_numpy_kernels_refuse_what_they_cannot_run_exactly():
    a = te.placeholder((8, 16), "float32", "a")
    h = te.placeholder((8, 16), "float16", "h")
    k = te.reduce_axis((0, 16), "k")
    refused = [
        _kernel(lambda x: te.compute((8,), lambda i: te.sum(x[i, k], axis=k), "sum"), a),
        _kernel(lambda x: te.compute((8, 16), lambda i, j: te.exp(x[i, j]), "exp"), a),
        _kernel(lambda x: te.compute((8, 16), lambda i, j: x[i, j] + x[i, j], "half"), h),
        _kernel(lambda x: te.compute((8, 16), lambda i, j: x[i, j * j % 16], "square"), a),
        _kernel(lambda x: te.compute((8, 16), lambda i, j: te.maximum(x[i, j], 0.0),
                                     "relu"), a),
    ]
    for f in refused:
        ins = [np.ones([int(d.value) for d in b.shape], b.dtype) for b in f.buffers[:-1]]
        out = np.full([int(d.value) for d in f.buffers[-1].shape], 7, f.buffers[-1].dtype)
        assert not fold.run_numpy_kernel(f, ins, out)
        assert (out == 7).all()                 # left alone
    # an index clamped in the box (the Winograd weight of 40 channels in blocks of 32: the
    # interpreter runs it)
    from tilecraft.relax.backend.cpu import winograd
    w = te.placeholder((40, 24, 3, 3), "float32", "w")
    f = te.create_prim_func([w, winograd.pack_winograd_weight(w, "OIHW", 32)])
    assert not fold.run_numpy_kernel(f, [np.ones((40, 24, 3, 3), "float32")],
                                     np.empty((16, 2, 24, 32), "float32"))
    # a read out of its input where the value is used is an error, as in the interpreter
    oob = _kernel(lambda x: te.compute((8, 16), lambda i, j: x[i + 1, j], "shift"), a)
    with pytest.raises(IndexError, match="out of bounds"):
        fold.run_numpy_kernel(oob, [np.ones((8, 16), "float32")], np.empty((8, 16), "float32"))


def test_numpy_kernels_in_pieces_refuse_before_writing(monkeypatch):
    """A refusal met in one piece only (an index clamped in the last channel block) is found
    before any piece is written: ``out`` is left alone."""
    from tilecraft.relax.backend.cpu import winograd
    monkeypatch.setattr(fold_numpy_kernel, "_CHUNK_ELEMENTS", 64)
    w = te.placeholder((40, 24, 3, 3), "float32", "w")
    f = te.create_prim_func([w, winograd.pack_winograd_weight(w, "OIHW", 32)])
    out = np.full((16, 2, 24, 32), 7, "float32")
    assert not fold.run_numpy_kernel(f, [np.ones((40, 24, 3, 3), "float32")], out)
    assert (out == 7).all()
