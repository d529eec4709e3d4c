"""Cost models: predict which candidates of a design space run fastest, learn from measurements.

* ``XGBModel`` — gradient-boosted trees (xgboost) over ``PerStoreFeature`` rows. A candidate's
  score is the sum of its stores' row scores (TVM's *pack sum*); scores are comparable within a
  workload (higher is faster). Trained online: ``update`` after every measured batch retrains
  on everything seen so far. Two losses:

  - ``"rank"`` (the default): pairwise logistic loss between candidates of the same workload,
    each pair weighted by the difference of their normalized throughputs, so that the model
    learns the *order* of candidates with the fastest ones mattering most;
  - ``"reg"``: TVM's loss, a squared error on normalized throughput (``best seconds /
    seconds`` within the workload, 0 for a failed candidate) weighted by that throughput.

  Before ``min_samples`` valid measurements of a workload exist, a workload is ranked by the
  analytic machine model of the features (``feature.analytic_cost``): the first batch is
  already chosen by an estimate of speed, not at random. The analytic estimate is also a
  column of the features, so the trees start from it.
* ``RandomModel`` — random scores: the baseline the tests compare against.

Both have ``save(path)`` / ``load(path)`` (one file, written atomically).

Examples
--------
>>> model = XGBModel()                                       # doctest: +SKIP
>>> scores = model.predict(funcs)           # before any data: the analytic prior
>>> model.update(funcs[:16], run_secs[:16], group="gemm")    # measured seconds
>>> scores = model.predict(funcs)           # now the trained trees
"""
from __future__ import annotations

import io
import json
import math
import os
from typing import Mapping, Sequence

import numpy as np

from tilecraft.optional import import_optional
from tilecraft.targets.fileio import atomic_write
from tilecraft.tensorir.function import PrimFunc

from .feature import NUM_FEATURES, PerStoreFeature, analytic_cost

COST_MODEL_VERSION = 1


def _valid_secs(s) -> bool:
    return s is not None and isinstance(s, (int, float, np.floating)) and math.isfinite(s) \
        and s > 0


class CostModel:
    """What the search asks of a cost model.

    ``predict`` returns one score per function, higher meaning faster (only the order within
    one workload matters); ``update`` adds measured results (seconds; ``None`` or ``inf`` for a
    failed candidate). ``group`` names the workload the functions belong to (normalization of
    throughput and ranking pairs stay within a group).
    """

    def __init__(self, extractor: PerStoreFeature | None = None):
        self.extractor = extractor or PerStoreFeature()

    def features(self, funcs: Sequence[PrimFunc],
                 shape_vars: Mapping[str, int] | None = None) -> list[np.ndarray]:
        return self.extractor.extract(funcs, shape_vars)

    def update(self, funcs: Sequence[PrimFunc], run_secs: Sequence[float | None], *,
               group: str = "default", shape_vars: Mapping[str, int] | None = None) -> None:
        self.update_features(self.features(funcs, shape_vars), run_secs, group=group)

    def predict(self, funcs: Sequence[PrimFunc], *, group: str = "default",
                shape_vars: Mapping[str, int] | None = None) -> np.ndarray:
        return self.predict_features(self.features(funcs, shape_vars), group=group)

    def update_features(self, features: Sequence[np.ndarray],
                        run_secs: Sequence[float | None], *, group: str = "default") -> None:
        raise NotImplementedError

    def predict_features(self, features: Sequence[np.ndarray], *,
                         group: str = "default") -> np.ndarray:
        raise NotImplementedError

    def save(self, path: str | os.PathLike) -> None:
        raise NotImplementedError

    def load(self, path: str | os.PathLike) -> None:
        raise NotImplementedError


class RandomModel(CostModel):
    """Uniform random scores (a baseline; learns nothing).

    Examples
    --------
    >>> m = RandomModel(seed=0)
    >>> m.predict_features([np.zeros((1, NUM_FEATURES))] * 3).shape
    (3,)
    """

    def __init__(self, seed: int | None = None, extractor: PerStoreFeature | None = None):
        super().__init__(extractor)
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.num_updates = 0

    def update_features(self, features, run_secs, *, group="default") -> None:
        if len(features) != len(run_secs):
            raise ValueError(f"update: {len(features)} candidates but {len(run_secs)} results")
        self.num_updates += len(features)

    def predict_features(self, features, *, group="default") -> np.ndarray:
        return self.rng.uniform(size=len(features))

    def save(self, path) -> None:
        state = {"version": COST_MODEL_VERSION, "kind": "random", "seed": self.seed,
                 "num_updates": self.num_updates,
                 "rng": self.rng.bit_generator.state}
        atomic_write(path, json.dumps(state), durable=True)

    def load(self, path) -> None:
        with open(path, "rb") as f:
            state = json.loads(f.read())
        if state.get("kind") != "random":
            raise ValueError(f"{path}: not a RandomModel file (kind {state.get('kind')!r})")
        self.seed = state["seed"]
        self.num_updates = state["num_updates"]
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = state["rng"]


class XGBModel(CostModel):
    """Gradient-boosted trees over per-store features, trained online (see the module
    docstring).

    Parameters
    ----------
    loss : "rank" | "reg"
        Pairwise ranking loss (default) or TVM's throughput-weighted squared error.
    min_samples : int
        Valid measurements of a workload before its predictions come from the trees; until
        then they come from the analytic model.
    num_boost_round, max_depth, eta : xgboost parameters.
    nthread : int, optional
        Threads xgboost uses (default: one below 20000 feature rows, where more threads only
        spin against the builder and runner processes; else the cores, at most 4).
    seed : int

    Examples
    --------
    >>> model = XGBModel(loss="rank")                         # doctest: +SKIP
    >>> model.update_features(feats, secs, group="w0")        # doctest: +SKIP
    >>> order = np.argsort(-model.predict_features(feats, group="w0"))   # doctest: +SKIP
    """

    def __init__(self, loss: str = "rank", min_samples: int = 8, num_boost_round: int = 120,
                 max_depth: int = 8, eta: float = 0.2, nthread: int | None = None,
                 seed: int = 0, prior_weight: float = 1.0,
                 extractor: PerStoreFeature | None = None):
        super().__init__(extractor)
        self.prior_weight = float(prior_weight)
        if loss not in ("rank", "reg"):
            raise ValueError(f"XGBModel: loss must be 'rank' or 'reg', got {loss!r}")
        self.loss = loss
        self.min_samples = int(min_samples)
        self.num_boost_round = int(num_boost_round)
        self.max_depth = int(max_depth)
        self.eta = float(eta)
        self.nthread = nthread
        self.seed = seed
        self.booster = None
        # the training data: one entry per measured candidate
        self._feats: list[np.ndarray] = []
        self._secs: list[float] = []
        self._groups: list[str] = []

    # -- data ---------------------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        return len(self._feats)

    def _valid_count(self, group: str) -> int:
        return sum(1 for g, s in zip(self._groups, self._secs) if g == group and _valid_secs(s))

    def _labels(self) -> np.ndarray:
        """Normalized throughput: best seconds of the group / seconds (0 when failed)."""
        best: dict[str, float] = {}
        for g, s in zip(self._groups, self._secs):
            if _valid_secs(s):
                best[g] = min(best.get(g, math.inf), s)
        return np.array([best[g] / s if _valid_secs(s) else 0.0
                         for g, s in zip(self._groups, self._secs)])

    def update_features(self, features, run_secs, *, group="default") -> None:
        if len(features) != len(run_secs):
            raise ValueError(f"update: {len(features)} candidates but {len(run_secs)} results")
        for f, s in zip(features, run_secs):
            f = np.asarray(f, dtype=np.float32)
            if f.ndim != 2 or f.shape[1] != NUM_FEATURES:
                raise ValueError(f"update: a feature matrix must be (n_stores, {NUM_FEATURES}), "
                                 f"got {f.shape}")
            self._feats.append(f)
            self._secs.append(float(s) if _valid_secs(s) else math.inf)
            self._groups.append(str(group))
        self._train()

    def _threads(self, rows: int) -> int:
        if self.nthread:
            return int(self.nthread)
        return 1 if rows < 20000 else min(4, os.cpu_count() or 1)

    # -- training -----------------------------------------------------------------------------
    def _train(self) -> None:
        xgb = import_optional("xgboost", "the XGBoost cost model (metaschedule.XGBModel)")
        labels = self._labels()
        if not np.any(labels > 0):
            self.booster = None
            return
        rows = np.concatenate(self._feats)
        counts = np.array([f.shape[0] for f in self._feats])
        owner = np.repeat(np.arange(len(self._feats)), counts)
        groups = np.array(self._groups)
        dtrain = xgb.DMatrix(rows, nthread=self._threads(len(rows)))
        loss = self.loss
        if loss == "rank":
            # the trees learn a correction of the analytic model's order
            dtrain.set_base_margin(self._margin(self._feats, counts, owner))

        def pack_sum(preds: np.ndarray) -> np.ndarray:
            return np.bincount(owner, weights=preds, minlength=len(counts))

        def objective(preds, _dtrain):
            s = pack_sum(preds)
            if loss == "reg":
                w = np.maximum(labels, 0.05)
                g = (s - labels) * w
                h = w
            else:
                g, h = _pairwise_grad(s, labels, groups)
            return g[owner], h[owner]

        params = {"max_depth": self.max_depth, "eta": self.eta, "gamma": 1e-3,
                  "min_child_weight": 0, "lambda": 1.0, "subsample": 1.0,
                  "nthread": self._threads(len(rows)), "seed": self.seed, "base_score": 0.0,
                  "verbosity": 0, "tree_method": "hist", "disable_default_eval_metric": 1}
        # fewer rounds while the data is small: the trees would only memorize it
        rounds = int(min(self.num_boost_round, 30 + len(counts) // 2))
        self.booster = xgb.train(params, dtrain, num_boost_round=rounds, obj=objective)

    # -- prediction ---------------------------------------------------------------------------
    def predict_features(self, features, *, group="default") -> np.ndarray:
        n = len(features)
        if n == 0:
            return np.zeros(0)
        if self.booster is None or self._valid_count(group) < self.min_samples:
            return self.prior(features)
        xgb = import_optional("xgboost", "the XGBoost cost model (metaschedule.XGBModel)")
        rows = np.concatenate([np.asarray(f, dtype=np.float32) for f in features])
        counts = np.array([f.shape[0] for f in features])
        owner = np.repeat(np.arange(n), counts)
        dmat = xgb.DMatrix(rows, nthread=self._threads(len(rows)))
        if self.loss == "rank":
            dmat.set_base_margin(self._margin(features, counts, owner))
        preds = self.booster.predict(dmat)
        return np.bincount(owner, weights=preds, minlength=n)

    def _margin(self, features, counts, owner) -> np.ndarray:
        """Per-row starting scores whose pack sum is ``prior_weight`` times the prior."""
        prior = self.prior(features) * self.prior_weight
        return (prior / counts)[owner]

    @staticmethod
    def prior(features: Sequence[np.ndarray]) -> np.ndarray:
        """Scores from the analytic model alone: minus the log of the estimated cycles."""
        return np.array([-math.log(max(analytic_cost(f), 1.0)) for f in features])

    # -- persistence ----------------------------------------------------------------------------
    def save(self, path) -> None:
        """Write the model and its training data to one file (``.npz``), atomically."""
        config = {"version": COST_MODEL_VERSION, "kind": "xgb", "loss": self.loss,
                  "min_samples": self.min_samples, "num_boost_round": self.num_boost_round,
                  "max_depth": self.max_depth, "eta": self.eta, "seed": self.seed,
                  "groups": self._groups}
        counts = np.array([f.shape[0] for f in self._feats], dtype=np.int64)
        rows = np.concatenate(self._feats) if self._feats else np.zeros((0, NUM_FEATURES),
                                                                        np.float32)
        booster = np.frombuffer(bytes(self.booster.save_raw("ubj")), dtype=np.uint8) \
            if self.booster is not None else np.zeros(0, np.uint8)
        buf = io.BytesIO()
        config_bytes = np.frombuffer(json.dumps(config).encode(), dtype=np.uint8)
        np.savez_compressed(buf, config=config_bytes, rows=rows, counts=counts,
                            secs=np.array(self._secs, dtype=np.float64), booster=booster)
        atomic_write(path, buf.getvalue(), durable=True)

    def load(self, path) -> None:
        """Read a file written by ``save`` (the model and its training data)."""
        xgb = import_optional("xgboost", "the XGBoost cost model (metaschedule.XGBModel)")
        try:
            data = np.load(os.fspath(path), allow_pickle=False)
            config = json.loads(bytes(data["config"]).decode())
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"{path}: not an XGBModel file ({err})") from None
        if config.get("kind") != "xgb" or config.get("version") != COST_MODEL_VERSION:
            raise ValueError(f"{path}: not an XGBModel file of version {COST_MODEL_VERSION} "
                             f"(kind {config.get('kind')!r}, version {config.get('version')!r})")
        rows, counts = data["rows"], data["counts"]
        if rows.shape[1:] != (NUM_FEATURES,):
            raise ValueError(f"{path}: features of width {rows.shape[1:]} (this tilecraft has "
                             f"{NUM_FEATURES}); retrain the model")
        self.loss = config["loss"]
        self.min_samples = config["min_samples"]
        self.num_boost_round = config["num_boost_round"]
        self.max_depth = config["max_depth"]
        self.eta = config["eta"]
        self.seed = config["seed"]
        self._groups = list(config["groups"])
        self._feats = list(np.split(rows, np.cumsum(counts)[:-1])) if len(counts) else []
        self._secs = [float(s) for s in data["secs"]]
        raw = bytes(data["booster"])
        if raw:
            self.booster = xgb.Booster()
            self.booster.load_model(bytearray(raw))
        else:
            self.booster = None


def _pairwise_grad(s: np.ndarray, y: np.ndarray, groups: np.ndarray,
                   max_group: int = 1500) -> tuple[np.ndarray, np.ndarray]:
    """Gradient and Hessian of the pairwise logistic loss on scores ``s`` for labels ``y``
    (pairs within a group, weighted by the label difference)."""
    g = np.zeros_like(s)
    h = np.zeros_like(s)
    for name in np.unique(groups):
        idx = np.nonzero(groups == name)[0]
        if len(idx) > max_group:  # keep the pair matrix small: the best and a random rest
            rng = np.random.default_rng(len(idx))
            order = np.argsort(-y[idx])
            keep = np.concatenate([order[:max_group // 2],
                                   rng.choice(order[max_group // 2:], max_group - max_group // 2,
                                              replace=False)])
            idx = idx[keep]
        ys, ss = y[idx], s[idx]
        dy = ys[:, None] - ys[None, :]           # > 0: i should score above j
        w = np.where(dy > 1e-9, dy, 0.0)
        if not w.any():
            continue
        z = ss[:, None] - ss[None, :]
        p = 1.0 / (1.0 + np.exp(np.clip(z, -30, 30)))   # sigma(-(s_i - s_j))
        gij = -w * p                              # d loss / d s_i for pairs where i > j
        hij = w * p * (1.0 - p)
        norm = max(w.sum(), 1e-12) / len(idx)     # the same scale whatever the group size
        g[idx] += (gij.sum(axis=1) - gij.sum(axis=0)) / norm
        h[idx] += (hij.sum(axis=1) + hij.sum(axis=0)) / norm
    return g, np.maximum(h, 1e-6)


__all__ = ["CostModel", "XGBModel", "RandomModel"]
