"""relax.build(share=True): DenseNet's pattern (1x1 convolutions over a concatenation that grows
by a few channels a layer) compiles one convolution kernel with its input channels symbolic,
and the outputs are those of the build without sharing (bit for bit) and of numpy."""
import importlib

import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, op
from tilecraft.relax.build import share_shaped_kernels
from tilecraft.tensorir.expr import IntImm

GROWTH, LAYERS, C0, HW = 16, 4, 32, 8


def _dense_block(seed=0):
    """``LAYERS`` layers of ``h = concat(h, relu(conv1x1(h)))``; the weights, for numpy."""
    rng = np.random.default_rng(seed)
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, C0, HW, HW), "float32"))
    weights = []
    with bb.function("main", [x]):
        with bb.dataflow():
            h, c = x, C0
            for _ in range(LAYERS):
                w = (rng.standard_normal((GROWTH, c, 1, 1)) / np.sqrt(c)).astype("float32")
                weights.append(w)
                y = bb.emit(op.nn.relu(bb.emit(op.nn.conv2d(h, relax.const(w)))))
                h = bb.emit(op.concat([h, y], axis=1))
                c += GROWTH
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get(), weights


def _numpy(x, weights):
    h = x
    for w in weights:
        y = np.maximum(np.einsum("oc,nchw->nohw", w[:, :, 0, 0], h), 0)
        h = np.concatenate([h, y], axis=1)
    return h


def _run(exe, x):
    return relax.VirtualMachine(exe, targets.cpu(0))["main"](x).numpy()


def test_shared_convolutions_compute_what_each_layer_does(tmp_path):
    mod, weights = _dense_block()
    x = np.random.default_rng(1).standard_normal((1, C0, HW, HW)).astype("float32")
    own = relax.build(mod, "llvm", cache=str(tmp_path), share=False)
    shared = relax.build(mod, "llvm", cache=str(tmp_path))
    assert shared.build_stats.kernels == own.build_stats.kernels
    assert shared.build_stats.distinct < own.build_stats.distinct
    called = [ins[1] for ins in shared.program["functions"]["main"]["code"]
              if ins[0] == "call_kernel"]
    assert max(called.count(k) for k in set(called)) >= 3     # one kernel, several layers
    got = _run(shared, x)
    np.testing.assert_array_equal(got, _run(own, x))
    np.testing.assert_allclose(got, _numpy(x, weights), rtol=1e-4, atol=1e-4)


def test_share_shaped_kernels_maps_every_member_to_the_shared_kernel():
    mod, _ = _dense_block()
    from tilecraft.relax.build import (_called_kernels, _layout_pipeline, _run_pipeline,
                                       dedupe_kernels, legalize)
    target = targets.Target("llvm")
    mod = legalize(_run_pipeline(mod, _layout_pipeline(None, None, target), target))
    called = _called_kernels(mod)
    aliases = dedupe_kernels(mod, called)
    shared_mod, shared = share_shaped_kernels(mod, aliases, target)
    assert set(shared) == set(aliases)
    assert len(set(shared.values())) < len(set(aliases.values()))
    for name, rep in shared.items():
        if rep != aliases[name]:
            # a member: its representative is the shared kernel, with a symbolic dimension
            assert any(not isinstance(d, IntImm) for b in shared_mod[rep].buffers
                       for d in b.shape)


def test_wrong_shapes_are_refused_by_the_shared_kernel():
    """The shared kernel still checks its arguments: a tensor whose size does not agree with
    the others is a clear error, not a wrong answer."""
    from tilecraft.tensorir import te
    from tilecraft.tensorir.function import IRModule
    from tilecraft.tensorir.generalize import share_kernels

    def shifted_dot(c):
        a = te.placeholder((c, 16), "float32", name="A")
        b = te.placeholder((c + 4, 16), "float32", name="B")
        r = te.reduce_axis((0, c), name="r")
        y = te.compute((16,), lambda j: te.sum(a[r, j] * b[r + 4, j], axis=[r]), name="y")
        return te.create_prim_func([a, b, y]).with_attr("global_symbol", f"dot{c}")

    shared = share_kernels([shifted_dot(c) for c in (8, 16, 24)])[0].func
    module = targets.build(IRModule({"dot8": shared}), "llvm", cache=False)
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(s).astype("float32") for s in ((40, 16), (44, 16)))
    out = targets.array(np.zeros(16, "float32"))            # 40 rows: not a member's size
    module["dot8"](targets.array(a), targets.array(b), out)
    np.testing.assert_allclose(out.numpy(), (a * b[4:]).sum(axis=0), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="expected"):
        module["dot8"](targets.array(a), targets.array(b[:43]), out)


def test_the_loop_structure_answer_is_kept_in_the_cache(tmp_path, monkeypatch):
    """The default schedules' comparison of a family's shared kernel with its first member is
    asked once per cache: a second build reads the answer, and gets the same module."""
    rb = importlib.import_module("tilecraft.relax.build")   # the module, not the function
    from tilecraft.targets.kernel_cache import KernelCache
    mod, _w = _dense_block()
    target = targets.Target("llvm")
    mod = rb.legalize(rb._run_pipeline(mod, rb._layout_pipeline(None, None, target), target))
    aliases = rb.dedupe_kernels(mod, rb._called_kernels(mod))
    plain_mod, plain = rb.share_shaped_kernels(mod, aliases, target)
    store = KernelCache(tmp_path)
    first_mod, first = rb.share_shaped_kernels(mod, aliases, target, cache=store)
    assert store.writes >= 1 and store.hits == 0
    asked = []
    real = rb.default_schedules.apply
    monkeypatch.setattr(rb.default_schedules, "apply",
                        lambda *a, **k: asked.append(1) or real(*a, **k))
    again_mod, again = rb.share_shaped_kernels(mod, aliases, target, cache=store)
    assert not asked and store.hits == store.writes
    assert plain == first == again
    for name in set(plain.values()):
        assert plain_mod[name].script() == first_mod[name].script() == again_mod[name].script()
    # a damaged entry is asked again (and stored again)
    for shard in tmp_path.iterdir():
        for entry in shard.iterdir():
            entry.write_bytes(entry.read_bytes()[:-1])
    monkeypatch.undo()
    _, damaged = rb.share_shaped_kernels(mod, aliases, target, cache=store)
    assert damaged == plain and store.corrupt >= 1
