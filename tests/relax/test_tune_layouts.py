"""relax.tune_layouts: each convolution's packed kernel chosen by measurement, the decisions
kept in the database (layouts.json) and used by relax.build, extract_tasks and relax.tune."""
import json
import warnings

import numpy as np
import pytest

from tilecraft import metaschedule
from tilecraft import relax
from tilecraft import targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.backend import cpu
from tilecraft.relax.backend.cpu import conv2d_nchw_cvec as cvec
from tilecraft.relax.backend.cpu import conv2d_nchw as flat
from tilecraft.relax.backend.cpu import conv2d_strategy as strategy
from tilecraft.relax.tune_layouts import _kernel, _reference, collect_convs, conv_layout_key

HOST = cpu.cpu_tile_params(targets.Target("llvm"))     # (lanes, registers) the host's plans use


@pytest.fixture
def rng():
    return np.random.default_rng(0)


GEOMETRIES = [
    cpu.ConvGeometry(16, 14, 14, 32, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    cpu.ConvGeometry(8, 9, 9, 32, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
    cpu.ConvGeometry(8, 10, 10, 32, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1),
    cpu.ConvGeometry(16, 8, 8, 32, (3, 3), (1, 1), (1, 0, 1, 0), (1, 1), 2),      # grouped
    cpu.ConvGeometry(16, 12, 12, 16, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 16),   # depthwise
    # a stride above the kernel: the flat kernel reads only some phase planes (one for the
    # 1x1 layer; two of three per axis for the 2x2 stride-3 one, with a border)
    cpu.ConvGeometry(16, 15, 15, 32, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    cpu.ConvGeometry(8, 11, 11, 16, (2, 2), (3, 3), (1, 1, 1, 1), (1, 1), 1),
    # a long reduction: the AVX2 rule's tiles across rows with reduction chunks
    cpu.ConvGeometry(256, 7, 7, 64, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
]


def conv_ref(x, w, g):
    """An independent convolution (one output position at a time, float64)."""
    pt, pl, pb, pr = g.padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    out = np.zeros((x.shape[0], g.out_channels, g.out_h, g.out_w))
    (sh, sw), (dh, dw), (kh, kw) = g.strides, g.dilation, g.kernel
    for o in range(g.out_channels):
        c0 = (o // g.out_per_group) * g.in_per_group
        for y in range(g.out_h):
            for xx in range(g.out_w):
                win = xp[:, c0:c0 + g.in_per_group, y * sh:y * sh + (kh - 1) * dh + 1:dh,
                         xx * sw:xx * sw + (kw - 1) * dw + 1:dw]
                out[:, o, y, xx] = (win * w[o]).sum(axis=(1, 2, 3))
    return out


def pack(w, r):
    o, i, kh, kw = w.shape
    return np.ascontiguousarray(w.reshape(o // r, r, i, kh, kw).transpose(0, 2, 3, 4, 1))


@pytest.mark.parametrize("isa", [(16, 32), (8, 16)], ids=["avx512", "avx2"])
@pytest.mark.parametrize("g", GEOMETRIES, ids=conv_layout_key)
def test_every_candidate_computes_the_convolution(g, isa, rng):
    lanes, registers = isa
    plans = strategy.nchw_plan_candidates(g, lanes, registers)
    assert plans[0] == strategy.nchw_kernel_plan(g, lanes, registers)   # the rule's choice first
    keys = [json.dumps(strategy.plan_to_json(p), sort_keys=True) for p in plans]
    assert len(set(keys)) == len(keys) > 1
    x = rng.uniform(-1, 1, (1, g.in_channels, g.height, g.width)).astype("float32")
    w = rng.uniform(-1, 1, (g.out_channels, g.in_per_group) + g.kernel).astype("float32")
    want = conv_ref(x, w, g)
    for p in plans:
        # the JSON round trip
        assert strategy.plan_from_json(g, strategy.plan_to_json(p), lanes, registers) == p
        r = p.width if isinstance(p, cvec.ChannelVectorPlan) else p.oc_block
        packed = pack(w, r)
        np.testing.assert_allclose(_reference(g, x, packed), want, rtol=1e-5, atol=1e-5)
        mod = targets.build(_kernel(g, p, targets.Target("llvm")), "llvm")
        out = np.zeros((1, g.out_channels, g.out_h, g.out_w), "float32")
        mod["main"](x, packed, out)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=str(p))


def test_a_plan_that_does_not_fit_is_refused():
    g = GEOMETRIES[0]          # 32 output channels, 14 x 14
    for bad, why in [({"kind": "cvec", "rows": 5, "width": 16}, "does not fit"),
                     ({"kind": "cvec", "rows": 7, "width": 48}, "does not fit"),
                     ({"kind": "flat", "oc_block": 3, "vectors": 4}, "does not fit"),
                     ({"kind": "flat", "oc_block": 2, "vectors": "7"}, "positive integer"),
                     ({"kind": "cvec", "rows": 3, "width": 16, "across_rows": True,
                       "k_chunk": 5}, "divisor"),
                     ({"kind": "cvec", "rows": 3, "width": 16, "k_chunk": 4}, "divisor"),
                     ({"kind": "cvec", "rows": 3, "width": 16, "across_rows": 1}, "boolean"),
                     ({"kind": "cvec", "rows": 9, "width": 64, "across_rows": True},
                      "does not fit"),
                     ({"kind": "winograd"}, "kind must be")]:
        with pytest.raises(ValueError, match=why):
            strategy.plan_from_json(g, bad, 16, 32)


def two_convs():
    """1x1 16 -> 32 + relu, then 3x3 32 -> 32 (dilation 2, padding 2), on 14 x 14: a chain
    that stays NCHW (undilated, the 3x3 layer would run as Winograd F(2x2, 3x3) in NHWC)."""
    rng = np.random.default_rng(1)
    w1 = rng.uniform(-0.3, 0.3, (32, 16, 1, 1)).astype("float32")
    w2 = rng.uniform(-0.2, 0.2, (32, 32, 3, 3)).astype("float32")
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, 16, 14, 14), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.relu(bb.emit(op.nn.conv2d(x, const(w1)))))
            gv = bb.emit_output(bb.emit(op.nn.conv2d(h, const(w2), padding=2, dilation=2)))
        bb.emit_func_output(gv)
    g1 = cpu.ConvGeometry(16, 14, 14, 32, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    g2 = cpu.ConvGeometry(32, 14, 14, 32, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1)

    def reference(xv):
        return conv_ref(np.maximum(conv_ref(xv, w1, g1), 0), w2, g2)
    return bb.get(), reference, (g1, g2)


def _run(exe, x):
    return relax.VirtualMachine(exe, targets.cpu(0))["main"](targets.array(x)).numpy()


def _rules(mod, db=None):
    """The schedule rule of each convolution kernel relax.build would schedule."""
    out = []
    for t in relax.extract_tasks(mod, "llvm", baselines=False, database=db):
        text = t.func.script()
        for rule in (cvec.RULE_CONV_NCHW_CVEC, flat.RULE_CONV_NCHW):
            if rule in text:
                out.append(rule)
                break
    return out


def test_tune_layouts_measures_records_and_resumes(tmp_path, rng):
    mod, reference, geos = two_convs()
    assert [conv_layout_key(g) for g in collect_convs(mod, "llvm")] == \
        [conv_layout_key(g) for g in geos]
    choices = relax.tune_layouts(mod, "llvm", work_dir=tmp_path, rounds=2, progress=False)
    assert set(choices) == {conv_layout_key(g) for g in geos}
    db = metaschedule.Database(tmp_path)
    assert "2 layout decisions" in repr(db)
    for g in geos:
        line = db.get_layouts("llvm")[conv_layout_key(g)]
        cands = line["candidates"]
        assert len(cands) == len(strategy.nchw_plan_candidates(g, *HOST))
        assert all(c["error"] is None and c["secs"] == min(c["rounds_secs"]) > 0 and
                   len(c["rounds_secs"]) == 2 for c in cands)     # all ran, checked, timed
        fastest = min(cands, key=lambda c: c["secs"])
        # the default stays unless the fastest beat it by the margin, back to back
        assert line["choice"] in (cands[0]["plan"], fastest["plan"])
        if fastest is not cands[0]:
            assert len(fastest["paired_ratios"]) == 5
        if line["choice"] != cands[0]["plan"]:
            assert np.median(fastest["paired_ratios"]) < 0.97
    log = (tmp_path / "tune.log").read_text()
    assert log.count("layout conv2d_nchw") == 2
    x = rng.uniform(-1, 1, (1, 16, 14, 14)).astype("float32")
    np.testing.assert_allclose(_run(relax.build(mod, "llvm", database=db), x), reference(x),
                               rtol=1e-4, atol=1e-4)

    class NoBuilds(metaschedule.LocalBuilder):
        def build(self, inputs):
            raise AssertionError("a decided convolution was measured again")
    again = relax.tune_layouts(mod, "llvm", db, builder=NoBuilds(), progress=False)
    assert again == choices


def _rule_of(plan):
    if isinstance(plan, cvec.ChannelVectorPlan):
        return cvec.RULE_CONV_NCHW_CVEC
    return flat.RULE_CONV_NCHW


def test_build_uses_the_decisions(tmp_path, rng):
    mod, reference, (g1, g2) = two_convs()
    rules = [_rule_of(strategy.nchw_kernel_plan(g, *HOST)) for g in (g1, g2)]
    assert _rules(mod) == rules          # the rule's kernels
    db = metaschedule.Database(tmp_path)
    for g in (g1, g2):
        db.commit_layout(conv_layout_key(g), "llvm", {"kind": "cvec", "rows": 3, "width": 32,
                                                      "across_rows": True, "k_chunk": 8})
    assert _rules(mod, db) == [cvec.RULE_CONV_NCHW_CVEC] * 2
    x = rng.uniform(-1, 1, (1, 16, 14, 14)).astype("float32")
    np.testing.assert_allclose(_run(relax.build(mod, "llvm", database=db), x), reference(x),
                               rtol=1e-4, atol=1e-4)
    for g in (g1, g2):
        db.commit_layout(conv_layout_key(g), "llvm", {"kind": "flat", "oc_block": 4,
                                                      "vectors": 3})
    assert _rules(mod, db) == [flat.RULE_CONV_NCHW] * 2
    x = rng.uniform(-1, 1, (1, 16, 14, 14)).astype("float32")
    np.testing.assert_allclose(_run(relax.build(mod, "llvm", database=db), x), reference(x),
                               rtol=1e-4, atol=1e-4)
    # another target's decisions do not apply
    other = metaschedule.Database(tmp_path / "other")
    other.commit_layout(conv_layout_key(g1), "llvm -mattr=+avx2", {"kind": "flat",
                                                                   "oc_block": 4, "vectors": 3})
    assert _rules(mod, other) == rules


def test_a_stale_decision_warns_and_keeps_the_default(tmp_path):
    mod, _, (g1, _) = two_convs()
    db = metaschedule.Database(tmp_path)
    db.commit_layout(conv_layout_key(g1), "llvm", {"kind": "cvec", "rows": 5, "width": 16})
    with pytest.warns(RuntimeWarning, match="does not apply"):
        rules = _rules(mod, db)
    assert rules == [_rule_of(strategy.nchw_kernel_plan(g, *HOST)) for g in two_convs()[2]]


def test_corrupt_layout_lines_are_skipped(tmp_path):
    _, _, (g1, g2) = two_convs()
    db = metaschedule.Database(tmp_path)
    db.commit_layout(conv_layout_key(g1), "llvm", {"kind": "flat", "oc_block": 4,
                                                   "vectors": 3})
    with open(tmp_path / "layouts.json", "a") as f:
        f.write('{"v": 1, "key": 3}\n{not json\n')
    with pytest.warns(RuntimeWarning, match=r"layouts.json:[23]: skipping a corrupt"):
        db.commit_layout(conv_layout_key(g2), "llvm", {"kind": "cvec", "rows": 7,
                                                       "width": 16})
    with pytest.warns(RuntimeWarning, match=r"layouts.json:[23]: skipping a corrupt"):
        fresh = metaschedule.Database(tmp_path)
    assert set(fresh.get_layouts("llvm")) == {conv_layout_key(g1), conv_layout_key(g2)}
    assert fresh.query_layout(conv_layout_key(g2), "llvm") == {"kind": "cvec", "rows": 7,
                                                               "width": 16}
    with pytest.raises(ValueError, match="non-empty string"):
        db.commit_layout("", "llvm", {})
    with pytest.raises(TypeError, match="must be a dict"):
        db.commit_layout("k", "llvm", ["flat"])


@pytest.mark.skipif(targets.Target("llvm").arch != "x86_64", reason="an AVX2 target")
def test_tiles_across_rows_with_epilogue_and_symbolic_batch(rng, monkeypatch):
    """The AVX2 rule's tiles across rows in a model: a 3x3 128 -> 128 convolution on 10 x 10
    (100 positions: the last 3 x 32 tile padded; reduction chunks of 64 channels) with bias,
    residual and relu fused into its copy, then 128 -> 32 (one channel block: tiles in
    parallel, unchunked); the batch symbolic. NCHW throughout: ``ConvertLayout`` would run
    these 10 x 10 layers in NHWC on AVX2 (5-pixel tiles divide the row)."""
    from tilecraft.relax.transform import convert_layout
    monkeypatch.setattr(convert_layout, "nhwc_pays", lambda g, target: False)
    target = "llvm -mcpu=haswell"
    w1 = rng.uniform(-0.05, 0.05, (128, 128, 3, 3)).astype("float32")
    b1 = rng.uniform(-1, 1, (1, 128, 1, 1)).astype("float32")
    w2 = rng.uniform(-0.05, 0.05, (32, 128, 3, 3)).astype("float32")
    g1 = cpu.ConvGeometry(128, 10, 10, 128, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    g2 = cpu.ConvGeometry(128, 10, 10, 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert strategy.nchw_kernel_plan(g1, 8, 16) == cvec.ChannelVectorPlan(g1, 3, 32, 8, True, 64)
    assert strategy.nchw_kernel_plan(g2, 8, 16).across_rows
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", 128, 10, 10), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            c1 = bb.emit(op.add(bb.emit(op.nn.conv2d(x, const(w1), padding=1)), const(b1)))
            h = bb.emit(op.nn.relu(bb.emit(op.add(c1, x))))
            gv = bb.emit_output(bb.emit(op.nn.conv2d(h, const(w2), padding=1)))
        bb.emit_func_output(gv)
    tasks = relax.extract_tasks(bb.get(), target, baselines=False)
    assert sum("conv2d_tiles" in t.func.script() for t in tasks) == 2
    exe = relax.build(bb.get(), target)
    for n in (1, 3):
        xv = rng.uniform(-1, 1, (n, 128, 10, 10)).astype("float32")
        h = np.maximum(conv_ref(xv, w1, g1) + b1 + xv, 0)
        np.testing.assert_allclose(_run(exe, xv), conv_ref(h, w2, g2), rtol=1e-4, atol=1e-4)


def test_relax_tune_decides_layouts_first(tmp_path):
    mod, _, geos = two_convs()
    runner = metaschedule.LocalRunner(number=1, repeat=1, min_repeat_ms=0,
                                      enable_cpu_cache_flush=False)
    db = relax.tune(mod, "llvm", max_trials=4, work_dir=tmp_path, runner=runner,
                    num_trials_per_iter=2, search={"population_size": 4, "genetic_num_iters": 1},
                    seed=0, progress=False, remeasure=0)
    assert set(db.get_layouts("llvm")) == {conv_layout_key(g) for g in geos}
    # the tasks tuned are the kernels the decisions give
    tuned = {w.shash for w in db.workloads}
    from tilecraft.metaschedule import workload_hash
    assert {workload_hash(t.func) for t in relax.extract_tasks(mod, "llvm", database=db)} \
        <= tuned
    with pytest.raises(ValueError, match="rounds and confirm"):
        relax.tune_layouts(mod, "llvm", db, rounds=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert relax.tune_layouts(mod, "opencl", db) == {}      # no packed kernels there
    # a board's target is not timed here
    assert relax.tune_layouts(mod, "llvm -mtriple=aarch64-linux-gnu", db, progress=False) == {}
