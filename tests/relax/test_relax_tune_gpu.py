"""relax.tune on OpenCL (PoCL, ``opencl -device=cpu``), then relax.build with the database: a
tiny MLP's kernels are tuned on the device and the tuned executable matches numpy."""
import os
import sys

import numpy as np
import pytest

from tilecraft import relax
from tilecraft import targets
from mlputil import mlp_module
from tilecraft.metaschedule import LocalRunner, apply_best

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "targets"))
from opencl_testutil import opencl_device  # noqa: E402

SIZES = (32, 64, 16)
TARGET = "opencl -device=cpu"


def tiny_mlp():
    return mlp_module(SIZES)


def test_relax_tune_then_build_opencl(tmp_path):
    dev = opencl_device()
    mod, reference = tiny_mlp()
    runner = LocalRunner(timeout_sec=20, number=2, repeat=1, min_repeat_ms=0,
                         enable_cpu_cache_flush=False)
    db = relax.tune(mod, TARGET, max_trials=4, work_dir=tmp_path, runner=runner,
                    upper_bounds={"batch": 16}, num_trials_per_iter=2,
                    search={"population_size": 8, "genetic_num_iters": 1}, seed=0,
                    progress=False)
    assert len(db) == 4
    tasks = relax.extract_tasks(mod, TARGET, upper_bounds={"batch": 16})
    assert all(apply_best(db, t.func, TARGET) is not None for t in tasks)   # each got trials
    exe = relax.build(mod, targets.Target(TARGET), database=db, upper_bounds={"batch": 16})
    vm = relax.VirtualMachine(exe, dev)
    rng = np.random.default_rng(1)
    for batch in (1, 16):
        xv = rng.uniform(-1, 1, (batch, SIZES[0])).astype("float32")
        out = vm["main"](targets.array(xv, dev)).numpy()
        np.testing.assert_allclose(out, reference(xv), rtol=1e-4, atol=1e-4)
