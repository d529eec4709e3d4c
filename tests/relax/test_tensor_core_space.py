"""The tuner's space of the tensor-core fp16 GEMM (``relax.tensor_core_space``, issue 31): the
tile and the options as knobs of a ``metaschedule.KnobSpace``, tried first on a target with
tensor cores. The seed is the untuned kernel; sampled and mutated points run correctly
(float16 GEMMs against numpy, the emulated tensor cores on PoCL); combinations over a target's
threads or shared memory are rejected naming why; a stored trace replays without the space
(``Schedule.apply_template``); ``relax.tune`` of an fp16 MLP with a symbolic batch runs end to
end and its build matches numpy."""
import numpy as np
import pytest

from gpu_testutil import emitted_module, tensor_core_device
from tilecraft import relax, targets
from tilecraft.metaschedule import KnobSpace, LocalRunner, TuneError, knob_values
from tilecraft.relax import const, gpu_schedules, op
from tilecraft.relax.backend.gpu import tensor_core as tc
from tilecraft.relax.gpu_space import GemmKnobs, gpu_space
from tilecraft.relax.op import nn
from tilecraft.relax.tensor_core_space import TC_KNOBS, TensorCoreKnobs, tile_list
from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.schedule import Schedule, ScheduleError, Trace
from tilecraft.tensorir.structural import structural_equal, structural_hash

TARGET = Target("opencl -device=nvidia-emulated")
RNG = np.random.default_rng(31)


@pytest.fixture(scope="module")
def dev():
    return tensor_core_device(False)


def _dense(rows, K, N):
    """``A (rows, K) @ W (K, N)`` in float16, accumulated in float32, plus a bias."""
    A = te.placeholder((rows, K), "float16", "A")
    W = te.placeholder((K, N), "float16", "W")
    bias = te.placeholder((N,), "float32", "bias")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((rows, N), lambda i, j: te.sum(
        A[i, k].astype("float32") * W[k, j].astype("float32"), axis=k), "C")
    D = te.compute((rows, N), lambda i, j: C[i, j] + bias[j], "D")
    return te.create_prim_func([A, W, bias, D])


def _batch_matmul(b, m, K, N):
    A = te.placeholder((b, m, K), "float16", "A")
    B = te.placeholder((b, K, N), "float16", "B")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((b, m, N), lambda z, i, j: te.sum(
        A[z, i, k].astype("float32") * B[z, k, j].astype("float32"), axis=k), "C")
    return te.create_prim_func([A, B, C])


# (kernel, its inputs, numpy reference)
KERNELS = {
    "dense": (lambda: _dense(96, 64, 128),
              lambda: [RNG.standard_normal((96, 64)).astype(np.float16),
                       RNG.standard_normal((64, 128)).astype(np.float16),
                       RNG.standard_normal(128).astype(np.float32)],
              lambda a, w, bias: a @ w + bias),
    "batch_matmul": (lambda: _batch_matmul(2, 40, 32, 64),
                     lambda: [RNG.standard_normal((2, 40, 32)).astype(np.float16),
                              RNG.standard_normal((2, 32, 64)).astype(np.float16)],
                     lambda a, b: a @ b),
}


def _check(got, ref, tol=2e-3):
    err = np.abs(got.astype(np.float64) - ref).max() / (np.abs(ref).max() + 1e-30)
    assert err < tol, f"relative error {err}"


def _run(dev, name, func):
    _, inputs, ref = KERNELS[name]
    args = inputs()
    mod = targets.build(func, TARGET)
    shape = tuple(int(d.value) for d in func.buffers[-1].shape)
    out = targets.empty(shape, "float32", dev)
    mod[mod.entry_name](*[targets.array(a, dev) for a in args], out)
    _check(out.numpy(), ref(*[a.astype(np.float64) for a in args]))


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_knobs_and_the_seed_is_the_untuned_kernel(name):
    func = KERNELS[name][0]()
    space = gpu_space(TARGET)
    assert isinstance(space.rule, TensorCoreKnobs) and isinstance(space.fallback.rule, GemmKnobs)
    knobs = space.knobs_of(func, TARGET)
    assert [k.name for k in knobs] == [k for k in TC_KNOBS if k != "small_tile"]
    tiles = tile_list()
    by_name = {k.name: k for k in knobs}
    assert len(by_name["tile"].candidates) > 1
    assert all(tc.tile_problem(tiles[i], tc.match_fp16_gemm(func), TARGET) is None
               for i in by_name["tile"].candidates)
    assert by_name["stages"].candidates == (1, 2, 3)
    seed, = space.seeds(func, TARGET)
    untuned = gpu_schedules.apply(func, TARGET)
    assert structural_equal(seed.func, untuned)
    assert untuned.attr_dict["tensor_core_tiles"] == str(tiles[by_name["tile"].default])
    assert knob_values(seed.trace, knobs) == {k.name: k.default for k in knobs}
    # the stored trace replays without the space
    stored = Trace.from_json(seed.trace.to_json())
    assert structural_equal(stored.apply(func).func, untuned)


def test_symbolic_rows_tune_the_tile_of_the_hinted_range():
    """A symbolic row count: ``tile`` (at or above TC_SMALL_ROWS rows) or ``small_tile``
    (below) is searched, the other fixed, as the shape hint says; the seed is the untuned
    pair of kernels."""
    n = te.var("n")
    func = _dense(n, 64, 768)
    for hint, searched in ((64, "small_tile"), (1024, "tile")):
        space = gpu_space(TARGET)
        knobs = {k.name: k for k in space.knobs_of(func, TARGET, {"n": hint})}
        fixed = "tile" if searched == "small_tile" else "small_tile"
        assert len(knobs[searched].candidates) > 1 and len(knobs[fixed].candidates) == 1
        seed, = space.seeds(func, TARGET, {"n": hint})
        assert structural_equal(seed.func, gpu_schedules.apply(func, TARGET))
        assert "below 512 rows" in seed.func.attr_dict["tensor_core_tiles"]


def _conv3x3(C, O, size):
    """A 3 x 3 convolution (pad 1) of a symbolic batch ``n`` in NCHW: its columns symbolic."""
    n = te.var("n")
    x = te.placeholder((n, C, size + 2, size + 2), "float16", "x")
    w = te.placeholder((O, C, 3, 3), "float16", "w")
    c = te.reduce_axis((0, C), "c")
    r = te.reduce_axis((0, 3), "r")
    q = te.reduce_axis((0, 3), "q")
    y = te.compute((n, O, size, size), lambda b, o, h, v: te.sum(
        w[o, c, r, q].astype("float32") * x[b, c, h + r, v + q].astype("float32"),
        axis=[c, r, q]), "conv")
    return te.create_prim_func([x, w, y])


def test_symbolic_columns_tune_the_tile_of_the_hinted_batch(dev):
    """A convolution's symbolic batch (its columns): the few-columns kernel's tile is
    ``small_tile``, searched where the hinted batch runs it (batch 1), ``tile`` at batch 16;
    the seed is the untuned pair of kernels; a sampled point of the small tile runs right."""
    func = _conv3x3(64, 64, 7)
    small = tc.few_columns_tile(tc.match_fp16_gemm(func), tc.TensorCoreOptions())
    assert small is not None
    for hint, searched in ((1, "small_tile"), (16, "tile")):
        space = gpu_space(TARGET)
        knobs = {k.name: k for k in space.knobs_of(func, TARGET, {"n": hint})}
        fixed = "tile" if searched == "small_tile" else "small_tile"
        assert len(knobs[searched].candidates) > 1 and len(knobs[fixed].candidates) == 1
        assert tile_list()[knobs["small_tile"].default] == small
        seed, = space.seeds(func, TARGET, {"n": hint})
        assert structural_equal(seed.func, gpu_schedules.apply(func, TARGET))
        assert "below 196 columns" in seed.func.attr_dict["tensor_core_tiles"]
    # a few-columns tile forced for a GPU A/B (TILECRAFT_TC_SMALL_TILE) is the seed's too
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILECRAFT_TC_SMALL_TILE", "32x64x16x16")
        space = gpu_space(TARGET)
        knobs = {k.name: k for k in space.knobs_of(func, TARGET, {"n": 1})}
        assert tile_list()[knobs["small_tile"].default] == tc.TensorCoreTile(32, 64, 16, 16)
        seed, = space.seeds(func, TARGET, {"n": 1})
        assert structural_equal(seed.func, gpu_schedules.apply(func, TARGET))
        assert seed.func.attr_dict["tensor_core_tiles"].startswith("32x64x16x16 below 196")
    # a point of another small tile (the hint: batch 1) against numpy at batch 1 and 5
    space = gpu_space(TARGET)
    other = tile_list().index(tc.TensorCoreTile(64, 32, 32, 16))
    sch = space.point(func, TARGET, {"small_tile": other}, shape_hints={"n": 1})
    assert sch is not None, space.last_rejection
    assert sch.func.attr_dict["tensor_core_tiles"].startswith("64x32x32x16 below 196")
    mod = targets.build(sch.func, TARGET)
    for n in (1, 5):
        x = RNG.standard_normal((n, 64, 9, 9)).astype(np.float16)
        w = (RNG.standard_normal((64, 64, 3, 3)) / 8).astype(np.float16)
        y = targets.empty((n, 64, 7, 7), "float32", dev)
        mod["main"](targets.array(x, dev), targets.array(w, dev), y)
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        ref = sum(np.einsum("bchw,oc->bohw", x64[:, :, r:r + 7, q:q + 7], w64[:, :, r, q])
                  for r in range(3) for q in range(3))
        _check(y.numpy(), ref)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_sampled_and_mutated_points_match_numpy(dev, name):
    func = KERNELS[name][0]()
    space = gpu_space(TARGET)
    knobs = space.knobs_of(func, TARGET)
    seed, = space.seeds(func, TARGET)
    seen, points = {structural_hash(seed.func)}, []
    for s in range(30):
        sch = space.sample(None, func, TARGET, s)
        assert sch is not None, space.last_rejection
        if structural_hash(sch.func) not in seen:
            seen.add(structural_hash(sch.func))
            points.append(sch)
        if len(points) == 2:
            break
    assert len(points) == 2
    mutated = space.mutate(points[0].trace, func, TARGET, np.random.default_rng(3))
    assert mutated is not None, space.last_rejection
    before, after = knob_values(points[0].trace, knobs), knob_values(mutated.trace, knobs)
    assert sum(before[k] != after[k] for k in before) == 1
    for sch in points + [mutated]:
        _run(dev, name, sch.func)


def test_options_are_used():
    """ldmatrix off, split-K off and a given tile reach the kernel (its attributes)."""
    func = _dense(128, 1024, 64)      # few tiles, a long K: split-K at the default
    space = gpu_space(TARGET)
    knobs = {k.name: k for k in space.knobs_of(func, TARGET)}
    assert knobs["split_k"].candidates == (0, 1)
    seed, = space.seeds(func, TARGET)
    assert "split-K" in seed.func.attr_dict["tensor_core_tiles"]
    tiles = tile_list()
    i = tiles.index(tc.TensorCoreTile(64, 64, 32, 32))
    sch = space.point(func, TARGET, {"tile": i, "ldmatrix": 0, "split_k": 0})
    assert sch is not None, space.last_rejection
    assert sch.func.attr_dict["tensor_core_tiles"] == "64x64x32x32"
    assert sch.func.attr_dict["tensor_core_options"] == "ldmatrix=0 stages=3 split_k=0"


def test_the_stages_knob_defaults_to_the_untuned_ring():
    func = KERNELS["dense"][0]()
    knobs = {k.name: k for k in KnobSpace(TensorCoreKnobs()).knobs_of(func, TARGET)}
    assert knobs["stages"].candidates == (1, 2, 3)
    assert knobs["stages"].default == tc.TensorCoreOptions().stages == 3


def test_over_the_targets_limits_is_rejected_naming_why():
    func = KERNELS["dense"][0]()
    gm = tc.match_fp16_gemm(func)
    tiles = tile_list()
    big = tiles.index(tc.TensorCoreTile(128, 128, 64, 32))      # 8 warps
    few_threads = Target("opencl -device=nvidia-emulated -max-threads-per-block=128")
    little_shared = Target("opencl -device=nvidia-emulated -max-shared-memory-per-block=8192")
    rule = TensorCoreKnobs()
    values = {"tile": big, "ldmatrix": 1, "split_k": 1, "stages": 1}
    assert "256 threads per work-group, over the target's 128" in \
        rule.check(func, few_threads, values)
    assert "bytes of shared memory, over the target's 8192" in \
        rule.check(func, little_shared, values)
    assert rule.check(func, TARGET, values) is None
    # the space does not offer them there, and says so when asked
    space = gpu_space(few_threads)
    knobs = {k.name: k for k in space.knobs_of(func, few_threads)}
    assert big not in knobs["tile"].candidates
    with pytest.raises(TuneError, match="not one of"):
        space.point(func, few_threads, {"tile": big})
    # the kernel and the schedule primitive refuse them with the reason
    with pytest.raises(ValueError, match="over the target's 128"):
        tc.tensor_core_kernel(func, few_threads, tiles[big])
    with pytest.raises(ValueError, match="must divide"):
        tc.tensor_core_kernel(func, TARGET, tc.TensorCoreTile(64, 64, 24, 32))
    assert tc.tile_problem(tiles[big], gm, TARGET) is None
    sch = Schedule(func)
    with pytest.raises(ScheduleError, match="apply_template: template 'tensor_core_fp16'.*"
                                            "over the target's 128"):
        sch.apply_template(tc.TEMPLATE, str(few_threads), {"tile": [128, 128, 64, 32]})
    assert structural_equal(sch.func, func) and not sch.trace.instructions
    with pytest.raises(ScheduleError, match="no kernel template 'nope'"):
        sch.apply_template("nope", str(TARGET), {})
    with pytest.raises(ScheduleError, match="unknown parameters"):
        sch.apply_template(tc.TEMPLATE, str(TARGET), {"tiles": [64, 64, 32, 32]})


def test_float32_gemms_get_the_simt_gemm_space():
    A = te.placeholder((128, 64), "float32", "A")
    B = te.placeholder((64, 96), "float32", "B")
    k = te.reduce_axis((0, 64), "k")
    C = te.compute((128, 96), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    func = te.create_prim_func([A, B, C])
    space = gpu_space(TARGET)
    assert space.knobs_of(func, TARGET) is None
    assert space.fallback.knobs_of(func, TARGET) is not None
    seed, = space.seeds(func, TARGET)
    assert structural_equal(seed.func, gpu_schedules.apply(func, TARGET))


def _mlp16(K=64, H=128, N=32):
    """A 2-layer MLP with a symbolic batch, quantized to fp16 (its dense layers the
    tensor-core kernel)."""
    w1 = (RNG.standard_normal((K, H)) / np.sqrt(K)).astype(np.float32)
    b1 = RNG.standard_normal(H).astype(np.float32)
    w2 = (RNG.standard_normal((H, N)) / np.sqrt(H)).astype(np.float32)

    def body(e, x):
        h = e(nn.relu(e(op.add(e(op.matmul(x, const(w1))), const(b1)))))
        return e(op.matmul(h, const(w2)))

    def ref(x):
        h16 = lambda a: a.astype(np.float16).astype(np.float64)     # noqa: E731
        h = np.maximum(h16(x) @ h16(w1) + b1, 0)
        return h16(h) @ h16(w2)

    mod = emitted_module([("x", ("batch", K), "float32")], body)
    return relax.quantize(mod, "fp16"), ref


def test_relax_tune_of_an_fp16_mlp_then_build_matches_numpy(tmp_path, dev):
    mod, ref = _mlp16()
    upper = {"batch": 64}
    space = gpu_space(TARGET)
    tasks = relax.extract_tasks(mod, TARGET, upper_bounds=upper)
    tc_tasks = [t for t in tasks if space.knobs_of(t.func, TARGET, t.shape_hints) is not None]
    assert len(tc_tasks) == 2, [t.name for t in tasks]
    # no schedule trace makes the tensor-core kernel: relax.tune gives them the seed
    assert all(t.baseline is None for t in tc_tasks)
    runner = LocalRunner(timeout_sec=120, number=1, repeat=1, min_repeat_ms=0,
                         enable_cpu_cache_flush=False)
    db = relax.tune(mod, TARGET, max_trials=len(tasks) + 6, work_dir=tmp_path, runner=runner,
                    upper_bounds=upper, num_trials_per_iter=3,
                    search={"population_size": 8, "genetic_num_iters": 1}, seed=0,
                    progress=False, remeasure=2, remeasure_rounds=1)
    searched = 0
    for task in tc_tasks:
        knobs = space.knobs_of(task.func, TARGET, task.shape_hints)
        recs = [r for r in db.get_top_k(task.func, TARGET, 100) if r.ok]
        assert recs, [r.error for r in db.get_all_tuning_records()]
        for rec in recs:      # each record's trace is a point of the space and replays to it
            values = knob_values(rec.trace, knobs)
            assert values is not None
            again = space.point(task.func, TARGET, values, shape_hints=task.shape_hints)
            assert structural_equal(rec.trace.apply(task.func).func, again.func)
        defaults = {k.name: k.default for k in knobs}
        # the untuned kernel (the seed) was measured as the task's baseline
        assert any(knob_values(r.trace, knobs) == defaults for r in recs)
        searched += sum(knob_values(r.trace, knobs) != defaults for r in recs)
        sch = db.query_schedule(task.func, TARGET)
        assert any(i.kind == "apply_template" for i in sch.trace.instructions)
    assert searched >= 1          # not only the seeds were measured
    exe = relax.build(mod, TARGET, database=db, upper_bounds=upper)
    vm = relax.VirtualMachine(exe, dev)
    for batch in (3, 64):
        x = RNG.standard_normal((batch, 64)).astype(np.float32)
        out = vm["main"](targets.array(x, dev))
        out = out[0] if isinstance(out, (list, tuple)) else out
        _check(out.numpy(), ref(x), 3e-3)
