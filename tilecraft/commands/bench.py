"""``tilecraft bench``: check a model against onnxruntime or PyTorch and time both."""
from __future__ import annotations

import os
import statistics
import tempfile

import numpy as np

from tilecraft import relax, targets

from ..devices import device_kind, open_device
from ..errors import CLIError, require
from ..inputs import parse_ints, random_inputs
from ..loader import LoadedModel, model_kind
from ..progress import Steps
from ..remote import add_rpc_arguments, board_from_args, board_name, check_runs_on, load_remote
from ..timing import calls_per_round, interleaved
from .common import add_model_args, build_model, check_dims, import_model, parse_target

DESCRIPTION = """\
Compile a model, check its output against the peer (onnxruntime for an ONNX model, PyTorch
eager for a .pt2 program) on random inputs, then time both, interleaved round by round in this
process, and print both latencies and the ratio (peer time / tilecraft time: above 1,
tilecraft is faster).

--target opencl or webgpu times tilecraft on that device (--device N); the peer still runs on
this CPU, which the output says. With --rpc-tracker and --rpc-key (or --rpc-host and
--rpc-port) the model is compiled for --target (the board's), run and timed on the board (its
own clock), and its output is checked against the peer run here; no ratio is printed across
two machines.

examples:
  tilecraft bench model.onnx --dim batch=8
  tilecraft bench model.pt2 --compare torch
  tilecraft bench model.onnx --target webgpu
  tilecraft bench model.onnx --target raspberry-pi/4b-aarch64 \\
      --rpc-tracker 192.168.1.10:9190 --rpc-key rasp4"""


def add_arguments(p) -> None:
    add_model_args(p)
    p.add_argument("--compare", default="onnxruntime", choices=["onnxruntime", "torch", "none"],
                   help="the peer (default onnxruntime; torch for .pt2 programs)")
    p.add_argument("--dim", action="append", metavar="DIM=N",
                   help="the size of a symbolic dim for the random inputs (default 1)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="onnxruntime / torch intra-op threads (default: all cores)")
    p.add_argument("--rounds", type=int, default=5,
                   help="interleaved timing rounds (a board: timing repeats)")
    p.add_argument("--rtol", type=float, default=1e-3)
    p.add_argument("--atol", type=float, default=1e-4)
    p.add_argument("--profile", action="store_true",
                   help="also print vm.profile: the time of every kernel")
    p.add_argument("--device", type=int, default=0, metavar="N",
                   help="which device of the target's kind (default 0)")
    add_rpc_arguments(p)


def _check_peer(args) -> None:
    """Fail before any work when the peer does not fit the model or is not installed."""
    if args.compare == "none":
        return
    kind = model_kind(args.model)
    if args.compare == "onnxruntime" and kind != "onnx":
        raise CLIError("--compare onnxruntime needs an ONNX model; use --compare torch "
                       "for a torch.export program")
    if args.compare == "torch" and kind != "torch":
        raise CLIError("--compare torch needs a torch.export program (.pt2)")
    module = "onnxruntime" if args.compare == "onnxruntime" else "torch"
    try:
        require(module, f"tilecraft bench --compare {args.compare}")
    except CLIError as err:
        raise type(err)(f"{err} (or --compare none)") from None


def _peer(args, model: LoadedModel, inputs):
    """A callable running the original model with its own framework, and its name."""
    if args.compare == "none":
        return None, None
    if args.compare == "onnxruntime":
        ort = require("onnxruntime", "tilecraft bench --compare onnxruntime")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(model.source.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        feed = {n: a for n, a in zip([s.name for s in model.inputs], inputs) if n in names}
        return (lambda: sess.run(None, feed)), f"onnxruntime {ort.__version__}"
    torch = require("torch", "tilecraft bench --compare torch")
    torch.set_num_threads(args.threads)
    module = model.source.module()
    tins = [torch.from_numpy(a) for a in inputs]

    def run_peer():
        with torch.no_grad():
            r = module(*tins)
        rs = r if isinstance(r, (tuple, list)) else [r]
        return [t.numpy() for t in rs]
    return run_peer, f"PyTorch {torch.__version__}"


def check_outputs(ours: list[np.ndarray], ref, peer_name: str, rtol: float, atol: float,
                  where: str = "tilecraft") -> None:
    """``CLIError`` unless ``ours`` matches the peer's outputs ``ref``."""
    if len(ref) != len(ours):
        raise CLIError(f"the peer gives {len(ref)} outputs, {where} {len(ours)}")
    for i, (o, r) in enumerate(zip(ours, ref)):
        r = np.asarray(r)
        if o.shape != r.shape:
            raise CLIError(f"output {i}: {where}'s shape {o.shape}, the peer's {r.shape}")
        if not np.allclose(o, r, rtol=rtol, atol=atol, equal_nan=True):
            err = float(np.max(np.abs(o.astype(np.float64) - r)))
            raise CLIError(f"output {i}: {where} and {peer_name} disagree (max abs "
                           f"difference {err:.3g}, rtol {rtol}, atol {atol})")


def _outputs(out) -> list[np.ndarray]:
    outs = list(out) if isinstance(out, tuple) else [out]
    return [o if isinstance(o, np.ndarray) else o.numpy() for o in outs]


def run(args) -> int:
    target = parse_target(args.target)
    dims = parse_ints(args.dim, "--dim")
    if args.rounds < 1:
        raise CLIError(f"--rounds {args.rounds}: must be >= 1")
    board = board_from_args(args)
    _check_peer(args)
    if board is not None:
        return _bench_remote(args, str(target), target.triple, dims, board)
    dev, where = open_device(str(target), args.device)     # before minutes of building
    with Steps(4, "bench", quiet=args.quiet) as steps:
        model, bounds = import_model(args, steps)
        check_dims(model, dims, "--dim")
        exe, build_s = build_model(model, str(target), bounds, steps)
        steps.step("checking against the peer")
        vm = relax.VirtualMachine(exe, dev)
        inputs = random_inputs(model.inputs, dims)
        peer, peer_name = _peer(args, model, inputs)
        args_nd = [targets.array(a, dev) for a in inputs]
        ours_out = _outputs(vm["main"](*args_nd))
        checked = "not checked"
        if peer is not None:
            check_outputs(ours_out, peer(), peer_name, args.rtol, args.atol)
            checked = f"matches {peer_name} (rtol {args.rtol}, atol {args.atol})"
        steps.step("timing")
        fn = vm["main"]

        def ours():
            fn(*args_nd)
            dev.sync()        # a GPU queue runs behind the host: time the work, not the enqueue
        number = calls_per_round(ours)
        fns = [ours] + ([peer] if peer is not None else [])
        times = interleaved(fns, number, args.rounds)
    sizes = ", ".join(f"{s.name} {s.concrete(dims)}" for s in model.inputs)
    print(f"{args.model}: inputs {sizes}; built for {target} in {build_s:.1f} s; output "
          f"{checked}")
    on_cpu = device_kind(str(target)) == "cpu"
    print(f"tilecraft   {times[0] * 1e3:10.3f} ms" + ("" if on_cpu else f"  on {where}"))
    if peer is not None:
        print(f"{peer_name.split()[0]:<11} {times[1] * 1e3:10.3f} ms"
              + ("" if on_cpu else "  on this CPU"))
        ratio = times[1] / times[0]
        devices = "" if on_cpu else f"; tilecraft on {where}, the peer on this CPU"
        shown = f"{ratio:.2f}" if ratio >= 0.1 else f"{ratio:.2g}"
        print(f"ratio {shown}x ({'tilecraft is faster' if ratio > 1 else 'the peer is faster'}"
              f"; peer time / tilecraft time, median of {args.rounds} interleaved rounds of "
              f"{number}{devices})")
    if args.profile:
        print(vm.profile(*args_nd, number=max(1, number)))
    return 0


def _bench_remote(args, target: str, triple: str, dims: dict, board) -> int:
    with Steps(6, "bench", quiet=args.quiet) as steps:
        steps.step(f"asking {board.describe()} what it is")
        with board.connect() as sess:          # fail before minutes of building
            check_runs_on(target, triple, sess, board, f"--target {args.target}",
                          "give the board's --target")
        model, bounds = import_model(args, steps)
        check_dims(model, dims, "--dim")
        exe, build_s = build_model(model, target, bounds, steps)
        inputs = random_inputs(model.inputs, dims)
        peer, peer_name = _peer(args, model, inputs)
        ref = peer() if peer is not None else None
        with tempfile.TemporaryDirectory(prefix="tilecraft-bench-") as tmp:
            path = exe.export_library(os.path.join(tmp, "model.tcx"))
            steps.step(f"running on {board.describe()}")
            with board.connect() as sess:
                vm = load_remote(sess, path, target, args.device, board)
                ours_out = _outputs(vm["main"](*inputs))
                checked = "not checked"
                if ref is not None:
                    check_outputs(ours_out, ref, peer_name, args.rtol, args.atol,
                                  where="the board")
                    checked = (f"matches {peer_name} run here (rtol {args.rtol}, "
                               f"atol {args.atol})")
                steps.step("timing on the board")
                once = vm.time_evaluator("main", number=1, repeat=1)(*inputs).median
                number = max(1, min(1000, int(0.2 / max(once, 1e-7))))
                res = vm.time_evaluator("main", number=number, repeat=args.rounds)(*inputs)
                profile = vm.profile(*inputs, number=max(1, number)) if args.profile else None
                name = board_name(sess)
    sizes = ", ".join(f"{s.name} {s.concrete(dims)}" for s in model.inputs)
    print(f"{args.model}: inputs {sizes}; built for {target} in {build_s:.1f} s; board output "
          f"{checked}")
    print(f"tilecraft   {statistics.median(res.results) * 1e3:10.3f} ms  on {board.describe()}, "
          f"{name} (median of {args.rounds} repeats of {number} calls, the board's clock)")
    if peer is not None:
        print(f"{peer_name.split()[0]} ran on this machine to check the output; it is not timed "
              f"against the board (a ratio across two machines says nothing)")
    if profile is not None:
        print(profile)
    return 0
