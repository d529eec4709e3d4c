"""Run-time checks: ``relax.op.assert_op`` and the frontends' ``shape_facts``."""
from __future__ import annotations

import numpy as np
import pytest

from tilecraft import relax, targets, tensorir
from tilecraft.relax import BlockBuilder, RelaxError, TensorStructInfo, Var
from tilecraft.relax import op as R
from tilecraft.relax.frontend.shape_facts import ShapeFactError, ShapeFacts
from tilecraft.relax.transform import DeadCodeElimination
from tilecraft.tensorir.expr import max_, min_


def _doubling_with_check(cond_of, fmt):
    n = tensorir.var("n")
    x = Var("x", TensorStructInfo((n, 4), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        bb.emit(R.assert_op(cond_of(n), [n], fmt))
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(R.add(x, x)))
        bb.emit_func_output(gv)
    return bb.get()


def test_assert_op_raises_with_its_message_when_false():
    mod = _doubling_with_check(lambda n: n <= 8, "n = {} exceeds 8")
    # impure: dead-code elimination keeps it though nothing uses its result
    mod = DeadCodeElimination()(mod)
    vm = relax.VirtualMachine(relax.build(mod, "llvm"), targets.cpu(0))
    x = np.random.default_rng(0).standard_normal((5, 4)).astype("float32")
    np.testing.assert_allclose(vm["main"](x).numpy(), x + x)
    with pytest.raises(relax.RuntimeCheckError, match=r"^n = 9 exceeds 8$"):
        vm["main"](np.zeros((9, 4), "float32"))
    assert "R.assert_op" in mod["main"].script()


def test_assert_op_arguments_are_checked():
    n = tensorir.var("n")
    with pytest.raises(RelaxError, match="bool"):
        R.assert_op(relax.PrimValue(n + 1))
    with pytest.raises(RelaxError, match="does not fit"):
        R.assert_op(n < 4, [n], "{} and {}")


def test_shape_facts_check_the_bound_that_makes_dims_equal():
    seq, batch = tensorir.var("seq"), tensorir.var("batch")
    facts = ShapeFacts()
    facts.assume(seq >= 0)
    table = max_(min_(seq, 256), 0)          # a 256-row table sliced by the sequence length
    assert facts.require_equal(table, seq, "node 'Expand_1'")
    assert [c.attr_dict["format"] for c in facts.checks] == [
        "seq = {} exceeds 256, the most this model supports (node 'Expand_1')"]
    # now a fact: a second use needs no second check
    assert not facts.require_equal(min_(seq, 256), seq)
    assert len(facts.checks) == 1
    # the other side of a min: min(seq, 1) == 1 holds for seq >= 1 (a mask's first column)
    assert facts.require_equal(min_(seq, 1), 1, "mask")
    assert facts.checks[-1].attr_dict["format"] == \
        "seq = {} is below 1, the least this model supports (mask)"
    # no bound makes two free dims equal: the equality itself is checked
    assert facts.require_equal(batch, seq * 2, "where {braces} are kept")
    assert facts.checks[-1].attr_dict["format"].endswith("(where {{braces}} are kept)")
    # never true: an error at import, not a check that always fails
    with pytest.raises(ShapeFactError, match="never holds"):
        facts.require(seq < 0, "seq = {} is negative", [seq])


def test_shape_facts_checks_run_first_in_the_function():
    seq = tensorir.var("seq")
    x = Var("x", TensorStructInfo((1, seq), "float32"))
    facts = ShapeFacts()
    facts.assume(seq >= 0)
    facts.require_equal(min_(seq, 16), seq, "position table")
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(R.multiply(x, x)))
        bb.emit_func_output(gv)
    mod = bb.get()
    mod = type(mod)({"main": facts.attach(mod["main"])})
    vm = relax.VirtualMachine(relax.build(mod, "llvm"), targets.cpu(0))
    x16 = np.arange(16, dtype="float32")[None]
    np.testing.assert_allclose(vm["main"](x16).numpy(), x16 * x16)
    with pytest.raises(relax.RuntimeCheckError, match="seq = 17 exceeds 16, the most this "
                                                      "model supports \\(position table\\)"):
        vm["main"](np.zeros((1, 17), "float32"))
