"""The Relax VM's cost per kernel call: ``python -m benchmarks.vm_overhead [--json]``.

A function that is a chain of ``N`` tiny kernels (``y = x + 1`` on 4 floats, a few ns of work)
is timed for two lengths; the difference divided by the number of extra kernels is what the VM
adds per call (dispatch, argument words, the ctypes call and the kernel entry's checks), the
rest the fixed cost of one invocation (argument checks, the result's allocation). For
reference the same kernel is timed called directly through ``targets`` (``Module["add1"]``
with NDArrays: packing plus the ctypes call) and through its time evaluator (the ctypes call
of pre-packed arguments alone).

Chains: ``static`` (shape (4,): every intermediate in planned storage, so its argument words
are written once per VM), ``symbolic`` (shape (n,): intermediates from the pool by size) and
``symbolic+bound`` (shape (n,), ``upper_bounds={"n": 64}``: planned statically).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from tilecraft import targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var
from tilecraft.relax.build import build
from tilecraft.relax.vm import VirtualMachine
from tilecraft.tensorir import te


def add1(a):
    return te.compute(a.shape, lambda i: a[i] + 1.0, "add1")


def chain(length: int, dim) -> "object":
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo((dim,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(length):
                h = bb.emit_te(add1, h)
            gv = bb.emit_output(h)
        bb.emit_func_output(gv)
    return bb.get()


def _per_call(fn, number: int, repeat: int) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return min(samples)   # the least disturbed run: overhead, not noise, is measured


def run(short: int = 1, long: int = 65, number: int = 200, repeat: int = 15) -> list[dict]:
    rows = []
    x = np.random.default_rng(0).standard_normal(4).astype("float32")
    xa = targets.array(x)
    for label, dim, bounds in (("static", 4, None), ("symbolic", "n", None),
                               ("symbolic+bound", "n", {"n": 64})):
        times = {}
        for length in (short, long):
            # pipeline=[]: no fusion, so the chain really makes `length` kernel calls
            exe = build(chain(length, dim), "llvm", pipeline=[], upper_bounds=bounds)
            assert exe.stats()["main"]["kernel_calls"] == length
            vm = VirtualMachine(exe)
            fn = vm["main"]
            np.testing.assert_allclose(fn(x).numpy(), x + length, rtol=1e-6)
            times[length] = _per_call(lambda: fn(xa), number, repeat)
        per_kernel = (times[long] - times[short]) / (long - short)
        rows.append({"chain": label, "per_kernel_us": per_kernel * 1e6,
                     "invocation_us": (times[short] - per_kernel * short) * 1e6,
                     f"total_{short}_us": times[short] * 1e6,
                     f"total_{long}_us": times[long] * 1e6})
    # the same kernel called directly
    a = te.placeholder((4,), "float32", "A")
    mod = targets.build(te.create_prim_func([a, add1(a)]), "llvm")
    out = targets.empty((4,), "float32")
    f = mod["main"]
    direct = _per_call(lambda: f(xa, out), number, repeat)
    bare = mod.time_evaluator("main", targets.cpu(0), number=number, repeat=repeat)(xa, out).min
    rows.append({"chain": "targets Function call", "per_kernel_us": direct * 1e6})
    rows.append({"chain": "ctypes call, pre-packed", "per_kernel_us": bare * 1e6})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--long", type=int, default=65, help="kernels in the long chain")
    parser.add_argument("--number", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", action="store_true",
                        help="also write benchmarks/results/vm_overhead/<machine>.json")
    args = parser.parse_args(argv)
    rows = run(long=args.long, number=args.number, repeat=args.repeat)
    from .common import print_table, write_results
    print_table(rows, ["chain", "per_kernel_us", "invocation_us", "total_1_us",
                       f"total_{args.long}_us"])
    if args.json:
        print(write_results("vm_overhead", rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
