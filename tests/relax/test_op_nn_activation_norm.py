"""relax.op.nn activations, softmax / log_softmax and normalizations: struct info, errors naming
the op, and the kernels against numpy (float64 references)."""
import math

import numpy as np
import pytest

from oputil import run_op
from tilecraft.relax import RelaxError, TensorStructInfo, TupleStructInfo, Var, op
from tilecraft.relax.op import OpPattern, nn

RNG = np.random.default_rng(2)


def rand(shape, dtype="float32", lo=-3.0, hi=3.0):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(int(lo), int(hi) + 1, size=shape).astype(dtype)
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def tvar(name, shape, dtype="float32"):
    return Var(name, TensorStructInfo(shape, dtype))


_erf = np.vectorize(math.erf)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


ACTS = {
    "relu": (nn.relu, lambda x: np.maximum(x, 0)),
    "relu6": (nn.relu6, lambda x: np.clip(x, 0, 6)),
    "gelu": (nn.gelu, lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))),
    "gelu_tanh": (nn.gelu_tanh,
                  lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))),
    "silu": (nn.silu, lambda x: x * _sigmoid(x)),
    "sigmoid": (nn.sigmoid, _sigmoid),
    "softplus": (lambda x: nn.softplus(x, beta=2.0, threshold=5.0),
                 lambda x: np.where(2 * x > 5, x, np.log1p(np.exp(2 * x)) / 2)),
    "leaky_relu": (lambda x: nn.leaky_relu(x, alpha=0.2), lambda x: np.where(x > 0, x, 0.2 * x)),
    "hard_sigmoid": (nn.hard_sigmoid, lambda x: np.clip(x / 6 + 0.5, 0, 1)),
    "hard_swish": (nn.hard_swish, lambda x: x * np.clip(x + 3, 0, 6) / 6),
    "elu": (lambda x: nn.elu(x, alpha=0.5), lambda x: np.where(x > 0, x, 0.5 * np.expm1(x))),
    "selu": (nn.selu, lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772
                                                                 * np.expm1(x))),
}


# ---------------------------------------------------------------------------------------------
# activations

@pytest.mark.parametrize("name", list(ACTS))
def test_activations(name):
    f, ref = ACTS[name]
    a = rand((4, 9), lo=-5, hi=5)
    out, si = run_op(f, [a], symbolic=True)
    assert repr(si) == "Tensor((d0_0, d0_1), 'float32')"
    np.testing.assert_allclose(out, ref(a.astype(np.float64)), rtol=1e-5, atol=2e-6)


def test_activation_dtypes_and_patterns():
    a = rand((10,), "int32", -5, 5)
    out, si = run_op(nn.relu, [a])
    assert si.dtype == "int32"
    np.testing.assert_array_equal(out, np.maximum(a, 0))
    h = rand((16,), "float16")
    out, _ = run_op(nn.gelu, [h])
    assert out.dtype == np.float16
    x64 = h.astype(np.float64)
    np.testing.assert_allclose(out, 0.5 * x64 * (1 + _erf(x64 / math.sqrt(2))), rtol=3e-3,
                               atol=2e-3)
    assert nn.sigmoid(tvar("x", (3,))).op is op.get("relax.sigmoid")
    assert op.get("relax.nn.relu").pattern == OpPattern.ELEMWISE
    assert op.get("relax.nn.softmax").pattern == OpPattern.COMM_REDUCE
    with pytest.raises(RelaxError, match=r"relax\.nn\.gelu: needs a float tensor, got int32"):
        nn.gelu(tvar("i", (3,), "int32"))
    with pytest.raises(RelaxError, match=r"relax\.nn\.leaky_relu: alpha must be a number"):
        nn.leaky_relu(tvar("x", (3,)), alpha="a")


# ---------------------------------------------------------------------------------------------
# softmax

def _softmax(x, axis):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax(log, axis):
    a = rand((3, 4, 5), lo=-4, hi=4)
    f = nn.log_softmax if log else nn.softmax
    out, si = run_op(lambda x: f(x, axis=axis), [a])
    expect = _softmax(a, axis)
    np.testing.assert_allclose(out, np.log(expect) if log else expect, rtol=1e-5, atol=1e-6)


def test_softmax_stable_symbolic_float16():
    a = rand((2, 7), lo=-5, hi=5) + np.float32(500.0)  # exp(500) overflows without the max
    out, si = run_op(nn.softmax, [a], symbolic=True)
    assert repr(si) == "Tensor((d0_0, d0_1), 'float32')"
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, _softmax(a, -1), rtol=1e-4, atol=1e-6)
    out, _ = run_op(nn.log_softmax, [a], symbolic=True)
    np.testing.assert_allclose(out, np.log(_softmax(a, -1)), rtol=1e-4, atol=1e-4)
    h = rand((3, 40), "float16")
    out, _ = run_op(nn.softmax, [h])
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, _softmax(h, -1), rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize("symbolic", [False, True])
def test_softmax_under_a_causal_mask(symbolic):
    # GPT-2's scores: the masked entries are float32's lowest value, whose exp is 0 (its
    # vector exp takes those lanes from 0, so that they make no subnormal intermediates)
    a = rand((2, 3, 37, 37), lo=-6, hi=6)
    masked = np.triu(np.ones((37, 37), bool), 1)
    a = np.where(masked, np.finfo(np.float32).min, a).astype(np.float32)
    out, _ = run_op(lambda x: nn.softmax(x, axis=-1), [a], symbolic=symbolic)
    assert (out[..., masked] == 0).all()
    np.testing.assert_allclose(out, _softmax(a, -1), rtol=1e-5, atol=1e-7)


def test_softmax_errors():
    with pytest.raises(RelaxError, match=r"relax\.nn\.softmax: axis 2 is out of range"):
        nn.softmax(tvar("x", ("n", 4)), axis=2)
    with pytest.raises(RelaxError, match=r"relax\.nn\.log_softmax: needs a float tensor"):
        nn.log_softmax(tvar("i", (4,), "int64"))


# ---------------------------------------------------------------------------------------------
# normalizations

def _norm(x, axes, eps):
    x = x.astype(np.float64)
    m = x.mean(axis=axes, keepdims=True)
    v = x.var(axis=axes, keepdims=True)
    return (x - m) / np.sqrt(v + eps)


def test_batch_norm_inference_and_struct_info():
    x = rand((2, 3, 4, 5))
    gamma, beta = rand((3,)), rand((3,))
    mean, var = rand((3,)), rand((3,), lo=0.5, hi=2.0)
    out, si = run_op(lambda *a: nn.batch_norm(*a, axis=1, epsilon=1e-3),
                     [x, gamma, beta, mean, var])
    assert isinstance(si, TupleStructInfo) and len(si.fields) == 3
    assert si.fields[0].static_shape() == (2, 3, 4, 5) and si.fields[1].static_shape() == (3,)
    c = (1, 3, 1, 1)
    expect = (x - mean.reshape(c)) / np.sqrt(var.reshape(c) + 1e-3) * gamma.reshape(c) + \
        beta.reshape(c)
    np.testing.assert_allclose(out[0], expect, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[1], mean)
    np.testing.assert_array_equal(out[2], var)


def test_batch_norm_training_last_axis():
    x = rand((6, 4))
    gamma, beta = rand((4,)), rand((4,))
    mean, var = rand((4,)), rand((4,), lo=0.5, hi=2.0)
    out, si = run_op(lambda *a: nn.batch_norm(*a, axis=-1, momentum=0.25, training=True,
                                              center=False), [x, gamma, beta, mean, var])
    bm, bv = x.astype(np.float64).mean(0), x.astype(np.float64).var(0)
    np.testing.assert_allclose(out[0], (x - bm) / np.sqrt(bv + 1e-5) * gamma, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(out[1], 0.75 * mean + 0.25 * bm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[2], 0.75 * var + 0.25 * bv, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axes", [-1, [1, 2]])
def test_layer_norm(axes):
    x = rand((2, 3, 8)) + 5.0
    ax = (axes,) if isinstance(axes, int) else tuple(axes)
    pshape = tuple(x.shape[a] for a in ax)
    gamma, beta = rand(pshape), rand(pshape)
    out, si = run_op(lambda *a: nn.layer_norm(*a, axes=axes, epsilon=1e-5), [x, gamma, beta])
    expect = _norm(x, ax, 1e-5) * gamma + beta
    np.testing.assert_allclose(out, expect, rtol=1e-4, atol=1e-4)


def test_layer_norm_symbolic_float16_and_flags():
    x = rand((5, 16))
    gamma, beta = rand((16,)), rand((16,))
    out, si = run_op(lambda *a: nn.layer_norm(*a, axes=-1), [x, gamma, beta],
                     symbolic=[True, False, False])
    assert repr(si) == "Tensor((d0_0, d0_1), 'float32')"
    np.testing.assert_allclose(out, _norm(x, -1, 1e-5) * gamma + beta, rtol=1e-4, atol=1e-4)
    out, _ = run_op(lambda *a: nn.layer_norm(*a, axes=-1, center=False, scale=False),
                    [x, gamma, beta])
    np.testing.assert_allclose(out, _norm(x, -1, 1e-5), rtol=1e-4, atol=1e-4)
    h, gh, bh = rand((3, 64), "float16"), rand((64,), "float16"), rand((64,), "float16")
    out, _ = run_op(lambda *a: nn.layer_norm(*a, axes=-1), [h, gh, bh])
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, _norm(h, -1, 1e-5) * gh + bh, rtol=1e-2, atol=1e-2)


def test_layer_norm_symbolic_gamma_checked_at_run_time():
    x, gamma, beta = rand((2, 4)), rand((4,)), rand((4,))
    out, _ = run_op(lambda *a: nn.layer_norm(*a, axes=-1), [x, gamma, beta], symbolic=True)
    np.testing.assert_allclose(out, _norm(x, -1, 1e-5) * gamma + beta, rtol=1e-4, atol=1e-4)
    with pytest.raises(Exception, match=r"relax\.nn\.layer_norm: dimension d0_1 and dimension "
                                        r"d1_0 must be equal"):
        run_op(lambda *a: nn.layer_norm(*a, axes=-1), [x, rand((5,)), rand((5,))], symbolic=True)


def test_group_norm_nchw_and_nhwc():
    x = rand((2, 6, 3, 4))
    gamma, beta = rand((6,)), rand((6,))
    out, si = run_op(lambda *a: nn.group_norm(*a, num_groups=3), [x, gamma, beta])
    g = x.reshape(2, 3, 2, 3, 4)
    expect = _norm(g, (2, 3, 4), 1e-5).reshape(x.shape) * gamma.reshape(1, 6, 1, 1) + \
        beta.reshape(1, 6, 1, 1)
    np.testing.assert_allclose(out, expect, rtol=1e-4, atol=1e-4)
    xh = rand((2, 3, 4, 8))
    gh, bh = rand((8,)), rand((8,))
    out, _ = run_op(lambda *a: nn.group_norm(*a, num_groups=2, channel_axis=-1, axes=[1, 2]),
                    [xh, gh, bh])
    gg = xh.reshape(2, 3, 4, 2, 4)
    expect = _norm(gg, (1, 2, 4), 1e-5).reshape(xh.shape) * gh + bh
    np.testing.assert_allclose(out, expect, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("axes", [-1, [1, 2]])
def test_rms_norm(axes):
    x = rand((2, 3, 8))
    ax = (axes,) if isinstance(axes, int) else tuple(axes)
    w = rand(tuple(x.shape[a] for a in ax))
    out, si = run_op(lambda *a: nn.rms_norm(*a, axes=axes, epsilon=1e-6), [x, w],
                     symbolic=[True, False])
    assert repr(si) == "Tensor((d0_0, d0_1, d0_2), 'float32')"
    x64 = x.astype(np.float64)
    expect = x64 / np.sqrt((x64 ** 2).mean(axis=ax, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-5)


def test_norm_struct_info_and_errors():
    x = tvar("x", ("n", 6, 8, 8))
    c = tvar("c", (6,))
    assert repr(nn.group_norm(x, c, c, num_groups=2).struct_info) == \
        "Tensor((n, 6, 8, 8), 'float32')"
    bn = nn.batch_norm(x, c, c, c, c).struct_info
    assert repr(bn) == "Tuple(Tensor((n, 6, 8, 8), 'float32'), Tensor((6), 'float32'), " \
                       "Tensor((6), 'float32'))"
    with pytest.raises(RelaxError, match=r"relax\.nn\.batch_norm: moving_mean must have shape "
                                         r"\(8,\)"):
        nn.batch_norm(x, tvar("g", (8,)), tvar("b", (8,)), c, c, axis=-1)
    with pytest.raises(RelaxError, match=r"relax\.nn\.batch_norm: gamma must have shape \(6,\), "
                                         r"got \(7,\)"):
        nn.batch_norm(x, tvar("g", (7,)), c, c, c)
    with pytest.raises(RelaxError, match=r"relax\.nn\.layer_norm: gamma must have shape \(8, 8\)"):
        nn.layer_norm(x, c, c, axes=[-2, -1])
    with pytest.raises(RelaxError, match=r"relax\.nn\.layer_norm: beta has dtype float16"):
        nn.layer_norm(x, tvar("g", (8,)), tvar("b", (8,), "float16"), axes=-1)
    with pytest.raises(RelaxError, match=r"relax\.nn\.group_norm: the channel dim 6 is not "
                                         r"divisible by num_groups=4"):
        nn.group_norm(x, c, c, num_groups=4)
    with pytest.raises(RelaxError, match=r"relax\.nn\.rms_norm: axes 4 is out of range"):
        nn.rms_norm(x, c, axes=4)
    with pytest.raises(RelaxError, match=r"relax\.nn\.layer_norm: needs a float tensor"):
        i = tvar("i", (2, 4), "int32")
        nn.layer_norm(i, i, i)


def test_group_norm_symbolic_channels_checked_at_run_time():
    x, gamma, beta = rand((2, 8, 3)), rand((8,)), rand((8,))
    out, si = run_op(lambda *a: nn.group_norm(*a, num_groups=4), [x, gamma, beta],
                     symbolic=True)
    assert repr(si) == "Tensor((d0_0, d0_1, d0_2), 'float32')"
    expect = _norm(x.reshape(2, 4, 2, 3), (2, 3), 1e-5).reshape(x.shape) * \
        gamma.reshape(1, 8, 1) + beta.reshape(1, 8, 1)
    np.testing.assert_allclose(out, expect, rtol=1e-4, atol=1e-4)
    with pytest.raises(Exception, match=r"relax\.nn\.group_norm: the channel dim d0_1 must be "
                                        r"divisible by num_groups=4"):
        run_op(lambda *a: nn.group_norm(*a, num_groups=4), [rand((2, 6, 3)), rand((6,)),
                                                           rand((6,))], symbolic=True)
