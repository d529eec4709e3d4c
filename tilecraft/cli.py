"""The ``tilecraft`` command line: compile, run, bench, zoo, demo.

    tilecraft compile model.onnx --target llvm -o model.tcx [--shape input=batch,3,224,224]
                      [--upper-bound batch=64]
    tilecraft run model.tcx --input x.npy [--output y.npy]
    tilecraft bench model.onnx --compare onnxruntime [--shape ...] [--dim batch=1]
    tilecraft zoo [--models resnet18,bert_base] [--show]
    tilecraft demo

Errors are one line on stderr (``tilecraft: error: ...``) and a non-zero exit status: 1 for a
problem with the model or the inputs, 2 for a bad command line. ``--traceback`` shows the
Python traceback too. See docs/cli.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

import numpy as np

from .loader import (CLIError, InputSpec, load_model, parse_ints, parse_shapes, random_inputs)
from .progress import Steps


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an ONNX file (.onnx) or a torch.export program saved with "
                                 "torch.export.save (.pt2)")
    p.add_argument("--shape", action="append", metavar="INPUT=D0,D1,...",
                   help="the shape of an ONNX input; names make symbolic dims "
                        "(--shape input=batch,3,224,224); repeat for several inputs")
    p.add_argument("--upper-bound", action="append", metavar="DIM=N",
                   help="an upper bound of a symbolic dim, for static memory planning "
                        "(--upper-bound batch=64); repeat for several dims")
    p.add_argument("--target", default="llvm", help="the target (default: llvm, this CPU; "
                                                     "any LLVM target or tag)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilecraft", description="Compile, run and benchmark models with tilecraft.",
        epilog="See docs/cli.md. Each command has its own --help.")
    parser.add_argument("--traceback", action="store_true",
                        help="show the Python traceback of an error")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("compile", help="import a model and build it into one file",
                       description="Import an ONNX model or a torch.export program, build it "
                                   "with relax.build (untuned: default schedules) and write "
                                   "the executable as one file (relax.load_executable reads "
                                   "it; `tilecraft run` runs it).")
    _add_model_args(p)
    p.add_argument("-o", "--output", required=True, help="the executable file to write")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", help="run a compiled model on .npy inputs",
                       description="Run a compiled model (from `tilecraft compile`) on inputs "
                                   "from .npy files (in the model's input order, or "
                                   "NAME=FILE.npy) or one .npz file of named arrays.")
    p.add_argument("executable", help="a file written by `tilecraft compile`")
    p.add_argument("--input", "-i", action="append", default=[], metavar="[NAME=]FILE",
                   help="an input array (.npy), or a .npz of all inputs by name")
    p.add_argument("--output", "-o", help="write the output (.npy; several outputs: .npz)")
    p.add_argument("--time", type=int, default=0, metavar="N",
                   help="also time N runs and print the median")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("bench", help="time a model beside onnxruntime or PyTorch",
                       description="Compile a model, check its output against the peer on "
                                   "random inputs, then time both, interleaved, in this "
                                   "process; prints the latencies and the ratio.")
    _add_model_args(p)
    p.add_argument("--compare", default="onnxruntime", choices=["onnxruntime", "torch", "none"],
                   help="the peer (default onnxruntime; torch for .pt2 programs)")
    p.add_argument("--dim", action="append", metavar="DIM=N",
                   help="the size of a symbolic dim for the random inputs (default 1)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="onnxruntime / torch intra-op threads (default: all cores)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--rtol", type=float, default=1e-3)
    p.add_argument("--atol", type=float, default=1e-4)
    p.add_argument("--profile", action="store_true",
                   help="also print vm.profile: the time of every kernel")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("zoo", help="run the model zoo (benchmarks/zoo) and print its table",
                       description="Run the zoo models through tilecraft, onnxruntime and "
                                   "PyTorch; writes benchmarks/results/zoo-<target>.json, a "
                                   "markdown table and a chart. Needs a source checkout.")
    p.add_argument("--models", help="comma-separated model names (default: all)")
    p.add_argument("--show", action="store_true",
                   help="print the table of the last run instead of running")
    p.add_argument("--target", default="llvm")
    p.add_argument("--list", action="store_true", help="list the models and exit")
    p.set_defaults(func=cmd_zoo)

    p = sub.add_parser("demo", help="the README's main job: ResNet-50 for this CPU vs "
                                    "onnxruntime",
                       description="Compile the ResNet-50 model shipped with the onnx "
                                   "package for this CPU, run it, check it against "
                                   "onnxruntime and print both latencies.")
    p.add_argument("--rounds", type=int, default=5)
    p.set_defaults(func=cmd_demo)
    return parser


# ---------------------------------------------------------------------------------------------


def _compile(args, steps: Steps):
    from tilecraft import relax
    shapes = parse_shapes(args.shape)
    bounds = parse_ints(args.upper_bound, "--upper-bound")
    steps.step(f"importing {os.path.basename(args.model)}")
    model = load_model(args.model, shapes)
    known = {str(d) for spec in model.inputs for d in spec.shape if not isinstance(d, int)}
    for name in bounds:
        if name not in known:
            raise CLIError(f"--upper-bound {name}: the model has no symbolic dim {name!r} "
                           f"(symbolic dims: {', '.join(sorted(known)) or 'none'})")
    steps.step(f"building for {args.target}")
    t0 = time.perf_counter()
    exe = relax.build(model.mod, args.target, upper_bounds=bounds or None)
    return model, exe, time.perf_counter() - t0


def cmd_compile(args) -> int:
    with Steps(3, "compile", quiet=args.quiet) as steps:
        model, exe, build_s = _compile(args, steps)
        steps.step(f"writing {args.output}")
        exe.export_library(args.output)
    ins = ", ".join(f"{s.name}: {s.shape_text()} {s.dtype}" for s in model.inputs)
    print(f"compiled {args.model} for {args.target} in {build_s:.1f} s: "
          f"{len(exe.kernel_names)} kernels, inputs {ins}")
    print(f"wrote {args.output} ({os.path.getsize(args.output) / 1e6:.2f} MB)")
    return 0


def _exe_inputs(exe) -> list[InputSpec]:
    fn = exe.program["functions"].get("main")
    if fn is None:
        raise CLIError(f"the executable has no main function (functions: "
                       f"{', '.join(exe.function_names)})")
    specs = []
    for name, spec in zip(fn["params"], fn.get("param_specs", [{}] * len(fn["params"]))):
        specs.append(InputSpec(name, [spec.get("shape_text", "?")], spec.get("dtype", "?")))
    return specs


def _read_inputs(items: list[str], specs: list[InputSpec]) -> list[np.ndarray]:
    names = [s.name for s in specs]
    arrays: dict[str, np.ndarray] = {}
    positional: list[np.ndarray] = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = None, item
        if not os.path.exists(path):
            raise CLIError(f"--input {item}: no such file")
        try:
            data = np.load(path, allow_pickle=False)
        except Exception as err:
            raise CLIError(f"--input {item}: not a .npy / .npz file ({err})") from None
        if isinstance(data, np.lib.npyio.NpzFile):
            for k in data.files:
                if k not in names:
                    raise CLIError(f"--input {path}: the model has no input {k!r} (inputs: "
                                   f"{', '.join(names)})")
                arrays[k] = data[k]
        elif name is not None:
            if name not in names:
                raise CLIError(f"--input {item}: the model has no input {name!r} (inputs: "
                               f"{', '.join(names)})")
            arrays[name] = data
        else:
            positional.append(data)
    out = []
    for spec in specs:
        if spec.name in arrays:
            out.append(arrays[spec.name])
        elif positional:
            out.append(positional.pop(0))
        else:
            raise CLIError(f"no value for input {spec.name} {spec.shape[0]} {spec.dtype} "
                           f"(give --input {spec.name}=FILE.npy)")
    if positional:
        raise CLIError(f"{len(items)} inputs given, the model takes {len(specs)} "
                       f"({', '.join(names)})")
    return out


def cmd_run(args) -> int:
    from tilecraft import relax
    from tilecraft import targets
    if not os.path.exists(args.executable):
        raise CLIError(f"{args.executable}: no such file")
    exe = relax.load_executable(args.executable)
    specs = _exe_inputs(exe)
    inputs = _read_inputs(args.input, specs)
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    t0 = time.perf_counter()
    out = vm["main"](*inputs)
    first_s = time.perf_counter() - t0
    outs = list(out) if isinstance(out, tuple) else [out]
    arrays = [o.numpy() for o in outs]
    for i, a in enumerate(arrays):
        flat = a.reshape(-1)
        head = ", ".join(f"{v:.6g}" if a.dtype.kind == "f" else str(v) for v in flat[:6])
        more = ", ..." if flat.size > 6 else ""
        stats = (f" min {a.min():.6g} max {a.max():.6g} mean {a.mean():.6g}"
                 if a.dtype.kind == "f" and a.size else "")
        print(f"output {i}: shape {a.shape} {a.dtype}: [{head}{more}]{stats}")
    print(f"ran in {first_s * 1e3:.2f} ms (first call)")
    if args.time:
        from .timing import interleaved
        (secs,) = interleaved([lambda: vm["main"](*inputs)], number=1, rounds=args.time)
        print(f"median of {args.time} runs: {secs * 1e3:.3f} ms")
    if args.output:
        _write_outputs(args.output, arrays)
        print(f"wrote {args.output}")
    return 0


def _write_outputs(path: str, arrays: list[np.ndarray]) -> None:
    """Write atomically: a temporary file beside ``path``, then a rename."""
    import tempfile
    d = os.path.dirname(os.path.abspath(path))
    if len(arrays) == 1 and not path.endswith(".npz"):
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".npy")
        with os.fdopen(fd, "wb") as f:
            np.save(f, arrays[0])
    else:
        if not path.endswith(".npz"):
            raise CLIError(f"--output {path}: the model has {len(arrays)} outputs; give a .npz "
                           f"file")
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".npz")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **{f"output_{i}": a for i, a in enumerate(arrays)})
    os.replace(tmp, path)


def _peer(args, model, inputs):
    """A callable running the original model with its own framework, or None."""
    if args.compare == "none":
        return None, None
    if args.compare == "onnxruntime":
        if model.kind != "onnx":
            raise CLIError("--compare onnxruntime needs an ONNX model; use --compare torch "
                           "for a torch.export program")
        try:
            import onnxruntime as ort
        except ImportError:
            raise CLIError("--compare onnxruntime: onnxruntime is not installed "
                           "(pip install onnxruntime)") from None
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(model.source.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        feed = {n: a for n, a in zip([s.name for s in model.inputs], inputs) if n in names}
        return (lambda: sess.run(None, feed)), f"onnxruntime {ort.__version__}"
    if model.kind != "torch":
        raise CLIError("--compare torch needs a torch.export program (.pt2)")
    import torch
    torch.set_num_threads(args.threads)
    module = model.source.module()
    tins = [torch.from_numpy(a) for a in inputs]

    def run():
        with torch.no_grad():
            r = module(*tins)
        rs = r if isinstance(r, (tuple, list)) else [r]
        return [t.numpy() for t in rs]
    return run, f"PyTorch {torch.__version__}"


def cmd_bench(args) -> int:
    from tilecraft import relax
    from tilecraft import targets
    from .timing import calls_per_round, interleaved
    dims = parse_ints(args.dim, "--dim")
    with Steps(4, "bench", quiet=args.quiet) as steps:
        model, exe, build_s = _compile(args, steps)
        known = {str(d) for spec in model.inputs for d in spec.shape if not isinstance(d, int)}
        for name in dims:
            if name not in known:
                raise CLIError(f"--dim {name}: the model has no symbolic dim {name!r} "
                               f"(symbolic dims: {', '.join(sorted(known)) or 'none'})")
        steps.step("checking against the peer")
        vm = relax.VirtualMachine(exe, targets.cpu(0))
        inputs = random_inputs(model.inputs, dims)
        peer, peer_name = _peer(args, model, inputs)
        out = vm["main"](*inputs)
        ours_out = [o.numpy() for o in (out if isinstance(out, tuple) else [out])]
        checked = "not checked"
        if peer is not None:
            ref = peer()
            if len(ref) != len(ours_out):
                raise CLIError(f"the peer gives {len(ref)} outputs, tilecraft {len(ours_out)}")
            for i, (o, r) in enumerate(zip(ours_out, ref)):
                r = np.asarray(r)
                if o.shape != r.shape:
                    raise CLIError(f"output {i}: tilecraft's shape {o.shape}, the peer's "
                                   f"{r.shape}")
                if not np.allclose(o, r, rtol=args.rtol, atol=args.atol, equal_nan=True):
                    err = float(np.max(np.abs(o.astype(np.float64) - r)))
                    raise CLIError(f"output {i}: tilecraft and {peer_name} disagree (max abs "
                                   f"difference {err:.3g}, rtol {args.rtol}, atol {args.atol})")
            checked = f"matches {peer_name} (rtol {args.rtol}, atol {args.atol})"
        steps.step("timing")
        args_nd = [targets.array(a) for a in inputs]
        fn = vm["main"]

        def ours():
            return fn(*args_nd)
        number = calls_per_round(ours)
        fns = [ours] + ([peer] if peer is not None else [])
        times = interleaved(fns, number, args.rounds)
    sizes = ", ".join(f"{s.name} {s.concrete(dims)}" for s in model.inputs)
    print(f"{args.model}: inputs {sizes}; built in {build_s:.1f} s; output {checked}")
    print(f"tilecraft   {times[0] * 1e3:10.3f} ms")
    if peer is not None:
        print(f"{peer_name.split()[0]:<11} {times[1] * 1e3:10.3f} ms")
        ratio = times[1] / times[0]
        print(f"ratio {ratio:.2f}x ({'tilecraft is faster' if ratio > 1 else 'the peer is faster'}"
              f"; peer time / tilecraft time, median of {args.rounds} interleaved rounds of "
              f"{number})")
    if args.profile:
        print(vm.profile(*args_nd, number=max(1, number)))
    return 0


def _benchmarks():
    """Import the zoo from the source checkout this package sits in (or the current dir)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for base in (root, os.getcwd()):
        if os.path.isdir(os.path.join(base, "benchmarks", "zoo")) and base not in sys.path:
            sys.path.insert(0, base)
    try:
        from benchmarks.zoo import run as zoo_run
    except ImportError as err:
        raise CLIError(f"tilecraft zoo and demo run from a source checkout (benchmarks/zoo was "
                       f"not found: {err})") from None
    return zoo_run


def cmd_zoo(args) -> int:
    zoo_run = _benchmarks()
    argv = ["--target", args.target]
    if args.models:
        argv += ["--models", args.models]
    if args.show:
        argv.append("--show")
    if args.list:
        argv.append("--list")
    if args.quiet:
        argv.append("--quiet")
    return zoo_run.main(argv)


def cmd_demo(args) -> int:
    _benchmarks()
    from benchmarks import demo
    demo.main(rounds=args.rounds, quiet=args.quiet)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The ``tilecraft`` entry point; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("tilecraft: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # one line per error; the traceback on request
        if args.traceback:
            raise
        print(f"tilecraft: error: {_describe(err)}", file=sys.stderr)
        return 1


def _describe(err: Exception) -> str:
    if isinstance(err, CLIError):
        return str(err)
    name = type(err).__name__
    text = str(err) or repr(err)
    return f"{name}: {text}"


if __name__ == "__main__":
    sys.exit(main())
