"""The CPU kernel library's table (relax.backend.cpu.KERNELS): every family is complete and
registered once, every rule AlterLayout's kernels carry (on AVX2, AVX-512, AArch64 and 32-bit
Arm targets; FuseExpandDepthwise's before it) has a family or is a family's stage, every registered rule is carried by some
kernel, and the table's schedule is what the default schedules give those blocks."""
import importlib
import pkgutil
import warnings

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax import default_schedules as ds
from tilecraft.relax.backend import cpu
from tilecraft.relax.backend.cpu import KERNELS, KernelFamily, KernelRegistry, block_rule
from tilecraft.relax.transform import AlterLayout, FuseExpandDepthwise
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.stmt import Block

TARGETS = ["llvm -mtriple=x86_64-linux-gnu -mcpu=haswell -num-cores=2",          # AVX2
           "llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512 -num-cores=8",   # AVX-512
           "llvm -mtriple=aarch64-linux-gnu -mattr=+neon -num-cores=4",          # NEON
           "llvm -mtriple=armv7a-linux-gnueabihf -mattr=+neon -num-cores=4"]
RNG = np.random.default_rng(3)


def rand(*shape):
    return (RNG.standard_normal(shape) * 0.1).astype("float32")


def _module(shape, make, dtype="float32"):
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(make(x)))
        bb.emit_func_output(gv)
    return bb.get()


def _conv(cin, cout, k, stride=1, pad=0, groups=1, layout="NCHW"):
    if layout == "NCHW":
        w, kl = rand(cout, cin // groups, k, k), "OIHW"
    else:
        w, kl = rand(k, k, cin // groups, cout), "HWIO"
    return lambda x: op.nn.conv2d(x, const(w), strides=stride, padding=pad, groups=groups,
                                  data_layout=layout, kernel_layout=kl)


def _expand_depthwise():
    """FuseExpandDepthwise's pattern, each step bound (1.2 MB an image expanded)."""
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((1, 56, 56, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(_conv(8, 96, 1, layout="NHWC")(x))
            y = bb.emit(op.nn.relu6(bb.emit(op.add(y, const(rand(1, 1, 1, 96))))))
            y = bb.emit(_conv(96, 96, 3, stride=2, pad=(0, 0, 1, 1), groups=96,
                              layout="NHWC")(y))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    return bb.get()


# Each operator AlterLayout rewrites, in the variants its plans tell apart
MODULES = {
    "conv nchw 3x3": _module(("n", 16, 12, 12), _conv(16, 32, 3, pad=1)),
    "conv nchw 3x3 7x7 plane": _module((1, 32, 7, 7), _conv(32, 64, 3, pad=1)),
    "conv nchw 1x1": _module((1, 64, 28, 28), _conv(64, 64, 1)),
    "conv nchw 1x1 long reduction": _module((1, 512, 7, 7), _conv(512, 64, 1)),
    "conv nchw stem": _module((1, 3, 32, 32), _conv(3, 16, 7, stride=2, pad=3)),
    "conv nchw grouped": _module((1, 32, 10, 10), _conv(32, 64, 3, pad=1, groups=2)),
    "conv nchw depthwise s2": _module((1, 16, 10, 10), _conv(16, 16, 3, stride=2, pad=1,
                                                             groups=16)),
    "conv nhwc winograd": _module((1, 10, 10, 32), _conv(32, 32, 3, pad=1, layout="NHWC")),
    "conv nhwc 1x1": _module((1, 14, 14, 32), _conv(32, 64, 1, layout="NHWC")),
    "conv nhwc depthwise": _module((1, 14, 14, 32), _conv(32, 32, 3, pad=1, groups=32,
                                                          layout="NHWC")),
    "conv nhwc 3x3 s2": _module((1, 14, 14, 64), _conv(64, 64, 3, stride=2, pad=1,
                                                       layout="NHWC")),
    "nhwc expansion + depthwise": _expand_depthwise(),
    "max pool s2": _module((1, 8, 11, 11), lambda x: op.nn.max_pool2d(x, pool_size=3, strides=2,
                                                                     padding=1)),
    "linear": _module(("n", 64), lambda x: op.linear(x, const(rand(48, 64)), const(rand(48)))),
    "int8 matmul": _module(("n", 64), lambda x: op.matmul(
        x, const(RNG.integers(-128, 128, (64, 48)).astype("int8")), out_dtype="int32"),
        dtype="uint8"),
    "int8 conv nchw": _module((1, 32, 28, 28), lambda x: op.nn.conv2d(
        x, const(RNG.integers(-128, 128, (16, 32, 3, 3)).astype("int8")), padding=1,
        out_dtype="int32"), dtype="uint8"),
    "int4 dense": _module(("n", 64), lambda x: op.dense_q4(
        x, const(RNG.integers(0, 256, (32, 48)).astype("uint8")), const(rand(2, 48)),
        const(rand(2, 48)), 32)),
}


def _blocks(func: PrimFunc) -> list[Block]:
    found = []
    post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, Block) else None)
    return found


def _kernels(target: str):
    """(case, PrimFunc, the rules its blocks carry) of every kernel AlterLayout makes."""
    out = []
    for case, mod in MODULES.items():
        for func in AlterLayout(target)(FuseExpandDepthwise(target)(mod)).functions.values():
            if isinstance(func, PrimFunc):
                out.append((case, func, {block_rule(b) for b in _blocks(func)} - {None}))
    return out


@pytest.fixture(scope="module")
def kernels():
    return {t: _kernels(t) for t in TARGETS}


def test_every_family_is_complete_and_registered_once():
    fams = KERNELS.families()
    assert len({f.rule for f in fams}) == len({f.name for f in fams}) == len(fams)
    for f in fams:
        assert isinstance(f, KernelFamily)
        assert callable(f.plan) and callable(f.compute) and callable(f.schedule), f.name
        assert f.pack is None or callable(f.pack), f.name
        assert KERNELS.family(f.rule) is f and KERNELS.schedule_of(f.rule) is f.schedule
        for rule, schedule in f.stages.items():
            assert KERNELS.family(rule) is None and KERNELS.schedule_of(rule) is schedule
    # each module of the library that defines a family has it in the table
    modules = [importlib.import_module(f"{cpu.__name__}.{m.name}")
               for m in pkgutil.iter_modules(cpu.__path__)]
    defined = [m.FAMILY for m in modules if hasattr(m, "FAMILY")]
    assert sorted(f.name for f in defined) == sorted(f.name for f in fams)
    assert all(KERNELS.family(f.rule) is f for f in defined)


def test_every_rule_alter_layout_emits_has_a_family(kernels):
    seen = set()
    for target, found in kernels.items():
        for case, func, rules in found:
            for rule in rules:
                assert KERNELS.knows(rule), f"{case} on {target}: {rule} has no family"
            seen |= rules
    # and no rule of the table is dead: some kernel carries each
    assert seen == KERNELS.rules()


def test_each_family_is_emitted(kernels):
    main = {f.rule for f in KERNELS.families()}
    emitted = {r for found in kernels.values() for _, _, rules in found for r in rules}
    assert main <= emitted


def test_default_schedules_use_the_table(kernels, monkeypatch):
    """Every kernel with a family's block is scheduled without a warning, and each block with a
    rule went through the table's schedule for it."""
    called = []
    spies = {}

    def spy(schedule):
        if schedule not in spies:       # one spy per schedule: a stage shared by families
            def run(sch, name, target, gemv_rows=None):
                called.append(block_rule(sch.get(sch.get_block(name))))
                return schedule(sch, name, target, gemv_rows)
            spies[schedule] = run
        return spies[schedule]
    spied = KernelRegistry([
        KernelFamily(f.name, f.rule, f.plan, f.compute, f.pack, spy(f.schedule), f.tile,
                     {r: (spy(s) if s is not None else None) for r, s in f.stages.items()})
        for f in KERNELS.families()])
    monkeypatch.setattr(ds, "KERNELS", spied)
    for target, found in kernels.items():
        t = targets.Target(target)
        for case, func, rules in found:
            if not rules:
                continue
            called.clear()
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                out = ds.apply(func, t)
            assert ds.is_scheduled(out), f"{case} on {target}"
            placed = {r for f in KERNELS.families() for r, s in f.stages.items() if s is None}
            assert set(called) == rules - placed, f"{case} on {target}"


def test_registry_rejects_clashes():
    def sched(sch, name, target, gemv_rows=None):
        return None

    def other(sch, name, target, gemv_rows=None):
        return None
    a = KernelFamily("a", "x.a", print, print, None, sched, stages={"x.pad": sched})
    with pytest.raises(ValueError, match="registered already"):
        KernelRegistry([a, KernelFamily("b", "x.a", print, print, None, sched)])
    with pytest.raises(ValueError, match="another schedule"):
        KernelRegistry([a, KernelFamily("b", "x.b", print, print, None, sched,
                                        stages={"x.pad": other})])
    with pytest.raises(ValueError, match="main rule"):
        KernelRegistry([a, KernelFamily("b", "x.b", print, print, None, sched,
                                        stages={"x.a": None})])
    table = KernelRegistry([a])
    assert table.family("x.unknown") is None and not table.knows("x.unknown")
    assert table.knows("x.pad") and not table.is_tile("x.a")
    with pytest.raises(KeyError):
        table.schedule_of("x.unknown")
