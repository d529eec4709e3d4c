"""Cost models: XGBModel ranks held-out measured GEMM candidates better than random, predicts
from the analytic prior before any data, trains online, and saves / loads; RandomModel."""
import math
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from tilecraft.targets import parallel
from tilecraft.tensorir import Trace
from tilecraft.metaschedule.cost_model import RandomModel, XGBModel
from tilecraft.metaschedule.feature import NUM_FEATURES, PerStoreFeature

from search_testutil import gemm_func, measure_candidate, random_gemm_schedule

SIZE = 128
NUM_CANDIDATES = 64


def _measure(seed: int):
    f = gemm_func(SIZE, SIZE, SIZE)
    sch = random_gemm_schedule(f, np.random.default_rng(seed))
    rng = np.random.default_rng(0)
    args = [rng.uniform(-1, 1, (SIZE, SIZE)).astype("float32") for _ in range(2)]
    args.append(np.zeros((SIZE, SIZE), "float32"))
    return sch.trace.to_json(), measure_candidate(sch, args, number=3)


@pytest.fixture(scope="module")
def measured():
    """~100 really measured random schedules of a 128^3 GEMM (built and timed once per
    module, in up to two worker processes: the cores this test may use, fewer under
    ``pytest -n N``, where ``$TILECRAFT_JOBS`` shares them out): (features, seconds)."""
    with ProcessPoolExecutor(min(2, parallel.default_jobs())) as ex:
        results = list(ex.map(_measure, range(1000, 1000 + NUM_CANDIDATES)))
    f = gemm_func(SIZE, SIZE, SIZE)
    funcs = [Trace.from_json(t).apply(f).func for t, _ in results]
    feats = PerStoreFeature("llvm").extract(funcs)
    secs = np.array([s for _, s in results])
    assert secs.max() / secs.min() > 5, "the random schedules should differ in speed"
    return feats, secs


def spearman(score, secs):
    a = np.argsort(np.argsort(score))
    b = np.argsort(np.argsort(-secs))
    return float(np.corrcoef(a, b)[0, 1])


def test_xgb_ranks_held_out_better_than_random(measured):
    feats, secs = measured
    rng = np.random.default_rng(0)
    xgb_rho, rand_rho, xgb_top, rand_top = [], [], [], []
    for split in range(3):
        perm = rng.permutation(len(secs))
        train, test = perm[:40], perm[40:]
        model = XGBModel(seed=split)
        model.update_features([feats[i] for i in train], secs[train], group="gemm")
        score = model.predict_features([feats[i] for i in test], group="gemm")
        xgb_rho.append(spearman(score, secs[test]))
        # the best of the model's top 5 against the best of the held-out set
        xgb_top.append(secs[test].min() / secs[test][np.argsort(-score)[:5]].min())
        for seed in range(5):
            r = RandomModel(seed=seed).predict_features([feats[i] for i in test])
            rand_rho.append(spearman(r, secs[test]))
            rand_top.append(secs[test].min() / secs[test][np.argsort(-r)[:5]].min())
    assert np.mean(xgb_rho) > 0.3
    assert np.mean(xgb_rho) > np.mean(rand_rho) + 0.25
    assert np.mean(xgb_top) > np.mean(rand_top)


def test_prior_before_any_data(measured):
    """With no measurement yet the analytic model ranks: already far better than random."""
    feats, secs = measured
    model = XGBModel()
    score = model.predict_features(feats, group="gemm")
    np.testing.assert_allclose(score, XGBModel.prior(feats))
    assert spearman(score, secs) > 0.3


def test_online_updates_and_groups(measured):
    feats, secs = measured
    model = XGBModel(min_samples=8)
    model.update_features(feats[:4], secs[:4], group="a")
    # too few samples of group "a": still the prior
    np.testing.assert_allclose(model.predict_features(feats[4:10], group="a"),
                               XGBModel.prior(feats[4:10]))
    model.update_features(feats[4:40], secs[4:40], group="a")
    assert model.num_samples == 40
    trained = model.predict_features(feats[40:], group="a")
    assert not np.allclose(trained, XGBModel.prior(feats[40:]))
    # another workload with no data of its own is ranked by the prior
    np.testing.assert_allclose(model.predict_features(feats[40:], group="b"),
                               XGBModel.prior(feats[40:]))


def test_failed_candidates_and_reg_loss(measured):
    feats, secs = measured
    results = list(secs[:30])
    results[3] = None           # a build error
    results[5] = math.inf       # a wrong result / timeout
    for loss in ("rank", "reg"):
        model = XGBModel(loss=loss)
        model.update_features(feats[:30], results, group="g")
        score = model.predict_features(feats[30:], group="g")
        assert score.shape == (len(feats) - 30,) and np.isfinite(score).all()
    with pytest.raises(ValueError, match="loss"):
        XGBModel(loss="hinge")
    with pytest.raises(ValueError, match="3 candidates but 2 results"):
        XGBModel().update_features(feats[:3], [1.0, 2.0])
    with pytest.raises(ValueError, match="n_stores"):
        XGBModel().update_features([np.zeros((2, 3))], [1.0])


def test_save_load_roundtrip(measured, tmp_path):
    feats, secs = measured
    model = XGBModel(seed=3)
    model.update_features(feats[:40], secs[:40], group="g")
    path = tmp_path / "model.npz"
    model.save(path)
    again = XGBModel()
    again.load(path)
    np.testing.assert_allclose(again.predict_features(feats[40:], group="g"),
                               model.predict_features(feats[40:], group="g"), rtol=1e-6)
    assert again.num_samples == 40 and again.loss == "rank"
    # it keeps learning after a load
    again.update_features(feats[40:50], secs[40:50], group="g")
    assert again.num_samples == 50
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not an XGBModel file"):
        XGBModel().load(bad)


def test_random_model(tmp_path):
    feats = [np.zeros((1, NUM_FEATURES), np.float32)] * 6
    m = RandomModel(seed=1)
    m.update_features(feats, [1.0] * 6)
    m.save(tmp_path / "r.json")
    expected = m.predict_features(feats)
    again = RandomModel()
    again.load(tmp_path / "r.json")
    np.testing.assert_array_equal(again.predict_features(feats), expected)
    assert again.num_updates == 6
