"""Expression nodes: construction, dtype rules, operator overloading, structural equality/hash."""
import pytest

from tilecraft import tensorir as T
from tilecraft.tensorir import dtype as dt
from tilecraft.tensorir.expr import TIRError


def test_operators_build_nodes():
    n = T.var("n")
    e = (n * 8 + 3) // 8
    assert isinstance(e, T.FloorDiv)
    assert isinstance(e.a, T.Add) and isinstance(e.a.a, T.Mul)
    assert e.dtype == "int64"
    assert isinstance(n % 4, T.FloorMod)
    assert isinstance(n < 4, T.LT) and (n < 4).dtype == "bool"
    assert isinstance(-n, T.Sub)


def test_python_scalars_take_the_other_operand_dtype():
    x = T.var("x", "float16")
    e = x * 2
    assert e.dtype == "float16" and isinstance(e.b, T.FloatImm) and e.b.dtype == "float16"
    i = T.var("i", "int32")
    assert (i + 1).b.dtype == "int32"
    assert (3 + i).a.dtype == "int32"


def test_mismatched_dtypes_name_both_operands():
    a = T.var("a", "float32")
    b = T.var("b", "float64")
    with pytest.raises(TIRError, match="float32.*float64"):
        a + b
    i = T.var("i")
    with pytest.raises(TIRError, match="Python float"):
        i * 0.5
    with pytest.raises(TIRError):
        T.Not(i)


def test_eq_is_structural_when_used_as_bool():
    i = T.var("i")
    assert bool((i + 1) == (i + 1))
    assert not bool((i + 1) == (i + 2))
    assert bool((i + 1) != (T.var("i") + 1))  # a different variable of the same name
    d = {i * 2: "a"}
    assert d[i * 2] == "a"
    assert (i * 2) in [i, i * 2]


def test_symbolic_truth_value_is_an_error():
    i = T.var("i")
    with pytest.raises(TIRError, match="truth value"):
        if i < 3:
            pass


def test_astype_and_cast():
    i = T.var("i", "int32")
    c = i.astype("float32")
    assert isinstance(c, T.Cast) and c.dtype == "float32"
    assert i.astype("int32") is i
    with pytest.raises(dt.DataTypeError):
        i.astype("float8")


def test_immutability_and_replace():
    i = T.var("i")
    e = i + 1
    with pytest.raises(AttributeError):
        e.a = i
    f = e.replace(b=T.const(2, "int64"))
    assert f.b.value == 2 and e.b.value == 1


def test_dtypes():
    for d in ["bool", "int8", "int16", "int32", "int64", "uint8", "uint32", "float16", "float32",
              "float64"]:
        assert dt.check(d) == d
    assert dt.lanes("float32x8") == 8 and dt.element_of("float32x8") == "float32"
    assert dt.itemsize("float16") == 2 and dt.itemsize("bool") == 1
    with pytest.raises(dt.DataTypeError):
        dt.check("int7")


def test_call_intrinsics_check_arity_and_types():
    x = T.var("x", "float32")
    assert T.Call("float32", "exp", [x]).op == "exp"
    with pytest.raises(TIRError, match="argument"):
        T.Call("float32", "exp", [x, x])
    with pytest.raises(TIRError, match="float"):
        T.Call("int64", "exp", [T.var("i")])


def test_buffer_load_checks_rank_and_index_type():
    A = T.Buffer("A", (4, 4), "float32")
    assert A[1, 2].dtype == "float32"
    with pytest.raises(TIRError, match="2 dimension"):
        A[1]
    with pytest.raises(TIRError, match="integer"):
        A[1, T.var("x", "float32")]


def test_structural_equal_maps_defined_vars():
    i, j = T.var("i"), T.var("j")
    A = T.Buffer("A", (8,), "float32")
    s1 = T.For(i, 0, 8, "serial", T.BufferStore(A, T.FloatImm(1.0), [i]))
    s2 = T.For(j, 0, 8, "serial", T.BufferStore(A, T.FloatImm(1.0), [j]))
    assert T.structural_equal(s1, s2)
    assert T.structural_hash(s1) == T.structural_hash(s2)
    s3 = T.For(j, 0, 8, "parallel", T.BufferStore(A, T.FloatImm(1.0), [j]))
    assert not T.structural_equal(s1, s3)
    # free variables compare by identity
    assert not T.structural_equal(i + 1, j + 1)
    assert T.structural_equal(i + 1, j + 1, map_free_vars=True)


def test_substitute_and_free_vars():
    i, n = T.var("i"), T.var("n")
    e = T.substitute(i * 2 + n, {i: n + 1})
    assert T.structural_equal(e, (n + 1) * 2 + n)
    A = T.Buffer("A", (n,), "float32")
    loop = T.For(i, 0, n, "serial", T.BufferStore(A, T.FloatImm(0.0), [i]))
    from tilecraft.tensorir.functor import free_vars
    assert free_vars(loop) == [n]
