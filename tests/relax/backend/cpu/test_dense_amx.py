"""The int8 dense kernel on Intel AMX tiles (``relax.backend.cpu.dense_amx``,
``targets.llvm.amx``): its schedule (a trace ending in ``tensorize`` with the AMX intrinsic)
interpreted bit-exactly on any machine; compiled, bit-exact int32 accumulators against numpy
on random data with the extreme bytes, odd and symbolic shapes; the same results as the VNNI kernel
(``-mattr=-amx-int8``) through the fused epilogue of a quantized BERT layer; the target
choice; the Linux permission request and its refusal."""
from __future__ import annotations

import os

import numpy as np
import pytest

from tilecraft import relax, targets
from tilecraft.models import bert_encoder_layer
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax.backend.cpu.dense import dense_panel_width
from tilecraft.relax.backend.cpu.dense_amx import amx_applies, amx_words
from tilecraft.relax.backend.cpu.dense_int8 import dense_u8i8
from tilecraft.relax.default_schedules import schedule_blocks
from tilecraft.tensorir import te
from tilecraft.tensorir.interpret import interpret
from tilecraft.tensorir.schedule import Schedule
from tilecraft.tensorir.structural import structural_equal
from tilecraft.targets import Target
from tilecraft.targets.target import host_cpu_flags
from tilecraft.targets.llvm.amx import has_amx_int8
from tilecraft.targets.runtime import amx as amx_runtime

CPU = targets.cpu(0)
NO_AMX = "llvm -mattr=-amx-int8"


HAS_AMX = {"amx_int8", "amx_tile"} <= host_cpu_flags()
needs_amx = pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX int8 tiles "
                               "(cpuinfo lacks amx_int8 / amx_tile)")


def _matmul_module(k: int, n: int, rng, m="m"):
    w = rng.integers(-128, 128, (k, n)).astype("int8")
    w[0, :] = -128                       # the extremes: the largest products
    w[-1, :] = 127
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((m, k), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(op.matmul(x, const(w), out_dtype="int32")))
        bb.emit_func_output(gv)
    return bb.get(), w


SPR = Target("llvm -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids")


@pytest.mark.parametrize("k,n", [(200, 130), (64, 32), (768, 192)])
def test_amx_schedule_interprets_bit_exact(k, n):
    """The AMX schedule of the kernel (for a Sapphire Rapids target, on any machine): one
    ``tensorize`` with ``amx_u8s8s32_*`` whose trace replays, run by ``tensorir.interpret``
    bit-exactly against numpy for symbolic rows (a ragged last block of rows, a ragged last
    panel of columns into the padded accumulators)."""
    rng = np.random.default_rng(k + n)
    width = dense_panel_width(n, 16, 32)
    kw = amx_words(k)
    panels = -(-n // width)
    xw = te.placeholder((te.var("m"), kw), "int32", "x")
    ww = te.placeholder((panels, kw, width), "int32", "w")
    func = te.create_prim_func([xw, ww, dense_u8i8(xw, ww, n)])
    sch = Schedule(func)
    schedule_blocks(sch, SPR)
    assert "amx_u8s8s32_32x" in str(sch.trace)
    again = Schedule(func)
    again.replay(sch.trace)
    assert structural_equal(again.func, sch.func)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    w[0] = -128
    wp = np.zeros((4 * kw, panels * width), np.int8)
    wp[:k, :n] = w
    words = wp.reshape(kw, 4, panels * width).transpose(0, 2, 1).copy().view("<i4")[..., 0]
    panel_words = words.reshape(kw, panels, width).transpose(1, 0, 2).astype(np.int32).copy()
    for m in (1, 33, 70):
        x = rng.integers(0, 256, (m, k)).astype(np.uint8)
        x[0] = 255
        xp = np.zeros((m, 4 * kw), np.uint8)
        xp[:, :k] = x
        out = np.zeros((m, n), np.int32)
        interpret(sch.func, xp.view("<i4").astype(np.int32), panel_words, out)
        np.testing.assert_array_equal(out, x.astype(np.int64) @ w.astype(np.int64),
                                      err_msg=f"m={m}")


def test_target_choice():
    spr = "llvm -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids"
    assert Target(spr).amx_int8
    assert not Target(spr + " -mattr=-amx-int8").amx_int8
    assert not Target("llvm -mtriple=x86_64-linux-gnu -mcpu=icelake-server").amx_int8
    assert Target("llvm -mtriple=x86_64-linux-gnu -mcpu=icelake-server "
                  "-mattr=+amx-tile,+amx-int8").amx_int8
    assert not Target("llvm -mtriple=aarch64-linux-gnu -mattr=+amx-int8").amx_int8
    assert Target("llvm").amx_int8 == HAS_AMX
    assert has_amx_int8("x86_64", "+amx-tile,+amx-int8")
    assert not has_amx_int8("x86_64", "+amx-tile,+amx-int8,-amx-int8")
    assert has_amx_int8("x86_64", "+amx-int8")              # implies amx-tile
    assert not has_amx_int8("x86_64", "+amx-int8,-amx-tile")
    assert amx_applies(Target(spr), 64) and not amx_applies(Target(spr), 8)
    assert [amx_words(k) for k in (1, 64, 65, 768, 3072)] == [16, 16, 32, 192, 768]


@needs_amx
@pytest.mark.parametrize("k,n", [(1, 1), (5, 17), (70, 40), (256, 65), (768, 768), (200, 130)])
def test_amx_dense_is_bit_exact(k, n):
    """Symbolic rows (the AMX kernel whatever the count) run 1..100 rows: one 16-row tile,
    two, and blocks of 32 with a ragged last block; K and N not multiples of 64 / 16 (zero-padded tiles, panel tails)."""
    rng = np.random.default_rng(k * 1000 + n)
    mod, w = _matmul_module(k, n, rng)
    exe = relax.build(mod, "llvm", strict=True)
    meta = {f["name"]: f for f in exe.kernel_module.metadata["functions"]}
    assert meta["dense_u8i8"].get("uses_amx"), "the AMX kernel was not chosen"
    vm = relax.VirtualMachine(exe, CPU)
    for m in (1, 3, 16, 17, 32, 33, 100):
        x = rng.integers(0, 256, (m, k)).astype("uint8")
        x[0] = 255
        x[-1, ::2] = 0
        got = vm["main"](x).numpy()
        np.testing.assert_array_equal(got, x.astype(np.int64) @ w.astype(np.int64),
                                      err_msg=f"m={m} k={k} n={n}")


@needs_amx
@pytest.mark.parametrize("m", [16, 48])
def test_amx_dense_static_rows(m):
    rng = np.random.default_rng(m)
    mod, w = _matmul_module(96, 48, rng, m=m)
    exe = relax.build(mod, "llvm", strict=True)
    assert "tdpbusd" in exe.kernel_module.get_source("asm")
    x = rng.integers(0, 256, (m, 96)).astype("uint8")
    got = relax.VirtualMachine(exe, CPU)["main"](x).numpy()
    np.testing.assert_array_equal(got, x.astype(np.int64) @ w.astype(np.int64))


def test_without_amx_the_vnni_kernel_runs():
    rng = np.random.default_rng(1)
    mod, w = _matmul_module(70, 40, rng)
    exe = relax.build(mod, NO_AMX, strict=True)
    assert not any(f.get("uses_amx") for f in exe.kernel_module.metadata["functions"])
    assert "tdpbusd" not in exe.kernel_module.get_source("asm")
    x = rng.integers(0, 256, (5, 70)).astype("uint8")
    got = relax.VirtualMachine(exe, CPU)["main"](x).numpy()
    np.testing.assert_array_equal(got, x.astype(np.int64) @ w.astype(np.int64))


@needs_amx
def test_quantized_bert_layer_same_on_amx_and_vnni():
    """int8-dynamic BERT layer (symbolic batch and sequence): the AMX build's output is the
    VNNI build's bit for bit (exact int32 accumulators, the same fused epilogue), and within
    the quantization error of float32."""
    model = bert_encoder_layer(hidden=128, heads=4, ffn=512, seed=3)
    q = relax.quantize(model.mod, "int8-dynamic")
    exe = relax.build(q, "llvm")
    assert sum(bool(f.get("uses_amx")) for f in exe.kernel_module.metadata["functions"]) >= 4
    vm_amx = relax.VirtualMachine(exe, CPU)
    vm_vnni = relax.VirtualMachine(relax.build(q, NO_AMX), CPU)
    rng = np.random.default_rng(2)
    for batch, seq in ((1, 7), (2, 40)):
        x, = model.make_inputs(rng, batch=batch, seq_len=seq)
        a, v = vm_amx["main"](x).numpy(), vm_vnni["main"](x).numpy()
        np.testing.assert_array_equal(a, v)
        ref = model.reference(x)
        cos = float((a * ref).sum() / np.linalg.norm(a) / np.linalg.norm(ref))
        assert cos > 0.999, cos


def test_refused_permission_is_a_clear_error(monkeypatch):
    """An old kernel refuses the request: AMXError naming AMX and the way around it."""
    monkeypatch.setattr(amx_runtime, "_GRANTED", False)
    monkeypatch.setattr(amx_runtime, "ARCH_REQ_XCOMP_PERM", 0x7fff)     # no such request
    with pytest.raises(amx_runtime.AMXError, match=r"AMX.*-mattr=-amx-int8"):
        amx_runtime.request_amx()


@needs_amx
def test_module_load_requests_permission(tmp_path):
    """An exported library using AMX asks for the tile state when loaded (the RPC server's
    loader does the same), here in a fresh process that never asked before."""
    import subprocess
    import sys
    rng = np.random.default_rng(3)
    mod, w = _matmul_module(64, 32, rng, m=20)
    exe = relax.build(mod, "llvm", strict=True)
    lib = str(tmp_path / "k.so")
    exe.kernel_module.export_library(lib)
    code = ("import numpy as np; from tilecraft.targets.runtime import load_module, amx; "
            f"m = load_module({lib!r}); print(amx.amx_permitted())")
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
