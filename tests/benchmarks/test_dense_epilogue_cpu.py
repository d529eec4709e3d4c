"""benchmarks.dense_epilogue_cpu: its rows on a small layer (no timing is asserted)."""
import pytest

pytest.importorskip("scipy", reason="the benchmark's float64 erf is scipy's")

from benchmarks import dense_epilogue_cpu as bench  # noqa: E402


def test_measure_rows():
    rows = bench.measure(k=24, n=80, rounds=1, shape=(2, 7), peer=False)
    assert [r["epilogue"] for r in rows] == list(bench.EPILOGUES)
    for r in rows:
        assert r["ms"] > 0
        assert r["max_abs_err"] < 1e-5, r
    assert rows[0]["extra_ms"] == 0.0
