"""export_library / load_module: one self-contained shared library per module, for any triple."""
import ctypes
import subprocess
import textwrap

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.targets.runtime.elf import (EF_ARM_ABI_FLOAT_HARD, EF_RISCV_FLOAT_ABI_DOUBLE,
                                 EF_RISCV_FLOAT_ABI_MASK, ET_DYN, read_elf_file_header)
from tilecraft.targets.target import ELF_MACHINE
from tilecraft.tensorir import te

from capabilities import requires_cross_toolchain
from targets_testutil import lower, needs_lld, run_sub, with_loop_kinds


def kernel(parallel=True):
    """B = tanh(A) * exp(-A) + c over (n, 19): calls libm, parallel rows, vector columns."""
    n = te.var("n")
    c = te.var("c", "float32")
    A = te.placeholder((n, 19), "float32", "A")
    B = te.compute((n, 19), lambda i, j: te.tanh(A[i, j]) * te.exp(-A[i, j]) + c, "B")
    func = lower(te.create_prim_func([A, B, c]))
    if parallel:
        func = with_loop_kinds(func, i="parallel", j="vectorized")
    return func


def int_kernel():
    """Same signature; integer index math, int32 and int64 division, int64 <-> float casts."""
    n = te.var("n")
    c = te.var("c", "float32")
    A = te.placeholder((n, 19), "float32", "A")

    def f(i, j):
        k = i * 19 + j
        q = (j.astype("int32") // (i.astype("int32") % 3 + 1)).astype("float32")
        return (A[i, j] + ((k // 7) % 5).astype("float32") + q + k.astype("float32") * c
                + (A[i, j] * 100.0).astype("int64").astype("float32"))
    B = te.compute((n, 19), f, "B")
    return lower(te.create_prim_func([A, B, c]))


def int_kernel_ref(a, c):
    i, j = np.meshgrid(np.arange(a.shape[0]), np.arange(19), indexing="ij")
    k = i * 19 + j
    return (a + ((k // 7) % 5) + j // (i % 3 + 1) + k.astype("float32") * np.float32(c)
            + (a * np.float32(100)).astype("int64")).astype("float32")


BLOCK_LLVMLITE = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] == 'llvmlite':
            raise ImportError('no llvmlite on the board')
sys.meta_path.insert(0, Block())
"""


@needs_lld
def test_export_and_load_in_a_fresh_process_without_llvmlite(tmp_path):
    path = tmp_path / "kernel.so"
    mod = targets.build(kernel(), "llvm -num-cores=2")
    assert mod.export_library(str(path)) == str(path)
    assert [p.name for p in tmp_path.iterdir()] == ["kernel.so"]  # no temporary left behind
    code = BLOCK_LLVMLITE + textwrap.dedent(f"""
        import numpy as np
        from tilecraft import targets
        mod = targets.load_module({str(path)!r})
        assert mod.num_threads == 2, mod.num_threads
        rng = np.random.default_rng(1)
        for rows in (1, 5, 64):
            a = rng.standard_normal((rows, 19)).astype("float32")
            b = targets.empty((rows, 19), "float32")
            mod["main"](targets.array(a), b, 0.5)
            np.testing.assert_allclose(b.numpy(), np.tanh(a) * np.exp(-a) + 0.5, rtol=2e-6,
                                       atol=1e-6)
        try:
            mod["main"](a, np.zeros((rows, 18), "float32"), 0.5)
        except ValueError as err:
            print("ERR", err)
        t = mod.time_evaluator("main", targets.cpu(0), number=3, repeat=2)(a, b, 1.0)
        assert len(t.results) == 2
        p = mod.metadata["functions"][0]["params"]
        print([(x["name"], x["kind"], x["dtype"], x.get("shape")) for x in p])
        print(mod.target, sorted(k for k in __import__("sys").modules if "llvmlite" in k))
    """)
    proc = run_sub(code)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "ERR main: argument B: dimension 1 has extent 18, expected 19" in out
    assert "[('A', 'buffer', 'float32', ['n', 19]), ('B', 'buffer', 'float32', ['n', 19]), " \
           "('c', 'scalar', 'float32', None)]" in out
    assert "llvm -num-cores=2 []" in out


@needs_lld
def test_export_replaces_atomically_and_loaded_module_reexports(tmp_path, rng):
    path = str(tmp_path / "k.so")
    with open(path, "w") as f:
        f.write("old")
    mod = targets.build(kernel(parallel=False), "llvm")
    mod.export_library(path)
    loaded = targets.load_module(path)
    copy = str(tmp_path / "copy.so")
    loaded.export_library(copy)
    again = targets.load_module(copy)
    a = rng.standard_normal((3, 19)).astype("float32")
    b = np.zeros((3, 19), "float32")
    again["main"](a, b, 2.0)
    np.testing.assert_allclose(b, np.tanh(a) * np.exp(-a) + 2, rtol=2e-6)
    with pytest.raises(KeyError, match="it has \\['main'\\]"):
        loaded["other"]
    with pytest.raises(ValueError, match="no source code"):
        loaded.get_source()


def test_load_module_rejects_other_files(tmp_path):
    bogus = tmp_path / "x.so"
    bogus.write_bytes(b"not a library at all" * 4)
    with pytest.raises(RuntimeError, match="cannot load kernel library"):
        targets.load_module(str(bogus))
    with pytest.raises(FileNotFoundError):
        targets.load_module(str(tmp_path / "missing.so"))


CROSS = [
    ("llvm -mtriple=aarch64-linux-gnu", "aarch64", 64),
    ("llvm -mtriple=armv7a-linux-gnueabihf -mattr=+neon,+vfp3", "arm", 32),
    ("llvm -mtriple=riscv64-linux-gnu", "riscv64", 64),
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell", "x86_64", 64),
    ("raspberry-pi/4b-aarch64", "aarch64", 64),
    ("visionfive2", "riscv64", 64),
]


@needs_lld
@pytest.mark.parametrize("target,arch,bits", CROSS)
def test_cross_compiled_shared_libraries(target, arch, bits, tmp_path):
    mod = targets.build(kernel(), target)
    path = str(tmp_path / f"{arch}.so")
    mod.export_library(path)
    header = read_elf_file_header(path)
    assert header.type == ET_DYN
    assert header.machine == ELF_MACHINE[arch]
    assert header.bits == bits and header.little_endian
    if arch == "riscv64":
        assert header.flags & EF_RISCV_FLOAT_ABI_MASK == EF_RISCV_FLOAT_ABI_DOUBLE  # lp64d
    if arch == "arm":
        assert header.flags & EF_ARM_ABI_FLOAT_HARD  # armhf: floats in VFP registers
    data = open(path, "rb").read()
    for symbol in (b"tilecraft_fn_main", b"tilecraft_metadata", b"tilecraft_get_last_error",
                   b"tilecraft_num_threads", b"pthread_create", b"libm.so.6",
                   b"libpthread.so.0"):
        assert symbol in data
    if arch != "x86_64":
        with pytest.raises(RuntimeError, match=f"{bits}-bit .* library and cannot run on this "
                                               "machine"):
            targets.load_module(path)


def test_object_files_for_every_triple():
    for target, arch, bits in CROSS[:4]:
        obj = targets.build(kernel(parallel=False), target).object_code()
        assert obj[:4] == b"\x7fELF" and obj[18] | (obj[19] << 8) == ELF_MACHINE[arch]


# -- running the cross-compiled library on an emulated board ----------------------------------

HARNESS_C = r"""
/* Call an exported tilecraft kernel from C (see docs/abi.md). */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
  void *data; DLDevice device; int32_t ndim; DLDataType dtype;
  int64_t *shape, *strides; uint64_t byte_offset;
} DLTensor;
typedef union { int64_t v_int64; double v_float64; void *v_handle; } TCValue;
typedef int32_t (*tc_entry)(TCValue *args, int32_t *type_codes, int32_t num_args);

int main(int argc, char **argv) {
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { printf("dlopen: %s\n", dlerror()); return 1; }
  tc_entry fn = (tc_entry)dlsym(lib, "tilecraft_fn_main");
  const char *(*last_error)(void) = (const char *(*)(void))dlsym(lib, "tilecraft_get_last_error");
  int32_t *num_threads = (int32_t *)dlsym(lib, "tilecraft_num_threads");
  *num_threads = 3;
  int64_t n = 101, shape[2] = {n, 19}, bad_shape[2] = {n, 18};
  float *a = malloc(sizeof(float) * n * 19), *b = malloc(sizeof(float) * n * 19);
  for (int i = 0; i < n * 19; i++) a[i] = (float)((i % 37) - 18) / 9.0f;
  DLTensor ta = {a, {1, 0}, 2, {2, 32, 1}, shape, NULL, 0};
  DLTensor tb = {b, {1, 0}, 2, {2, 32, 1}, shape, NULL, 0};
  TCValue args[3]; int32_t codes[3] = {7, 7, 2};
  args[0].v_handle = &ta; args[1].v_handle = &tb; args[2].v_float64 = 0.25;
  for (int rep = 0; rep < 20; rep++)
    if (fn(args, codes, 3) != 0) { printf("error: %s\n", last_error()); return 1; }
  double err = 0;
  for (int i = 0; i < n * 19; i++) {
    double want;
    if (argv[2][0] == 'f') {
      want = tanh(a[i]) * exp(-a[i]) + 0.25;
    } else {  /* the integer kernel */
      int64_t row = i / 19, col = i % 19;
      want = a[i] + (float)((i / 7) % 5) + (float)(col / (row % 3 + 1)) + (float)i * 0.25f
             + (float)(int64_t)(a[i] * 100.0f);
    }
    double d = fabs(want - b[i]) / (1 + fabs(want));
    if (d > err) err = d;
  }
  printf("max_error %g\n", err);
  printf("b[1000] = %f\n", b[1000]);
  tb.shape = bad_shape;
  if (fn(args, codes, 3) != 0) printf("error: %s\n", last_error());
  return 0;
}
"""

# board -> (target, the GNU triple of its cross gcc)
BOARDS = {
    "aarch64": ("llvm -mtriple=aarch64-linux-gnu", "aarch64-linux-gnu"),
    "armv7": ("llvm -mtriple=armv7a-linux-gnueabihf -mattr=+neon,+vfp3", "arm-linux-gnueabihf"),
    "riscv64": ("llvm -mtriple=riscv64-linux-gnu", "riscv64-linux-gnu"),
}


@needs_lld
@pytest.mark.parametrize("board", sorted(BOARDS))
@pytest.mark.parametrize("which", ["float", "int"])
def test_cross_library_runs_under_qemu(board, which, tmp_path):
    target, triple = BOARDS[board]
    cc, qemu, sysroot = requires_cross_toolchain(triple)
    lib = str(tmp_path / "kernel.so")
    func = kernel() if which == "float" else int_kernel()
    targets.build(func, target).export_library(lib)
    src = tmp_path / "harness.c"
    src.write_text(HARNESS_C)
    exe = str(tmp_path / "harness")
    subprocess.run([cc, "-O1", str(src), "-o", exe, "-ldl", "-lm", "-lpthread"], check=True)
    proc = subprocess.run([qemu, "-L", sysroot, exe, lib, which], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    err = float(proc.stdout.split("max_error")[1].split()[0])
    assert err < 1e-5, proc.stdout
    assert "error: main: argument B: dimension 1 has extent 18, expected 19" in proc.stdout


def test_int_kernel_on_the_host(rng):
    mod = targets.build(int_kernel(), "llvm")
    a = rng.uniform(-2, 2, (31, 19)).astype("float32")
    b = np.zeros_like(a)
    mod["main"](a, b, 0.25)
    np.testing.assert_allclose(b, int_kernel_ref(a, 0.25), rtol=1e-6, atol=1e-4)


def test_software_division_and_int64_casts_on_the_host(monkeypatch, rng):
    """What 32-bit targets get (softops), forced on for the host so it runs here."""
    from tilecraft.targets.llvm import compiler, softops
    monkeypatch.setattr(compiler, "hardware_division", lambda *a: {32: False, 64: False})
    init = softops.SoftOps.__init__

    def forced(self, *args):
        init(self, *args)
        self.soft_int64_float = True
    monkeypatch.setattr(softops.SoftOps, "__init__", forced)
    mod = targets.build(int_kernel(), "llvm")
    raw = mod.get_source("ll-raw")
    assert "tilecraft_rt.udivrem64" in raw and "tilecraft_rt.udivrem32" in raw
    assert "sitofp i64" not in raw and "fptosi float" not in raw.replace("fptosi float %", "")
    a = rng.uniform(-2, 2, (40, 19)).astype("float32")
    b = np.zeros_like(a)
    mod["main"](a, b, 0.25)
    np.testing.assert_allclose(b, int_kernel_ref(a, 0.25), rtol=1e-6, atol=1e-4)
    # signed and unsigned division of every width, both halves of the 64-bit path
    outs = {}
    for dtype in ("int64", "uint64", "int32", "uint16"):
        X = te.placeholder((64,), dtype, "X")
        Y = te.placeholder((64,), dtype, "Y")
        Q = te.compute((64,), lambda i: X[i] // Y[i], "Q")
        R = te.compute((64,), lambda i: X[i] % Y[i], "R")
        m = targets.build(te.create_prim_func([X, Y, Q, R]), "llvm")
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, 64, dtype=dtype, endpoint=True)
        y = rng.integers(info.min, info.max, 64, dtype=dtype, endpoint=True)
        y[:8] = rng.integers(1, 100, 8).astype(dtype)
        x[8:16] = rng.integers(0, 1000, 8).astype(dtype)
        y[8:16] = rng.integers(1, 10, 8).astype(dtype)
        y[16] = 0
        q, r = np.zeros(64, dtype), np.zeros(64, dtype)
        m["main"](x, y, q, r)
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(q, x // y, err_msg=dtype)
            np.testing.assert_array_equal(r, x % y, err_msg=dtype)
        outs[dtype] = q
    assert outs


def _sequence_calls(mod, rng):
    """Two calls of ``kernel()``'s entry through the library's sequence runner (one foreign call),
    then a run whose second record fails: the runner stops there and says which one."""
    fn = mod["main"]
    run = mod.call_sequence()
    assert run is not None
    a = rng.standard_normal((7, 19)).astype("float32")
    outs = [targets.empty((7, 19), "float32") for _ in range(2)]
    bad = targets.empty((7, 18), "float32")
    packed = [fn._pack([targets.array(a), b, c]) for b, c in ((outs[0], 0.5), (outs[1], 2.0),
                                                              (bad, 1.0))]
    entry = ctypes.cast(fn._cfunc, ctypes.c_void_p).value

    def records(ps):
        words = []
        for p in ps:
            words += [entry, ctypes.addressof(p.values), ctypes.addressof(p.codes), len(fn.params)]
        return (ctypes.c_ssize_t * len(words))(*words)

    failed = ctypes.c_int32(-1)
    recs = records(packed[:2])
    assert run(ctypes.addressof(recs), 2, ctypes.addressof(failed)) == 0
    for out, c in zip(outs, (0.5, 2.0)):
        np.testing.assert_allclose(out.numpy(), np.tanh(a) * np.exp(-a) + c, rtol=2e-6, atol=1e-6)
    recs = records([packed[0], packed[2], packed[1]])
    assert run(ctypes.addressof(recs), 3, ctypes.addressof(failed)) != 0
    assert failed.value == 1
    assert "dimension 1 has extent 18, expected 19" in mod._last_error()


@needs_lld
def test_sequence_runner_in_jit_and_exported_libraries(tmp_path, rng):
    mod = targets.build(kernel(), "llvm")
    _sequence_calls(mod, rng)
    path = str(tmp_path / "kernel.so")
    mod.export_library(path)
    _sequence_calls(targets.load_module(path), rng)
