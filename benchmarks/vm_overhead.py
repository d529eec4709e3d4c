"""The Relax VM's cost per kernel call: ``python -m benchmarks.vm_overhead [--json]``.

A function that is a chain of ``N`` tiny kernels (``y = x + 1`` on 4 floats, a few ns of work)
is timed for two lengths; the difference divided by the number of extra kernels is what the VM
adds per call (dispatch, argument words, the foreign call and the kernel entry's checks), the
rest the fixed cost of one invocation (argument checks, the result's allocation). A run of
kernels on planned arguments is one foreign call of the library's sequence runner, so per
kernel only the entry's checks and the kernel remain. For
reference the same kernel is timed called directly through ``targets`` (``Module["add1"]``
with NDArrays: packing plus the ctypes call) and through its time evaluator (the ctypes call
of pre-packed arguments alone).

Chains: ``static`` (shape (4,): every intermediate in planned storage, so its argument words
are written once per VM), ``symbolic`` (shape (n,): intermediates from the pool by size) and
``symbolic+bound`` (shape (n,), ``upper_bounds={"n": 64}``: planned statically).

The model rows measure a whole call of a small real model: a 4-layer GPT-2 (``transformers``,
random weights, hidden size 32, batch and sequence length dynamic: 88 kernel calls) through
``torch.export`` and ``relax.build``, beside the same model exported to ONNX
(``torch.onnx.export(dynamo=True)``) in onnxruntime; both on one thread, called from Python
with a numpy input. ``wall_*_us`` is a call's time for a 2 x 8 token input and for a one-token
request (1 x 1, where the kernels have almost nothing to do: the small-request cost), and
``wall_1x8_us`` for one 8-token sequence.
``outside_kernels_us`` is our call with every kernel entry replaced by a native function that
returns at once (argument checks, shape plan lookup, allocation, dispatch, and the foreign calls
into the kernels or the sequence runner); ``ctypes_loop_us`` is, for reference, a Python loop
making one ctypes call per kernel into such a no-op (what a dispatcher that calls each kernel
through ctypes pays at the least). onnxruntime has no such switch
and its profiler costs more than the quantity (it slows a call several times over), so its
peer figure is the one-token call.
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


GPT2_LAYERS = 4
GPT2_INPUT = (2, 8)     # batch, sequence length


def _gpt2():
    import torch
    import transformers
    from tilecraft.models import hf_zoo
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=hf_zoo.VOCAB, n_embd=32, n_layer=GPT2_LAYERS,
                                  n_head=2, n_positions=128, use_cache=False, bos_token_id=0,
                                  eos_token_id=0)
    model = hf_zoo.randomize(transformers.GPT2Model(cfg).eval())
    ids = torch.randint(0, hf_zoo.VOCAB, GPT2_INPUT, generator=torch.Generator().manual_seed(1))
    return model, ids, hf_zoo


def _noop_entry():
    """A native function of the kernel entry's signature that returns 0 at once (llvmlite)."""
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly("define i32 @noop(i8* %a, i8* %b, i32 %n) { ret i32 0 }")
    machine = llvm.Target.from_default_triple().create_target_machine()
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    return engine, engine.get_function_address("noop")


def _ours(model, ids, hf_zoo, small, number: int, repeat: int) -> dict:
    import copy

    from tilecraft import relax
    exe = relax.build(hf_zoo.via_torch_export(model, (ids,), hf_zoo._text_dims()), "llvm")
    exe.kernel_module.num_threads = 1          # as onnxruntime's session below
    vm = VirtualMachine(exe, targets.cpu(0))
    fn = vm["main"]
    x = ids.numpy()
    x1 = np.ascontiguousarray(x[:1])
    np.testing.assert_allclose(fn(x).numpy(), hf_zoo.reference(model, (ids,))[0], rtol=1e-4,
                               atol=1e-4)
    row = {"kernel_calls": exe.stats()["main"]["kernel_calls"],
           "wall_2x8_us": _per_call(lambda: fn(x), number, repeat) * 1e6,
           "wall_1x8_us": _per_call(lambda: fn(x1), number, repeat) * 1e6,
           "wall_1x1_us": _per_call(lambda: fn(small), number, repeat) * 1e6}
    # the same VM with every kernel entry a native no-op: what remains is the VM's own cost
    # (a copy of each kernel Function with its entry swapped, decoded into a fresh VM)
    engine, noop = _noop_entry()
    hollow = VirtualMachine(exe, targets.cpu(0))
    for name, kfn in list(hollow._kernel_fns.items()):     # every kernel the program calls
        stub = copy.copy(kfn)
        stub._cfunc = type(kfn._cfunc)(noop)
        hollow._kernel_fns[name] = stub
    hollow._functions = hollow._decode_all(None)
    hfn = hollow["main"]
    outside = _per_call(lambda: hfn(x), number, repeat)
    # for reference: one ctypes call per kernel, in a Python loop
    entries = [type(kfn._cfunc)(noop) for _ in range(row["kernel_calls"])]

    def ctypes_calls():
        for entry in entries:
            entry(0, 0, 0)
    ctypes_cost = _per_call(ctypes_calls, number, repeat)
    del engine
    row.update(outside_kernels_us=outside * 1e6, ctypes_loop_us=ctypes_cost * 1e6)
    return row


def _onnxruntime(model, ids, hf_zoo, small, number: int, repeat: int) -> dict:
    import os
    import tempfile

    import onnx
    import onnxruntime as ort
    import torch
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gpt2.onnx")
        torch.onnx.export(model, (ids,), path, dynamo=True, input_names=["input_ids"],
                          dynamic_shapes=hf_zoo._text_dims())
        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        nodes = len(onnx.load(path).graph.node)
    x = {"input_ids": ids.numpy()}
    x1 = {"input_ids": np.ascontiguousarray(ids.numpy()[:1])}
    got = sess.run(None, x)[0]
    np.testing.assert_allclose(got, hf_zoo.reference(model, (ids,))[0], rtol=1e-4, atol=1e-4)
    return {"kernel_calls": nodes,      # the exported graph's nodes (before its own fusions)
            "wall_2x8_us": _per_call(lambda: sess.run(None, x), number, repeat) * 1e6,
            "wall_1x8_us": _per_call(lambda: sess.run(None, x1), number, repeat) * 1e6,
            "wall_1x1_us": _per_call(lambda: sess.run(None, {"input_ids": small}), number,
                                     repeat) * 1e6}


def run_model(number: int = 200, repeat: int = 7) -> list[dict]:
    """One call of the 4-layer GPT-2, ours (and our cost outside kernels) and onnxruntime's."""
    model, ids, hf_zoo = _gpt2()
    small = np.zeros((1, 1), "int64")
    ours = _ours(model, ids, hf_zoo, small, number, repeat)
    peer = _onnxruntime(model, ids, hf_zoo, small, number, repeat)
    name = f"GPT-2 {GPT2_LAYERS} layers"
    return [{"model": name, "runtime": "relax VM", **ours},
            {"model": name, "runtime": "onnxruntime", **peer},
            {"model": name, "runtime": "ratio (onnxruntime / ours)",
             "wall_1x1_vs_ort": peer["wall_1x1_us"] / ours["wall_1x1_us"],
             "wall_1x8_vs_ort": peer["wall_1x8_us"] / ours["wall_1x8_us"],
             "wall_2x8_vs_ort": peer["wall_2x8_us"] / ours["wall_2x8_us"]}]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--long", type=int, default=65, help="kernels in the long chain")
    parser.add_argument("--number", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--no-model", action="store_true",
                        help="skip the GPT-2 rows (they need torch, transformers, onnxruntime)")
    parser.add_argument("--json", action="store_true",
                        help="also write benchmarks/results/vm_overhead/<machine>.json")
    args = parser.parse_args(argv)
    rows = run(long=args.long, number=args.number, repeat=args.repeat)
    from .common import print_table, write_results
    print_table(rows, ["chain", "per_kernel_us", "invocation_us", "total_1_us",
                       f"total_{args.long}_us"])
    if not args.no_model:
        model_rows = run_model(number=args.number, repeat=max(args.repeat // 2, 3))
        print_table(model_rows, ["model", "runtime", "kernel_calls", "wall_2x8_us",
                                 "wall_1x8_us", "wall_1x1_us", "outside_kernels_us",
                                 "ctypes_loop_us", "wall_1x1_vs_ort", "wall_1x8_vs_ort",
                                 "wall_2x8_vs_ort"])
        rows += model_rows
    if args.json:
        print(write_results("vm_overhead", rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
