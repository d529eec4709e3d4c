"""Every misuse gives a Python exception that names the problem; nothing crashes."""
import ctypes

import numpy as np
import pytest

from tilecraft import targets
from tilecraft.targets.runtime import abi
from tilecraft.tensorir import Buffer, BufferStore, For, TIRError, te, var

from targets_testutil import lower, lowered_func


@pytest.fixture(scope="module")
def add_mod():
    n = te.var("n")
    A = te.placeholder((n, 3), "float32", "A")
    B = te.compute((n, 3), lambda i, j: A[i, j] + 1.0, "B")
    return targets.build(te.create_prim_func([A, B]), "llvm")


def test_wrong_argument_count(add_mod):
    a = np.zeros((2, 3), "float32")
    with pytest.raises(ValueError, match=r"main: expected 2 argument\(s\) \(A, B\), got 1"):
        add_mod["main"](a)
    with pytest.raises(ValueError, match=r"expected 2 argument\(s\) \(A, B\), got 3"):
        add_mod["main"](a, a.copy(), a.copy())


def test_wrong_dtype_rank_and_dims(add_mod):
    a = np.zeros((2, 3), "float32")
    with pytest.raises(ValueError, match="argument A has dtype float64, expected float32"):
        add_mod["main"](a.astype("float64"), a)
    with pytest.raises(ValueError, match=r"argument B must have 2 dimension\(s\), got 1"):
        add_mod["main"](a, np.zeros(6, "float32"))
    with pytest.raises(ValueError, match="argument B: dimension 0 has extent 4, expected n = 2"):
        add_mod["main"](a, np.zeros((4, 3), "float32"))
    with pytest.raises(ValueError, match="argument A: dimension 1 has extent 4, expected 3"):
        add_mod["main"](np.zeros((2, 4), "float32"), a)


def test_python_objects_are_validated(add_mod):
    a = np.zeros((4, 3), "float32")
    with pytest.raises(ValueError, match="argument B is not C-contiguous"):
        add_mod["main"](a, np.zeros((3, 8), "float32").T[:4])
    ro = np.zeros((4, 3), "float32")
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="argument B is written by the kernel but the array is "
                                         "read-only"):
        add_mod["main"](a, ro)
    with pytest.raises(ValueError, match="argument A must be an NDArray or a numpy array, got "
                                         "list"):
        add_mod["main"]([[1.0, 2.0, 3.0]], a)
    with pytest.raises(ValueError, match="non-native byte order"):
        add_mod["main"](a.astype(">f4"), a)


def test_scalar_argument_checks():
    n = te.var("n")
    k = te.var("k", "int8")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] * k.astype("float32"), "B")
    mod = targets.build(te.create_prim_func([A, B, k]), "llvm")
    a = np.ones(3, "float32")
    with pytest.raises(ValueError, match=r"argument k = 300 does not fit in int8"):
        mod["main"](a, a.copy(), 300)
    with pytest.raises(ValueError, match="argument k must be an integer"):
        mod["main"](a, a.copy(), 1.5)


def _raw_call(mod, tensors, codes=None):
    """Call the C entry directly with hand-made DLTensors (what a C caller could pass)."""
    fn = mod["main"]
    from tilecraft.targets.runtime.module import _Packed
    packed = _Packed(len(tensors))
    for i, t in enumerate(tensors):
        if isinstance(t, abi.DLTensor):
            packed.keep.append(t)
            packed.values[i].v_handle = ctypes.addressof(t)
            packed.codes[i] = abi.TYPE_DLTENSOR
        else:
            packed.values[i].v_int64 = int(t)
            packed.codes[i] = abi.TYPE_INT
    if codes:
        for i, c in codes.items():
            packed.codes[i] = c
    fn._invoke(packed)


def _tensor(arr, dtype=None, strides=None, data=True, device=abi.DL_CPU):
    code, bits, lanes = abi.dl_dtype(dtype or arr.dtype.name)
    t = abi.DLTensor()
    t.data = arr.ctypes.data if data else None
    t.device = abi.DLDevice(device, 0)
    t.ndim = arr.ndim
    t.dtype = abi.DLDataType(code, bits, lanes)
    t._shape = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
    t.shape = ctypes.addressof(t._shape)
    if strides is not None:
        t._strides = (ctypes.c_int64 * len(strides))(*strides)
        t.strides = ctypes.addressof(t._strides)
    t._arr = arr
    return t


def test_entry_checks_what_a_c_caller_passes(add_mod):
    a = np.zeros((2, 3), "float32")
    b = np.zeros((2, 3), "float32")
    _raw_call(add_mod, [_tensor(a), _tensor(b)])
    np.testing.assert_array_equal(b, a + 1)
    with pytest.raises(ValueError, match="argument A must have dtype float32 .* got code 2, 64 "
                                         "bits"):
        _raw_call(add_mod, [_tensor(a, "float64"), _tensor(b)])
    with pytest.raises(ValueError, match=r"argument B \(#1\) must be a tensor"):
        _raw_call(add_mod, [_tensor(a), 5])
    with pytest.raises(ValueError, match="argument B has a NULL data pointer"):
        _raw_call(add_mod, [_tensor(a), _tensor(b, data=False)])
    with pytest.raises(ValueError, match="argument A must be in CPU memory"):
        _raw_call(add_mod, [_tensor(a, device=4), _tensor(b)])
    with pytest.raises(ValueError, match="argument A is not compact row-major: dimension 0 has "
                                         "stride 6, expected 3"):
        _raw_call(add_mod, [_tensor(a, strides=[6, 1]), _tensor(b)])
    _raw_call(add_mod, [_tensor(a, strides=[3, 1]), _tensor(b)])  # compact strides are fine
    neg = _tensor(a)
    neg._shape[0] = -2
    with pytest.raises(ValueError, match="argument A: dimension 0 has negative extent -2"):
        _raw_call(add_mod, [neg, _tensor(b)])
    with pytest.raises(ValueError, match="argument A is a NULL DLTensor pointer"):
        _raw_call(add_mod, [0, _tensor(b)], codes={0: abi.TYPE_DLTENSOR})


def test_unknown_function_name(add_mod):
    with pytest.raises(KeyError, match=r"module has no function 'nope'; it has \['main'\]"):
        add_mod["nope"]


def test_thread_binding_is_rejected_on_cpu():
    A = te.placeholder((64,), "float32", "A")
    B = te.compute((64,), lambda i: A[i] * 2.0, "B")
    func = lower(te.create_prim_func([A, B]))
    from targets_testutil import SetLoopKinds

    class Bind(SetLoopKinds):
        def visit_For(self, s):
            return s.replace(kind="thread_binding", thread_tag="threadIdx.x")
    func = Bind({}).visit(func)
    with pytest.raises(TIRError, match="loop i is bound to threadIdx.x; thread bindings are for "
                                       "GPU targets"):
        targets.build(func, "llvm")


def test_cross_compiled_module_cannot_run_here():
    A = te.placeholder((8,), "float32", "A")
    B = te.compute((8,), lambda i: A[i] + 1.0, "B")
    mod = targets.build(te.create_prim_func([A, B]), "llvm -mtriple=aarch64-linux-gnu")
    a = np.zeros(8, "float32")
    with pytest.raises(RuntimeError, match="compiled for aarch64-unknown-linux-gnu and cannot run "
                                           "on this machine"):
        mod["main"](a, a.copy())
    with pytest.raises(RuntimeError, match="cannot run on this machine"):
        mod.time_evaluator("main", targets.cpu(0))(a, a.copy())
    assert "aarch64" in mod.get_source("ll") and mod.get_source("asm")


def test_unknown_triple_is_a_target_error():
    with pytest.raises(targets.TargetError, match="unknown target triple 'sparc64-linux-gnu'"):
        targets.Target("llvm -mtriple=sparc64-linux-gnu")
    # LLVM's own refusal is wrapped too (Target lets no such triple through, so force one)
    from tilecraft.targets.llvm.compiler import MachineConfig
    t = targets.Target("llvm")
    t._config["mtriple"] = "foo-linux-gnu"
    with pytest.raises(targets.TargetError, match="LLVM cannot generate code for the triple "
                                                  "'foo-linux-gnu'.*No available targets"):
        MachineConfig(t)


def test_unbindable_shape_variable_is_a_build_error():
    n = var("n")
    A, B = Buffer("A", (n * 2,), "float32"), Buffer("B", (n * 2,), "float32")
    i = var("i")
    func = lowered_func([A, B], For(i, 0, n * 2, "serial", BufferStore(B, A[i], [i])))
    with pytest.raises(TIRError, match=r"dimension 0 of argument A is n \* 2, but n is neither a "
                                       "parameter nor a dimension of its own"):
        targets.build(func, "llvm")


def test_missing_lld_is_a_toolchain_error(monkeypatch, tmp_path, add_mod):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(targets.ToolchainError, match="ld.lld was not found on PATH.*Install lld"):
        add_mod.export_library(str(tmp_path / "k.so"))
    assert issubclass(targets.ToolchainError, RuntimeError)
    assert list(tmp_path.iterdir()) == []
