"""FoldCastIntoGEMM: a GEMM-like call reads a float32 value itself where its float16 cast would
be a kernel of its own (a parameter, a value also used in float32, a reduction's result), and
leaves the cast where its producer can take it; the folded module computes what the unfolded
one does (float16 accumulation: bit for bit on the interpreter-exact CPU build)."""
import numpy as np

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.op import nn
from tilecraft.relax.transform import FoldCastIntoGEMM, ToMixedPrecision


def _module():
    """x -> three dense layers of x (the input's cast used three times), a layer norm whose
    result feeds a dense layer and a residual add, a dense layer after a relu (its cast joins
    the relu's kernel)."""
    rng = np.random.default_rng(0)
    w = [const(rng.standard_normal((16, 16)).astype("float32")) for _ in range(5)]
    g, b = const(np.ones(16, "float32")), const(np.zeros(16, "float32"))
    x = Var("x", TensorStructInfo(("n", 16), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.add(bb.emit(op.matmul(x, w[0])), bb.emit(op.matmul(x, w[1]))))
            a = bb.emit(op.add(a, bb.emit(op.matmul(x, w[2]))))
            ln = bb.emit(nn.layer_norm(a, g, b, axes=[-1]))
            h = bb.emit(op.add(bb.emit(op.matmul(ln, w[3])), ln))
            r = bb.emit(nn.relu(h))
            out = bb.emit_output(bb.emit(op.matmul(r, w[4])))
        bb.emit_func_output(out)
    return bb.get()


def _gemm_operand_dtypes(mod):
    from tilecraft.relax.analysis import get_var2val
    return [tuple(a.struct_info.dtype for a in v.args)
            for v in get_var2val(mod["main"]).values()
            if getattr(getattr(v, "op", None), "name", None) == "relax.matmul"]


def test_casts_fold_where_they_stand_alone_only():
    mod16 = ToMixedPrecision()(_module())
    before = _gemm_operand_dtypes(mod16)
    assert all(d == ("float16", "float16") for d in before)
    after = _gemm_operand_dtypes(FoldCastIntoGEMM()(mod16))
    # the parameter's three dense layers and the layer norm's read float32; the last one reads
    # the relu's float16 result (the relu writes it so)
    assert after == [("float32", "float16")] * 4 + [("float16", "float16")], after


def test_folded_module_computes_the_same():
    mod = _module()
    x = np.random.default_rng(1).standard_normal((5, 16)).astype("float32")
    for out_dtype, tol in (("float32", 3e-3), ("float16", 0.0)):
        mod16 = ToMixedPrecision(out_dtype=out_dtype)(mod)
        outs = []
        for m in (mod16, FoldCastIntoGEMM()(mod16)):
            vm = relax.VirtualMachine(relax.build(m, "llvm"), targets.cpu(0))
            outs.append(vm["main"](x).numpy().astype("float64"))
        err = np.abs(outs[0] - outs[1]).max() / np.abs(outs[0]).max()
        assert err <= tol, (out_dtype, err)


def test_the_gpu_pipelines_run_it_except_with_tensor_cores():
    from tilecraft.relax.transform import get_pipeline

    def names(t):
        return [p.name for p in get_pipeline(target=t).passes]
    assert "FoldCastIntoGEMM" in names("webgpu") and "FoldCastIntoGEMM" in names("opencl")
    assert "FoldCastIntoGEMM" not in names("llvm")
    assert "FoldCastIntoGEMM" not in names("opencl -device=nvidia")
