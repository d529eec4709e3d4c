"""benchmarks.depthwise_cpu: its layer against numpy and one row on a small layer (no timing is
asserted)."""
import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the benchmark's peer is onnxruntime")

from benchmarks import depthwise_cpu as bench  # noqa: E402


@pytest.mark.parametrize("stride", [1, 2])
def test_layer_function_matches_numpy(stride):
    rng = np.random.default_rng(stride)
    c, hw = 40, 9
    w = rng.uniform(-1, 1, (c, 1, 3, 3)).astype("float32")
    b = rng.uniform(-1, 1, (c,)).astype("float32")
    x = rng.uniform(-1, 3, (1, hw, hw, c)).astype("float32")
    got = bench.layer_function(c, hw, stride, w, b)(x).numpy()
    np.testing.assert_allclose(got, bench.reference(x, w, b, stride), rtol=1e-5, atol=1e-5)


def test_measure_row(monkeypatch):
    monkeypatch.setattr(bench, "FLUSH_BYTES", 1 << 20)
    row = bench.measure(32, 10, 2, rounds=1)
    assert row["layer"] == "32 x 10 x 10 / 2"
    for key in ("hot_ms", "cold_ms", "ort_hot_ms", "ort_cold_ms", "gbs_cold"):
        assert row[key] > 0, key
    assert row["max_abs_err"] < 1e-4
