"""relax.transform.ToMixedPrecision: what it converts (matmul / dense / convolution inputs to
float16, the sensitive ops kept in float32, the rest following, the signature unchanged, the
constants float16 after FoldConstant), and what the converted models compute: an MLP, a BERT
encoder layer and a ResNet bottleneck on random inputs against their float32 numpy reference,
on the CPU (LLVM, F16C conversions), OpenCL (float16 storage, PoCL) and WebGPU (f16,
lavapipe), with float32 and float16 accumulation; float16 at the VM boundary; the error where
a device cannot run float16; a tuning run over the float16 kernels.

Tolerances: the largest error over the output's largest magnitude. float16 carries 11
significant bits (relative rounding 4.9e-4); a layer rounds its inputs and outputs, so float32
accumulation stays within a few 1e-3 of the float32 model, float16 accumulation (sums of 64-256
products) within about 1e-2.
"""
import capabilities
import numpy as np
import pytest

from tilecraft import relax
from tilecraft import targets
from tilecraft.models import bert_encoder_layer, mlp, resnet_bottleneck
from tilecraft.relax import BlockBuilder, Constant, TensorStructInfo, Var, const, op
from tilecraft.relax.analysis import check_well_formed
from tilecraft.relax.expr import BindingBlock, Call, If, SeqExpr, VarBinding
from tilecraft.relax.op.base import Op
from tilecraft.relax.transform import FoldConstant, FoldConstantCasts, ToMixedPrecision
from tilecraft.relax.transform import to_mixed_precision as tmp_mod

TOL = {"float32": 3e-3, "float16": 1.5e-2}


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def bindings(mod, name="main"):
    body = mod[name].body
    return [b for blk in body.blocks for b in blk.bindings]


def calls_of(mod, op_name):
    return [b.value for b in bindings(mod) if isinstance(b.value, Call) and
            isinstance(b.value.op, Op) and b.value.op.name == op_name]


def rel_err(got, ref):
    return float(np.abs(got.astype("float64") - ref).max() / np.abs(ref).max())


# ------------------------------------------------------------------------------------------
# what the pass does


def attention_block(rng):
    """softmax(x W1 / 8), layer_norm(x + x W2), then relu, a reshape and a matmul: every
    class of operator."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 16, 32), "float32"))
    w1 = const(rng.standard_normal((32, 16)).astype("float32"))
    w2 = const(rng.standard_normal((32, 32)).astype("float32"))
    w3 = const(rng.standard_normal((512, 8)).astype("float32"))
    gamma, beta = const(np.ones(32, "float32")), const(np.zeros(32, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(op.matmul(x, w1))
            s = bb.emit(op.divide(s, const(np.float32(8))))
            p = bb.emit(op.nn.softmax(s, axis=-1))
            v = bb.emit(op.matmul(x, w2))
            a = bb.emit(op.add(x, v))
            h = bb.emit(op.nn.layer_norm(a, gamma, beta, axes=[-1]))
            r = bb.emit(op.nn.relu(h))
            flat = bb.emit(op.reshape(r, (x.struct_info.shape[0], 512)))
            y = bb.emit(op.matmul(flat, w3))
            out = bb.emit_output((y, p))
        bb.emit_func_output(out)
    return bb.get()


def test_matmul_inputs_are_half_sensitive_ops_float32_signature_unchanged():
    mod = attention_block(np.random.default_rng(0))
    new = ToMixedPrecision()(mod)
    check_well_formed(new)
    assert new["main"].struct_info == mod["main"].struct_info   # float32 in, float32 out
    for call in calls_of(new, "relax.matmul"):
        assert call.attr_dict["out_dtype"] == "float32"
        assert [a.struct_info.dtype for a in call.args] == ["float16", "float16"]
    for name in ("relax.nn.softmax", "relax.nn.layer_norm"):
        (call,) = calls_of(new, name)
        assert call.args[0].struct_info.dtype == "float32"
    # relu's result feeds a matmul through a reshape: both run in float16 (exact)
    (relu,) = calls_of(new, "relax.nn.relu")
    (reshape,) = calls_of(new, "relax.reshape")
    assert relu.struct_info.dtype == reshape.struct_info.dtype == "float16"
    # the division after an fp32-accumulating matmul stays float32 (rounded once, later)
    (div,) = calls_of(new, "relax.divide")
    assert div.struct_info.dtype == "float32"
    # the input is converted once, though two matmuls read it
    casts = [c for c in calls_of(new, "relax.astype") if c.args[0] is new["main"].params[0]]
    assert len(casts) == 1
    # the input mod is unchanged (immutable IR)
    assert all(c.attr_dict.get("out_dtype") in (None, "") for c in calls_of(mod, "relax.matmul"))


def test_float16_accumulation_on_request():
    new = ToMixedPrecision(out_dtype="float16")(attention_block(np.random.default_rng(0)))
    check_well_formed(new)
    assert {c.struct_info.dtype for c in calls_of(new, "relax.matmul")} == {"float16"}
    (softmax,) = calls_of(new, "relax.nn.softmax")
    assert softmax.args[0].struct_info.dtype == "float32"


def test_weights_become_float16_constants_at_build_time():
    m = mlp(in_features=16, hidden=(32,), out_features=4)
    folded = FoldConstant()(ToMixedPrecision()(m.mod))
    weights = [a.data for c in calls_of(folded, "relax.matmul") for a in c.args
               if isinstance(a, Constant)]
    assert [w.shape for w in weights] == [(16, 32), (32, 4)]
    assert all(w.dtype == np.float16 for w in weights)
    originals = [a.data for c in calls_of(m.mod, "relax.matmul") for a in c.args
                 if isinstance(a, Constant)]
    for w, w32 in zip(weights, originals):
        np.testing.assert_array_equal(w, w32.astype("float16"))


def test_relax_quantize_fp16_is_mixed_precision_with_float16_weights_now(rng):
    m = mlp(in_features=64, hidden=(128,), out_features=10, seed=4)
    qmod = relax.quantize(m.mod, "fp16")
    check_well_formed(qmod)
    # the weights are float16 constants in the module itself, converted as numpy rounds
    weights = [a for c in calls_of(qmod, "relax.matmul") for a in c.args]
    originals = [a.data for c in calls_of(m.mod, "relax.matmul") for a in c.args
                 if isinstance(a, Constant)]
    half = [a.data for a in weights if isinstance(a, Constant)]
    assert len(half) == 2 and all(w.dtype == np.float16 for w in half)
    for w, w32 in zip(half, originals):
        np.testing.assert_array_equal(w, w32.astype("float16"))
    assert not [c for c in calls_of(qmod, "relax.astype") if isinstance(c.args[0], Constant)]
    assert all(c.attr_dict["out_dtype"] == "float32" for c in calls_of(qmod, "relax.matmul"))
    # the same program as ToMixedPrecision's, its casts folded at build time instead: the
    # same bits out
    x = m.make_inputs(rng, batch=3)[0]
    cpu = targets.cpu(0)
    got = relax.VirtualMachine(relax.build(qmod, "llvm"), cpu)["main"](x).numpy()
    via_build = relax.VirtualMachine(relax.build(ToMixedPrecision()(m.mod), "llvm"),
                                     cpu)["main"](x).numpy()
    np.testing.assert_array_equal(got, via_build)
    assert got.dtype == np.float32 and rel_err(got, m.reference(x)) < TOL["float32"]
    acc16 = relax.quantize(m.mod, "fp16", out_dtype="float16")
    assert {c.struct_info.dtype for c in calls_of(acc16, "relax.matmul")} == {"float16"}
    with pytest.raises(ValueError, match="out_dtype must be 'float32' or 'float16'"):
        relax.quantize(m.mod, "fp16", out_dtype="int8")


def test_fold_constant_casts_only_folds_float_casts_of_constants():
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((4,), "float32"))
    c = const(np.array([1.0, 65520.0, 1e-8, -2.5], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            # folded (65520 -> inf, as numpy); it leaves the block, so it stays bound
            h = bb.emit_output(op.astype(c, "float16"))
            i = bb.emit_output(op.astype(c, "int32"))     # an integer cast: left alone
            xh = bb.emit_output(op.astype(x, "float16"))  # not a constant: left alone
            gv = bb.emit_output((h, i, xh))
        bb.emit_func_output(gv)
    mod = bb.get()
    new = FoldConstantCasts()(mod)
    check_well_formed(new)
    values = [b.value for b in bindings(new)]
    assert isinstance(values[0], Constant)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(values[0].data, c.data.astype("float16"))
    assert np.isinf(values[0].data[1])
    assert isinstance(values[1], Call) and isinstance(values[2], Call)
    assert [b.value for b in bindings(mod)][0].op.name == "relax.astype"   # input unchanged


def test_cpu_kernels_read_float16_weights_packed_at_build_time():
    from tilecraft.tensorir.functor import post_order_visit
    for m, rank, layers in ((mlp(in_features=64, hidden=(128,), out_features=16), 3, 2),
                            (resnet_bottleneck(channels=32, width=8, height=8), 5, 3)):
        mod = relax.get_pipeline(target="llvm")(ToMixedPrecision()(m.mod))
        consts = []
        post_order_visit(mod["main"], lambda n: consts.append(n.data)
                         if isinstance(n, Constant) else None)
        # dense panels [N/NR, K, NR] / convolution blocks [O/R, I, KH, KW, R], all half (the
        # biases, added in the float32 epilogue, stay float32)
        weights = [c for c in consts if c.ndim == rank]
        assert len(weights) == layers and all(w.dtype == np.float16 for w in weights)
        assert all(c.dtype == np.float32 for c in consts if c.ndim != rank)


def test_out_dtype_is_checked():
    with pytest.raises(ValueError, match="out_dtype must be 'float32' or 'float16', got "
                                         "'bfloat16'"):
        ToMixedPrecision(out_dtype="bfloat16")
    with pytest.raises(TypeError, match="IRModule"):
        ToMixedPrecision()("not a module")


def test_the_tables_name_registered_operators_each_once():
    known = set(Op.list_ops())
    tables = [set(tmp_mod.ALWAYS), tmp_mod.EXACT, tmp_mod.FOLLOW, tmp_mod.NEVER]
    for t in tables:
        assert t <= known, sorted(t - known)
    for i, a in enumerate(tables):
        for b in tables[i + 1:]:
            assert not a & b, sorted(a & b)


def test_if_branches_and_other_dtypes_are_left_alone():
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((4, 8), "float32"))
    c = Var("c", TensorStructInfo((), "bool"))
    i = Var("i", TensorStructInfo((4, 8), "int32"))
    with bb.function("main", [x, c, i]):
        with bb.dataflow():
            y = bb.emit(op.matmul(x, const(np.ones((8, 8), "float32"))))
            k = bb.emit(op.matmul(i, const(np.ones((8, 8), "int32"))))
            gv = bb.emit_output(op.add(y, op.astype(k, "float32")))
        bb.emit_func_output(gv)
    func = bb.get()["main"]
    # return relu(gv) if c else gv: the branch computes on float32, as written
    r = Var("r", gv.struct_info)
    branch = SeqExpr([BindingBlock([VarBinding(r, op.nn.relu(gv))])], r)
    body = SeqExpr(list(func.body.blocks), If(c, branch, SeqExpr([], gv)))
    mod = relax.IRModule({"main": func.replace(body=body)})
    new = ToMixedPrecision()(mod)
    check_well_formed(new)
    (int_mm,) = [m for m in calls_of(new, "relax.matmul") if m.struct_info.dtype == "int32"]
    assert "out_dtype" not in int_mm.attr_dict
    (half_mm,) = [m for m in calls_of(new, "relax.matmul") if m.struct_info.dtype == "float32"]
    assert half_mm.args[0].struct_info.dtype == "float16"
    cond = new["main"].body.body
    assert isinstance(cond, If) and cond.true_branch.blocks[0].bindings[0].value.struct_info \
        .dtype == "float32"


# ------------------------------------------------------------------------------------------
# what the converted models compute

MODELS = {
    "mlp": (lambda: mlp(in_features=64, hidden=(128, 128), out_features=10, seed=1),
            {"batch": 3}),
    "bert": (lambda: bert_encoder_layer(hidden=64, heads=2, ffn=128, seed=2),
             {"batch": 2, "seq_len": 12}),
    "resnet": (lambda: resnet_bottleneck(channels=32, width=8, height=8, seed=3),
               {"batch": 2}),
}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    make, sizes = MODELS[request.param]
    return request.param, make(), sizes


@pytest.mark.parametrize("out_dtype", ["float32", "float16"])
def test_models_on_the_cpu_match_float32(model, out_dtype, rng):
    name, m, sizes = model
    exe = relax.build(ToMixedPrecision(out_dtype=out_dtype)(m.mod), "llvm")
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    for scale in (1, 2):
        xs = m.make_inputs(rng, **{k: v * scale for k, v in sizes.items()})
        got = vm["main"](*xs).numpy()
        assert got.dtype == np.float32
        assert rel_err(got, m.reference(*xs)) < TOL[out_dtype], name


def opencl_device():
    """OpenCL device 0 (under CI=true, a missing driver fails the run instead of skipping)."""
    return capabilities.opencl_device()[0]


def gpu_device(kind):
    """The device and the float16 target string of ``kind``, or a skip saying why not."""
    if kind == "opencl":
        return opencl_device(), "opencl"
    from tilecraft.targets.webgpu_backend import runtime
    capabilities.webgpu_device()   # a missing adapter fails under CI=true instead of skipping
    if "shader-f16" not in runtime.adapter_features(0):
        pytest.skip("the WebGPU adapter has no shader-f16")
    runtime.close_device(0)   # reopened asking for shader-f16
    return targets.webgpu(0), "webgpu -supports-float16=1"


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_models_on_the_gpu_back_ends_match_float32(model, kind, rng):
    name, m, sizes = model
    dev, target = gpu_device(kind)
    exe = relax.build(ToMixedPrecision()(m.mod), target)
    vm = relax.VirtualMachine(exe, dev)
    xs = m.make_inputs(rng, **sizes)
    got = vm["main"](*xs).numpy()
    assert rel_err(got, m.reference(*xs)) < TOL["float32"], name


def half_io_module():
    """float16 in, float16 out: y = relu(x @ W) as float16 throughout."""
    w = np.random.default_rng(5).standard_normal((8, 4)).astype("float16")
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 8), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.nn.relu(op.matmul(x, const(w), out_dtype="float32")))
            gv = bb.emit_output(op.astype(y, "float16"))
        bb.emit_func_output(gv)
    return bb.get(), w


@pytest.mark.parametrize("kind", ["llvm", "opencl", "webgpu"])
def test_float16_arrays_in_and_out_of_the_vm(kind, rng):
    mod, w = half_io_module()
    if kind == "llvm":
        dev, target = targets.cpu(0), "llvm"
    else:
        dev, target = gpu_device(kind)
    vm = relax.VirtualMachine(relax.build(mod, target), dev)
    x = rng.standard_normal((5, 8)).astype("float16")
    want = np.maximum(x.astype("float32") @ w.astype("float32"), 0).astype("float16")
    for arg in (x, targets.array(x, dev)):
        out = vm["main"](arg)
        assert out.dtype == "float16" and out.numpy().dtype == np.float16
        np.testing.assert_allclose(out.numpy().astype("float32"), want.astype("float32"),
                                   rtol=2e-3, atol=2e-3)
    with pytest.raises(ValueError, match="float16"):
        vm["main"](x.astype("float32"))


def test_half_where_the_device_cannot_is_a_clear_error(rng):
    m = mlp(in_features=16, hidden=(32,), out_features=4)
    mod16 = ToMixedPrecision()(m.mod)
    with pytest.raises(ValueError, match="shader-f16 feature; build for "
                                         "Target\\('webgpu -supports-float16=1'\\)"):
        relax.build(mod16, "webgpu")
    from tilecraft.targets.opencl_backend.runtime import OpenCLError, context
    dev = opencl_device()
    if "cl_khr_fp16" in context(dev.index).extensions:
        pytest.skip("this OpenCL device has cl_khr_fp16: half arithmetic runs")
    vm = relax.VirtualMachine(relax.build(mod16, "opencl -supports-float16=1"), dev)
    x, = m.make_inputs(rng, batch=2)
    with pytest.raises(OpenCLError, match="needs the cl_khr_fp16 extension"):
        vm["main"](x)


def test_the_tuner_searches_the_float16_kernels(tmp_path, rng):
    from tilecraft.metaschedule import LocalRunner, apply_best
    from test_relax_tune import small_space
    m = mlp(in_features=32, hidden=(64,), out_features=16, seed=4)
    mod16 = ToMixedPrecision()(m.mod)
    runner = LocalRunner(number=2, repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False)
    db = relax.tune(mod16, "llvm", max_trials=4, work_dir=tmp_path, runner=runner,
                    upper_bounds={"batch": 8}, num_trials_per_iter=2, space=small_space(),
                    search={"population_size": 8, "genetic_num_iters": 1}, seed=0,
                    progress=False)
    tasks = relax.extract_tasks(mod16, "llvm", upper_bounds={"batch": 8})
    half_tasks = [t for t in tasks if any(b.dtype == "float16" for b in t.func.buffers)]
    assert half_tasks
    assert any(apply_best(db, t.func, "llvm") is not None for t in half_tasks)
    vm = relax.VirtualMachine(relax.build(mod16, "llvm", database=db,
                                          upper_bounds={"batch": 8}), targets.cpu(0))
    x, = m.make_inputs(rng, batch=8)
    assert rel_err(vm["main"](x).numpy(), m.reference(x)) < TOL["float32"]


# ------------------------------------------------------------------------------------------
# the GPU kernels of a converted model: the float32 model's, no cast kernels of their own


def _launches(exe) -> list[str]:
    """The kernels the program calls, in order (one entry per launch)."""
    return [line.split()[1].strip('"') for line in exe.as_text().splitlines()
            if line.strip().startswith("call_kernel ")]


@pytest.mark.parametrize("out_dtype", ["float32", "float16"])
@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
@pytest.mark.parametrize("name", ["bert", "resnet"])
def test_gpu_kernels_of_a_float16_model_are_the_float32_models(name, kind, out_dtype, rng):
    """The fp16 model launches as many kernels as the fp32 one: the attention fused (one
    kernel reading float16 Q, K, V), no standalone cast (the input's and the layer norm's
    casts read by the GEMMs, the others in their producers); and it matches float32."""
    make, sizes = MODELS[name]
    m = make()
    dev, target = gpu_device(kind)
    exe32 = relax.build(m.mod, target.replace(" -supports-float16=1", ""))
    exe16 = relax.build(relax.quantize(m.mod, "fp16", out_dtype=out_dtype), target)
    k32, k16 = _launches(exe32), _launches(exe16)
    assert len(k16) == len(k32), (k32, k16)
    assert not [k for k in k16 if k.startswith("astype")], k16
    assert len([k for k in k16 if "attention" in k]) == len([k for k in k32 if "attention" in k])
    vm = relax.VirtualMachine(exe16, dev)
    xs = m.make_inputs(rng, **sizes)
    got = vm["main"](*xs).numpy()
    assert rel_err(got, m.reference(*xs)) < TOL[out_dtype], (name, kind, out_dtype)
