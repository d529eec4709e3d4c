"""Host cost of a GPU kernel launch: ``python -m benchmarks.gpu_launch_overhead``.

What the launch path costs on the host, per kernel, for both GPU back ends (OpenCL, WebGPU) on
whatever device ``targets.opencl(0)`` / ``targets.webgpu(0)`` is (PoCL and lavapipe in CI, where
the kernels themselves take microseconds):

* ``direct``: ``mod["main"](a, b)`` of a tiny kernel (``B = A * 2`` on 64 floats, symbolic
  ``n``), N calls then one sync; per call.
* ``direct+check``: the same for a gather whose bounds check stays in the kernel (an error
  word to read back); before the error buffer was read once per call *per launch*.
* ``vm_chain``: a Relax function of ``L`` such kernels (``x + 1`` repeated, symbolic batch),
  run by the GPU VM; the difference between ``L = 33`` and ``L = 1`` over 32 is the VM's cost
  per kernel call (argument binding, launch geometry, enqueue).
* ``vm_chain+check``: the chain with a ``take`` (a gather, in-kernel check) at its start: the
  extra sync(s) it costs per VM call.
* ``vm_chain (no buffer pool)``: the chain with ``targets.runtime.buffer_pool`` off: every
  call's result a fresh device buffer (``L=1 call``: what a VM call's fixed cost was before).
* ``host path only``: the shared launch plan (``targets.runtime.host_program``) of the tiny
  kernel with a back end that launches nothing: the Python cost of binding the arguments and
  walking the host program, per call — ``bind`` (a direct call) and ``bind_cached`` (a VM call
  site). This is the part of a launch the driver does not see.

The peer is numpy doing the same arithmetic (``x * 2``) on the host: it tells the order of
magnitude of a Python call, not a competing implementation. Rows: ``us_per_call``.
Results: ``benchmarks/results/gpu_launch_overhead/<machine>.json`` (the machine: the GPU a back
end ran on, else this CPU's name).
"""
from __future__ import annotations

import sys
import time

import numpy as np

from .common import print_table, write_results


def _per_call(fn, sync, number: int, repeat: int = 7) -> float:
    for _ in range(3):
        fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def _kernels(target: str):
    from tilecraft import targets
    from tilecraft.tensorir import Schedule, te

    def bind(func, block):
        sch = Schedule(func)
        loops = sch.get_loops(sch.get_block(block))
        bx, tx = sch.split(loops[0], [None, 64])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        return sch.mod

    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n,), "float32", "A")
    B = te.compute((n,), lambda i: A[i] * 2.0, "B")
    double = targets.build(bind(te.create_prim_func([A, B]), "B"), target)
    idx = te.placeholder((m,), "int64", "idx")
    G = te.compute((m,), lambda i: A[idx[i]], "G")
    gather = targets.build(bind(te.create_prim_func([A, idx, G]), "G"), target)
    return double, gather


def _chain(length: int, with_take: bool):
    from tilecraft.relax import BlockBuilder, TensorStructInfo, Var
    from tilecraft.tensorir import te

    def add1(a):
        return te.compute(a.shape, lambda i, j: a[i, j] + 1.0, "add1")

    def gather(a, ind):
        return te.compute((ind.shape[0], a.shape[1]), lambda i, j: a[ind[i], j], "gather")

    bb = BlockBuilder()
    n = te.var("n")
    x = Var("x", TensorStructInfo((n, 16), "float32"))
    idx = Var("idx", TensorStructInfo((4,), "int64"))
    with bb.function("main", [x, idx]):
        with bb.dataflow():
            h = x
            if with_take:
                h = bb.emit_te(gather, h, idx)
            for _ in range(length):
                h = bb.emit_te(add1, h)
            gv = bb.emit_output(h)
        bb.emit_func_output(gv)
    return bb.get()


class _NullBackend:
    """A back end whose launches do nothing: isolates the host program's own cost."""

    def __init__(self):
        from tilecraft.targets.runtime.host_program import KernelErrorLog
        self.errors = KernelErrorLog(lambda words: [0] * len(words), lambda word: None)

    def launcher(self, key):
        return lambda arrays, scalars, grid, sink, memo: None

    def alloc_temp(self, dtype, size, what):
        return None

    def alloc_error_word(self, key):
        return None


def _host_path_rows(kind: str, fn, args, number: int) -> list[dict]:
    plan, null = fn.plan, _NullBackend()

    def direct():
        _, arrays, env = plan.bind(args)
        plan.run(null, arrays, env, None)

    def site():
        _, arrays, env, memo = plan.bind_cached(args)
        plan.run(null, arrays, env, None, memo)
    return [{"backend": kind, "case": "host path only: direct call",
             "us_per_call": _per_call(direct, lambda: None, number * 5) * 1e6},
            {"backend": kind, "case": "host path only: VM call site",
             "us_per_call": _per_call(site, lambda: None, number * 5) * 1e6}]


def _rows_for(kind: str, dev, target: str, number: int) -> list[dict]:
    from tilecraft import relax
    from tilecraft import targets
    rows = []
    double, gather = _kernels(target)
    x = np.random.default_rng(0).standard_normal(64).astype("float32")
    a = targets.array(x, dev)
    b = targets.empty((64,), "float32", dev)
    ix = targets.array(np.arange(64, dtype="int64")[::-1].copy(), dev)
    g = targets.empty((64,), "float32", dev)
    peer = _per_call(lambda: x * 2.0, lambda: None, number)
    f = double["main"]
    us = _per_call(lambda: f(a, b), dev.sync, number) * 1e6
    np.testing.assert_allclose(b.numpy(), x * 2.0)
    rows.append({"backend": kind, "case": "direct", "us_per_call": us, "numpy_us": peer * 1e6})
    rows += _host_path_rows(kind, f, (a, b), number)
    fg = gather["main"]
    us = _per_call(lambda: fg(a, ix, g), dev.sync, number) * 1e6
    np.testing.assert_allclose(g.numpy(), x[::-1])
    rows.append({"backend": kind, "case": "direct+check", "us_per_call": us,
                 "numpy_us": peer * 1e6})
    from tilecraft.targets.runtime import buffer_pool
    pool_bytes = buffer_pool.POOL_BYTES
    for with_take, pooled in ((False, True), (True, True), (False, False)):
        # without the pool, every call's result is a fresh device buffer (as before it)
        buffer_pool.POOL_BYTES = pool_bytes if pooled else 0
        per = {}
        for length in (1, 33):
            exe = relax.build(_chain(length, with_take), target, pipeline=[])
            vm = relax.VirtualMachine(exe, dev)
            xin = targets.array(np.ones((8, 16), "float32"), dev)
            iin = targets.array(np.array([0, 2, 4, 6], "int64"), dev)
            fn = vm["main"]
            out = fn(xin, iin).numpy()
            want = (np.ones((4, 16)) if with_take else np.ones((8, 16))) + length
            np.testing.assert_allclose(out, want)
            per[length] = _per_call(lambda: fn(xin, iin), dev.sync, max(number // 10, 5))
        buffer_pool.POOL_BYTES = pool_bytes
        case = ("vm_chain+check" if with_take else "vm_chain") + \
            ("" if pooled else " (no buffer pool)")
        rows.append({"backend": kind, "case": case + " per kernel",
                     "us_per_call": (per[33] - per[1]) / 32 * 1e6, "numpy_us": peer * 1e6})
        rows.append({"backend": kind, "case": case + " L=1 call", "us_per_call": per[1] * 1e6,
                     "numpy_us": peer * 1e6})
    return rows


# run() writes the results itself, under the GPU's name (``benchmarks.run`` does not)
WRITES_RESULTS = True


def _gpu_name(kind: str, dev) -> str | None:
    """The device's name when it is a GPU (not PoCL or lavapipe), else None."""
    if kind == "opencl":
        from tilecraft.targets.opencl_backend import list_devices
        info = next((d for d in list_devices() if d["index"] == dev.index), None)
        return info["name"] if info and "CPU" not in info["type"].upper() else None
    from tilecraft.targets.webgpu_backend import list_adapters
    info = list_adapters()[dev.index]
    return info["name"] if info["type"] != "CPU" else None


def run(number: int = 200) -> list[dict]:
    """The rows, also written to ``benchmarks/results/gpu_launch_overhead/<machine>.json``."""
    from tilecraft import targets
    rows, gpu = [], None
    for kind, make, target in (("opencl", targets.opencl, "opencl -device=cpu"),
                               ("webgpu", targets.webgpu, "webgpu")):
        try:
            dev = make(0)
            if kind == "opencl":
                from tilecraft.targets.opencl_backend.runtime import context
                if context(dev.index).is_gpu:
                    target = "opencl"
            if not dev.exist:
                raise RuntimeError(f"no {kind} device")
            rows += _rows_for(kind, dev, target, number)
            gpu = gpu or _gpu_name(kind, dev)
        except Exception as err:   # a missing driver is a row, not a crash
            rows.append({"backend": kind, "case": "error",
                         "error": f"{type(err).__name__}: {str(err)[:200]}"})
            print(f"{kind}: {rows[-1]['error']}", file=sys.stderr)
    print(f"(written to {write_results('gpu_launch_overhead', rows, gpu=gpu)})")
    return rows


def main(argv=None) -> int:
    rows = run()
    print_table(rows, ["backend", "case", "us_per_call", "numpy_us"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
