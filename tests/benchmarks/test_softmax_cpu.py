"""benchmarks.softmax_cpu: the symbolic scores softmax against numpy and one row at a small size
(no timing is asserted)."""
import numpy as np

from benchmarks import softmax_cpu as bench


def test_scores_function_matches_numpy():
    f = bench.scores_function(("n", 4, "s", "s"), {"n": 2, "s": 40})
    rng = np.random.default_rng(0)
    for n, s in ((1, 3), (2, 40)):
        x = rng.normal(0, 8, (n, 4, s, s)).astype("float32")
        np.testing.assert_allclose(f(x).numpy(), bench.reference(x), rtol=2e-6, atol=1e-12)


def test_measure_row():
    symbolic = bench.scores_function(("n", 4, "s", "s"), {"n": 2, "s": 40})
    row = bench.measure(symbolic, 1, 9, rounds=1)
    assert row["size"] == "1 x 9"
    for key in ("symbolic_ms", "concrete_ms", "ratio"):
        assert row[key] > 0, key
