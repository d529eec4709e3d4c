"""Accuracy of the inline float32 math of the LLVM back end (targets/llvm/intrinsics.py).

exp, log, tanh and erf are polynomials emitted as vector code. Each is compiled for the host
(on AVX-512, exp scales through ``vscalefps``), for a 256-bit target (the exponent-bit path) and
as a scalar loop, and compared with float64 references in units in the last place, over random
points of the whole range, subnormals and the special values.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.tensorir import Schedule, te

TARGETS = {
    "host": "llvm",
    "avx2": "llvm -mcpu=haswell",   # vector_width 256: exp scales by exponent bits
}
MAX_ULP = {"exp": 1.0, "log": 1.0, "tanh": 2.0, "erf": 2.0}

_erf64 = np.frompyfunc(math.erf, 1, 1)


def erf_reference(x: np.ndarray) -> np.ndarray:
    return _erf64(x.astype(np.float64)).astype(np.float64)


REFERENCE = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "erf": erf_reference}
TE_OP = {"exp": te.exp, "log": te.log, "tanh": te.tanh, "erf": te.erf}

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-40, 1.17549435e-38,
                    1e-30, 0.5, 1.0, -1.0, 2.0, 0.625, 0.62499, 0.921875, 0.9218749, 3.9, 4.0,
                    4.5, 10.0, -10.0, 30.0, -30.0, 88.0, 88.72283935546875, 88.7228394,
                    88.73, 89.0, 100.0, -86.0, -87.3, -100.0, -103.9, -104.0, -110.0, -1e30,
                    1e30, 3.4028235e38], np.float32)


def _build(op: str, target: str, vectorized: bool):
    n = te.var("n")
    a = te.placeholder((n,), "float32", "A")
    b = te.compute((n,), lambda i: TE_OP[op](a[i]), "B")
    sch = Schedule(te.create_prim_func([a, b]))
    if vectorized:
        (i,) = sch.get_loops(sch.get_block("B"))
        sch.vectorize(i)
    return targets.build(sch.mod, target)


def _inputs(op: str, rng) -> np.ndarray:
    if op == "exp":
        parts = [rng.uniform(-104, 89, 60000), rng.uniform(-1, 1, 20000)]
    elif op == "log":
        bits = rng.integers(1, 0x7F800000, 60000).astype(np.uint32)   # every positive finite
        sub = rng.integers(1, 1 << 23, 5000).astype(np.uint32)          # subnormals
        parts = [bits.view(np.float32), sub.view(np.float32), rng.uniform(0.5, 2, 20000)]
    elif op == "tanh":
        parts = [rng.uniform(-10, 10, 40000), rng.uniform(-1, 1, 20000),
                 rng.uniform(-1e-3, 1e-3, 5000)]
    else:
        parts = [rng.uniform(-5, 5, 40000), rng.uniform(-1.2, 1.2, 20000),
                 rng.uniform(-1e-3, 1e-3, 5000)]
    return np.concatenate([np.asarray(p, np.float32) for p in parts] + [SPECIAL])


def ulp_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in float32 ulps of ref (0 where both are the same inf or both NaN)."""
    with np.errstate(all="ignore"):
        ref32 = ref.astype(np.float32)
        spacing = np.spacing(np.maximum(np.abs(ref32), np.float32(2.0 ** -126)))
        err = np.abs(got.astype(np.float64) - ref) / spacing.astype(np.float64)
    err[got == ref32] = 0
    err[np.isnan(got) & np.isnan(ref)] = 0
    return err


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("op", sorted(MAX_ULP))
def test_fast_math_accuracy_in_ulps(op, target, rng):
    x = _inputs(op, rng)
    mod = _build(op, TARGETS[target], vectorized=True)
    got = np.empty_like(x)
    mod["main"](x, got)
    with np.errstate(all="ignore"):
        ref = REFERENCE[op](x.astype(np.float64))
    err = ulp_error(got, ref)
    worst = int(err.argmax())
    assert err.max() <= MAX_ULP[op], (op, target, x[worst], got[worst], ref[worst], err.max())
    # NaN exactly where the reference is NaN
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))


@pytest.mark.parametrize("op", sorted(MAX_ULP))
def test_fast_math_scalar_loop_matches_vector(op, rng):
    # the same polynomial on scalars (a serial loop) and on vectors gives the same bits
    x = _inputs(op, rng)[::7].copy()
    scalar = _build(op, "llvm", vectorized=False)
    vector = _build(op, "llvm", vectorized=True)
    a, b = np.empty_like(x), np.empty_like(x)
    scalar["main"](x, a)
    vector["main"](x, b)
    np.testing.assert_array_equal(a.view(np.uint32)[~np.isnan(a)],
                                  b.view(np.uint32)[~np.isnan(a)])
    assert np.isnan(b[np.isnan(a)]).all()


SPECIAL_INPUTS = {
    "exp": [0.0, -0.0, np.inf, -np.inf, np.nan, 89.0, 88.72283935546875, 88.72283172607422,
            -87.0, -100.0, -103.5, -104.0, -1e30, 1e30],
    "log": [0.0, -0.0, -1.0, -np.inf, np.inf, np.nan, 1.0, 1e-45, 1.17549435e-38, 2.0,
            3.4028235e38],
    "tanh": [0.0, -0.0, np.inf, -np.inf, np.nan, 20.0, -20.0, 1e-30, 0.625],
    "erf": [0.0, -0.0, np.inf, -np.inf, np.nan, 4.0, 3.92, -10.0, 1e-40, 1e-30],
}


def test_special_values():
    # exact where libm is exact (zeros with their sign, infinities, NaN), else within the bound
    for op, values in SPECIAL_INPUTS.items():
        x = np.array(values, np.float32)
        with np.errstate(all="ignore"):
            ref = REFERENCE[op](x.astype(np.float64))
            want = ref.astype(np.float32)
        for target in TARGETS.values():
            got = np.empty_like(x)
            _build(op, target, vectorized=True)["main"](x, got)
            for xi, g, w, r in zip(x, got, want, ref):
                if np.isnan(w):
                    assert np.isnan(g), (op, target, xi, g)
                elif w == 0 or np.isinf(w):
                    assert g == w and np.signbit(g) == np.signbit(w), (op, target, xi, g, w)
                else:
                    err = ulp_error(np.array([g]), np.array([r]))[0]
                    assert err <= MAX_ULP[op], (op, target, xi, g, w, err)


def test_float16_uses_the_float32_polynomials(rng):
    # float16 computes in float32 and rounds once: within an ulp of float16
    n = te.var("n")
    a = te.placeholder((n,), "float16", "A")
    outs = [te.compute((n,), lambda i, f=f: f(a[i]), "B_" + name) for name, f in TE_OP.items()]
    mod = targets.build(te.create_prim_func([a] + outs), "llvm")
    x = rng.uniform(0.01, 4, 4000).astype(np.float16)
    got = [np.empty_like(x) for _ in outs]
    mod["main"](x, *got)
    for name, g in zip(TE_OP, got):
        ref = REFERENCE[name](x.astype(np.float64))
        spacing = np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64)
        assert (np.abs(g.astype(np.float64) - ref) <= spacing).all(), name
