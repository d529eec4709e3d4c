"""``benchmarks.gpu_tc_conv``'s pieces that need no GPU: the layer list, the variants, the
totals and the numpy reference (the benchmark's smoke run, ``TILECRAFT_TC_CONV_SMOKE=1``,
checks the kernels themselves on PoCL)."""
import numpy as np
import pytest

from benchmarks import gpu_tc_conv as bench
from benchmarks.results_table import headlines


def test_layers_are_resnet50s_53_convolutions():
    assert sum(layer[-1] for layer in bench.LAYERS) == 53
    assert len({layer[0] for layer in bench.LAYERS}) == len(bench.LAYERS)


def test_variants():
    assert bench.variant_env("tc") == {}
    assert bench.variant_env("nohoist") == {"TILECRAFT_TC_GATHER_PLAN": "0"}
    assert bench.variant_env("onekernel") == {"TILECRAFT_TC_COLUMN_DISPATCH": "0"}
    assert bench.variant_env("small:64x32x32x16") == {"TILECRAFT_TC_SMALL_TILE": "64x32x32x16"}
    assert bench.variant_env("tile:64x64x32x32") == {"TILECRAFT_TC_TILE": "64x64x32x32"}
    assert bench.variant_env("oihw") == {"TILECRAFT_TC_CONV_OHWI": "0"}
    with pytest.raises(ValueError, match="unknown variant"):
        bench.variant_env("fast")


def test_weight_layout(monkeypatch):
    """The variants' weights as ConvWeightOHWI would store them: OHWI for a 3 x 3 on 16k
    channels (not ``oihw``, not the 7 x 7 stem's 3 channels, not a 1 x 1)."""
    monkeypatch.delenv("TILECRAFT_TC_CONV_OHWI", raising=False)
    assert bench.weight_layout("tc", 64, 3) == "OHWI"
    assert bench.weight_layout("onekernel", 512, 3) == "OHWI"
    assert bench.weight_layout("oihw", 64, 3) == "OIHW"
    assert bench.weight_layout("tc", 3, 7) == "OIHW"
    assert bench.weight_layout("tc", 256, 1) == "OIHW"


def test_kernel_at():
    tiles = "32x32x16x16 split-K 6 below 196 columns, else 64x64x32x32"
    assert bench.kernel_at(tiles, 49) == "32x32x16x16 split-K 6"
    assert bench.kernel_at(tiles, 196) == "64x64x32x32"
    assert bench.kernel_at("32x64x32x32", 5) == "32x64x32x32"


def test_totals_and_headline():
    rows = [{"layer": "a", "batch": 1, "count": 2, "tc_ms": 1.0, "fp32_ms": 3.0,
             "onekernel_ms": 2.0},
            {"layer": "b", "batch": 1, "count": 1, "tc_ms": 2.0, "fp32_ms": 2.0,
             "torch_fp16_ms": 1.0, "onekernel_ms": 2.0}]
    total, = bench.totals(rows)
    assert total["count"] == 3 and total["tc_ms"] == 4.0 and total["fp32_ms"] == 8.0
    assert total["tc_vs_onekernel"] == 1.5
    assert "torch_fp16_ms" not in total          # not timed in every layer
    assert total["tc_vs_fp32"] == 2.0
    lines = headlines("gpu_tc_conv", {"rows": rows + [total]})
    assert [h.ratio for h in lines] == [2.0]


def test_reference_against_direct_sum():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 5, 5))
    w = rng.standard_normal((4, 3, 3, 3))
    b = rng.standard_normal(4)
    got = bench.reference(x, w, b, 2, 1)
    p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((2, 4, 3, 3))
    for i in range(3):
        for j in range(3):
            ref[:, :, i, j] = np.einsum("nchw,ochw->no", p[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3], w)
    np.testing.assert_allclose(got, np.maximum(ref + b.reshape(1, -1, 1, 1), 0), rtol=1e-12)
