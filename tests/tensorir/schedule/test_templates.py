"""Kernel templates (``tensorir.schedule.templates``): ``Schedule.apply_template`` replaces the
function by a registered builder's kernel, records the call, and the trace replays (as JSON,
too); a template that does not apply, an unknown name or a builder that changes the function's
parameters is a ``ScheduleError`` that leaves the schedule unchanged."""
import json

import numpy as np
import pytest

from tilecraft.tensorir import te
from tilecraft.tensorir.interpret import interpret
from tilecraft.tensorir.schedule import KernelTemplate, Schedule, ScheduleError, Trace
from tilecraft.tensorir.structural import structural_equal


def _scale():
    A = te.placeholder((64, 32), "float32", "A")
    B = te.compute((64, 32), lambda i, j: A[i, j] * 3.0, "B")
    return te.create_prim_func([A, B])


def _split_build(func, target, params):
    """A template: B's inner loop split by ``params["inner"]`` and vectorized."""
    if 32 % params["inner"]:
        raise ValueError(f"inner {params['inner']} does not divide 32")
    sch = Schedule(func)
    _, j = sch.get_loops(sch.get_block("B"))
    _, ji = sch.split(j, [None, params["inner"]])
    sch.vectorize(ji)
    return sch.func.with_attr("template_target", target)


KernelTemplate.register("test_split_vectorize", _split_build, override=True)


def test_apply_template_is_traced_and_replays():
    func = _scale()
    sch = Schedule(func)
    sch.apply_template("test_split_vectorize", "llvm", {"inner": 8})
    inst, = sch.trace.instructions
    assert inst.kind == "apply_template"
    assert sch.func.attr_dict["template_target"] == "llvm"
    assert structural_equal(sch.func, _split_build(func, "llvm", {"inner": 8}))
    stored = Trace.from_json(json.loads(json.dumps(sch.trace.to_json())))
    assert structural_equal(stored.apply(func).func, sch.func)
    a = np.random.default_rng(0).standard_normal((64, 32)).astype("float32")
    b = np.zeros((64, 32), "float32")
    interpret(sch.func, a, b)
    np.testing.assert_allclose(b, a * 3.0, rtol=1e-6)


def test_refusals_name_the_problem_and_leave_the_schedule_unchanged():
    func = _scale()
    sch = Schedule(func)
    with pytest.raises(ScheduleError, match="apply_template: template 'test_split_vectorize' "
                                            "at .*inner 5 does not divide 32"):
        sch.apply_template("test_split_vectorize", "llvm", {"inner": 5})
    with pytest.raises(ScheduleError, match="no kernel template 'nope'"):
        sch.apply_template("nope", "llvm", {})
    with pytest.raises(ScheduleError, match="params must be a dict"):
        sch.apply_template("test_split_vectorize", "llvm", [8])
    KernelTemplate.register("test_drops_a_param", lambda f, t, p: f.replace(
        params=f.params[:-1], buffer_map=dict(f.buffer_map[:-1])), override=True)
    with pytest.raises(ScheduleError, match="other parameters"):
        sch.apply_template("test_drops_a_param", "llvm", {})
    assert structural_equal(sch.func, func) and not sch.trace.instructions


def test_register_refuses_a_second_template_of_a_name():
    with pytest.raises(Exception, match="already registered"):
        KernelTemplate.register("test_split_vectorize", _split_build)
