"""relax.build with the kernel cache, parallel compilation and kernel deduplication: the
executable is the same whatever the cache and the number of jobs; exe.build_stats."""
import os

import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, op
from tilecraft.relax.frontend import from_onnx
from tilecraft.targets import parallel
from tilecraft.zoo import models

# SqueezeNet and the MLP build in seconds; the other light models take a minute each on two
# cores, three times over here
FAST = {"squeezenet", "mlp"}
ZOO = ["mlp", "squeezenet", "resnet50", "inception_v1", "densenet121", "shufflenet"]


def _outputs(exe, inputs):
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    out = vm["main"](*inputs)
    return [o.numpy() for o in (out if isinstance(out, tuple) else [out])]


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in FAST else [pytest.mark.slow])
                                  for n in ZOO])
def test_the_cache_never_changes_results(name, tmp_path):
    """The zoo built without a cache, into an empty one (in parallel) and from it: the same
    kernels (object code) and the same outputs, bit for bit."""
    z = models.ZOO[name]()
    mod = from_onnx(z.onnx_model)
    inputs = list(z.inputs.values())
    plain = relax.build(mod, "llvm", upper_bounds=z.upper_bounds, cache=False, jobs=1)
    cold = relax.build(mod, "llvm", upper_bounds=z.upper_bounds, cache=str(tmp_path), jobs=2)
    warm = relax.build(mod, "llvm", upper_bounds=z.upper_bounds, cache=str(tmp_path), jobs=2)
    st = warm.build_stats
    assert st.cache_hits == st.distinct == len(warm.kernel_names) and st.compiled == 0
    assert cold.build_stats.compiled == cold.build_stats.distinct
    assert plain.build_stats.cache_dir is None and plain.build_stats.cache_hits == 0
    assert plain.program == cold.program == warm.program
    objects = plain.kernel_module.objects()
    assert cold.kernel_module.objects() == objects and warm.kernel_module.objects() == objects
    expected = _outputs(plain, inputs)
    for exe in (cold, warm):
        for got, want in zip(_outputs(exe, inputs), expected):
            np.testing.assert_array_equal(got, want)
    # and the outputs are right (onnxruntime)
    import onnxruntime as ort
    sess = ort.InferenceSession(z.onnx_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    ref = sess.run(None, z.inputs)
    scale = np.abs(ref[-1]).max()
    np.testing.assert_allclose(expected[-1], ref[-1], rtol=1e-3, atol=1e-4 * scale)


def _two_blocks(seed=0):
    """The same dense + relu block twice (different names everywhere): two call sites of
    structurally equal kernels after fusion, and a third kernel of another shape."""
    rng = np.random.default_rng(seed)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((4, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(2):
                w = relax.const(rng.standard_normal((32, 32)).astype("float32"))
                h = bb.emit(op.nn.relu(bb.emit(op.matmul(h, w))))
            w3 = relax.const(rng.standard_normal((32, 8)).astype("float32"))
            out = bb.emit_output(bb.emit(op.matmul(h, w3)))
        bb.emit_func_output(out)
    return bb.get()


def test_structurally_equal_kernels_are_compiled_once(tmp_path):
    mod = _two_blocks()
    exe = relax.build(mod, "llvm", cache=str(tmp_path))
    st = exe.build_stats
    assert st.kernels > st.distinct == len(exe.kernel_names) == st.compiled
    assert exe.stats()["main"]["kernel_calls"] == st.kernels
    called = [ins[1] for ins in exe.program["functions"]["main"]["code"]
              if ins[0] == "call_kernel"]
    assert len(called) == st.kernels and set(called) == set(exe.kernel_names)
    x = np.random.default_rng(1).standard_normal((4, 32)).astype("float32")
    ref = relax.VirtualMachine(relax.build(mod, "llvm", pipeline=[], cache=False),
                               targets.cpu(0))["main"](x).numpy()
    got = relax.VirtualMachine(exe, targets.cpu(0))["main"](x).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_build_stats_and_verbose(capsys, tmp_path):
    mod = _two_blocks()
    exe = relax.build(mod, "llvm", cache=str(tmp_path), verbose=True)
    printed = capsys.readouterr().out
    st = exe.build_stats
    assert printed.strip() == st.summary()
    for phase in ("graph passes", "memory planning", "kernel deduplication",
                  "VM code generation", "compile kernels", "link and load"):
        assert phase in st.phases and phase in printed
    assert st.total == pytest.approx(sum(st.phases.values()))
    assert set(st.kernel_phases) >= {"schedule", "lower", "codegen", "llvm_optimize",
                                     "llvm_emit"}
    data = st.as_dict()
    assert data["distinct"] == st.distinct and data["cache_dir"] == str(tmp_path)
    loaded_path = str(tmp_path / "exe.tcx")
    exe.export_library(loaded_path)
    assert relax.load_executable(loaded_path).build_stats is None


def test_cache_off_reaches_the_graph_passes(tmp_path, monkeypatch):
    """cache=False also keeps FoldConstant's kernels out of the default cache."""
    monkeypatch.setenv(targets.kernel_cache.ENV_DIR, str(tmp_path))
    monkeypatch.delenv(targets.kernel_cache.ENV_SWITCH, raising=False)
    z = models.light("squeezenet")
    relax.build(from_onnx(z.onnx_model), "llvm", cache=False)
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs]


@pytest.mark.skipif(not parallel.can_fork(), reason="forked workers need Linux")
def test_jobs_do_not_change_the_executable(tmp_path):
    mod = _two_blocks(seed=3)
    one = relax.build(mod, "llvm", jobs=1, cache=False)
    three = relax.build(mod, "llvm", jobs=3, cache=False)
    assert one.program == three.program
    assert one.kernel_module.objects() == three.kernel_module.objects()
    with pytest.raises(ValueError, match="jobs must be a positive integer"):
        relax.build(mod, "llvm", jobs=0)


@pytest.mark.parametrize("name", ["mlp", "squeezenet"])
def test_folded_constants_do_not_depend_on_the_llvm_opt_level(name, monkeypatch):
    """FoldConstant compiles its kernels at -O0 (fast to build, run once): the constants are
    the same bits as with -O3."""
    import importlib
    import tilecraft.relax.transform.fold_constant as fold
    from tilecraft.relax.analysis import post_order_visit
    from tilecraft.relax.expr import Constant
    build_module = importlib.import_module("tilecraft.relax.build")
    mod = from_onnx(models.ZOO[name]().onnx_model)

    def constants(target):
        monkeypatch.setattr(fold, "_FOLD_TARGET", target)
        monkeypatch.setattr(fold, "_BUILD_CACHE", {})
        with targets.kernel_cache.use(False):
            out = build_module._run_pipeline(mod, None, targets.Target("llvm"))
        found = []
        for f in out.functions.values():
            if isinstance(f, relax.Function):
                post_order_visit(f, lambda n: found.append(n.data)
                                 if isinstance(n, Constant) else None)
        return found

    assert fold._FOLD_TARGET == "llvm -opt-level=0"
    fast, slow = constants("llvm -opt-level=0"), constants("llvm")
    assert len(fast) == len(slow) > 0
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
