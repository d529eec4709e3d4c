"""A GELU fused into a dense layer's write-back (the erf form, BERT's, and the tanh form,
GPT-2's): on random inputs whose outputs reach well past erf's and tanh's saturation, and on
infinite and NaN outputs (through the bias), the fused kernel matches the float64 formula on
the layer's own pre-activation (the same layer built without the GELU), with erf and tanh from
scipy / numpy in float64."""
import math

import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op

special = pytest.importorskip("scipy.special", reason="scipy gives the float64 erf oracle")

RNG = np.random.default_rng(37)
K, N = 48, 160


def _gelu64(y: np.ndarray) -> np.ndarray:
    y = y.astype(np.float64)
    with np.errstate(invalid="ignore"):
        return 0.5 * y * (1.0 + special.erf(y / math.sqrt(2.0)))


def _gelu_tanh64(y: np.ndarray) -> np.ndarray:
    y = y.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return 0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y ** 3)))


def _build(w: np.ndarray, b: np.ndarray, act: str | None):
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("batch", "seq", K), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.add(bb.emit(op.matmul(x, const(w))), const(b)))
            if act is not None:
                y = bb.emit(getattr(op.nn, act)(y))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    exe = relax.build(bb.get(), "llvm", upper_bounds={"batch": 2, "seq": 16})
    return relax.VirtualMachine(exe, targets.cpu(0))


@pytest.mark.parametrize("act,reference", [("gelu", _gelu64), ("gelu_tanh", _gelu_tanh64)])
def test_fused_gelu_matches_float64(act, reference):
    # weights scaled so the pre-activations span about +-40: both tails of erf / tanh, the
    # polynomial side and the exp side of each; the bias puts +-inf and NaN in some columns
    w = (RNG.standard_normal((K, N)) * 12 / math.sqrt(K)).astype("float32")
    b = RNG.uniform(-3, 3, N).astype("float32")
    b[[3, 70]], b[[5, 90]], b[[7, 150]] = np.inf, -np.inf, np.nan
    plain, fused = _build(w, b, None), _build(w, b, act)
    for batch, seq in ((1, 1), (1, 7), (2, 13), (2, 16)):
        x = RNG.standard_normal((batch, seq, K)).astype("float32")
        y = plain["main"](x).numpy()
        got = fused["main"](x).numpy()
        ref = reference(y)
        assert np.abs(y[np.isfinite(y)]).max() > 20
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        finite = np.isfinite(ref)
        np.testing.assert_array_equal(got[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)])
        # erf / tanh within 2 ulp (at most 1.2e-7 beside 1), times 0.5 |y|, and a few float32
        # roundings of the result
        err = np.abs(got[finite] - ref[finite])
        bound = 1e-6 * np.abs(ref[finite]) + 1.2e-7 * np.abs(y[finite]) + 1e-30
        assert (err <= bound).all(), float((err / bound).max())
