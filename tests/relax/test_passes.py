"""Relax graph passes: LegalizeOps, FoldConstant, DeadCodeElimination, CanonicalizeBindings,
FuseOps, FuseTIR and the default pipeline.

Each pass runs on small modules built with BlockBuilder (on the private ``ptest.*`` operators of
passutil, so these tests do not depend on the real operator set); the tests check the key lines
of the printed result, well-formedness, and that the module computes the same as numpy before
and after, on random inputs, with symbolic dims.
"""
import numpy as np
import pytest

from tilecraft import relax
from tilecraft import tensorir
from tilecraft.relax import (BlockBuilder, Call, Function, GlobalVar, RelaxError, TensorStructInfo, Tuple,
                   TupleGetItem, Var, const)
from tilecraft.relax.analysis import check_well_formed, infer_op_pattern, well_formed
from tilecraft.relax.op.base import OpPattern, call, register_op
from tilecraft.relax.printer import to_script
from tilecraft.relax.transform import (CanonicalizeBindings, DeadCodeElimination, FoldConstant, FuseOps,
                             FuseTIR, LegalizeOps, Sequential, get_pipeline)
from tilecraft.tensorir import te
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.interpret import interpret

from passutil import (REFERENCE, add, cumsum, div, exp, matmul, relu, rowmax, rowsum, run_module,
                      shape_of, sub, transpose)

RNG = np.random.default_rng(1234)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def T(shape, dtype="float32"):
    return TensorStructInfo(shape, dtype)


def main_text(mod) -> str:
    """The printed text of mod["main"] (as the module prints it)."""
    text = to_script(mod)
    start = text.index("    def main(")
    end = text.find("\n\n", start)
    return text[start:end if end >= 0 else None]


def relax_funcs(mod):
    return {n: f for n, f in mod.functions.items() if isinstance(f, Function)}


def prim_funcs(mod):
    return {n: f for n, f in mod.functions.items() if isinstance(f, PrimFunc)}


# ---------------------------------------------------------------------------------------------
# modules


def mlp_module(layers=2, hidden=(16, 32, 8)):
    bb = BlockBuilder()
    x = Var("x", T(("n", hidden[0])))
    params = [x]
    weights = []
    for k in range(layers):
        w = Var(f"w{k}", T((hidden[k], hidden[k + 1])))
        b = Var(f"b{k}", T((hidden[k + 1],)))
        weights += [w, b]
    with bb.function("main", params + weights):
        with bb.dataflow():
            h = x
            for k in range(layers):
                w, b = weights[2 * k], weights[2 * k + 1]
                h = bb.emit(matmul(h, w))
                h = bb.emit(add(h, b))
                h = bb.emit(relu(h)) if k < layers - 1 else bb.emit_output(relu(h))
        bb.emit_func_output(h)
    return bb.get()


def mlp_inputs(n, layers=2, hidden=(16, 32, 8)):
    args = [rand(n, hidden[0])]
    for k in range(layers):
        args += [rand(hidden[k], hidden[k + 1]), rand(hidden[k + 1])]
    return args


def mlp_reference(args, layers=2):
    h = args[0]
    for k in range(layers):
        h = np.maximum(h @ args[1 + 2 * k] + args[2 + 2 * k], 0)
    return h


def check_same(mod_a, mod_b, *args, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(run_module(mod_b, *args), run_module(mod_a, *args), rtol=rtol,
                               atol=atol)


# ---------------------------------------------------------------------------------------------
# LegalizeOps


def test_legalize_ops_mlp_symbolic():
    mod = mlp_module()
    new = LegalizeOps()(mod)
    check_well_formed(new)
    text = main_text(new)
    assert 'lv: R.Tensor((n, 32), "float32") = R.call_tir(cls.matmul, (x, w0), ' \
           'out_sinfo=R.Tensor((n, 32), "float32"))' in text
    assert "ptest." not in text
    # the kernels carry the operator's pattern for FuseOps
    pats = {n: f.attr_dict["op_pattern"] for n, f in prim_funcs(new).items()}
    assert pats["matmul"] == OpPattern.OUT_EWISE_FUSABLE
    assert pats["add"] == OpPattern.BROADCAST and pats["relu"] == OpPattern.ELEMWISE
    assert mod["main"].body.blocks[0].bindings[0].value.op.name == "ptest.matmul"  # input intact
    for n in (3, 7):
        args = mlp_inputs(n)
        np.testing.assert_allclose(run_module(new, *args), mlp_reference(args), rtol=1e-5,
                                   atol=1e-5)


def test_legalize_keeps_builtins_and_legalizes_nested():
    # a legalization that emits another operator call: it is legalized in turn
    def legal_add_relu(bb, c):
        s = bb.emit(add(c.args[0], c.args[1]), "s")
        return relu(s)

    register_op("ptest.add_relu", lambda c: c.args[0].struct_info, legal_add_relu,
                OpPattern.BROADCAST)
    REFERENCE["ptest.add_relu"] = lambda a, b: np.maximum(a + b, 0)
    bb = BlockBuilder()
    x = Var("x", T(("n", 4)))
    y = Var("y", T((4,)))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            lv = bb.emit(call("ptest.add_relu", [x, y]))
            s = bb.emit_output(shape_of(lv))
            gv = bb.emit_output(lv)
        bb.emit_func_output(Tuple([gv, s]))
    mod = bb.get()
    new = LegalizeOps()(mod)
    check_well_formed(new)
    text = main_text(new)
    assert "ptest.shape_of(lv)" in text                 # no legalization: stays for the VM
    assert "R.call_tir(cls.add, (x, y)" in text and "R.call_tir(cls.relu, (s,)" in text
    # two kernels from one legalization: each gets the pattern read off its body
    pats = {n: f.attr_dict["op_pattern"] for n, f in prim_funcs(new).items()}
    assert pats == {"add": OpPattern.BROADCAST, "relu": OpPattern.ELEMWISE}
    a, b = rand(5, 4), rand(4)
    out, shape = run_module(new, a, b)
    np.testing.assert_allclose(out, np.maximum(a + b, 0), rtol=1e-6)
    assert shape == (5, 4)


def test_legalize_real_operators():
    op = relax.op
    bb = BlockBuilder()
    x = Var("x", T(("n", 8)))
    w = Var("w", T((8, 4)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            gv = bb.emit_output(op.nn.relu(op.add(op.matmul(x, w), const(rand(4)))))
        bb.emit_func_output(gv)
    mod = get_pipeline(check=True)(bb.get())
    assert sum(isinstance(f, PrimFunc) for f in mod.functions.values()) == 1
    xs, ws = rand(3, 8), rand(8, 4)
    c = bb.get()["main"].body.blocks[0].bindings[0].value.args[0].args[1].data
    np.testing.assert_allclose(run_module(mod, xs, ws), np.maximum(xs @ ws + c, 0), rtol=1e-5,
                               atol=1e-5)


# ---------------------------------------------------------------------------------------------
# FoldConstant


def test_fold_constant_call_tir_and_ops():
    c1, c2 = rand(4), rand(4)
    big = rand(64, 128)  # large enough to be compiled rather than interpreted
    bb = BlockBuilder()
    x = Var("x", T(("n", 4)))
    with bb.function("main", [x]):
        with bb.dataflow():
            lv = bb.emit(add(const(c1), const(c2)))
            lv1 = bb.emit_output(relu(const(big)), "big")
            t = bb.emit(Tuple([lv, x]))
            item = bb.emit(TupleGetItem(t, 1))
            gv = bb.emit_output(add(item, lv))
        bb.emit_func_output(Tuple([gv, lv1]))
    mod = LegalizeOps()(bb.get())
    folded = FoldConstant()(mod)
    check_well_formed(folded)
    text = main_text(folded)
    assert 'lv2: R.Tensor((n, 4), "float32") = x' in text      # (lv, x)[1] is x
    assert 'lv: R.Tensor((4,), "float32") = metadata["relax.expr.Constant"][0]' in text
    assert 'gv: R.Tensor((n, 4), "float32") = R.call_tir(cls.add1, (lv2, ' \
           'metadata["relax.expr.Constant"][0])' in text
    assert "return (gv, metadata[" in text
    cleaned = DeadCodeElimination()(folded)
    assert "add" not in prim_funcs(cleaned) and "relu" not in prim_funcs(cleaned)
    assert list(prim_funcs(cleaned)) == ["add1"]
    a = rand(3, 4)
    out, r = run_module(cleaned, a)
    np.testing.assert_allclose(out, a + c1 + c2, rtol=1e-6)
    np.testing.assert_array_equal(r, np.maximum(big, 0))
    # an operator call on constants folds before legalization too
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(add(x, add(const(c1), const(c2))))
        bb.emit_func_output(gv)
    mod2 = FoldConstant()(bb.get())
    assert "R.call_tir" not in main_text(mod2)
    assert 'ptest.add(x, metadata["relax.expr.Constant"][0])' in main_text(mod2)
    np.testing.assert_allclose(run_module(mod2, a), a + c1 + c2, rtol=1e-6)


def test_fold_constant_compiles_the_constant_calls_in_one_module(monkeypatch):
    """The calls on constants that take the compiled path are built in one host module (one
    link); a call whose arguments only become constant while folding is built as it comes."""
    from tilecraft.relax.transform import fold_constant as fold
    built = []
    real_build = fold.targets.build

    def counting_build(func_or_mod, target):
        built.append(sorted(func_or_mod.functions) if hasattr(func_or_mod, "functions")
                     else ["one"])
        return real_build(func_or_mod, target)
    monkeypatch.setattr(fold.targets, "build", counting_build)
    monkeypatch.setattr(fold, "_BUILD_CACHE", {})
    big1, big2, big3 = rand(64, 96), rand(80, 64), rand(64, 96)
    bb = BlockBuilder()
    x = Var("x", T((64, 96)))
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit(relu(const(big1)))
            e = bb.emit(exp(const(big2)))
            s = bb.emit(add(const(big3), const(big1)))
            # constant only once r and s are folded (sub, as add, is interpreted: elementwise
            # IEEE arithmetic has the kernel's bits in numpy; exp is compiled)
            chained = bb.emit(exp(sub(r, s)))
            gv = bb.emit_output(Tuple([add(x, chained), e]))
        bb.emit_func_output(gv)
    folded = FoldConstant()(LegalizeOps()(bb.get()))
    check_well_formed(folded)
    assert built == [["exp", "relu"], ["one"]], built
    a = rand(64, 96)
    out, ex = run_module(DeadCodeElimination()(folded), a)
    np.testing.assert_allclose(out, a + np.exp(np.maximum(big1, 0) - (big3 + big1)), rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(ex, np.exp(big2), rtol=1e-6)


def test_fold_constant_leaves_non_constant_and_builtins():
    bb = BlockBuilder()
    x = Var("x", T((4,)))
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit_output(shape_of(const(rand(2, 3))))  # no legalization: not folded
            gv = bb.emit_output(add(x, x))
        bb.emit_func_output(Tuple([gv, s]))
    mod = LegalizeOps()(bb.get())
    assert FoldConstant()(mod)["main"] is mod["main"]


# ---------------------------------------------------------------------------------------------
# DeadCodeElimination


def test_dead_code_elimination():
    bb = BlockBuilder()
    x = Var("x", T(("n", 4)))
    y = Var("y", T((4,)))
    with bb.function("helper", [y]):
        bb.emit_func_output(y)
    with bb.function("main", [x]):
        with bb.dataflow():
            unused = bb.emit(exp(x))
            unused2 = bb.emit(relu(unused))
            gv = bb.emit_output(add(x, x))
        kept = bb.emit(Call(GlobalVar("helper"), [const(rand(4))], struct_info=T((4,))))
        bb.emit_func_output(gv)
    mod = LegalizeOps()(bb.get())
    private = Function([Var("z", T((4,)))], relax.SeqExpr([], const(rand(4))), attrs={})
    mod = mod.with_function("unused_private", private)
    new = DeadCodeElimination()(mod)
    check_well_formed(new)
    text = main_text(new)
    assert "cls.exp" not in text and "cls.relu" not in text
    assert "cls.helper(" in text          # a call of a function outside dataflow is kept
    assert set(new.functions) == {"helper", "main", "add"}
    assert DeadCodeElimination(entry_functions=["unused_private"])(mod)["unused_private"] \
        is private
    a = rand(3, 4)
    np.testing.assert_allclose(run_module(new, a), a + a)
    assert DeadCodeElimination()(new) is new   # nothing left to do: the same module


# ---------------------------------------------------------------------------------------------
# CanonicalizeBindings


def test_canonicalize_bindings():
    bb = BlockBuilder()
    x = Var("x", T(("n", 4)))
    with bb.function("main", [x]):
        with bb.dataflow():
            lv = bb.emit(exp(x))
            lv1 = bb.emit(lv)                                         # copy
            lv2 = bb.match_cast(lv1, T((x.struct_info.shape[0], 4)))  # trivial match_cast
            lv3 = bb.match_cast(lv2, T(("m", 4)))                     # introduces m: kept
            lv4 = bb.emit(relu(lv3))
            gv = bb.emit_output(lv4)                                  # gv = lv4
        bb.emit_func_output(gv)
    mod = bb.get()
    new = CanonicalizeBindings()(mod)
    check_well_formed(new)
    text = main_text(new)
    assert 'lv3: R.Tensor((m, 4), "float32") = R.match_cast(lv, R.Tensor((m, 4), "float32"))' \
        in text
    assert 'gv: R.Tensor((m, 4), "float32") = ptest.relu(lv3)' in text
    assert "lv1" not in text and "lv2" not in text and "lv4" not in text
    a = rand(3, 4)
    np.testing.assert_allclose(run_module(new, a), np.maximum(np.exp(a), 0), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# FuseOps


def fused_groups(mod):
    """{name: [kernel names in the group]} of the Primitive functions."""
    out = {}
    for n, f in relax_funcs(mod).items():
        if f.attr_dict.get("Primitive"):
            out[n] = [b.value.args[0].name_hint for blk in f.body.blocks for b in blk.bindings
                      if isinstance(b.value, Call) and b.value.args
                      and isinstance(b.value.args[0], GlobalVar)]
    return out


def test_fuse_ops_mlp_two_layers():
    mod = LegalizeOps()(mlp_module())
    fused = FuseOps()(mod)
    check_well_formed(fused)
    assert fused_groups(fused) == {"fused_matmul_add_relu": ["matmul", "add", "relu"],
                                   "fused_matmul1_add1_relu1": ["matmul1", "add1", "relu1"]}
    text = main_text(fused)
    assert 'lv2: R.Tensor((n, 32), "float32") = cls.fused_matmul_add_relu(x, w0, b0)' in text
    assert 'gv: R.Tensor((n, 8), "float32") = cls.fused_matmul1_add1_relu1(lv2, w1, b1)' in text
    ftext = to_script(fused)
    assert "@R.function(private=True)\n    def fused_matmul_add_relu(" in ftext
    assert 'R.func_attr({"Primitive": 1})' in ftext
    args = mlp_inputs(6)
    np.testing.assert_allclose(run_module(fused, *args), mlp_reference(args), rtol=1e-5,
                               atol=1e-5)


def _softmax_module():
    bb = BlockBuilder()
    x = Var("x", T(("n", 10)))
    with bb.function("main", [x]):
        with bb.dataflow():
            m = bb.emit(rowmax(x))
            s = bb.emit(sub(x, m))
            e = bb.emit(exp(s))
            z = bb.emit(rowsum(e))
            gv = bb.emit_output(div(e, z))
        bb.emit_func_output(gv)
    return bb.get()


def test_fuse_ops_softmax_chain():
    mod = LegalizeOps()(_softmax_module())
    fused = FuseOps()(mod)
    check_well_formed(fused)
    # as TVM: the reductions end groups; sub + exp fuse (exp has two consumers, and a path
    # through the reduction does not fuse into the final div)
    assert fused_groups(fused) == {"fused_sub_exp": ["sub", "exp"]}
    a = rand(4, 10)
    e = np.exp(a - a.max(-1, keepdims=True))
    np.testing.assert_allclose(run_module(FuseTIR()(fused), a), e / e.sum(-1, keepdims=True),
                               rtol=1e-5)


def test_fuse_ops_reduction_takes_elementwise_inputs():
    bb = BlockBuilder()
    x = Var("x", T(("n", 10)))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(exp(x))
            r = bb.emit(relu(e))
            gv = bb.emit_output(rowsum(r))
        bb.emit_func_output(gv)
    fused = FuseOps()(LegalizeOps()(bb.get()))
    assert fused_groups(fused) == {"fused_exp_relu_rowsum": ["exp", "relu", "rowsum"]}
    a = rand(3, 10)
    np.testing.assert_allclose(run_module(FuseTIR()(fused), a),
                               np.maximum(np.exp(a), 0).sum(-1, keepdims=True), rtol=1e-5)


def test_fuse_ops_diamond():
    bb = BlockBuilder()
    x = Var("x", T(("n", 8)))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(exp(x))          # used twice
            b = bb.emit(relu(a))
            c = bb.emit(add(a, b))
            gv = bb.emit_output(add(c, b))
        bb.emit_func_output(gv)
    mod = LegalizeOps()(bb.get())
    fused = FuseOps()(mod)
    # every path from exp reaches the last add through element-wise ops: one group
    assert list(fused_groups(fused).values()) == [["exp", "relu", "add", "add"]]
    check_well_formed(fused)
    xs = rand(5, 8)
    ea = np.exp(xs)
    ref = ea + 2 * np.maximum(ea, 0)
    np.testing.assert_allclose(run_module(FuseTIR()(fused), xs), ref, rtol=1e-5)


def test_fuse_ops_value_used_by_an_opaque_branch():
    bb = BlockBuilder()
    x = Var("x", T(("n", 8)))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(exp(x))
            b = bb.emit(relu(a))
            c = bb.emit(cumsum(a))       # opaque consumer of a: a cannot join the group
            gv = bb.emit_output(add(b, c))
        bb.emit_func_output(gv)
    fused = FuseOps()(LegalizeOps()(bb.get()))
    check_well_formed(fused)
    assert list(fused_groups(fused).values()) == [["relu", "add"]]
    text = main_text(fused)
    assert "R.call_tir(cls.exp, (x,)" in text and "R.call_tir(cls.cumsum, (lv,)" in text
    xs = rand(4, 8)
    ea = np.exp(xs)
    np.testing.assert_allclose(run_module(fused, xs), np.maximum(ea, 0) + np.cumsum(ea, -1),
                               rtol=1e-5)


def test_fuse_ops_opaque_in_the_middle_and_shared_functions():
    bb = BlockBuilder()
    x = Var("x", T(("n", 8)))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relu(bb.emit(exp(x))))
            c = bb.emit(cumsum(a))
            gv = bb.emit_output(relu(bb.emit(exp(c))))
        bb.emit_func_output(gv)
    fused = FuseOps()(LegalizeOps()(bb.get()))
    check_well_formed(fused)
    # exp+relu on either side of the opaque cumsum; identical groups share one function
    assert fused_groups(fused) == {"fused_exp_relu": ["exp", "relu"]}
    text = main_text(fused)
    assert text.count("cls.fused_exp_relu(") == 2 and "R.call_tir(cls.cumsum" in text
    final = DeadCodeElimination()(FuseTIR()(fused))
    assert set(prim_funcs(final)) == {"cumsum", "fused_exp_relu"}
    xs = rand(3, 8)
    ref = np.maximum(np.exp(np.cumsum(np.maximum(np.exp(xs), 0), -1)), 0)
    np.testing.assert_allclose(run_module(final, xs), ref, rtol=1e-5)


def test_fuse_ops_injective_and_outputs():
    # transpose (injective) fuses into its element-wise consumer in phase 1; a value that leaves
    # the dataflow block ends its group
    bb = BlockBuilder()
    x = Var("x", T((6, "n")))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(transpose(x))
            e = bb.emit_output(exp(t))           # leaves the block
            gv = bb.emit_output(relu(e))
        bb.emit_func_output(Tuple([e, gv]))
    fused = FuseOps()(LegalizeOps()(bb.get()))
    check_well_formed(fused)
    assert fused_groups(fused) == {"fused_transpose_exp": ["transpose", "exp"]}
    xs = rand(6, 5)
    e, g = run_module(FuseTIR()(fused), xs)
    np.testing.assert_allclose(e, np.exp(xs.T), rtol=1e-6)
    np.testing.assert_allclose(g, np.maximum(np.exp(xs.T), 0), rtol=1e-6)


def test_fuse_ops_level_zero_and_high_level_ops():
    mod = LegalizeOps()(mlp_module(layers=1))
    assert FuseOps(fuse_opt_level=0)(mod) is mod
    # operator calls (not legalized) fuse by their own patterns; FuseTIR leaves those functions
    raw = mlp_module(layers=1)
    fused = FuseOps()(raw)
    assert [n for n in relax_funcs(fused) if n != "main"] == ["fused_matmul_add_relu"]
    assert FuseTIR()(fused) is fused
    args = mlp_inputs(2, layers=1)
    np.testing.assert_allclose(run_module(fused, *args), mlp_reference(args, 1), rtol=1e-5,
                               atol=1e-5)


# ---------------------------------------------------------------------------------------------
# FuseTIR


def test_fuse_tir_mlp_and_interpret_oracle():
    legal = LegalizeOps()(mlp_module())
    fused = FuseOps()(legal)
    final = FuseTIR()(fused)
    check_well_formed(final)
    assert set(prim_funcs(final)) == {"fused_matmul_add_relu", "fused_matmul1_add1_relu1"}
    assert set(relax_funcs(final)) == {"main"}
    text = main_text(final)
    assert ('lv2: R.Tensor((n, 32), "float32") = R.call_tir(cls.fused_matmul_add_relu, '
            '(x, w0, b0), out_sinfo=R.Tensor((n, 32), "float32"))') in text
    pf = final["fused_matmul_add_relu"]
    assert pf.attr_dict["op_pattern"] == OpPattern.OUT_EWISE_FUSABLE
    ptext = to_script(pf)
    assert 'lv = T.alloc_buffer((n, 32), "float32")' in ptext
    assert 'with T.block("matmul")' in ptext and 'with T.block("relu")' in ptext
    # ordinary TensorIR: it prints and parses back, and schedules by block name
    assert tensorir.structural_equal(tensorir.parse(ptext), pf)
    sch = tensorir.Schedule(pf)
    sch.compute_inline(sch.get_block("add"))
    # the fused kernel computes what the chain of kernels computed (interpreter as the oracle)
    n = 5
    xs, w, b = rand(n, 16), rand(16, 32), rand(32)
    out = np.zeros((n, 32), "float32")
    interpret(pf, xs, w, b, out)
    chain = np.zeros((n, 32), "float32")
    tmp1, tmp2 = np.zeros((n, 32), "float32"), np.zeros((n, 32), "float32")
    interpret(legal["matmul"], xs, w, tmp1)
    interpret(legal["add"], tmp1, b, tmp2)
    interpret(legal["relu"], tmp2, chain)
    np.testing.assert_allclose(out, chain, rtol=1e-5, atol=1e-5)
    for n in (1, 9):
        args = mlp_inputs(n)
        np.testing.assert_allclose(run_module(final, *args), mlp_reference(args), rtol=1e-5,
                                   atol=1e-5)


def test_fuse_tir_unifies_symbolic_dims_and_lifts_constants():
    # the add kernel is shared between a call on (n, 4) and one on (m, 4): inlined into the
    # group on m, its n becomes m; a constant argument becomes a parameter of the fused kernel
    c = rand(4)
    bb = BlockBuilder()
    x = Var("x", T(("n", 4)))
    y = Var("y", T(("m", 4)))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = bb.emit(add(x, const(c)))
            b = bb.emit(add(y, const(c)))
            gv = bb.emit_output(Tuple([bb.emit(cumsum(a)), bb.emit(relu(b))]))
        bb.emit_func_output(gv)
    legal = LegalizeOps()(bb.get())
    assert [n for n in prim_funcs(legal) if n.startswith("add")] == ["add"]
    final = FuseTIR()(FuseOps()(legal))
    check_well_formed(final)
    text = main_text(final)
    assert "R.call_tir(cls.fused_add_relu, (y, metadata[" in text
    ptext = to_script(final["fused_add_relu"])
    assert 'y: T.Buffer((m, 4), "float32")' in ptext and "const: T.Buffer((4,)" in ptext
    assert "m = T.int64()" in ptext and "n = T.int64()" not in ptext
    xs, ys = rand(3, 4), rand(7, 4)
    r1, r2 = run_module(final, xs, ys)
    np.testing.assert_allclose(r1, np.cumsum(xs + c, -1), rtol=1e-5)
    np.testing.assert_allclose(r2, np.maximum(ys + c, 0), rtol=1e-6)


def test_fuse_tir_multi_output_group_and_tir_vars():
    # a kernel with two outputs inside a group, and a kernel taking a tir var
    def split2(a):
        return [te.compute((a.shape[0], 4), lambda i, j: a[i, j], "lo"),
                te.compute((a.shape[0], 4), lambda i, j: a[i, j + 4], "hi")]

    bb = BlockBuilder()
    x = Var("x", T(("n", 8)))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(exp(x))
            t = bb.emit_te(split2, e)
            lo = bb.emit(TupleGetItem(t, 0))
            hi = bb.emit(TupleGetItem(t, 1))
            gv = bb.emit_output(add(lo, hi))
        bb.emit_func_output(gv)
    mod = LegalizeOps()(bb.get())
    fused = FuseOps()(mod)
    check_well_formed(fused)
    assert list(fused_groups(fused).values()) == [["exp", "split2", "add"]]
    final = FuseTIR()(fused)
    check_well_formed(final)
    assert [n for n in prim_funcs(final)] == ["fused_exp_split2_add"]
    xs = rand(3, 8)
    np.testing.assert_allclose(run_module(final, xs), np.exp(xs[:, :4]) + np.exp(xs[:, 4:]),
                               rtol=1e-6)


def test_fuse_tir_group_taking_a_tuple_of_tensors():
    # a two-output kernel whose tuple feeds two groups stays its own kernel; each group takes
    # the whole tuple and reads one item (the attention's q / k / v of a split): FuseTIR passes
    # the items as buffers, so no Relax function but main is left
    def split2(a):
        return [te.compute((a.shape[0], 4), lambda i, j: a[i, j], "lo"),
                te.compute((a.shape[0], 4), lambda i, j: a[i, j + 4], "hi")]

    bb = BlockBuilder()
    x = Var("x", T(("n", 8)))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit_te(split2, x)
            outs = [bb.emit(relu(bb.emit(exp(bb.emit(TupleGetItem(t, k)))))) for k in range(2)]
            gv = bb.emit_output(Tuple(outs))
        bb.emit_func_output(gv)
    fused = FuseOps()(LegalizeOps()(bb.get()))
    groups = [f for f in relax_funcs(fused).values() if f.attr_dict.get("Primitive")]
    assert len(groups) == 2 and all(len(f.params) == 1 for f in groups)   # the tuple, whole
    final = FuseTIR()(fused)
    check_well_formed(final)
    assert set(relax_funcs(final)) == {"main"}
    assert set(prim_funcs(final)) == {"split2", "fused_exp_relu", "fused_exp_relu1"}
    assert len(final["fused_exp_relu"].buffers) == 3      # both items, the output
    for n in (1, 5):
        xs = rand(n, 8)
        lo, hi = run_module(final, xs)
        np.testing.assert_allclose(lo, np.maximum(np.exp(xs[:, :4]), 0), rtol=1e-6)
        np.testing.assert_allclose(hi, np.maximum(np.exp(xs[:, 4:]), 0), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# analysis helpers the passes use


def test_infer_op_pattern():
    A = te.placeholder((4, 8), "float32", "A")
    b = te.placeholder((8,), "float32", "b")
    W = te.placeholder((8, 3), "float32", "W")
    k = te.reduce_axis((0, 8), "k")
    cases = {
        OpPattern.ELEMWISE: te.compute((4, 8), lambda i, j: te.exp(A[i, j]), "e"),
        OpPattern.BROADCAST: te.compute((4, 8), lambda i, j: A[i, j] + b[j], "bc"),
        OpPattern.INJECTIVE: te.compute((8, 4), lambda i, j: A[j, i], "t"),
        OpPattern.COMM_REDUCE: te.compute((4,), lambda i: te.sum(A[i, k], axis=k), "s"),
        OpPattern.OUT_EWISE_FUSABLE: te.compute((4, 3), lambda i, j: te.sum(A[i, k] * W[k, j],
                                                                           axis=k), "mm"),
    }
    for want, out in cases.items():
        ins = [t for t in (A, b, W) if any(t is x for x in out.inputs)]
        assert infer_op_pattern(te.create_prim_func(ins + [out])) == want, out.name


def test_pipeline_default_symbolic_and_well_formed():
    c = rand(32)
    bb = BlockBuilder()
    x = Var("x", T(("n", 16)))
    w = Var("w", T((16, 32)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            bias = bb.emit(add(const(c), const(c)))          # folded
            h = bb.emit(matmul(x, w))
            h = bb.emit(add(h, bias))
            h1 = bb.emit(h)                                  # copy: canonicalized
            dead = bb.emit(exp(h1))                          # dead
            gv = bb.emit_output(relu(h1))
        bb.emit_func_output(gv)
    mod = bb.get()
    seq = get_pipeline()
    assert [p.name for p in seq.passes] == ["DecomposeOpsForInference", "FoldConstant",
                                           "FoldScaleAxis", "FoldPad", "ConvertLayout",
                                           "FoldConstant", "FuseExpandDepthwise",
                                           "AlterLayout", "SinkReshape", "LegalizeOps",
                                           "FoldConstant", "DeadCodeElimination",
                                           "CanonicalizeBindings", "FuseOps", "FuseTIR",
                                           "RewriteReshapeView", "DeadCodeElimination"]
    gpu = [p.name for p in get_pipeline(target="opencl").passes]
    assert "AlterLayout" not in gpu and "ConvertLayout" not in gpu and \
        "FuseExpandDepthwise" not in gpu
    out = get_pipeline(check=True)(mod)
    assert well_formed(out)
    # add(c, c) is folded before legalization (the first FoldConstant), so the one add kernel
    # is "add"
    assert list(prim_funcs(out)) == ["fused_matmul_add_relu"]
    text = main_text(out)
    assert 'gv: R.Tensor((n, 32), "float32") = R.call_tir(cls.fused_matmul_add_relu, (x, w, ' \
           'metadata["relax.expr.Constant"][0]), out_sinfo=R.Tensor((n, 32), "float32"))' in text
    for n in (2, 5):
        xs, ws = rand(n, 16), rand(16, 32)
        np.testing.assert_allclose(run_module(out, xs, ws), np.maximum(xs @ ws + 2 * c, 0),
                                   rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unknown pipeline"):
        get_pipeline("nope")


def test_sequential_check_names_the_pass():
    def breaker(mod):
        f = mod["main"]
        ghost = Var("ghost", T((4,)))
        return mod.with_function("main", f.replace(body=relax.SeqExpr(f.body.blocks, ghost),
                                                   ret_struct_info=T((4,))))
    mod = mlp_module(layers=1)
    with pytest.raises(RelaxError, match="after breaker.*ghost"):
        Sequential([CanonicalizeBindings(), breaker], check=True)(mod)


def test_passes_reject_non_modules():
    with pytest.raises(TypeError, match="IRModule"):
        LegalizeOps()(mlp_module()["main"])


def test_pipeline_result_runs_on_the_vm():
    from tilecraft import targets
    from tilecraft.relax import VirtualMachine, build
    mod = mlp_module()
    exe = build(mod, "llvm")       # runs get_pipeline() first
    vm = VirtualMachine(exe, targets.cpu(0))
    for n in (1, 6):
        args = mlp_inputs(n)
        out = vm["main"](*args)
        np.testing.assert_allclose(out.numpy(), mlp_reference(args), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(run_module(get_pipeline()(mod), *args), out.numpy(),
                                   rtol=1e-5, atol=1e-5)


def test_scalar_constants_fold_and_fuse():
    # 0-d constants: folded, then passed to a fused kernel as a 0-d buffer
    c1, c2 = np.float32(1.5), np.float32(-0.25)
    bb = BlockBuilder()
    x = Var("x", T(("n", 4)))
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(add(const(c1), const(c2)))
            assert s.struct_info == T(())
            gv = bb.emit_output(relu(bb.emit(add(x, s))))
        bb.emit_func_output(gv)
    out = get_pipeline(check=True)(bb.get())
    assert list(prim_funcs(out)) == ["fused_add_relu"]
    assert 'const: T.Buffer((), "float32")' in to_script(out["fused_add_relu"])
    a = rand(3, 4)
    np.testing.assert_allclose(run_module(out, a), np.maximum(a + (c1 + c2), 0), rtol=1e-6)
