"""benchmarks.nhwc_cold_input: its rows on a small layer (no timing is asserted)."""
import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the benchmark's peer is onnxruntime")

from benchmarks import nhwc_cold_input as bench  # noqa: E402


def test_layer_function_matches_numpy_at_every_batch():
    rng = np.random.default_rng(1)
    w = rng.uniform(-1, 1, (24, 40, 1, 1)).astype("float32")
    b = rng.uniform(-1, 1, (24,)).astype("float32")
    f = bench.layer_function(40, 8, 24, "n", w, b, {"n": 8})
    for n in (1, 3, 8):
        x = rng.uniform(-1, 1, (n, 8, 8, 40)).astype("float32")
        want = np.einsum("nhwc,oc->nhwo", x.astype(np.float64), w[:, :, 0, 0]) + b
        np.testing.assert_allclose(f(x).numpy(), want, rtol=1e-4, atol=1e-4)


def test_measure_row(monkeypatch):
    monkeypatch.setattr(bench, "ROUNDS", 1)
    row = bench.measure(32, 8, 24, cold_bytes=64 << 10)
    assert row["layer"] == "32 -> 24 @ 8x8"
    for key in ("hot_ms", "cold_ms", "batch8_ms", "concrete8_ms", "ort_hot_ms", "ort_cold_ms",
                "ort_batch8_ms", "cold_over_hot", "vs_ort_cold", "vs_ort_batch8",
                "noprefetch_cold_ms", "noprefetch8_ms", "prefetch_gain"):
        assert row[key] > 0, key
    assert row["max_abs_err"] < 1e-3


def test_headline_is_the_geometric_mean_of_the_cold_ratios():
    from benchmarks.results_table import _nhwc_cold_input
    doc = {"rows": [{"layer": "a", "vs_ort_cold": 0.5}, {"layer": "b", "vs_ort_cold": 2.0}]}
    (h,) = _nhwc_cold_input(doc)
    assert h.ratio == pytest.approx(1.0) and h.peer == "onnxruntime"
    assert "lowest 0.50x a" in h.figure and "highest 2.00x b" in h.figure
