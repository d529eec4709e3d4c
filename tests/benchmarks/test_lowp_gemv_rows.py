"""benchmarks/lowp.py's ``gemv-gpu-layers`` rows on the CI back ends (PoCL, lavapipe) at small
shapes: each row has the int4 GEMV's time, its codes' stream, its launch shape and an error
against the dequantized weight beside the float32 GEMV's (the device run is the lead's; no
timing is asserted)."""
import pytest

from benchmarks import lowp
from capabilities import gpu_device


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_gemv_rows_report_the_int4_codes_stream(kind, monkeypatch):
    gpu_device(kind)                     # skips, naming why, where the back end is missing
    monkeypatch.setattr(lowp, "GEMV_STREAM_BYTES", 1 << 20)
    monkeypatch.setattr(lowp, "GPU_ROUNDS", 1)
    rows = lowp.gemv_gpu_layer_rows(targets_=[kind], shapes=[(256, 33), (96, 40)])
    assert [r["model"] for r in rows] == ["dense 256x33, 1 row", "dense 96x40, 1 row"]
    for r in rows:
        assert "error" not in r and "int4_error" not in r, r
        assert r["int4_us"] > 0 and r["int4_codes_GBps"] > 0
        assert r["int4_GBps"] > r["int4_codes_GBps"]          # the scales stream too
        assert r["int4_rel"] < 1e-5 and r["ours_rel"] < 1e-5
        assert r["int4_tile"].startswith("4 cols x ")
        assert r["int4_vs_ours"] == r["ours_us"] / r["int4_us"]
