"""The tuner's GPU space of the default GEMM family (``relax.gpu_space``, issue 32): the GEMM
recipe's decisions (tile threads and registers, k-step, register fragments and their vector,
fetch vector, register prefetch, min-groups, shared staging) as knobs of a
``metaschedule.KnobSpace``. The untuned default stays bit-identical; the knob defaults make
exactly the default schedule; every sampled or mutated point is correct against numpy on PoCL
(OpenCL) and lavapipe (WebGPU); combinations over a target's limits are rejected before any
build, naming why; traces replay from the database; ``relax.tune`` of a small BERT-like
layer and a small conv net runs end to end and its build matches numpy."""
import hashlib

import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.metaschedule import KnobSpace, LocalRunner, default_space, knob_values
from tilecraft.relax import const, gpu_schedules
from tilecraft.relax import op
from tilecraft.relax.backend.gpu import gemm
from tilecraft.relax.gpu_space import GEMM_KNOBS, GemmKnobs, gpu_space
from tilecraft.relax.op import nn
from tilecraft.targets import Target
from tilecraft.tensorir import te
from tilecraft.tensorir.schedule import Trace
from tilecraft.tensorir.structural import structural_hash

import gpu_testutil
from capabilities import gpu_device

RNG = np.random.default_rng(32)
# (kind of device, target string): PoCL runs the CPU OpenCL variant (small tiles; its GPU tile
# takes it minutes to compile), lavapipe the WebGPU one
DEVICES = [("opencl", "opencl -device=cpu"), ("webgpu", "webgpu")]


def _gemm(m, n, k):
    A = te.placeholder((m, k), "float32", "A")
    B = te.placeholder((k, n), "float32", "B")
    r = te.reduce_axis((0, k), "k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), "C")
    return te.create_prim_func([A, B, C])


def _batch_matmul(b, m, n, k):
    A = te.placeholder((b, m, k), "float32", "A")
    B = te.placeholder((b, k, n), "float32", "B")
    r = te.reduce_axis((0, k), "k")
    C = te.compute((b, m, n), lambda z, i, j: te.sum(A[z, i, r] * B[z, r, j], axis=r), "C")
    return te.create_prim_func([A, B, C])


def _conv_relu(n, c, h, w, f):
    X = te.placeholder((n, c, h, w), "float32", "X")
    W = te.placeholder((f, c, 3, 3), "float32", "W")
    P = te.compute((n, c, h + 2, w + 2), lambda b, ci, y, x: te.if_then_else(
        te.all(y >= 1, y <= h, x >= 1, x <= w), X[b, ci, y - 1, x - 1], 0.0), "pad")
    rc = te.reduce_axis((0, c), "rc")
    ry = te.reduce_axis((0, 3), "ry")
    rx = te.reduce_axis((0, 3), "rx")
    Y = te.compute((n, f, h, w), lambda b, o, y, x: te.sum(
        P[b, rc, y + ry, x + rx] * W[o, rc, ry, rx], axis=[rc, ry, rx]), "conv")
    R = te.compute((n, f, h, w), lambda b, o, y, x: te.maximum(Y[b, o, y, x],
                                                                te.const(0.0, "float32")),
                   "relu")
    return te.create_prim_func([X, W, R])


def _conv_reference(x, w):
    n, c, h, wd = x.shape
    p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd), "float64")
    for ry in range(3):
        for rx in range(3):
            out += np.einsum("bchw,oc->bohw", p[:, :, ry:ry + h, rx:rx + wd], w[:, :, ry, rx])
    return np.maximum(out, 0)


# (kernel, argument shapes, numpy reference)
KERNELS = {
    "gemm": (lambda: _gemm(128, 96, 40), [(128, 40), (40, 96)], lambda a, b: a @ b),
    "batch_matmul": (lambda: _batch_matmul(3, 64, 96, 24), [(3, 64, 24), (3, 24, 96)],
                     lambda a, b: a @ b),
    "conv": (lambda: _conv_relu(1, 8, 14, 14, 32), [(1, 8, 14, 14), (32, 8, 3, 3)],
             _conv_reference),
}

# sha256 (first 16 hex digits) of the default GPU source of these kernels before the knobs
# existed (gpu5's base commit a906c45; the WebGPU ones after the WGSL unroll rule of 227c6ed,
# which stopped unrolling the k-step loop; and after web9's WGSL changes, which left the schedules
# alone: integer division / modulo by powers of two written as shifts / masks, and the bounds
# prover's integer bounds that took gemm_1024_512_48's run-time fetch check (its error buffer)
# out — checked line by line against the sources before; and after the WGSL generator's fewer
# naga clamps — constant vec4 lanes, flat workgroup arrays, workgroup reads reused — which left
# the schedules alone): the untuned default must not move
GOLDEN = {
    "gemm_256_256_64 opencl": "ee9e8f8b7ca133df",
    "gemm_256_256_64 webgpu": "799404afd6b25b16",
    "gemm_256_256_64 opencl -device=cpu": "d4d0513b766cec0b",
    "gemm_1024_512_48 opencl": "e667b9325d3c6cc8",
    "gemm_1024_512_48 webgpu": "b4e7a19431cacb51",
    "gemm_1024_512_48 opencl -device=cpu": "84ef8cd8120c148c",
    "batch_matmul_4_64_64_32 opencl": "cfa7aaecf9c95860",
    "batch_matmul_4_64_64_32 webgpu": "1509dba1edc0dbf9",
    "batch_matmul_4_64_64_32 opencl -device=cpu": "5365b8ffaaba9c92",
    "conv3x3_relu_1_32_14_14_64 opencl": "478d1999e858e277",
    "conv3x3_relu_1_32_14_14_64 webgpu": "e36816089bbdaaa0",
    "conv3x3_relu_1_32_14_14_64 opencl -device=cpu": "a0e07252f66b6928",
}
GOLDEN_KERNELS = {"gemm_256_256_64": lambda: _gemm(256, 256, 64),
                  "gemm_1024_512_48": lambda: _gemm(1024, 512, 48),
                  "batch_matmul_4_64_64_32": lambda: _batch_matmul(4, 64, 64, 32),
                  "conv3x3_relu_1_32_14_14_64": lambda: _conv_relu(1, 32, 14, 14, 64)}


def _source(func, target):
    mod = targets.build(func, target)
    return mod.source if target.kind == "opencl" else mod.get_source()


def test_untuned_default_source_is_unchanged():
    got = {}
    for key in GOLDEN:
        name, t = key.split(" ", 1)
        target = Target(t)
        src = _source(gpu_schedules.apply(GOLDEN_KERNELS[name](), target), target)
        got[key] = hashlib.sha256(src.encode()).hexdigest()[:16]
    assert got == GOLDEN


@pytest.mark.parametrize("t", ["opencl", "webgpu", "opencl -device=cpu"])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_knob_defaults_make_the_default_schedule(name, t):
    target = Target(t)
    func = KERNELS[name][0]()
    space = gpu_space(target)
    knobs = space.knobs_of(func, target)
    assert [k.name for k in knobs] == list(GEMM_KNOBS)
    defaults = {k.name: k.default for k in knobs}
    config = gemm.default_config(target)
    assert (defaults["k_step"], defaults["register_prefetch"]) == \
        (config["k_step"], int(config["register_prefetch"]))
    seed, = space.seeds(func, target)
    assert structural_hash(seed.func) == structural_hash(gpu_schedules.apply(func, target))
    assert knob_values(seed.trace, knobs) == defaults


def test_kernels_that_are_not_gemm_like_get_the_generic_space():
    A = te.placeholder((64, 256), "float32", "A")
    k = te.reduce_axis((0, 256), "k")
    S = te.compute((64,), lambda i: te.sum(A[i, k], axis=k), "S")
    func = te.create_prim_func([A, S])
    space = gpu_space(Target("opencl"))
    assert space.knobs_of(func, "opencl") is None
    designs = space.generate(func, "opencl")
    generic = default_space(Target("opencl")).generate(func, "opencl")
    assert [str(d.trace) for d in designs] == [str(d.trace) for d in generic]


def _run_point(kind, target, name, sch):
    dev, _ = gpu_device(kind)
    _, shapes, ref = KERNELS[name]
    args = [RNG.standard_normal(s).astype("float32") for s in shapes]
    mod = targets.build(sch.mod, target)
    out_shape = tuple(int(d.value) for d in sch.func.buffers[-1].shape)
    out = targets.empty(out_shape, "float32", dev)
    mod[mod.entry_name](*[targets.array(a, dev) for a in args], out)
    want = ref(*[a.astype("float64") for a in args])
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind,t", DEVICES)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_sampled_and_mutated_points_match_numpy(kind, t, name):
    """Random points of the knob space (and a mutation of each) run correctly; the points
    differ from each other and from the default."""
    target = Target(t)
    func = KERNELS[name][0]()
    space = gpu_space(target)
    knobs = space.knobs_of(func, target)
    seed, = space.seeds(func, target)
    points, seen = [], {structural_hash(seed.func)}
    rng = np.random.default_rng(7)
    for s in range(40):
        sch = space.sample(None, func, target, s)
        if sch is None:
            assert space.last_rejection      # a rejection names its reason
            continue
        if structural_hash(sch.func) in seen:
            continue
        seen.add(structural_hash(sch.func))
        points.append(sch)
        if len(points) == 3:
            break
    assert len(points) == 3
    mutated = None
    for _ in range(20):
        mutated = space.mutate(points[0].trace, func, target, rng)
        if mutated is not None:
            break
    assert mutated is not None
    before, after = knob_values(points[0].trace, knobs), knob_values(mutated.trace, knobs)
    assert sum(before[k] != after[k] for k in before) == 1      # one knob moved
    for sch in points + [mutated]:
        _run_point(kind, target, name, sch)


def test_fragments_and_prefetch_knobs_on_opencl_cpu_match_numpy():
    """The fragment / vector / prefetch code paths (off by default on a CPU driver) at small
    tiles, on PoCL."""
    target = Target("opencl -device=cpu")
    space = gpu_space(target)
    for name in ("gemm", "batch_matmul"):
        func = KERNELS[name][0]()
        sch = space.point(func, target, {"fragments": 1, "fragment_vector": 4,
                                         "fetch_vector": 4, "register_prefetch": 1})
        assert sch is not None, space.last_rejection
        assert structural_hash(sch.func) != \
            structural_hash(gpu_schedules.apply(func, target))
        assert "prefetch" in _source(sch.func, target)
        _run_point("opencl", target, name, sch)


def test_invalid_combinations_are_rejected_before_build():
    func = KERNELS["gemm"][0]()
    target = Target("opencl")
    space = gpu_space(target)
    assert space.point(func, target, {"rows_threads": 32, "cols_threads": 32}) is None
    assert "1024 threads per work-group, over the target's 256" in space.last_rejection
    big = _gemm(2048, 2048, 256)   # 256 work-groups of 128 x 128: the tile is not shrunk
    web = Target("webgpu")
    space = gpu_space(web)
    assert space.point(big, web, {"k_step": 32, "rows_regs": 8, "cols_regs": 8}) is None
    assert "32768 bytes of shared memory exceed the target's limit of 16384" in \
        space.last_rejection
    with pytest.raises(Exception, match="not one of"):
        space.point(big, web, {"k_step": 3})
    with pytest.raises(Exception, match="unknown knobs"):
        space.point(big, web, {"tile": 3})


def test_a_point_replays_from_its_stored_trace():
    """What the database stores (the trace as JSON) replays to the same program without the
    space (``Trace.apply``, as ``relax.build(database=...)`` does), and ``finish`` (the
    space) makes the same point again."""
    target = Target("webgpu")
    func = KERNELS["conv"][0]()
    space = gpu_space(target)
    sch = space.point(func, target, {"k_step": 4, "fragments": 0, "cols_regs": 2})
    assert sch is not None, space.last_rejection
    stored = Trace.from_json(sch.trace.to_json())
    assert structural_hash(stored.apply(func).func) == structural_hash(sch.func)
    again = space.finish(stored, func, target)
    assert structural_hash(again.func) == structural_hash(sch.func)


def _bert_like(seq=128, d=64, ffn=128):
    """One attention head and a feed-forward block with residuals and layer norms, static
    shapes (the GEMM-like kernels: q/k/v/out projections, QK^T, PV, the FFN's two)."""
    w = {k: (RNG.standard_normal(s) / np.sqrt(s[0])).astype("float32") for k, s in
         (("q", (d, d)), ("k", (d, d)), ("v", (d, d)), ("o", (d, d)), ("f1", (d, ffn)),
          ("f2", (ffn, d)))}
    g = np.ones(d, "float32")
    z = np.zeros(d, "float32")

    def body(x):
        q = op.matmul(x, const(w["q"]))
        k = op.matmul(x, const(w["k"]))
        v = op.matmul(x, const(w["v"]))
        s = op.multiply(op.matmul(q, op.permute_dims(k, [1, 0])),
                        const(np.float32(1 / np.sqrt(d))))
        a = op.matmul(nn.softmax(s, axis=-1), v)
        h = nn.layer_norm(op.add(op.matmul(a, const(w["o"])), x), const(g), const(z))
        f = op.matmul(nn.relu(op.matmul(h, const(w["f1"]))), const(w["f2"]))
        return [nn.layer_norm(op.add(f, h), const(g), const(z))]

    def ln(t):
        return (t - t.mean(-1, keepdims=True)) / np.sqrt(t.var(-1, keepdims=True) + 1e-5)

    def ref(x):
        x = x.astype("float64")
        s = (x @ w["q"]) @ (x @ w["k"]).T / np.sqrt(d)
        e = np.exp(s - s.max(-1, keepdims=True))
        a = (e / e.sum(-1, keepdims=True)) @ (x @ w["v"])
        h = ln(a @ w["o"] + x)
        return ln(np.maximum(h @ w["f1"], 0) @ w["f2"] + h)

    return gpu_testutil.module([("x", (seq, d), "float32")], body), ref


def _small_convnet():
    w1 = (RNG.standard_normal((16, 4, 3, 3)) / 6).astype("float32")
    w2 = (RNG.standard_normal((32, 16, 3, 3)) / 12).astype("float32")

    def body(x):
        y = nn.relu(nn.conv2d(x, const(w1), padding=(1, 1)))
        return [nn.relu(nn.conv2d(y, const(w2), padding=(1, 1)))]

    def ref(x):
        return _conv_reference(_conv_reference(x.astype("float64"), w1), w2)

    return gpu_testutil.module([("x", (1, 4, 16, 16), "float32")], body), ref


@pytest.mark.parametrize("kind,t,model", [("opencl", "opencl -device=cpu", "bert_like"),
                                          ("webgpu", "webgpu", "convnet")])
def test_relax_tune_of_a_model_then_build_matches_numpy(tmp_path, kind, t, model):
    dev, _ = gpu_device(kind)
    target = Target(t)
    mod, ref = _bert_like() if model == "bert_like" else _small_convnet()
    tasks = relax.extract_tasks(mod, target)
    space = gpu_space(target)
    gemm_tasks = [task for task in tasks if space.knobs_of(task.func, target) is not None]
    assert gemm_tasks and all(task.baseline is not None for task in gemm_tasks)
    runner = LocalRunner(timeout_sec=60, number=1, repeat=1, min_repeat_ms=0,
                         enable_cpu_cache_flush=False)
    db = relax.tune(mod, target, max_trials=len(tasks) + 6, work_dir=tmp_path, runner=runner,
                    num_trials_per_iter=3, search={"population_size": 8,
                                                   "genetic_num_iters": 1},
                    seed=0, progress=False, remeasure=2, remeasure_rounds=1)
    # every GEMM-like kernel's selected record is a point of the knob space, replayed
    for task in gemm_tasks:
        sch = db.query_schedule(task.func, target)
        assert sch is not None
        assert knob_values(sch.trace, space.knobs_of(task.func, target)) is not None
    exe = relax.build(mod, target, database=db)
    vm = relax.VirtualMachine(exe, dev)
    x = RNG.standard_normal(tuple(int(d) for d in (
        (128, 64) if model == "bert_like" else (1, 4, 16, 16)))).astype("float32")
    out = vm["main"](targets.array(x, dev))
    out = out[0] if isinstance(out, (list, tuple)) else out
    np.testing.assert_allclose(out.numpy(), ref(x), rtol=1e-3, atol=1e-3)


def test_gpu_space_is_a_knob_space_of_the_gemm_rule():
    space = gpu_space("opencl")
    assert isinstance(space, KnobSpace) and isinstance(space.rule, GemmKnobs)
