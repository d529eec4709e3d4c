"""``tilecraft run``: run a compiled model on .npy inputs, here or on a board."""
from __future__ import annotations

import os
import statistics
import time

from tilecraft import relax, targets
from tilecraft.relax.executable import ExecutableFormatError

from ..devices import open_device
from ..errors import CLIError
from ..inputs import describe_output, exe_inputs, read_inputs, write_outputs
from ..progress import Steps
from ..remote import add_rpc_arguments, board_from_args, board_name, check_runs_on, load_remote

DESCRIPTION = """\
Run a compiled model (from `tilecraft compile`) on inputs from .npy files (in the model's input
order, or NAME=FILE.npy) or one .npz file of named arrays. It runs on the device its target
names: the CPU (llvm), an OpenCL device (opencl) or a WebGPU adapter (webgpu); --device N
picks one of several. With --rpc-tracker and --rpc-key (or --rpc-host and --rpc-port) the
executable is uploaded to a board, run there through the Relax RPC plugin, and the outputs
come back.

examples:
  tilecraft run model.tcx --input x.npy --output y.npy
  tilecraft run model-cl.tcx --input x=x.npy --device 0 --time 20
  tilecraft run model-pi.tcx --input x.npy --rpc-tracker 192.168.1.10:9190 --rpc-key rasp4"""


def add_arguments(p) -> None:
    p.add_argument("executable", help="a file written by `tilecraft compile`")
    p.add_argument("--input", "-i", action="append", default=[], metavar="[NAME=]FILE",
                   help="an input array (.npy), or a .npz of all inputs by name")
    p.add_argument("--output", "-o", help="write the output (.npy; several outputs: .npz)")
    p.add_argument("--time", type=int, default=0, metavar="N",
                   help="also time N runs and print the median (a board: on its own clock)")
    p.add_argument("--device", type=int, default=0, metavar="N",
                   help="which device of the target's kind (default 0)")
    add_rpc_arguments(p)


def _load(path: str) -> relax.Executable:
    if not os.path.exists(path):
        raise CLIError(f"{path}: no such file")
    try:
        return relax.load_executable(path)
    except ExecutableFormatError as err:
        raise CLIError(str(err)) from None


def run(args) -> int:
    if args.time < 0:
        raise CLIError(f"--time {args.time}: must be >= 0")
    board = board_from_args(args)
    exe = _load(args.executable)
    inputs = read_inputs(args.input, exe_inputs(exe.program))
    if board is not None:
        arrays, first_s, median_s, where = _run_remote(args, exe, inputs, board)
        first_what = "round trip, first call"
    else:
        arrays, first_s, median_s, where = _run_here(args, exe, inputs)
        first_what = "first call"
    for i, a in enumerate(arrays):
        print(describe_output(i, a))
    print(f"ran on {where} in {first_s * 1e3:.2f} ms ({first_what})")
    if median_s is not None:
        clock = " on the board's clock" if board is not None else ""
        print(f"median of {args.time} runs: {median_s * 1e3:.3f} ms{clock}")
    if args.output:
        write_outputs(args.output, arrays)
        print(f"wrote {args.output}")
    return 0


def _run_here(args, exe, inputs):
    reason = exe.unavailable_reason()
    if reason:
        raise CLIError(f"{args.executable} cannot run here: {reason}; or run it there: "
                       f"tilecraft run {args.executable} --rpc-tracker HOST:PORT --rpc-key KEY")
    dev, where = open_device(exe.target, args.device)
    vm = relax.VirtualMachine(exe, dev)
    args_nd = [targets.array(a, dev) for a in inputs]
    t0 = time.perf_counter()
    out = vm["main"](*args_nd)
    dev.sync()
    first_s = time.perf_counter() - t0
    outs = list(out) if isinstance(out, tuple) else [out]
    arrays = [o.numpy() for o in outs]
    median_s = None
    if args.time:
        res = vm.time_evaluator("main", dev, number=1, repeat=args.time)(*args_nd)
        median_s = statistics.median(res.results)
    return arrays, first_s, median_s, where


def _run_remote(args, exe, inputs, board):
    with Steps(3, "run", quiet=args.quiet) as steps:
        steps.step(f"connecting to {board.describe()}")
        with board.connect() as sess:
            check_runs_on(exe.target, exe.triple, sess, board, args.executable,
                          "compile it with the board's --target")
            steps.step(f"uploading {os.path.basename(args.executable)}")
            vm = load_remote(sess, args.executable, exe.target, args.device, board)
            steps.step("running on the board")
            t0 = time.perf_counter()
            out = vm["main"](*inputs)
            first_s = time.perf_counter() - t0
            arrays = list(out) if isinstance(out, tuple) else [out]
            median_s = None
            if args.time:
                res = vm.time_evaluator("main", number=1, repeat=args.time)(*inputs)
                median_s = statistics.median(res.results)
            where = f"{board.describe()}, {board_name(sess)}"
    return arrays, first_s, median_s, where
