"""benchmarks.gpu_dense without a CUDA GPU: its layer functions against its numpy reference
(OpenCL: PoCL in CI), its GEMM-rule switch (what each variant builds, and that it restores the
defaults), its headline. No timing is asserted."""
import numpy as np
import pytest

from benchmarks import gpu_dense as bench
from capabilities import opencl_device
from tilecraft.relax.backend.gpu import gemm
from tilecraft.tensorir.transform import compact


@pytest.mark.parametrize("epilogue", ["bias", "residual", "gelu_erf", "gelu_tanh"])
def test_layer_function_matches_its_reference(epilogue):
    from tilecraft import relax, targets
    dev, target = opencl_device()
    rng = np.random.default_rng(3)
    mod, w, b = bench._module(32, 64, epilogue, rng)
    vm = relax.VirtualMachine(relax.build(mod, target, upper_bounds={"n": 4}), dev)
    for n in (1, 3):
        x = rng.standard_normal((n, bench.SEQ, 32)).astype("float32")
        r = rng.standard_normal((n, bench.SEQ, 64)).astype("float32")
        args = [targets.array(x, dev)] + ([targets.array(r, dev)] if epilogue == "residual"
                                          else [])
        got = vm["main"](*args).numpy()
        np.testing.assert_allclose(got, bench._reference(x, r, w, b, epilogue), rtol=1e-4,
                                   atol=1e-4)


def test_variants_build_the_old_and_the_new_rule_and_restore_the_defaults():
    """BERT's 768 -> 768 layer for the GPU tile (``Target("opencl")``, no device): the old rule's
    row tile unpadded (64 x 16 = 1024 floats) and 64 x 128 tiles at batch 16 (three schedules);
    the new one padded (1084) and 64 x 64 from batch 4 on (two). Both add split-K's two kernels
    (partials, then their sum) below batch 3; ``nosplitk`` is the new rule without them."""
    saved = gemm.GEMM_BALANCE_MPS, compact._compact_strides
    mod, _, _ = bench._module(768, 768, "bias", np.random.default_rng(0))
    src = {v: bench.build(mod, "opencl", v).kernel_module.get_source()
           for v in ("old", "new", "nosplitk")}
    assert (gemm.GEMM_BALANCE_MPS, compact._compact_strides) == saved
    assert "x_shared[1024]" in src["old"] and "x_shared[1084]" not in src["old"]
    assert "x_shared[1084]" in src["new"] and "x_shared[1024]" not in src["new"]
    counts = {v: s.count("__kernel") for v, s in src.items()}
    assert counts == {"old": 3 + 2, "new": 2 + 2, "nosplitk": 2}
    with pytest.raises(ValueError, match="unknown variant 'fast'"):
        bench.build(mod, "opencl", "fast")


def test_headline_sums_each_variant_at_the_largest_batch():
    from benchmarks.results_table import _gpu_dense
    row = {"target": "opencl", "count": 1, "batch": 16}
    doc = {"rows": [{**row, "variant": "old", "layer": "a", "tilecraft_ms": 2.0,
                     "torch_ms": 1.0, "vs_torch": 0.5, "count": 3},
                    {**row, "variant": "old", "layer": "b", "tilecraft_ms": 1.0,
                     "torch_ms": 1.0, "vs_torch": 1.0},
                    {**row, "variant": "new", "layer": "a", "tilecraft_ms": 1.0,
                     "torch_ms": 1.0, "vs_torch": 1.0},
                    {**row, "variant": "new", "batch": 1, "layer": "a", "tilecraft_ms": 9.0,
                     "torch_ms": 1.0, "vs_torch": 0.1}]}
    old, new = _gpu_dense(doc)
    assert old.ratio == pytest.approx(4.0 / 7.0) and "'old'" in old.figure
    assert new.ratio == pytest.approx(1.0) and "batch 16" in new.figure


def test_accumulators_name_each_kernels_register_tile():
    mod, _, _ = bench._module(768, 768, "bias", np.random.default_rng(0))
    # below batch 3 split-K's two kernels come first: the partials' 4 x 4 tile, then the sum
    # (4 outputs a thread); then the batch-1, nominal (and large) tiles
    assert bench.accumulators(bench.build(mod, "opencl", "old")) == [16, 4, 2, 16, 32]
    assert bench.accumulators(bench.build(mod, "opencl", "new")) == [16, 4, 2, 16]
    assert bench.accumulators(bench.build(mod, "opencl", "nosplitk")) == [2, 16]
