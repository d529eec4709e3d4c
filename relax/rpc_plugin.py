"""Run exported Relax executables on a board through RPC: an ``rpc`` plugin.

``rpc`` sits below ``relax`` and knows nothing of it; this module adds the session operations
that load and run an executable on the board, and the client API that calls them.

* **Board half.** ``python -m tilecraft.rpc.server --plugin tilecraft.relax.rpc_plugin ...``
  (or ``tilecraft rpc server --plugin ...``) imports this module before the server forks its
  session launcher, which registers (``rpc.worker.register_op``):

  ========================  =====================================================================
  operation                 what
  ========================  =====================================================================
  relax.load_executable     ``relax.load_executable`` of an uploaded file, then a
                            ``VirtualMachine`` on it; replies with its handle and its functions
  relax.vm_call             run a function on inputs (arrays of the session, or sent along);
                            results come back as arrays, or stay on the board
  relax.vm_time             ``VirtualMachine.time_evaluator`` on the board's clock
  relax.vm_profile          ``VirtualMachine.profile``: per-kernel times on the board
  ========================  =====================================================================

  Loading needs numpy and ctypes only (no LLVM): what a board has.

* **Client half.** ``RemoteVirtualMachine(session, uploaded_name)``: ``vm["main"](*inputs)``
  returns numpy arrays (``outputs="remote"``: ``rpc.RemoteNDArray``\\ s that stay on the board),
  ``vm.time_evaluator(...)``, ``vm.profile(...)``.

Argument errors are raised on the board by the VM with the same message as on the host and come
back as ``RemoteVMArgumentError``, a ``relax.VMArgumentError`` (so a ``ValueError``) and an
``rpc.RemoteError``; the session goes on. A kernel that crashes ends only that session
(``rpc.SessionLost``).

Values travel as JSON: ``["t", i]`` is the i-th array of the request (or reply), ``["r", desc]``
an array kept on the board, ``["i", int]``, ``["f", float]``, ``["b", bool]``, ``["T", [values]]``
a tuple (a shape is a tuple of ints), ``["n"]`` None.

Examples
--------
>>> exe = relax.build(mod, "raspberry-pi/4b-aarch64")                       # doctest: +SKIP
>>> with rpc.connect_tracker("127.0.0.1", 9190).request("rasp4") as sess:   # doctest: +SKIP
...     vm = RemoteVirtualMachine(sess, sess.upload(exe.export_library("mlp.tcx")))
...     y = vm["main"](np.random.rand(5, 16).astype("float32"))          # numpy out
...     print(vm.time_evaluator("main", number=100)(x).mean)
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from tilecraft.rpc.client import RemoteDevice, RemoteError, RemoteNDArray, Session
from tilecraft.rpc.worker import OpContext, register_op
from tilecraft.targets.runtime import BenchmarkResult, Device, NDArray

from .executable import load_executable
from .vm import ProfileReport, VirtualMachine, VMArgumentError

__all__ = ["RemoteVirtualMachine", "RemoteVMFunction", "RemoteVMArgumentError", "OPS"]

OPS = ("relax.load_executable", "relax.vm_call", "relax.vm_time", "relax.vm_profile")
_MAX_DEPTH = 32   # of nested tuples in a value


class RemoteVMArgumentError(VMArgumentError, RemoteError):
    """A ``VMArgumentError`` raised by the VM on the board (a wrong count, rank, dtype or
    dimension): a ``ValueError``, a ``relax.VMArgumentError`` and an ``rpc.RemoteError``, with
    the board's message (the host's wording)."""

    remote_type = "VMArgumentError"


# ---------------------------------------------------------------------------------------------
# values on the wire


def _pack_value(x, arrays: list, what: str, depth: int = 0) -> list:
    """The wire form of an input value; arrays are appended to ``arrays``."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"{what}: tuples nested more than {_MAX_DEPTH} deep")
    if isinstance(x, (RemoteNDArray, np.ndarray, NDArray)):
        arrays.append(x)
        return ["t", len(arrays) - 1]
    if isinstance(x, (bool, np.bool_)):
        return ["b", bool(x)]
    if isinstance(x, (int, np.integer)):
        return ["i", int(x)]
    if isinstance(x, (float, np.floating)):
        return ["f", float(x)]
    if isinstance(x, (tuple, list)):
        return ["T", [_pack_value(v, arrays, f"{what}[{i}]", depth + 1)
                      for i, v in enumerate(x)]]
    if x is None:
        return ["n"]
    raise TypeError(f"{what} must be an array (numpy, NDArray or rpc.RemoteNDArray), a number or "
                    f"a tuple of them, got {type(x).__name__}")


def _unpack_value(v, arrays: Sequence, what: str, depth: int = 0):
    """A value from its wire form (the board's inputs)."""
    if not isinstance(v, list) or not v or not isinstance(v[0], str) or depth > _MAX_DEPTH:
        raise ValueError(f"{what}: malformed value {v!r}")
    tag = v[0]
    if tag == "n" and len(v) == 1:
        return None
    if len(v) != 2:
        raise ValueError(f"{what}: malformed value {v!r}")
    x = v[1]
    if tag == "t":
        if type(x) is not int or not 0 <= x < len(arrays):
            raise ValueError(f"{what}: no array {x!r} in the request ({len(arrays)} arrays)")
        return arrays[x]
    if tag == "i" and type(x) is int:
        return x
    if tag == "f" and type(x) in (int, float):
        return float(x)
    if tag == "b" and type(x) is bool:
        return x
    if tag == "T" and isinstance(x, list):
        return tuple(_unpack_value(e, arrays, f"{what}[{i}]", depth + 1) for i, e in enumerate(x))
    raise ValueError(f"{what}: malformed value {v!r}")


def _encode_result(x, ctx: OpContext, remote: bool, out: list, depth: int = 0):
    """The wire form of a VM result (the board's side); arrays sent back go to ``out``."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"the result nests tuples more than {_MAX_DEPTH} deep")
    if isinstance(x, NDArray):
        if remote:
            return ["r", ctx.put_array(x)]
        out.append(x)
        return ["t", len(out) - 1]
    if isinstance(x, np.ndarray):
        if remote:
            return ["r", ctx.put_array(x)]
        out.append(x)
        return ["t", len(out) - 1]
    if isinstance(x, tuple):
        return ["T", [_encode_result(e, ctx, remote, out, depth + 1) for e in x]]
    if isinstance(x, (bool, np.bool_)):
        return ["b", bool(x)]
    if isinstance(x, (int, np.integer)):
        return ["i", int(x)]
    if isinstance(x, (float, np.floating)):
        return ["f", float(x)]
    if x is None:
        return ["n"]
    raise TypeError(f"the result holds a {type(x).__name__}, which cannot be sent back")


def _decode_result(v, arrays: Sequence, session: Session):
    """A result from its wire form (the client's side)."""
    tag = v[0]
    if tag == "t":
        return arrays[v[1]]
    if tag == "r":
        return session.remote_array(v[1])
    if tag == "T":
        return tuple(_decode_result(e, arrays, session) for e in v[1])
    if tag == "n":
        return None
    return v[1]


# ---------------------------------------------------------------------------------------------
# the board half


def _vm_of(ctx: OpContext, args: dict) -> VirtualMachine:
    return ctx.get(args.get("vm"), VirtualMachine, "Relax virtual machine")


def _inputs(ctx: OpContext, args: dict, arrays: list) -> list:
    # Arrays sent with the request are read-only views of the frame: give the VM arrays of its
    # own (aligned, writable, not pinning the frame when a result aliases an input).
    arrays = [a if isinstance(a, NDArray) else np.array(a) for a in arrays]
    specs = args.get("inputs", [])
    if not isinstance(specs, list):
        raise ValueError(f"{ctx.op}: 'inputs' must be a list")
    return [_unpack_value(s, arrays, f"input {i}") for i, s in enumerate(specs)]


def _function_name(vm: VirtualMachine, args: dict) -> str:
    name = args.get("function")
    if not isinstance(name, str):
        raise ValueError(f"function name must be a string, got {name!r}")
    vm[name]  # raises the KeyError naming the functions there are
    return name


def _op_load_executable(ctx: OpContext, args: dict, arrays: list) -> dict:
    exe = load_executable(ctx.file_path(args.get("name")))
    vm = VirtualMachine(exe, ctx.device(args.get("device")))
    functions = {name: {"params": list(fn["params"])}
                 for name, fn in exe.program["functions"].items()}
    return {"handle": ctx.put(vm), "target": exe.target, "triple": exe.triple,
            "functions": functions, "kernels": exe.kernel_names}


def _op_vm_call(ctx: OpContext, args: dict, arrays: list):
    vm = _vm_of(ctx, args)
    name = _function_name(vm, args)
    outputs = args.get("outputs", "numpy")
    if outputs not in ("numpy", "remote"):
        raise ValueError(f"outputs must be 'numpy' or 'remote', got {outputs!r}")
    result = vm[name](*_inputs(ctx, args, arrays))
    out: list = []
    return {"result": _encode_result(result, ctx, outputs == "remote", out)}, out


def _timing_args(args: dict) -> tuple[int, int, float]:
    number, repeat = args.get("number", 10), args.get("repeat", 3)
    min_ms = args.get("min_repeat_ms", 0)
    if type(number) is not int or type(repeat) is not int or number < 1 or repeat < 1:
        raise ValueError(f"number and repeat must be positive integers, got {number!r}, "
                         f"{repeat!r}")
    if type(min_ms) not in (int, float) or min_ms < 0:
        raise ValueError(f"min_repeat_ms must be >= 0, got {min_ms!r}")
    return number, repeat, float(min_ms)


def _op_vm_time(ctx: OpContext, args: dict, arrays: list) -> dict:
    vm = _vm_of(ctx, args)
    name = _function_name(vm, args)
    number, repeat, min_ms = _timing_args(args)
    dev = ctx.device(args.get("device")) if args.get("device") is not None else vm.device
    timer = vm.time_evaluator(name, dev, number=number, repeat=repeat, min_repeat_ms=min_ms)
    return {"results": list(timer(*_inputs(ctx, args, arrays)).results)}


def _op_vm_profile(ctx: OpContext, args: dict, arrays: list) -> dict:
    vm = _vm_of(ctx, args)
    name = _function_name(vm, args)
    number = args.get("number", 1)
    if type(number) is not int or number < 1:
        raise ValueError(f"number must be a positive integer, got {number!r}")
    report = vm.profile(*_inputs(ctx, args, arrays), func_name=name, number=number)
    return {"func_name": report.func_name, "rows": report.rows, "total_ms": report.total_ms,
            "runs": report.runs}


for _name, _handler in zip(OPS, (_op_load_executable, _op_vm_call, _op_vm_time,
                                 _op_vm_profile)):
    register_op(_name, _handler)


# ---------------------------------------------------------------------------------------------
# the client half


def _device_spec(dev) -> list | None:
    if dev is None:
        return None
    if isinstance(dev, (RemoteDevice, Device)):
        return [dev.kind, dev.index]
    raise TypeError(f"expected a device (sess.cpu(0)), got {type(dev).__name__}")


def _call(session: Session, op: str, inputs, timeout, fname: str, **args):
    """``session.call_plugin`` with the inputs packed, board-side argument errors raised as
    ``RemoteVMArgumentError``."""
    arrays: list = []
    packed = [_pack_value(x, arrays, f"{fname}: argument {i}") for i, x in enumerate(inputs)]
    try:
        return session.call_plugin(op, arrays=arrays, timeout=timeout, inputs=packed, **args)
    except RemoteError as err:
        if err.remote_type != "VMArgumentError":
            raise
        message = str(err)
        if message.startswith("VMArgumentError: "):
            message = message[len("VMArgumentError: "):]
        raise RemoteVMArgumentError(message) from None


class RemoteVMFunction:
    """A function of a ``RemoteVirtualMachine``: ``vm["main"](*inputs)``."""

    def __init__(self, vm: "RemoteVirtualMachine", name: str):
        self.vm = vm
        self.name = name
        self.params = list(vm.functions[name]["params"])

    def __call__(self, *inputs, outputs: str | None = None, timeout: float | None = None):
        """Run the function on the board.

        ``inputs`` are numpy arrays (sent with the call), ``rpc.RemoteNDArray``\\ s of the
        session (passed by handle), numbers and tuples. Returns numpy arrays, or with
        ``outputs="remote"`` ``rpc.RemoteNDArray``\\ s that stay on the board (pass them to the
        next call without copying); a tuple result is a tuple.
        """
        outputs = outputs or self.vm.outputs
        if outputs not in ("numpy", "remote"):
            raise ValueError(f"outputs must be 'numpy' or 'remote', got {outputs!r}")
        vm = self.vm
        reply = _call(vm.session, "relax.vm_call", inputs, timeout, self.name, vm=vm.handle,
                      function=self.name, outputs=outputs)
        return _decode_result(reply.meta["result"], reply.arrays, vm.session)

    def __repr__(self):
        return f"<relax.RemoteVMFunction {self.name}({', '.join(self.params)})>"


class RemoteVirtualMachine:
    """A ``relax.VirtualMachine`` on a board, on an executable uploaded to the session.

    Parameters
    ----------
    session : rpc.Session
        A session on a server started with ``--plugin tilecraft.relax.rpc_plugin``.
    uploaded_name : str
        The executable's name in the session (``sess.upload("mlp.tcx")`` returns it).
    device : rpc.RemoteDevice, optional
        Where the VM runs on the board (the CPU by default).
    outputs : {"numpy", "remote"}
        What calls return by default: numpy arrays, or arrays kept on the board.

    Attributes
    ----------
    functions : dict
        The executable's functions, each ``{"params": [...]}``.
    target, triple : str
        What the kernels were compiled for.

    Examples
    --------
    >>> sess.upload(exe.export_library("mlp.tcx"))                       # doctest: +SKIP
    >>> vm = RemoteVirtualMachine(sess, "mlp.tcx")                      # doctest: +SKIP
    >>> vm["main"](np.random.rand(5, 16).astype("float32")).shape       # doctest: +SKIP
    (5, 32)
    >>> vm.time_evaluator("main", number=100)(x).mean                   # doctest: +SKIP
    3.1e-05
    """

    def __init__(self, session: Session, uploaded_name: str, device=None, *,
                 outputs: str = "numpy", timeout: float | None = None):
        if not isinstance(session, Session):
            raise TypeError(f"RemoteVirtualMachine takes an rpc.Session, got "
                            f"{type(session).__name__}")
        if outputs not in ("numpy", "remote"):
            raise ValueError(f"outputs must be 'numpy' or 'remote', got {outputs!r}")
        if session.plugins is not None and "relax.load_executable" not in session.plugins:
            raise ValueError(f"the server at {session.address[0]}:{session.address[1]} cannot "
                             f"run Relax executables: start it with --plugin "
                             f"tilecraft.relax.rpc_plugin")
        self.session = session
        self.name = uploaded_name
        self.outputs = outputs
        self.device = device
        meta = session.call_plugin("relax.load_executable", name=uploaded_name,
                                   device=_device_spec(device), timeout=timeout).meta
        self.handle = int(meta["handle"])
        self.functions: dict[str, dict] = meta["functions"]
        self.target = meta.get("target", "")
        self.triple = meta.get("triple")
        self.kernel_names = list(meta.get("kernels", []))

    @property
    def function_names(self) -> list[str]:
        return list(self.functions)

    def __contains__(self, name: str) -> bool:
        return name in self.functions

    def __getitem__(self, name: str) -> RemoteVMFunction:
        if name not in self.functions:
            raise KeyError(f"the executable {self.name!r} has no function {name!r}; it has "
                           f"{sorted(self.functions)}")
        return RemoteVMFunction(self, name)

    def invoke(self, name: str, *inputs):
        return self[name](*inputs)

    def time_evaluator(self, func_name: str, device=None, number: int = 10, repeat: int = 3,
                       min_repeat_ms: float = 0,
                       timeout: float | None = None) -> Callable[..., BenchmarkResult]:
        """A function that times ``func_name`` on the board's own clock, like
        ``VirtualMachine.time_evaluator``: it takes the function's inputs and returns a
        ``targets.BenchmarkResult`` (seconds per call). The network is not in the timings: the
        board runs the ``number x repeat`` calls itself (after one warm-up call).

        Examples
        --------
        >>> vm.time_evaluator("main", number=100, repeat=3)(x).median      # doctest: +SKIP
        """
        self[func_name]  # raises the KeyError
        if int(number) < 1 or int(repeat) < 1:
            raise ValueError(f"time_evaluator: number and repeat must be >= 1 (got {number}, "
                             f"{repeat})")
        spec = _device_spec(device)

        def evaluator(*inputs) -> BenchmarkResult:
            reply = _call(self.session, "relax.vm_time", inputs, timeout, func_name,
                          vm=self.handle, function=func_name, device=spec, number=int(number),
                          repeat=int(repeat), min_repeat_ms=float(min_repeat_ms))
            return BenchmarkResult(reply.meta["results"])

        return evaluator

    def profile(self, *inputs, func_name: str = "main", number: int = 1,
                timeout: float | None = None) -> ProfileReport:
        """``VirtualMachine.profile`` on the board: per-kernel times of ``number`` runs."""
        self[func_name]
        reply = _call(self.session, "relax.vm_profile", inputs, timeout, func_name,
                      vm=self.handle, function=func_name, number=int(number))
        m = reply.meta
        return ProfileReport(m["func_name"], m["rows"], m["total_ms"], m["runs"])

    def __del__(self):
        session = getattr(self, "session", None)
        handle = getattr(self, "handle", None)
        if session is not None and handle is not None:
            session.release(handle)  # the board drops the VM with the next request

    def __repr__(self):
        return (f"<relax.RemoteVirtualMachine {self.name!r} target={self.target!r} "
                f"functions={self.function_names} on {self.session!r}>")
