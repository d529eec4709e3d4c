"""LLVM code generation: te kernels compiled for the host and compared with numpy."""
import math
import warnings

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.tensorir import te
from tilecraft.tensorir.schedule import Schedule

UNARY = {
    "exp": (te.exp, np.exp, (-3, 3)),
    "log": (te.log, np.log, (0.1, 5)),
    "sqrt": (te.sqrt, np.sqrt, (0, 5)),
    "rsqrt": (te.rsqrt, lambda x: 1 / np.sqrt(x), (0.1, 5)),
    "tanh": (te.tanh, np.tanh, (-3, 3)),
    "sigmoid": (te.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-5, 5)),
    "erf": (te.erf, np.vectorize(math.erf), (-2, 2)),
    "fabs": (te.abs, np.abs, (-3, 3)),
    "floor": (te.floor, np.floor, (-3, 3)),
    "ceil": (te.ceil, np.ceil, (-3, 3)),
    "round": (te.round, np.round, (-3, 3)),
    "sin": (te.sin, np.sin, (-3, 3)),
    "cos": (te.cos, np.cos, (-3, 3)),
    "exp2": (lambda x: te.call_intrin_like("exp2", x), np.exp2, (-3, 3)),
    "log2": (lambda x: te.call_intrin_like("log2", x), np.log2, (0.1, 5)),
    "trunc": (lambda x: te.call_intrin_like("trunc", x), np.trunc, (-3, 3)),
}


def _intrin(op, x):
    from tilecraft.tensorir.expr import Call
    return Call(x.dtype, op, [x])


te.call_intrin_like = _intrin  # exp2 / log2 / trunc have no te wrapper

TOL = {"float16": (2e-3, 2e-3), "float32": (2e-6, 1e-6), "float64": (1e-12, 1e-12)}


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_every_intrinsic(dtype, rng):
    n = te.var("n")
    inputs, outputs = [], []
    for name, (fte, fnp, (lo, hi)) in UNARY.items():
        A = te.placeholder((n,), dtype, "A_" + name)
        inputs.append((A, lo, hi, fnp))
        outputs.append(te.compute((n,), lambda i, A=A, fte=fte: fte(A[i]), "B_" + name))
    P = te.placeholder((n,), dtype, "P")
    Q = te.placeholder((n,), dtype, "Q")
    POW = te.compute((n,), lambda i: te.pow(P[i], Q[i]), "POW")
    func = te.create_prim_func([t for t, *_ in inputs] + [P, Q] + outputs + [POW])
    mod = targets.build(func, "llvm")
    size = 67
    args, expect = [], []
    for A, lo, hi, fnp in inputs:
        a = rng.uniform(lo, hi, size).astype(dtype)
        if A.name.endswith("round"):
            a[:4] = np.array([0.5, 1.5, -2.5, 2.5], dtype)  # ties go to even, as numpy
        args.append(a)
        expect.append(fnp(a.astype("float64")).astype(dtype))
    p = rng.uniform(0.5, 2, size).astype(dtype)
    q = rng.uniform(-2, 2, size).astype(dtype)
    outs = [np.zeros(size, dtype) for _ in outputs] + [np.zeros(size, dtype)]
    mod["main"](*args, p, q, *outs)
    expect.append(np.power(p.astype("float64"), q.astype("float64")).astype(dtype))
    rtol, atol = TOL[dtype]
    for name, got, want in zip(list(UNARY) + ["pow"], outs, expect):
        np.testing.assert_allclose(got.astype("float64"), want.astype("float64"), rtol=rtol,
                                   atol=atol, err_msg=f"{name} {dtype}")


def test_float16_rounds_every_operation(rng):
    # numpy rounds each float16 operation; so must the compiled code (it computes in float32)
    A = te.placeholder((500,), "float16", "A")
    B = te.placeholder((500,), "float16", "B")
    C = te.compute((500,), lambda i: (A[i] + B[i]) * B[i] - A[i] / B[i], "C")
    mod = targets.build(te.create_prim_func([A, B, C]), "llvm")
    a = rng.uniform(-4, 4, 500).astype("float16")
    b = rng.uniform(0.5, 4, 500).astype("float16")
    c = np.zeros(500, "float16")
    mod["main"](a, b, c)
    np.testing.assert_array_equal(c, (a + b) * b - a / b)


def test_software_float16_conversion_matches_numpy(rng):
    # a generic x86-64 CPU has no F16C: the inline integer conversion must round like numpy
    A = te.placeholder((4096,), "float32", "A")
    B = te.compute((4096,), lambda i: A[i].astype("float16"), "B")
    C = te.compute((4096,), lambda i: B[i].astype("float32"), "C")
    mod = targets.build(te.create_prim_func([A, B, C]), "llvm -mcpu=x86-64")
    assert "half" not in mod.get_source("ll-raw")
    a = np.concatenate([rng.standard_normal(4000).astype("float32") * 10.0 ** rng.integers(-8, 5, 4000),
                        np.array([0, -0.0, np.inf, -np.inf, np.nan, 65504, 65520, 1e-8, 6e-8,
                                  -3e-5, 70000, 2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -24],
                                 "float32"),
                        np.zeros(82, "float32")]).astype("float32")
    b, c = np.zeros(4096, "float16"), np.zeros(4096, "float32")
    mod["main"](a, b, c)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = a.astype("float16")
    np.testing.assert_array_equal(b.view("uint16")[~np.isnan(ref)], ref.view("uint16")[~np.isnan(ref)])
    assert np.isnan(b[np.isnan(ref)]).all()
    np.testing.assert_array_equal(c[~np.isnan(ref)], ref.astype("float32")[~np.isnan(ref)])


INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_arithmetic(dtype, rng):
    n = te.var("n")
    A = te.placeholder((n,), dtype, "A")
    B = te.placeholder((n,), dtype, "B")
    ops = {
        "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b,
        "min": te.minimum, "max": te.maximum,
    }
    outs = [te.compute((n,), lambda i, f=f: f(A[i], B[i]), name) for name, f in ops.items()]
    mod = targets.build(te.create_prim_func([A, B] + outs), "llvm")
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    a = rng.integers(lo, hi, 301, endpoint=True).astype(dtype)
    b = rng.integers(lo, hi, 301, endpoint=True).astype(dtype)
    b[:3] = 0  # x // 0 and x % 0 give 0, as in numpy
    if info.min < 0:
        a[3:6], b[3:6] = [-7, 7, -7], [2, -2, -2]
    res = [np.zeros(301, dtype) for _ in ops]
    mod["main"](a, b, *res)
    with np.errstate(all="ignore"):
        want = [a + b, a - b, a * b, a // b, a % b, np.minimum(a, b), np.maximum(a, b)]
    for name, got, w in zip(ops, res, want):
        np.testing.assert_array_equal(got, w, err_msg=f"{name} {dtype}")


def test_truncating_div_mod_and_constant_divisors(rng):
    from tilecraft.tensorir.expr import truncdiv, truncmod
    A = te.placeholder((200,), "int32", "A")
    B = te.placeholder((200,), "int32", "B")
    TD = te.compute((200,), lambda i: truncdiv(A[i], B[i]), "TD")
    TM = te.compute((200,), lambda i: truncmod(A[i], B[i]), "TM")
    F4 = te.compute((200,), lambda i: A[i] // 4, "F4")
    M4 = te.compute((200,), lambda i: A[i] % 4, "M4")
    FN = te.compute((200,), lambda i: A[i] // -3, "FN")
    MN = te.compute((200,), lambda i: A[i] % -3, "MN")
    mod = targets.build(te.create_prim_func([A, B, TD, TM, F4, M4, FN, MN]), "llvm")
    a = rng.integers(-100, 100, 200).astype("int32")
    b = rng.integers(-9, 9, 200).astype("int32")
    b[b == 0] = 5
    outs = [np.zeros(200, "int32") for _ in range(6)]
    mod["main"](a, b, *outs)
    np.testing.assert_array_equal(outs[0], np.trunc(a / b).astype("int32"))
    np.testing.assert_array_equal(outs[1], np.fmod(a, b))
    np.testing.assert_array_equal(outs[2], a // 4)
    np.testing.assert_array_equal(outs[3], a % 4)
    np.testing.assert_array_equal(outs[4], a // -3)
    np.testing.assert_array_equal(outs[5], a % -3)


def test_float_floordiv_floormod_min_max_nan(rng):
    A = te.placeholder((100,), "float32", "A")
    B = te.placeholder((100,), "float32", "B")
    outs = [te.compute((100,), lambda i: A[i] // B[i], "FD"),
            te.compute((100,), lambda i: A[i] % B[i], "FM"),
            te.compute((100,), lambda i: te.max(A[i], B[i]), "MX"),
            te.compute((100,), lambda i: te.min(A[i], B[i]), "MN")]
    mod = targets.build(te.create_prim_func([A, B] + outs), "llvm")
    a = rng.uniform(-10, 10, 100).astype("float32")
    b = rng.uniform(-3, 3, 100).astype("float32")
    a[0], b[1] = np.nan, np.nan
    res = [np.zeros(100, "float32") for _ in outs]
    mod["main"](a, b, *res)
    np.testing.assert_allclose(res[0], np.floor_divide(a, b), rtol=1e-6)
    np.testing.assert_allclose(res[1], np.mod(a, b), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(res[2], np.maximum(a, b))
    np.testing.assert_array_equal(res[3], np.minimum(a, b))


def test_casts_and_bool(rng):
    A = te.placeholder((64,), "float32", "A")
    M = te.placeholder((64,), "bool", "M")
    I = te.placeholder((64,), "int16", "I")
    outs = [te.compute((64,), lambda i: A[i].astype("int32"), "to_i32"),
            te.compute((64,), lambda i: A[i].astype("uint8"), "to_u8"),
            te.compute((64,), lambda i: I[i].astype("float64"), "to_f64"),
            te.compute((64,), lambda i: I[i].astype("int64"), "widen"),
            te.compute((64,), lambda i: I[i].astype("int8"), "narrow"),
            te.compute((64,), lambda i: A[i] > 0.0, "gt"),
            te.compute((64,), lambda i: (A[i] > 0.0) & M[i] | ~M[i] & (I[i] < 0), "logic"),
            te.compute((64,), lambda i: M[i].astype("float32") * 2.0, "from_bool"),
            te.compute((64,), lambda i: A[i].astype("bool"), "f_to_bool"),
            te.compute((64,), lambda i: te.if_then_else(M[i], A[i], -A[i]), "sel")]
    mod = targets.build(te.create_prim_func([A, M, I] + outs), "llvm")
    a = rng.uniform(0, 200, 64).astype("float32")
    a[::3] *= -0.01
    a[5] = 0
    m = rng.random(64) > 0.5
    ii = rng.integers(-30000, 30000, 64).astype("int16")
    res = [np.zeros(64, o.dtype if o.dtype != "bool" else "bool") for o in outs]
    mod["main"](a, m, ii, *res)
    np.testing.assert_array_equal(res[0], a.astype("int32"))
    pos = a >= 0
    np.testing.assert_array_equal(res[1][pos], a[pos].astype("uint8"))
    np.testing.assert_array_equal(res[2], ii.astype("float64"))
    np.testing.assert_array_equal(res[3], ii.astype("int64"))
    np.testing.assert_array_equal(res[4], ii.astype("int8"))
    np.testing.assert_array_equal(res[5], a > 0)
    np.testing.assert_array_equal(res[6], (a > 0) & m | ~m & (ii < 0))
    np.testing.assert_array_equal(res[7], m.astype("float32") * 2)
    np.testing.assert_array_equal(res[8], a != 0)
    np.testing.assert_array_equal(res[9], np.where(m, a, -a))


def test_broadcast_and_matmul_reduction(rng):
    n = te.var("n")
    A = te.placeholder((n, 24), "float32", "A")
    W = te.placeholder((24, 10), "float32", "W")
    bias = te.placeholder((10,), "float32", "bias")
    k = te.reduce_axis((0, 24), "k")
    C = te.compute((n, 10), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    D = te.compute((n, 10), lambda i, j: te.max(C[i, j] + bias[j], 0.0), "D")
    mod = targets.build(te.create_prim_func([A, W, bias, D]), "llvm")
    w = rng.standard_normal((24, 10)).astype("float32")
    bb = rng.standard_normal(10).astype("float32")
    for rows in (1, 5, 33):  # one build serves every n
        a = rng.standard_normal((rows, 24)).astype("float32")
        d = targets.empty((rows, 10), "float32")
        mod["main"](targets.array(a), w, bb, d)
        np.testing.assert_allclose(d.numpy(), np.maximum(a @ w + bb, 0), rtol=1e-5, atol=1e-5)


def test_max_and_prod_reductions_and_0d_output(rng):
    A = te.placeholder((7, 9), "float64", "A")
    k = te.reduce_axis((0, 9), "k")
    r = te.reduce_axis((0, 7), "r")
    c = te.reduce_axis((0, 9), "c")
    MX = te.compute((7,), lambda i: te.max(A[i, k], axis=k), "MX")
    PR = te.compute((7,), lambda i: te.prod(A[i, k], axis=k), "PR")
    TOT = te.compute((), lambda: te.sum(A[r, c], axis=[r, c]), "TOT")
    mod = targets.build(te.create_prim_func([A, MX, PR, TOT]), "llvm")
    a = rng.uniform(0.5, 1.5, (7, 9))
    mx, pr, tot = np.zeros(7), np.zeros(7), np.zeros(())
    mod["main"](a, mx, pr, tot)
    np.testing.assert_allclose(mx, a.max(1))
    np.testing.assert_allclose(pr, a.prod(1))
    np.testing.assert_allclose(tot, a.sum())


def test_intermediates_on_stack_and_heap(rng):
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    S = te.placeholder((8,), "float32", "S")
    T1 = te.compute((n,), lambda i: A[i] * 2.0, "T1")        # symbolic size: heap
    T2 = te.compute((8,), lambda i: S[i] + 1.0, "T2")        # 32 bytes: stack
    B = te.compute((n,), lambda i: T1[i] + T2[i % 8], "B")
    mod = targets.build(te.create_prim_func([A, S, B]), "llvm")
    src = mod.get_source("ll-raw")
    assert "posix_memalign" in src and "alloca [8 x float]" in src
    s = rng.standard_normal(8).astype("float32")
    for size in (0, 3, 100):
        a = rng.standard_normal(size).astype("float32")
        b = np.zeros(size, "float32")
        mod["main"](a, s, b)
        np.testing.assert_allclose(b, a * 2 + (s + 1)[np.arange(size) % 8], rtol=1e-6)


def _two_stage(n, scope="local"):
    A = te.placeholder((n,), "float32", "A")
    T1 = te.compute((n,), lambda i: A[i] * 2.0, "T1")        # an intermediate on the heap
    B = te.compute((n,), lambda i: T1[n - 1 - i] + 1.0, "B")
    sch = Schedule(te.create_prim_func([A, B]))
    sch.set_scope(sch.get_block("T1"), 0, scope)
    return sch.mod["main"]


def test_global_heap_intermediate_is_freed_each_call(rng):
    # a "global"-scope intermediate keeps no block (only a kernel's local workspace does)
    mod = targets.build(_two_stage(te.var("n"), "global"), "llvm")
    assert "tilecraft_ws." not in mod.get_source("ll-raw")
    a = rng.standard_normal(300_000).astype("float32")
    b = np.zeros_like(a)
    mod["main"](a, b)
    np.testing.assert_allclose(b, (a * 2 + 1)[::-1], rtol=1e-6)


@pytest.mark.parametrize("cache_max", [None, 1 << 10])
def test_heap_intermediate_keeps_its_block(rng, monkeypatch, cache_max):
    # a local heap intermediate keeps its block between calls (no fresh mapping, no page faults):
    # sizes that grow and shrink, and above WORKSPACE_CACHE_MAX (its own block each call)
    # give the same values
    from tilecraft.targets.llvm import codegen
    if cache_max is not None:
        monkeypatch.setattr(codegen, "WORKSPACE_CACHE_MAX", cache_max)
    mod = targets.build(_two_stage(te.var("n")), "llvm")
    assert "tilecraft_ws." in mod.get_source("ll-raw")
    for size in (3, 300_000, 100, 0, 700_000, 5):
        a = rng.standard_normal(size).astype("float32")
        b = np.zeros(size, "float32")
        mod["main"](a, b)
        np.testing.assert_allclose(b, (a * 2 + 1)[::-1], rtol=1e-6)


def test_heap_intermediate_from_threads_at_once(rng):
    # calls on several threads at once: one owns the kept block, the others take their own
    import threading
    mod = targets.build(_two_stage(te.var("n")), "llvm")
    errors = []

    def work(seed):
        r = np.random.default_rng(seed)
        for _ in range(20):
            size = int(r.integers(40_000, 400_000))
            a = r.standard_normal(size).astype("float32")
            b = np.zeros(size, "float32")
            mod["main"](a, b)
            if not np.allclose(b, (a * 2 + 1)[::-1], rtol=1e-6):
                errors.append(size)
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_scalar_params(rng):
    n = te.var("n")
    alpha = te.var("alpha", "float32")
    shift = te.var("shift", "int32")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] * alpha + shift.astype("float32"), "B")
    mod = targets.build(te.create_prim_func([A, B, alpha, shift]), "llvm")
    a = rng.standard_normal(10).astype("float32")
    b = np.zeros(10, "float32")
    mod["main"](a, b, 2.5, -3)
    np.testing.assert_allclose(b, a * 2.5 - 3, rtol=1e-6)
    mod["main"](a, b, 1, np.int32(4))  # an int for a float parameter is converted
    np.testing.assert_allclose(b, a + 4, rtol=1e-6)


def test_shape_var_passed_as_scalar_is_checked(rng):
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] + 1.0, "B")
    mod = targets.build(te.create_prim_func([A, B, n]), "llvm")
    a = rng.standard_normal(6).astype("float32")
    b = np.zeros(6, "float32")
    mod["main"](a, b, 6)
    np.testing.assert_allclose(b, a + 1)
    with pytest.raises(ValueError, match=r"argument A: dimension 0 has extent 6, expected n = 5"):
        mod["main"](a, b, 5)


def test_compound_dims_are_checked(rng):
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n * 2,), lambda i: A[i // 2], "B")
    mod = targets.build(te.create_prim_func([A, B]), "llvm")
    a = rng.standard_normal(5).astype("float32")
    b = np.zeros(10, "float32")
    mod["main"](a, b)
    np.testing.assert_array_equal(b, np.repeat(a, 2))
    with pytest.raises(ValueError, match=r"main: argument B: dimension 0 has extent 9, "
                                         r"expected n \* 2 = 10"):
        mod["main"](a, np.zeros(9, "float32"))


def test_guarded_load_with_if_then_else(rng):
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: te.if_then_else(i + 1 < n, A[i + 1] - A[i], 0.0), "B")
    mod = targets.build(te.create_prim_func([A, B]), "llvm")
    for size in (1, 2, 50):
        a = rng.standard_normal(size).astype("float32")
        b = np.full(size, 7, "float32")
        mod["main"](a, b)
        np.testing.assert_allclose(b, np.append(np.diff(a), 0), rtol=1e-6)


def test_ndarray_inputs_and_time_evaluator(rng):
    A = te.placeholder((128,), "float32", "A")
    B = te.compute((128,), lambda i: A[i] * A[i], "B")
    mod = targets.build(te.create_prim_func([A, B]), "llvm")
    a = targets.array(rng.standard_normal(128).astype("float32"))
    b = targets.empty((128,), "float32")
    t = mod.time_evaluator("main", targets.cpu(0), number=5, repeat=4)(a, b)
    assert len(t.results) == 4 and all(r > 0 for r in t.results)
    assert t.mean > 0 and t.median > 0
    np.testing.assert_allclose(b.numpy(), a.numpy() ** 2)
    t2 = mod.time_evaluator("main", targets.cpu(0), number=1, repeat=1, min_repeat_ms=2)(a, b)
    assert len(t2.results) == 1
    assert mod.entry_name == "main" and mod.entry_func is mod["main"]
    mod(a, b)  # the module calls its entry function


def test_module_with_several_functions(rng):
    from tilecraft.tensorir import IRModule
    A = te.placeholder((16,), "float32", "A")
    B = te.compute((16,), lambda i: A[i] + 1.0, "B")
    C = te.compute((16,), lambda i: A[i] * 3.0, "C")
    irmod = IRModule({"add_one": te.create_prim_func([A, B], name="add_one"),
                      "triple": te.create_prim_func([A, C], name="triple")})
    mod = targets.build(irmod, "llvm")
    a = rng.standard_normal(16).astype("float32")
    out = np.zeros(16, "float32")
    mod["triple"](a, out)
    np.testing.assert_allclose(out, a * 3)
    mod["add_one"](a, out)
    np.testing.assert_allclose(out, a + 1)
    assert sorted(mod.function_names) == ["add_one", "triple"]
    assert "tilecraft_fn_triple" in mod.get_source("ll")
    assert mod.get_source("asm").strip()


def test_opt_level_zero_still_correct(rng):
    A = te.placeholder((40,), "float32", "A")
    k = te.reduce_axis((0, 40), "k")
    S = te.compute((), lambda: te.sum(A[k] * A[k], axis=k), "S")
    mod = targets.build(te.create_prim_func([A, S]), "llvm -opt-level=0")
    a = rng.standard_normal(40).astype("float32")
    s = np.zeros((), "float32")
    mod["main"](a, s)
    np.testing.assert_allclose(s, (a * a).sum(), rtol=1e-5)


@pytest.mark.parametrize("target", ["llvm", "llvm -mcpu=x86-64"])
def test_vectorized_float16_native_and_software(target, rng):
    from targets_testutil import lower, with_loop_kinds
    n = te.var("n")
    A = te.placeholder((n,), "float16", "A")
    B = te.compute((n,), lambda i: te.exp(A[i]) * A[i] + 1.0, "B")
    func = with_loop_kinds(lower(te.create_prim_func([A, B])), i="vectorized")
    mod = targets.build(func, target)
    if target.endswith("x86-64"):  # no F16C: conversions are integer code on <N x i16>
        assert "x i16>" in mod.get_source("ll-raw")
    a = rng.standard_normal(77).astype("float16")
    b = np.zeros_like(a)
    mod["main"](a, b)
    np.testing.assert_array_equal(b, np.exp(a) * a + np.float16(1))


def test_read_only_inputs_and_concurrent_callers(rng):
    import threading
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] * 3.0, "B")
    mod = targets.build(te.create_prim_func([A, B]), "llvm")
    a = rng.standard_normal(50).astype("float32")
    a.flags.writeable = False  # inputs may be read-only
    b = np.zeros(50, "float32")
    mod["main"](a, b)
    np.testing.assert_allclose(b, a * 3)
    errors = []

    def worker(size):
        x = rng.standard_normal(size).astype("float32")
        y = np.zeros(size, "float32")
        for _ in range(200):
            mod["main"](x, y)
            if not np.allclose(y, x * 3):
                errors.append(size)
    threads = [threading.Thread(target=worker, args=(s,)) for s in (3, 40, 1000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_float32_exp_and_tanh_accuracy_and_special_values(rng):
    # float32 exp / tanh are inline polynomials (vector code): check them in ulps over the range
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    E = te.compute((n,), lambda i: te.exp(A[i]), "E")
    T = te.compute((n,), lambda i: te.tanh(A[i]), "T")
    mod = targets.build(te.create_prim_func([A, E, T]), "llvm")
    special = np.array([0, -0.0, 1e-30, -1e-30, 88.7, 88.73, 89, -87.3, -100, -103.9, -104, -200,
                        0.625, -0.625, 0.62499, 9, 10, 30, -30, np.inf, -np.inf, np.nan],
                       "float32")
    a = np.concatenate([rng.uniform(-104, 89, 20000), rng.uniform(-2, 2, 20000),
                        special]).astype("float32")
    e, t = np.zeros_like(a), np.zeros_like(a)
    mod["main"](a, e, t)
    with np.errstate(all="ignore"):
        ref_e = np.exp(a.astype("float64"))
        ref_t = np.tanh(a.astype("float64"))
    for got, ref, ulps in ((e, ref_e, 2), (t, ref_t, 3)):
        nan = np.isnan(ref)
        assert np.isnan(got[nan]).all()
        with np.errstate(all="ignore"):
            ref32 = ref[~nan].astype("float32")
            spacing = np.spacing(np.maximum(np.abs(ref32), np.float32(1.2e-38)))
            err = np.abs(got[~nan].astype("float64") - ref[~nan]) / spacing
        err[got[~nan] == ref32] = 0  # infinities
        assert err.max() <= ulps, (err.max(), a[~nan][err.argmax()])
    assert e[-3] == np.inf and e[-2] == 0 and t[-3] == 1 and t[-2] == -1


def test_min_max_with_a_constant_keep_nan(rng):
    """``max(x, 0)`` / ``min(x, 6)`` / ``max(-1, x)`` (a constant operand that is not NaN: one
    max / min instruction) keep numpy's results: NaN stays NaN, infinities and signed zeros
    are ordered; vectorized and scalar loops alike."""
    A = te.placeholder((103,), "float32", "A")
    outs = [te.compute((103,), lambda i: te.max(A[i], te.const(0.0, "float32")), "relu"),
            te.compute((103,), lambda i: te.min(A[i], te.const(6.0, "float32")), "clip_hi"),
            te.compute((103,), lambda i: te.max(te.const(-1.0, "float32"), A[i]), "clip_lo"),
            te.compute((103,), lambda i: te.min(te.const(np.inf, "float32"), A[i]), "min_inf")]
    func = te.create_prim_func([A] + outs)
    a = rng.uniform(-10, 10, 103).astype("float32")
    a[[0, 9, 50]] = np.nan
    a[[1, 60]] = np.inf, -np.inf
    a[2] = -0.0
    refs = [np.maximum(a, 0), np.minimum(a, 6), np.maximum(-1, a), np.minimum(np.inf, a)]
    sch = Schedule(func)
    for name in ("relu", "clip_hi", "clip_lo", "min_inf"):
        (i,) = sch.get_loops(sch.get_block(name))
        _, inner = sch.split(i, [None, 8])
        sch.vectorize(inner)
    for f in (func, sch.func):
        mod = targets.build(f, "llvm")
        res = [np.zeros(103, "float32") for _ in outs]
        mod["main"](a, *res)
        for got, ref in zip(res, refs):
            np.testing.assert_array_equal(got, ref)
