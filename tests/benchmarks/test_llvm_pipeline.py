"""benchmarks.llvm_pipeline: the kernels' LLVM IR, their compile times and object identity per
optimization level, and the executables built at each level checked against numpy."""
import numpy as np

from benchmarks.llvm_pipeline import compile_times, kernel_ir, run_times
from tilecraft.models import mlp
from tilecraft.targets import Target


def _small_mlp():
    return mlp(in_features=24, hidden=(40,), out_features=6, batch=3)


def test_kernel_ir_and_object_identity_per_level():
    texts = kernel_ir(_small_mlp().mod, Target("llvm"))
    assert texts and all("define" in text for _, text in texts)
    times = compile_times(texts, [3, 3, 0])
    # the same level twice gives the same objects; -O0 leaves every kernel as it came
    assert times[3]["identical"] == len(texts)
    assert times[0]["identical"] < len(texts)
    assert all(t["optimize"] >= 0.0 and t["emit"] > 0.0 for t in times.values())


def test_run_times_checks_each_level_against_the_first():
    model = _small_mlp()
    inputs = model.make_inputs(np.random.default_rng(0), batch=3)
    res = run_times(model.mod, inputs, [3, 1], rounds=1)
    for r in res.values():
        assert r["median_ms"] > 0.0 and r["kernel_ms"]
    # no fast-math and the fused multiply-adds tagged by us: the levels agree
    assert res[1]["max_abs_diff"] <= 1e-5 * float(np.max(np.abs(model.reference(*inputs))))
