"""func.script() and tensorir.parser.parse: readable text that reads back exactly.

The oracle is structural equality: parse(print(f)) must equal f, and printing the parsed node
must give the same text again.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tilecraft import tensorir as T
from tilecraft.tensorir import te
from tilecraft.tensorir.expr import (Add, And, Call, Cast, Div, EQ, FloatImm, FloorDiv,
                           FloorMod, GE, GT, IntImm, LE, LT, Let, Max, Min, Mod, Mul, NE, Not, Or,
                           Select, StringImm, Sub, Var, call)
from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.parser import ParseError, parse
from tilecraft.tensorir.stmt import (Allocate, AssertStmt, Block, BlockRealize, Buffer, BufferRegion,
                           BufferStore, Evaluate, For, IfThenElse, IterVar, LetStmt, Range,
                           SeqStmt, seq)
from tilecraft.tensorir.script import to_script

ALL_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64"]


def roundtrip(node, **parse_kw):
    """print -> parse -> structurally equal, and printing again gives the same text."""
    text = node.script()
    assert node.script() == text, "printing is not deterministic"
    back = parse(text, **parse_kw)
    assert T.structural_equal(back, node), f"round trip changed the IR:\n{text}\n---\n{back.script()}"
    assert back.script() == text
    return text, back


def func_of(body, buffers=(), scalars=(), attrs=None):
    """A PrimFunc with buffer parameters (handles named <name>_handle) and scalar parameters."""
    params, bmap = [], {}
    for b in buffers:
        h = Var(b.name + "_handle", "handle")
        params.append(h)
        bmap[h] = b
    params.extend(scalars)
    return PrimFunc(params, body, bmap, attrs if attrs is not None else {"global_symbol": "main"})


def root(body, allocs=()):
    return BlockRealize([], None, Block("root", [], [], [], body, alloc_buffers=allocs))


# ---------------------------------------------------------------------------------------------
# te-made functions


def matmul(n=None, dtype="float32"):
    n = te.var("n") if n is None else n
    A = te.placeholder((n, 64), dtype, "A")
    W = te.placeholder((64, 32), dtype, "W")
    k = te.reduce_axis((0, 64), "k")
    C = te.compute((n, 32), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    return te.create_prim_func([A, W, C])


def test_golden_matmul():
    A = te.placeholder((16, 8), "float32", "A")
    B = te.placeholder((8, 4), "float32", "B")
    k = te.reduce_axis((0, 8), "k")
    C = te.compute((16, 4), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), "C")
    f = te.create_prim_func([A, B, C])
    expected = '''\
@T.prim_func
def main(A: T.Buffer((16, 8), "float32"), B: T.Buffer((8, 4), "float32"), C: T.Buffer((16, 4), "float32")):
    T.func_attr({"global_symbol": "main"})
    with T.block("root"):
        for i, j, k in T.grid(16, 4, 8):
            with T.block("C"):
                vi = T.axis.spatial(16, i)
                vj = T.axis.spatial(4, j)
                vk = T.axis.reduce(8, k)
                T.reads(A[vi, vk], B[vk, vj])
                T.writes(C[vi, vj])
                with T.init():
                    C[vi, vj] = T.float32(0)
                C[vi, vj] = C[vi, vj] + A[vi, vk] * B[vk, vj]'''
    assert f.script() == expected
    assert repr(f) == expected
    roundtrip(f)


def test_golden_symbolic_with_intermediate():
    n = te.var("n")
    A = te.placeholder((n, 64), "float32", "A")
    W = te.placeholder((64, 32), "float32", "W")
    k = te.reduce_axis((0, 64), "k")
    C = te.compute((n, 32), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), "C")
    D = te.compute((n, 32), lambda i, j: te.max(C[i, j], 0.0), "D")
    f = te.create_prim_func([A, W, D])
    text, _ = roundtrip(f)
    assert text.splitlines()[:6] == [
        "@T.prim_func",
        'def main(A: T.Buffer((n, 64), "float32"), W: T.Buffer((64, 32), "float32"), '
        'D: T.Buffer((n, 32), "float32")):',
        '    T.func_attr({"global_symbol": "main"})',
        "    n = T.int64()",
        '    with T.block("root"):',
        '        C = T.alloc_buffer((n, 32), "float32")',
    ]
    assert "D[vi, vj] = T.max(C[vi, vj], 0.0)" in text
    # the second loop nest reuses i, j: names are unique per scope, as in TVMScript
    assert text.count("for i, j") == 2


def test_te_elementwise_and_matmul_round_trip():
    roundtrip(matmul())
    roundtrip(matmul(n=128, dtype="float16"))
    A = te.placeholder((te.var("m"), 3), "float32", "A")
    B = te.compute(A.shape, lambda i, j: te.exp(A[i, j]) * 2.0 + te.sqrt(A[i, j]) - 1.0, "B")
    roundtrip(te.create_prim_func([A, B]))


def test_te_select_if_then_else_casts_and_scalar_param():
    n = te.var("n")
    alpha = te.var("alpha", "float32")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: te.if_then_else(i < 4, A[i], A[i - 4]) * alpha, "B")
    C = te.compute((n,), lambda i: T.Select(B[i] > 0.0, B[i], -B[i]).astype("float16"), "C")
    D = te.compute((n,), lambda i: (C[i].astype("int32") // 3 % 5).astype("float64"), "D")
    f = te.create_prim_func([A, D, alpha])
    text, _ = roundtrip(f)
    assert "alpha: T.float32" in text
    assert "T.if_then_else(i" not in text  # the block's own vars are used
    assert "T.Cast(\"float16\", T.Select(" in text


def test_te_reduction_with_offset_axis_and_condition():
    A = te.placeholder((10, 10), "float32", "A")
    k = te.reduce_axis((2, 10), "k")
    B = te.compute((10,), lambda i: te.max(A[i, k], axis=k, where=k > i), "B")
    text, _ = roundtrip(te.create_prim_func([A, B]))
    assert 'T.float32("-inf")' in text


@pytest.mark.parametrize("dtype", [d for d in ALL_DTYPES if d != "bool"])
def test_te_every_dtype(dtype):
    A = te.placeholder((4, 5), dtype, "A")
    one = te.const(1, dtype)
    B = te.compute((4, 5), lambda i, j: A[i, j] * one + te.const(3, dtype), "B")
    Cb = te.compute((4, 5), lambda i, j: B[i, j] > te.const(2, dtype), "Cb")
    D = te.compute((4, 5), lambda i, j: T.Select(Cb[i, j], B[i, j], A[i, j]).astype("float32"), "D")
    text, _ = roundtrip(te.create_prim_func([A, D]))
    assert f'T.Buffer((4, 5), "{dtype}")' in text


def test_random_te_graphs_round_trip():
    rng = np.random.default_rng(0)
    unary = [te.exp, te.tanh, te.sigmoid, te.abs, lambda x: x * 2.0, lambda x: -x]
    for trial in range(20):
        n = te.var("n")
        shape = (n, int(rng.integers(1, 9)))
        A = te.placeholder(shape, "float32", "A")
        cur = A
        for step in range(int(rng.integers(1, 4))):
            fn = unary[int(rng.integers(len(unary)))]
            prev = cur
            cur = te.compute(shape, lambda i, j, p=prev, f=fn: f(p[i, j]), f"T{step}")
        roundtrip(te.create_prim_func([A, cur]))


# ---------------------------------------------------------------------------------------------
# hand-built IR: every node kind


def test_every_loop_kind_with_annotations():
    A = Buffer("A", (64,), "float32")
    n = Var("n")
    loops = []
    for kind, tag in [("serial", None), ("parallel", None), ("vectorized", None),
                      ("unrolled", None), ("thread_binding", "threadIdx.x")]:
        i = Var("i")
        loops.append(For(i, 0, 64, kind, BufferStore(A, A[i] + 1.0, [i]), thread_tag=tag,
                         annotations={"pragma_unroll": 4} if kind == "unrolled" else None))
    j = Var("j")
    loops.append(For(j, 2, n, "serial", BufferStore(A, FloatImm(0.0), [j]),
                     annotations={"meta": {"a": [1, 2.5, "x"], "b": (True, None)},
                                  "expr": IntImm(16, "int64"), "inf": float("inf")}))
    m = Var("m")
    loops.append(For(m, n, 4, "parallel", BufferStore(A, FloatImm(1.0), [m])))
    k32 = Var("k", "int32")
    loops.append(For(k32, IntImm(0, "int32"), IntImm(8, "int32"), "serial",
                     BufferStore(A, FloatImm(2.0), [k32.astype("int64")])))
    odd = Var("odd", "int32")  # loop var dtype differs from its extent's
    loops.append(For(odd, 0, 8, "serial", Evaluate(odd)))
    bx = Var("bx")
    loops.append(For(bx, 0, 4, "thread_binding", Evaluate(bx), thread_tag="blockIdx.x",
                     annotations={"k": "v"}))
    f = func_of(root(seq(*loops)), [A], [n])
    text, _ = roundtrip(f)
    for piece in ["for i in range(64):", "for i in T.parallel(64):", "for i in T.vectorized(64):",
                  'for i in T.unroll(64, annotations={"pragma_unroll": 4}):',
                  'for i in T.thread_binding(64, thread="threadIdx.x"):',
                  "for j in T.serial(2, 2 + n, annotations=", "for m in T.parallel(n, n + 4):",
                  "for k in range(T.int32(8)):", 'for odd in T.serial(8, dtype="int32"):',
                  'T.thread_binding(4, thread="blockIdx.x", annotations={"k": "v"})',
                  '"expr": T.int64(16)', 'float("inf")', '"b": (True, None)']:
        assert piece in text, piece


def test_blocks_predicates_regions_scopes_and_annotations():
    n = Var("n")
    A = Buffer("A", (n, 16), "float32")
    B = Buffer("B", (n, 16), "float32", strides=(IntImm(32), IntImm(1)), align=128)
    S = Buffer("S", (4, 16), "float32", scope="shared")
    L = Buffer("L", (1,), "float32", scope="local")
    io, ii, j = Var("io"), Var("ii"), Var("j")
    vi, vj, vk = Var("vi"), Var("vj"), Var("vk")
    inner = Block(
        "compute", [IterVar(vi, Range(0, n), "spatial"), IterVar(vj, Range(0, 16), "spatial"),
                    IterVar(vk, Range(2, 14), "reduce")],
        reads=[BufferRegion(A, [Range(vi, 1), Range(0, 16)]),
               BufferRegion(S, [Range(vi % 4, 1), Range(vj * 4, 4)]),
               BufferRegion(A, [Range(vi, IntImm(2)), Range(n - 1, 1)])],
        writes=[BufferRegion(B, [Range(vi, 1), Range(vj, 1)])],
        body=BufferStore(B, B[vi, vj] + A[vi, vk] * L[0], [vi, vj]),
        init=BufferStore(B, FloatImm(0.0), [vi, vj]),
        alloc_buffers=[L],
        annotations={"schedule_rule": "matmul", "vector_bytes": 32})
    pred = io * 4 + ii < n
    realize = BlockRealize([io * 4 + ii, j, IntImm(5)], pred, inner)
    nest = For(io, 0, (n + 3) // 4, "serial",
               For(ii, 0, 4, "serial", For(j, 0, 16, "vectorized", realize)))
    f = func_of(root(nest, allocs=[S]), [A, B])
    text, _ = roundtrip(f)
    for piece in ["vk = T.axis.reduce((2, 16), 5)", "T.where(io * 4 + ii < n)",
                  "T.reads(A[vi, 0:16], S[vi % 4, vj * 4:vj * 4 + 4], A[vi:vi + 2, n - 1])",
                  'T.block_attr({"schedule_rule": "matmul", "vector_bytes": 32})',
                  'L = T.alloc_buffer((1,), "float32", scope="local")',
                  'S = T.alloc_buffer((4, 16), "float32", scope="shared")',
                  'strides=(32, 1), align=128', "for io, ii in T.grid((n + 3) // 4, 4):"]:
        assert piece in text, piece


def test_let_assert_allocate_flat_and_nested():
    A = Buffer("A", (8,), "int32")
    x, y = Var("x", "int32"), Var("y")
    tmp = Buffer("tmp", (8,), "int32", scope="shared")
    tmp2 = Buffer("tmp", (4,), "float16", scope="local")
    i = Var("i")
    use_tmp = For(i, 0, 8, "serial", BufferStore(tmp, A[i] * 2, [i]))
    body = seq(
        LetStmt(x, IntImm(3, "int32"), BufferStore(A, x * 2, [0])),        # not last: with-form
        AssertStmt(A[1] > 0, "A[1] must be positive", Evaluate(A[2])),     # not last
        Allocate(tmp2, BufferStore(tmp2, FloatImm(0.5, "float16"), [1])),   # not last
        LetStmt(y, IntImm(7), AssertStmt(y < 10, 'y "small"',
                                          Allocate(tmp, seq(use_tmp, Evaluate(y))))))
    f = func_of(root(body), [A])
    text, _ = roundtrip(f)
    for piece in ["with T.LetStmt(T.int32(3)) as x:", 'with T.Assert(A[1] > 0, "A[1] must be positive"):',
                  'with T.allocate((4,), "float16", scope="local") as tmp:',
                  "y: T.int64 = 7", 'assert y < 10, "y \\"small\\""',
                  'tmp = T.allocate((8,), "int32", scope="shared")',
                  "tmp[i] = A[i] * 2", "T.evaluate(y)"]:
        assert piece in text, piece


def test_if_then_else_elif_and_evaluate():
    A = Buffer("A", (4,), "float32")
    i = Var("i")
    chain = IfThenElse(i < 1, BufferStore(A, FloatImm(1.0), [i]),
                       IfThenElse(i < 2, BufferStore(A, FloatImm(2.0), [i]),
                                  seq(BufferStore(A, FloatImm(3.0), [i]), Evaluate(IntImm(0, "int32")))))
    only_then = IfThenElse((i == 3) & ~(i > 5) | (i != 0), Evaluate(call("exp", A[i])))
    f = func_of(root(For(i, 0, 4, "serial", seq(chain, only_then))), [A])
    text, _ = roundtrip(f)
    assert "elif i < 2:" in text and "else:" in text
    assert "if i == 3 and not (i > 5) or i != 0:" in text
    assert "T.evaluate(T.exp(A[i]))" in text and "T.evaluate(T.int32(0))" in text


def test_empty_bodies_print_pass():
    A = Buffer("A", (4,), "float32")
    f = func_of(root(SeqStmt([])), [A])
    text, _ = roundtrip(f)
    assert text.rstrip().endswith("pass")


def test_match_buffer_form_and_free_declarations():
    n = Var("n")
    A = Buffer("A", (n,), "float32")
    h = Var("data", "handle")  # not named A_handle: printed through T.match_buffer
    offset = Var("offset")      # free in the body only
    f = PrimFunc([h], BufferStore(A, FloatImm(1.0), [offset]), {h: A})
    text = f.script()
    assert "def main(data: T.handle):" in text
    assert 'A = T.match_buffer(data, (n,), "float32")' in text
    assert "offset = T.int64()" in text
    back = parse(text)
    # a variable free in the body only becomes a new Var: equal up to free variables
    assert T.structural_equal(back, f, map_free_vars=True)
    assert back.script() == text


def test_expressions_all_ops_and_precedence():
    a, b, c = Var("a"), Var("b"), Var("c")
    x, y = Var("x", "float32"), Var("y", "float32")
    p, q = Var("p", "bool"), Var("q", "bool")
    cases = {
        a + b * c: "a + b * c",
        (a + b) * c: "(a + b) * c",
        a - (b - c): "a - (b - c)",
        (a - b) - c: "a - b - c",
        a - (b + c): "a - (b + c)",
        a * (b // c): "a * (b // c)",
        (a * b) // c: "a * b // c",
        a // b % c: "a // b % c",
        a % (b % c): "a % (b % c)",
        -(a + b): "-(a + b)",
        -a * b: "-a * b",
        -(a * b): "-(a * b)",
        a - -3: "a - -3",
        Sub(IntImm(0), IntImm(3)): "0 - 3",
        T.truncdiv(a, b) + T.truncmod(a, 7): "T.truncdiv(a, b) + T.truncmod(a, 7)",
        x / y / x: "x / y / x",
        x / (y / x): "x / (y / x)",
        Min(a, b) + Max(a, 1): "T.min(a, b) + T.max(a, 1)",
        (a < b) == (b < c): "(a < b) == (b < c)",
        (a <= b) & (b >= c) | p: "a <= b and b >= c or p",
        p & (q | p): "p and (q or p)",
        ~(p & q): "not (p and q)",
        ~p & q: "not p and q",
        Select(p, x, 0.0): "T.Select(p, x, 0.0)",
        call("if_then_else", a > 0, x, y * 2.0): "T.if_then_else(a > 0, x, y * 2.0)",
        Cast("float32", a) * x: 'T.Cast("float32", a) * x',
        call("pow", x, 2.0): "T.pow(x, 2.0)",
        Let(Var("t"), a + 1, a * 2): "T.Let(a * 2, where={t: a + 1})",
        IntImm(3, "int32") + IntImm(4, "int32"): "T.int32(3) + 4",
        FloatImm(0.5, "float16") * FloatImm(2.0, "float16"): "T.float16(0.5) * 2.0",
        IntImm(5) + IntImm(6): "5 + 6",
    }
    env = {"a": a, "b": b, "c": c, "x": x, "y": y, "p": p, "q": q}
    for e, text in cases.items():
        assert e.script() == text
        assert repr(e) == text
        back = parse(text, env)
        assert T.structural_equal(back, e), text
        assert back.script() == text


def test_every_intrinsic_and_call_intrin():
    x, y = Var("x", "float32"), Var("y", "float32")
    env = {"x": x, "y": y}
    for op, nargs in T.expr.INTRINSICS.items():
        args = [x > y, x, y] if op == "if_then_else" else [x, y][:nargs]
        e = Call("float32", op, args)
        text = e.script()
        assert text.startswith(f"T.{op}(")
        assert T.structural_equal(parse(text, env), e)
    odd = [Call("int32", "my_extern", [x, IntImm(3, "int32")]), Call("float64", "exp", [x]),
           Call("handle", "noop", [])]
    for e in odd:
        text = e.script()
        assert text.startswith("T.call_intrin(")
        assert T.structural_equal(parse(text, env), e)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_immediates_of_every_dtype(dtype):
    if dtype == "bool":
        values = [0, 1]
    elif dtype.startswith("float"):
        values = [0.0, -0.0, 0.5, -2.25, 1e-7, 3.0e38 if dtype != "float16" else 65504.0,
                  5e-324, 0.1, 123456789.0, float("inf"), float("-inf")]
    else:
        info = np.iinfo(dtype)
        values = [0, 1, int(info.min), int(info.max), 7]
    for v in values:
        e = FloatImm(v, dtype) if dtype.startswith("float") else IntImm(v, dtype)
        text = e.script()
        back = parse(text)
        assert type(back) is type(e) and back.dtype == dtype, text
        assert back.value == e.value and math.copysign(1, back.value) == math.copysign(1, e.value)
        assert back.script() == text
        if dtype not in ("int64", "bool"):
            assert text.startswith(f"T.{dtype}("), text
        # and as an operand next to an expression of the same dtype
        other = Var("z", dtype)
        for expr in ([Add(other, e), Sub(e, other)] if dtype != "bool" else [And(other, e)]):
            back = parse(expr.script(), {"z": other})
            assert T.structural_equal(back, expr), expr.script()
    assert FloatImm(3.0, "float16").script() == "T.float16(3)"
    assert IntImm(3, "int32").script() == "T.int32(3)"
    assert IntImm(3).script() == "3"
    assert IntImm(1, "bool").script() == "True"


def test_nan_prints_and_parses():
    e = FloatImm(float("nan"), "float32")
    assert e.script() == 'T.float32("nan")'
    back = parse(e.script())
    assert back.dtype == "float32" and math.isnan(back.value)


def test_string_imm_and_evaluate_string():
    A = Buffer("A", (1,), "float32")
    f = func_of(Evaluate(Call("int32", "printf", [StringImm('a "quoted"\nline é')])), [A])
    roundtrip(f)


# random expressions: the printer's parentheses and literal typing against the parser

_VARS = [Var("a"), Var("b"), Var("c")]
_ENV = {v.name: v for v in _VARS}


def _int_exprs():
    leaves = st.one_of(st.sampled_from(_VARS),
                       st.integers(-5, 20).map(lambda v: IntImm(v, "int64")))

    def extend(children):
        binops = [Add, Sub, Mul, FloorDiv, FloorMod, Div, Mod, Min, Max]
        return st.one_of(
            st.tuples(st.sampled_from(binops), children, children).map(lambda t: t[0](t[1], t[2])),
            children.map(lambda e: Sub(IntImm(0), e)),
            st.tuples(st.sampled_from([LT, LE, GT, GE, EQ, NE]), children, children,
                      children, children).map(lambda t: Select(t[0](t[1], t[2]), t[3], t[4])),
            st.tuples(children, children).map(lambda t: Let(Var("t"), t[0], t[1])),
        )
    return st.recursive(leaves, extend, max_leaves=12)


def _bool_exprs():
    cmp = st.tuples(st.sampled_from([LT, LE, GT, GE, EQ, NE]), _int_exprs(),
                    _int_exprs()).map(lambda t: t[0](t[1], t[2]))
    leaves = st.one_of(cmp, st.booleans().map(lambda v: IntImm(int(v), "bool")))

    def extend(children):
        return st.one_of(
            st.tuples(st.sampled_from([And, Or, EQ, NE]), children, children).map(
                lambda t: t[0](t[1], t[2])),
            children.map(Not))
    return st.recursive(leaves, extend, max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(st.one_of(_int_exprs(), _bool_exprs()))
def test_random_expressions_round_trip(e):
    text = e.script()
    back = parse(text, _ENV)
    assert T.structural_equal(back, e), text
    assert back.script() == text


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["float16", "float32", "float64", "int8", "uint32",
                                            "int32"]),
                          st.floats(-1e4, 1e4, width=32) | st.integers(-100, 100)),
                min_size=2, max_size=5))
def test_random_typed_literal_chains(items):
    # a chain of same-dtype immediates and a variable: which literals print bare is subtle
    dtype = items[0][0]
    z = Var("z", dtype)
    e = z
    for k, (_, v) in enumerate(items):
        imm = FloatImm(float(v), dtype) if dtype.startswith("float") else IntImm(int(v), dtype)
        e = Add(e, imm) if k % 2 else Mul(imm, Sub(imm, e) if k % 3 else imm)
    text = e.script()
    back = parse(text, {"z": z})
    assert T.structural_equal(back, e), text
    assert back.script() == text


# ---------------------------------------------------------------------------------------------
# names


def test_duplicate_and_awkward_names_are_made_unique():
    A = Buffer("A", (8, 8), "float32")
    A2 = Buffer("A", (8,), "float32")         # two buffers named A
    i1, i2 = Var("i"), Var("i")                # two different loop vars named i, nested
    kw, tv, dotted = Var("for"), Var("T"), Var("a.b")
    n = Var("1n")
    body = For(i1, 0, 8, "serial", For(i2, 0, 8, "serial", seq(
        BufferStore(A, A2[i1] + A2[i2], [i1, i2]),
        For(kw, 0, 2, "serial", For(tv, 0, 2, "serial", For(dotted, 0, n, "serial",
                                                            Evaluate(kw + tv + dotted)))))))
    f = func_of(root(body), [A, A2], [n])
    text, _ = roundtrip(f)
    assert 'def main(A: T.Buffer((8, 8), "float32"), A_1: T.Buffer((8,), "float32"), v1n: T.int64):' in text
    for piece in ["for i, i_1 in T.grid(8, 8):", "A[i, i_1] = A_1[i] + A_1[i_1]",
                  "for for_1, T_1, a_b in T.grid(2, 2, v1n):"]:
        assert piece in text, piece


def test_sibling_scopes_reuse_names_but_shadowing_is_avoided():
    A = Buffer("A", (4,), "float32")
    outer = Var("i")
    inner_same_name = Var("i")
    first = For(Var("j"), 0, 4, "serial", Evaluate(IntImm(0)))
    second = For(Var("j"), 0, 4, "serial", Evaluate(IntImm(1)))
    nested = For(outer, 0, 4, "serial", For(inner_same_name, 0, outer, "serial",
                                            BufferStore(A, FloatImm(0.0), [outer + inner_same_name])))
    f = func_of(root(seq(first, second, nested)), [A])
    text, _ = roundtrip(f)
    assert text.count("for j in range(4):") == 2
    assert "for i_1 in range(i):" in text   # not T.grid: the inner extent depends on i
    assert "A[i + i_1] = T.float32(0)" in text


# ---------------------------------------------------------------------------------------------
# modules, attributes, other nodes


def test_ir_module_with_several_functions():
    f1 = matmul()
    A = te.placeholder((8,), "float32", "A")
    B = te.compute((8,), lambda i: te.exp(A[i]), "B")
    f2 = te.create_prim_func([A, B], name="exp8")
    f3 = func_of(root(SeqStmt([])), [Buffer("X", (1,), "int8")],
                 attrs={"global_symbol": "fused.op", "tir.noalias": True, "nums": [1, 2.5],
                        "nested": {"k": ("t", None)}, "neg": -3})
    mod = IRModule({"main": f1, "exp8": f2, "fused.op": f3})
    text, back = roundtrip(mod)
    assert text.startswith("@I.ir_module\nclass Module:\n    @T.prim_func\n    def main(")
    assert '@T.prim_func(name="fused.op")\n    def fused_op(' in text
    assert list(back.functions) == ["main", "exp8", "fused.op"]
    assert back["fused.op"].attr_dict["nested"] == {"k": ("t", None)}
    assert roundtrip(IRModule({}))[0].endswith("pass")


def test_repr_of_nodes_shows_script():
    n = Var("n")
    A = Buffer("A", (n, 4), "float16", scope="shared")
    i = Var("i")
    assert repr(A) == 'A: T.Buffer((n, 4), "float16", scope="shared")'
    assert repr(BufferStore(A, FloatImm(1.0, "float16"), [i, 0])) == "A[i, 0] = T.float16(1)"
    assert repr(Range(0, n)) == "T.min_extent(0, n)"
    assert repr(BufferRegion(A, [Range(i, 1), Range(0, 4)])) == "A[i, 0:4]"
    assert repr(IterVar(Var("vk"), Range(0, 8), "reduce")) == "vk = T.axis.reduce(8)"
    loop = For(i, 0, n, "parallel", BufferStore(A, FloatImm(0.0, "float16"), [i, 1]))
    assert repr(loop) == "for i in T.parallel(n):\n    A[i, 1] = T.float16(0)"
    f = matmul()
    assert repr(f) == f.script() == to_script(f)
    assert repr(IRModule({"main": f})).startswith("@I.ir_module")
    with pytest.raises(TypeError, match="expects an IR node"):
        to_script(3)
    k = te.reduce_axis((0, 8), "k")
    B = te.placeholder((8,), "float32", "B")
    assert repr(te.sum(B[k], axis=k)) == "T.sum(B[k], axis=[k])"


def test_hand_written_variants():
    text = '''
    @T.prim_func
    def add_one(A: T.Buffer((n, 16), "float32"), B: T.Buffer((n, 16), "float32")):
        n = T.int64()
        for i in T.serial(0, n):
            for j in range(16):
                with T.block("B"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    T.reads(A[vi, :])
                    T.writes([B[vi, vj]])
                    t = A[vi, vj] + 1
                    B[vi, vj] = t * 2 if False else t * 2
    '''
    with pytest.raises(ParseError, match="line 12"):
        parse(text)  # `x if c else y` is not TensorIR
    f = parse(text.replace(" if False else t * 2", ""))
    blk = f.body.body.body.block
    assert [iv.kind for iv in blk.iter_vars] == ["spatial", "spatial"]
    assert T.structural_equal(blk.reads[0].region[1], Range(0, 16))
    assert isinstance(blk.body, LetStmt) and blk.body.value.b.dtype == "float32"
    assert f.attrs == () and f.buffers[0].shape[0] is f.body.extent
    roundtrip(f)
    # chained comparisons mean what Python says; a bare int next to a float is a float
    a, b, c = Var("a"), Var("b"), Var("c")
    assert T.structural_equal(parse("a < b <= c", {"a": a, "b": b, "c": c}),
                              And(LT(a, b), LE(b, c)))
    x = Var("x", "float32")
    assert T.structural_equal(parse("x * 2", {"x": x}), x * FloatImm(2.0))


def test_parse_expression_creates_unknown_names():
    e = parse("(n + 1) * 4")
    assert e.script() == "(n + 1) * 4" and e.dtype == "int64"
    assert isinstance(e.a.a, Var) and e.a.a.name == "n"


# ---------------------------------------------------------------------------------------------
# errors


def _error(text, **kw):
    with pytest.raises(ParseError) as info:
        parse(text, **kw)
    assert isinstance(info.value, ValueError)
    return info.value


def test_parse_errors_name_line_and_expectation():
    good = matmul().script()
    lines = good.splitlines()

    bad = lines.copy()
    bad[10] = bad[10].replace("T.reads(A[vi, vk], W[vk, vj])", "T.reads(A[vi, vk], Q[vk, vj])")
    err = _error("\n".join(bad))
    assert err.lineno == 11 and "undefined name 'Q'" in str(err) and "line 11" in str(err)

    bad = lines.copy()
    bad[13] = bad[13].replace("T.float32(0)", "T.float32(0) +")
    err = _error("\n".join(bad))
    assert err.lineno == 14 and "invalid syntax" in str(err)

    bad = lines.copy()
    bad[14] = bad[14].replace("C[vi, vj] =", "C[vi, vj, vk] =")
    err = _error("\n".join(bad))
    assert err.lineno == 15 and "3 indices for 2 dimensions" in str(err)

    bad = lines.copy()
    bad[14] = bad[14].replace("C[vi, vj] + ", "T.Cast(\"int32\", C[vi, vj]) + ")
    err = _error("\n".join(bad))
    assert err.lineno == 15 and "dtypes differ" in str(err)

    bad = lines.copy()
    bad[5] = bad[5].replace("T.grid", "T.gird")
    err = _error("\n".join(bad))
    assert err.lineno == 6 and "expected range(...)" in str(err)

    bad = lines.copy()
    bad.insert(15, "                T.reads(A[vi, vk])")
    err = _error("\n".join(bad))
    assert err.lineno == 16 and "before its body" in str(err)

    err = _error(good.replace("@T.prim_func", "@T.prim_fun"))
    assert err.lineno == 1 and "expected the decorator @T.prim_func" in str(err)

    err = _error(good.replace("A: T.Buffer((n, 64)", "A: T.Buffer((m, 64)"))
    assert err.lineno == 2 and "undefined name 'm'" in str(err)

    err = _error("@T.prim_func\ndef f(A: T.Buffer((4,), \"float32\")):\n    x: T.int64 = 3\n")
    assert err.lineno == 3 and "body" in str(err)

    err = _error("@T.prim_func\ndef f(A: T.Buffer((4,), \"float32\")):\n    A[0] = T.frob(1)\n")
    assert err.lineno == 3 and "unknown function T.frob" in str(err)

    err = _error("@T.prim_func\ndef f(A: T.Buffer((4,), \"float32\")):\n    A[0] = 1.5\n    A[0] = A\n")
    assert err.lineno == 4 and "index it as A[...]" in str(err)

    err = _error("@T.prim_func\ndef f(A):\n    pass\n")
    assert err.lineno == 2 and "needs an annotation" in str(err)

    err = _error("@T.prim_func\ndef f(i: T.int32):\n    T.evaluate(i + 1.5)\n")
    assert err.lineno == 3 and "float literal 1.5" in str(err)

    err = _error("x = 1\ny = 2\n")
    assert "expected one @T.prim_func" in str(err)
    err = _error("T.exp(x)", extra_vars={"x": Var("x")})
    assert "float arguments" in str(err)
    assert "A is not a buffer" in str(_error("A[0]"))  # unknown names are Vars in expressions
    assert _error("T.float32(T.opaque)").lineno == 1


def test_redefinition_and_unparseable_values_are_errors():
    text = matmul().script().replace("vj = T.axis.spatial(32, j)", "vi = T.axis.spatial(32, j)")
    err = _error(text)
    assert err.lineno == 9 and "'vi' is already defined" in str(err)
    f = func_of(root(SeqStmt([])), [Buffer("A", (1,), "float32")],
                attrs={"target": object()})
    text = f.script()
    assert 'T.func_attr({"target": T.opaque("<object object at' in text
    assert "has no text form" in str(_error(text))


# ---------------------------------------------------------------------------------------------
# more forms: 0-d buffers, vectors, lowered functions, deep expressions, relax entries


def test_zero_dim_buffers_and_vector_dtypes():
    s = Buffer("s", (), "float32")
    v = Buffer("v", (4,), "float32")
    x = Var("x", "float32x4")
    blk = Block("b", [], [BufferRegion(v, [Range(0, 4)])], [BufferRegion(s, [])],
                BufferStore(s, s[()] + v[0], []))
    body = seq(BlockRealize([], None, blk),
               LetStmt(x, Cast("float32x4", IntImm(1, "int32x4")),
                       Evaluate(Add(x, FloatImm(2.0, "float32x4")))))
    f = func_of(root(body), [s, v])
    text, _ = roundtrip(f)
    assert 's: T.Buffer((), "float32")' in text and "s[()] = s[()] + v[0]" in text
    assert "T.writes(s[()])" in text
    assert 'x: T.float32x4 = T.Cast("float32x4", T.int32x4(1))' in text
    assert "T.evaluate(x + 2.0)" in text


def test_handle_used_in_body_prints_match_buffer():
    A = Buffer("A", (4,), "float32")
    h = Var("A_handle", "handle")
    f = PrimFunc([h], Evaluate(Call("int32", "touch", [h])), {h: A})
    text, _ = roundtrip(f)
    assert "def main(A_handle: T.handle):" in text
    assert 'A = T.match_buffer(A_handle, (4,), "float32")' in text


def test_lowered_functions_round_trip():
    from tilecraft.tensorir import transform
    n = te.var("n")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: te.if_then_else(i < 4, A[i], A[i - 4]) * 2.0, "B")
    C = te.compute((n,), lambda i: te.exp(B[i]), "C")
    for f in [matmul(), matmul(n=16), te.create_prim_func([A, C])]:
        g = transform.lower(f)
        text = g.script()
        back = parse(text)
        # "arg_buffers" holds buffers that no parameter or allocation defines: they compare
        # by identity unless free variables and buffers may be mapped
        assert T.structural_equal(back, g, map_free_vars=True), text
        assert back.script() == text


def test_deep_expressions():
    a = Var("a")
    e = a
    for k in range(2000):
        e = e + a * k
    back = parse(e.script(), {"a": a})
    assert back.script() == e.script()
    e = a
    for k in range(150):
        e = k - e
    assert parse(e.script(), {"a": a}).script() == e.script()
    for k in range(100):
        e = k - e
    assert "nested parentheses" in str(_error(e.script(), extra_vars={"a": a}))


def test_module_with_a_relax_function_prints_it_and_refuses_to_parse_it():
    class FakeRelaxFunction:
        def script(self):
            return '@R.function\ndef f(x: R.Tensor((n,), "float32")):\n    return x'

    mod = IRModule({"add": matmul(), "f": FakeRelaxFunction()})
    text = mod.script()
    assert "\n    @R.function\n    def f(" in text
    err = _error(text)
    assert "relax functions" in str(err) and err.lineno == text.splitlines().index("    @R.function") + 1


def test_text_printed_by_tvm_parses():
    text = '''
    # from tvm.script import tir as T

    @T.prim_func
    def main(A: T.Buffer((128, 128), "float32"), B: T.Buffer((128, 128), "float32"),
             C: T.Buffer((128, 128), "float32")):
        T.func_attr({"global_symbol": "main", "tir.noalias": T.bool(True)})
        for i, j, k in T.grid(128, 128, 128):
            with T.block("C"):
                v_i, v_j, v_k = T.axis.remap("SSR", [i, j, k])
                T.reads(A[v_i, v_k], B[v_k, v_j])
                T.writes(C[v_i, v_j])
                with T.init():
                    C[v_i, v_j] = T.float32(0.0)
                C[v_i, v_j] = C[v_i, v_j] + A[v_i, v_k] * B[v_k, v_j]
    '''
    f = parse(text)
    assert f.attr_dict["tir.noalias"].dtype == "bool"
    blk = f.body.body.body.body.block
    assert [iv.kind for iv in blk.iter_vars] == ["spatial", "spatial", "reduce"]
    assert all(T.structural_equal(iv.dom, Range(0, 128)) for iv in blk.iter_vars)
    text2, _ = roundtrip(f)
    assert "v_k = T.axis.reduce(128, k)" in text2
