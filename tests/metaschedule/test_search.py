"""EvolutionarySearch: distinct unmeasured candidates, a database-seeded population, ε-greedy
picks; measure_candidates checks every candidate against the unscheduled function and rejects
(and logs) a wrong one."""
import logging

import numpy as np
import pytest

from tilecraft.targets import Target
from tilecraft.tensorir import Schedule, te
from tilecraft.metaschedule import Database
from tilecraft.metaschedule.builder import LocalBuilder
from tilecraft.metaschedule.cost_model import RandomModel, XGBModel
from tilecraft.metaschedule.database import workload_hash
from tilecraft.metaschedule.errors import TuneError
from tilecraft.metaschedule.runner import LocalRunner
from tilecraft.metaschedule.search import (Candidate, EvolutionarySearch, MeasureResult, TuneContext,
                                 compute_reference, measure_candidates)

from search_testutil import gemm_func, small_space

LLVM = Target("llvm")


def fast_runner():
    return LocalRunner(number=1, repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False)


def make_ctx(tmp_path, func=None, model=None, seed=0):
    func = func if func is not None else gemm_func(64, 64, 64)
    ctx = TuneContext(func, LLVM, small_space(), model or XGBModel(), Database(tmp_path),
                      name="gemm", seed=seed)
    ctx.reference = compute_reference(func, ctx.args_info, ctx.seed)
    return ctx


def test_reference_is_the_unscheduled_function(tmp_path):
    ctx = make_ctx(tmp_path)
    from tilecraft.metaschedule import random_inputs
    a, b, _ = random_inputs(ctx.args_info, ctx.seed)
    ref, = ctx.reference
    np.testing.assert_allclose(ref, a @ b, rtol=1e-4, atol=1e-4)


def test_candidates_distinct_unmeasured_and_ranked(tmp_path):
    ctx = make_ctx(tmp_path)
    search = EvolutionarySearch(population_size=12, genetic_num_iters=2, eps_greedy=0.0)
    search.initialize(ctx)
    assert search.tunable and len(search.spaces) >= 1
    batch = search.generate_candidates(6)
    assert len(batch) == 6
    hashes = [c.shash for c in batch]
    assert len(set(hashes)) == 6
    assert all(workload_hash(c.sch.func) == c.shash for c in batch)
    # without ε-greedy picks the batch is the best-scored, in order
    scores = [c.score for c in batch]
    assert scores == sorted(scores, reverse=True)
    assert search.stats["mutated"] > 0
    # once measured, the candidates are not proposed again
    results = [MeasureResult([1e-3 * (i + 1)]) for i in range(6)]
    search.notify(batch, results)
    again = search.generate_candidates(6)
    assert not set(hashes) & {c.shash for c in again}


def test_eps_greedy_takes_random_samples(tmp_path):
    ctx = make_ctx(tmp_path, model=RandomModel(seed=0))
    search = EvolutionarySearch(population_size=16, genetic_num_iters=1, eps_greedy=0.5)
    search.initialize(ctx)
    batch = search.generate_candidates(8)
    assert len(batch) == 8
    assert sum(c.source == "random" for c in batch) >= 4


def test_measure_checks_every_candidate_and_rejects_wrong(tmp_path, caplog):
    ctx = make_ctx(tmp_path)
    search = EvolutionarySearch(population_size=8, genetic_num_iters=1)
    search.initialize(ctx)
    good = search.generate_candidates(2)
    # a fast but wrong "candidate": C = A @ B + 1, scheduled like the others
    A = te.placeholder((64, 64), "float32", "A")
    B = te.placeholder((64, 64), "float32", "B")
    k = te.reduce_axis((0, 64), "k")
    C = te.compute((64, 64), lambda i, j: te.sum(A[i, k] * B[k, j] + 1.0, axis=k), "C")
    wrong_func = te.create_prim_func([A, B, C])
    wrong = Candidate(Schedule(wrong_func), workload_hash(wrong_func),
                      search.extractor.extract_one(wrong_func))
    with caplog.at_level(logging.WARNING, logger="metaschedule"):
        with LocalBuilder() as builder, fast_runner() as runner:
            results = measure_candidates(ctx, good + [wrong], builder, runner)
    assert [r.ok for r in results] == [True, True, False]
    assert results[2].wrong and "wrong result" in results[2].error
    assert any("rejected a wrong candidate" in r.message for r in caplog.records)
    # every candidate has a record; the wrong one is never the best
    recs = ctx.database.get_all_tuning_records()
    assert len(recs) == 3 and sum(r.ok for r in recs) == 2
    best = ctx.database.get_top_k(ctx.workload, LLVM, 5)
    assert len(best) == 2 and all(r.error is None for r in best)
    assert "wrong result" in [r for r in recs if not r.ok][0].error
    # a second search starts from the database: its best is in the population, not re-measured
    search2 = EvolutionarySearch(population_size=8, genetic_num_iters=1, init_measured_ratio=0.5)
    search2.initialize(make_ctx(tmp_path, seed=1))
    seeded = search2._from_database(4)
    assert {c.shash for c in seeded} == {c.shash for c in good}
    assert all(c.source == "database" for c in seeded)
    nxt = search2.generate_candidates(4)
    assert not {c.shash for c in good} & {c.shash for c in nxt}


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="population_size"):
        EvolutionarySearch(population_size=0)
    with pytest.raises(ValueError, match="probabilities"):
        EvolutionarySearch(eps_greedy=1.5)
    with pytest.raises(TuneError, match="before initialize"):
        EvolutionarySearch().generate_candidates(4)
    search = EvolutionarySearch(population_size=4)
    search.initialize(make_ctx(tmp_path))
    with pytest.raises(ValueError, match="2 candidates but 1 results"):
        search.notify(search.generate_candidates(2), [MeasureResult([1e-3])])
