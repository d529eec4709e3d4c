"""targets.llvm.llvmir, the text-emitting LLVM IR builder, against llvmlite.ir as the oracle:
the same program built through both compiles to the same machine code (assembly text), and
the text parses and verifies."""
from __future__ import annotations

import math

import numpy as np
import pytest

llvm = pytest.importorskip("llvmlite.binding")
import llvmlite.ir as lir  # noqa: E402

from tilecraft.targets import Target  # noqa: E402
from tilecraft.targets.llvm import llvmir  # noqa: E402
from tilecraft.targets.llvm.compiler import MachineConfig, optimize  # noqa: E402

TARGETS = ["llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512",
           "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -mattr=+neon"]


def _asm(text: str, target: str) -> str:
    config = MachineConfig(Target(target))
    tm = config.machine(jit=False, pic=True)
    mod = llvm.parse_assembly(text)
    mod.verify()
    optimize(mod, tm, 3)
    return tm.emit_assembly(mod)


def _module(ir, target: str):
    config = MachineConfig(Target(target))
    m = ir.Module(name="t")
    m.triple = config.triple
    m.data_layout = str(config.machine(jit=False, pic=True).target_data)
    return m


def _random_program(ir, m, seed: int, lanes: int):
    """A loop over ``n`` elements of ``out[i] = f(x[i], y[i])`` with ``f`` a random mix of
    integer and float operations, vectors of ``lanes`` lanes, selects, compares and casts; the
    same sequence of builder calls for ``ir`` = llvmlite.ir or llvmir."""
    rng = np.random.default_rng(seed)
    i32, i64, f32, f64 = ir.IntType(32), ir.IntType(64), ir.FloatType(), ir.DoubleType()
    ptr = ir.PointerType()
    vf = ir.VectorType(f32, lanes)
    vi = ir.VectorType(i32, lanes)
    fn = ir.Function(m, ir.FunctionType(i32, [ptr, ptr, ptr, i64]), f"kernel{seed}")
    fn.attributes.add("nounwind")
    for a, name in zip(fn.args, ("x", "y", "out", "n")):
        a.name = name
    fn.args[0].add_attribute("noalias")
    entry = fn.append_basic_block("entry")
    loop = fn.append_basic_block("loop")
    body = fn.append_basic_block("loop")          # a repeated name: made unique
    done = fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(i64, name="i")
    i.add_incoming(ir.Constant(i64, 0), entry)
    br = b.cbranch(b.icmp_signed("<", i, fn.args[3]), body, done)
    br.set_weights([1 << 20, 1])
    b.position_at_end(body)
    xp = b.gep(fn.args[0], [i], source_etype=vf)
    yp = b.gep(fn.args[1], [i], source_etype=vf)
    x = b.load(xp, typ=vf, align=4)
    y = b.load(yp, typ=vf, align=4)
    vals_f = [x, y, ir.Constant(vf, [ir.Constant(f32, float(v)) for v in rng.normal(size=lanes)])]
    vals_i = [b.fptosi(x, vi), ir.Constant(vi, [ir.Constant(i32, int(v))
                                                for v in rng.integers(-9, 9, lanes)])]
    for _ in range(int(rng.integers(8, 20))):
        k = int(rng.integers(0, 10))
        p, q = (vals_f[int(j)] for j in rng.integers(0, len(vals_f), 2))
        s, t = (vals_i[int(j)] for j in rng.integers(0, len(vals_i), 2))
        if k == 0:
            vals_f.append(b.fadd(p, q))
        elif k == 1:
            vals_f.append(b.fmul(p, q, name="prod"))
        elif k == 2:
            vals_f.append(b.select(b.fcmp_ordered("<", p, q), p, q))
        elif k == 3:
            vals_i.append(b.add(s, b.mul(t, ir.Constant(vi, [ir.Constant(i32, 3)] * lanes))))
        elif k == 4:
            vals_i.append(b.select(b.icmp_unsigned(">=", s, t), s, b.xor(s, t)))
        elif k == 5:
            vals_f.append(b.sitofp(s, vf))
        elif k == 6:
            one = b.insert_element(ir.Constant(vf, ir.Undefined), b.extract_element(p, i32(1)),
                                   i32(0))
            vals_f.append(b.shuffle_vector(one, ir.Constant(vf, ir.Undefined),
                                           ir.Constant(vi, [0] * lanes)))
        elif k == 7:
            vals_i.append(b.and_(b.shl(s, ir.Constant(vi, [ir.Constant(i32, 2)] * lanes)),
                                 b.ashr(t, ir.Constant(vi, [ir.Constant(i32, 1)] * lanes))))
        elif k == 8:
            vals_f.append(b.fsub(b.fdiv(p, q), p))
        else:
            wide = b.fpext(p, ir.VectorType(f64, lanes))
            vals_f.append(b.fptrunc(b.fmul(wide, wide), vf))
    res = b.fadd(vals_f[-1], b.sitofp(vals_i[-1], vf))
    op = b.gep(fn.args[2], [i], source_etype=vf)
    st = b.store(res, op, align=4)
    st.set_metadata("nontemporal", m.add_metadata([ir.Constant(i32, 1)]))
    nxt = b.add(i, ir.Constant(i64, 1), name="i")
    back = b.branch(loop)
    i.add_incoming(nxt, body)
    ops = [ir.MetaDataString(m, "llvm.loop.vectorize.enable"), ir.Constant(ir.IntType(1), 1)]
    node = m.add_metadata(ops)
    loop_id = m.add_metadata([None, node])
    loop_id.operands = (loop_id,) + tuple(loop_id.operands[1:])
    back.set_metadata("llvm.loop", loop_id)
    b.position_at_end(done)
    b.ret(ir.Constant(i32, 0))


def _runtime_pieces(ir, m):
    """Globals, a string, a declared varargs function, atomics, aggregates and an alloca."""
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    ptr = ir.PointerType()
    text = bytearray(b'say "%d"\\ \n\x00')
    s = ir.GlobalVariable(m, ir.ArrayType(i8, len(text)), name=".str")
    s.initializer = ir.Constant(ir.ArrayType(i8, len(text)), text)
    s.global_constant, s.linkage, s.unnamed_addr = True, "private", True
    flag = ir.GlobalVariable(m, i32, name="flag")
    flag.initializer = ir.Constant(i32, 0)
    flag.linkage = "internal"
    ext = ir.GlobalVariable(m, i32, name="ext")
    ext.storage_class = "hidden"
    printf = ir.Function(m, ir.FunctionType(i32, [ptr], var_arg=True), "printf")
    pair = ir.LiteralStructType([i32, i32])
    fn = ir.Function(m, ir.FunctionType(pair, [i32, i32]), "pieces")
    fn.linkage = "internal"
    a, c = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    slot = b.alloca(i32, name="slot")
    slot.align = 16
    b.store(a, slot)
    res = b.cmpxchg(flag, ir.Constant(i32, 0), c, "seq_cst", "monotonic")
    won = b.extract_value(res, 1)
    old = b.atomic_rmw("add", flag, b.zext(won, i32), "monotonic")
    b.call(printf, [s, b.load(slot, typ=i32), old, b.load(ext, typ=i32)])
    q = b.sdiv(a, c)
    r = b.srem(a, b.not_(c))
    out = b.insert_value(ir.Constant(pair, ir.Undefined), q, 0)
    b.ret(b.insert_value(out, b.add(r, b.neg(b.trunc(b.sext(a, i64), i32))), 1))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("seed", range(6))
def test_random_programs_compile_to_llvmlite_s_machine_code(seed, target):
    lanes = (4, 8, 16)[seed % 3]
    texts = []
    for ir in (lir, llvmir):
        m = _module(ir, target)
        _random_program(ir, m, seed, lanes)
        _runtime_pieces(ir, m)
        texts.append(str(m))
    assert _asm(texts[0], target) == _asm(texts[1], target)


def test_names_are_unique_and_quoted():
    m = llvmir.Module("n")
    i32 = llvmir.IntType(32)
    fn = llvmir.Function(m, llvmir.FunctionType(i32, [i32]), 'odd"name')
    fn.args[0].name = "x"
    blocks = [fn.append_basic_block(n) for n in ("a", "a", "a.1", ".1", "9lives", "x")]
    assert [blk.name for blk in blocks] == ["a", "a.1", "a.1.1", ".1.1", "9lives", "x.1"]
    b = llvmir.IRBuilder(blocks[0])
    v = b.add(fn.args[0], i32(1), name="x")
    w = b.add(v, i32(2))
    assert v.ref == '%"x.2"' and w.ref.startswith('%".')
    b.ret(w)
    for blk in blocks[1:]:
        llvmir.IRBuilder(blk).ret(i32(0))
    text = str(m)
    assert '@"odd\\22name"' in text and '"9lives":' in text
    mod = llvm.parse_assembly(text)
    mod.verify()


@pytest.mark.parametrize("value", [0.0, -0.0, 1.0, 1 / 3, -2.5e-8, 65504.0, 1e300, math.inf,
                                   -math.inf, math.nan])
def test_float_constants_match_llvmlite(value):
    # the same bits (llvmlite pads short hex numbers with spaces: "  0x0")
    for mine, theirs in ((llvmir.HalfType(), lir.HalfType()), (llvmir.FloatType(), lir.FloatType()),
                         (llvmir.DoubleType(), lir.DoubleType())):
        try:
            expected = int(lir.Constant(theirs, value).get_reference().strip(), 16)
        except OverflowError:    # does not fit a half: refused alike (a float rounds to inf)
            with pytest.raises(OverflowError):
                llvmir.Constant(mine, value)
            continue
        assert int(llvmir.Constant(mine, value).ref, 16) == expected


def test_constants_match_llvmlite():
    cases = [(lambda ir: ir.IntType(1), True), (lambda ir: ir.IntType(64), -(1 << 63)),
             (lambda ir: ir.ArrayType(ir.IntType(8), 4), bytearray(b'a"\\\x7f')),
             (lambda ir: ir.ArrayType(ir.IntType(32), 3), None),
             (lambda ir: ir.VectorType(ir.FloatType(), 4), 0.5),
             (lambda ir: ir.VectorType(ir.IntType(16), 3), [1, -2, 3]),
             (lambda ir: ir.PointerType(), None)]
    for make, value in cases:
        assert str(llvmir.Constant(make(llvmir), value)) == str(lir.Constant(make(lir), value))


def test_same_metadata_operands_give_the_same_node():
    m = llvmir.Module("md")
    s = llvmir.MetaDataString(m, "branch_weights")
    a = m.add_metadata([s, llvmir.IntType(32)(5)])
    b = m.add_metadata([llvmir.MetaDataString(m, "branch_weights"), llvmir.IntType(32)(5)])
    c = m.add_metadata([s, llvmir.IntType(32)(6)])
    assert a is b and c is not a and [a.ref, c.ref] == ["!0", "!1"]


def test_call_through_a_function_pointer_and_bad_use():
    m = llvmir.Module("fp")
    i32, ptr = llvmir.IntType(32), llvmir.PointerType()
    fty = llvmir.FunctionType(i32, [i32])
    fn = llvmir.Function(m, llvmir.FunctionType(i32, [ptr]), "f")
    b = llvmir.IRBuilder(fn.append_basic_block("entry"))
    target = b.load(fn.args[0], typ=fty.as_pointer())
    b.ret(b.call(target, [i32(7)]))
    llvm.parse_assembly(str(m)).verify()
    with pytest.raises(TypeError, match="FunctionType"):
        b.call(fn.args[0], [i32(7)])
    with pytest.raises(TypeError, match="typ="):
        b.load(fn.args[0])
    with pytest.raises(KeyError, match="duplicate global"):
        llvmir.Function(m, fty, "f")
