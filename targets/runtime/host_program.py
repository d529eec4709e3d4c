"""The launch path shared by the GPU back ends: argument binding, host programs, kernel errors.

A GPU function (OpenCL or WebGPU) is a *host program* — checks over the symbolic dims, device
temporaries, kernel launches whose geometry is an expression of the dims — plus kernels. Both
back ends translate their (JSON) host program into the normal form below once per function, and
``HostPlan`` compiles it into a flat list of Python closures: constant expressions folded,
constant launch geometry computed once, temporaries and kernel error words cached per device. A
call then does little more than bind the arguments and call the back end's launcher per kernel.

Normal form (tuples)::

    ("seq", [stmt, ...])
    ("let", name, expr, body)                 ("assert", cond, message, body)
    ("if", cond, then, else_or_None)          ("for", name, min, extent, body)
    ("alloc", slot, dtype, size, name, body)  (a device temporary of ``size`` elements)
    ("launch", key, [slot, ...], [(expr, type), ...], [grid x, y, z])

Slots index the call's buffer table: the buffer parameters first (in order), then temporaries;
``ERROR_SLOT`` stands for the kernel's error word. Scalar types are ``"i32"``, ``"u32"`` or
``"f32"``; expressions are ``targets.gpu_build``'s JSON (an int, ``["var", n]``, ``[op, a, b]``,
``["not", a]``, ``["select", c, t, f]``).

**Kernel errors.** A run-time check that stays inside a kernel (a gather's indices) writes a
code into the kernel's error word, which is zero otherwise. Nothing is read back at the launch:
the word is noted in the device's ``KernelErrorLog`` and read at the next check — the end of a
direct call of a function with such checks, the end of a VM function call, ``Device.sync()`` —
all pending words in one round trip, raising ``DeviceKernelError`` with the message of the first
failed check in launch order (naming the function and kernel). Words that were set are cleared.

A back end's per-device object (``loaded``) provides::

    launcher(key) -> launch(arrays, scalars, grid, sink, memo)   # arrays: slot objects
                                             # (.buffer); memo: a dict per call site or None
    alloc_temp(dtype, size, what) -> array-like              # cached here by (slot, size)
    alloc_error_word(key) -> array-like                      # one int32, zero
    errors: KernelErrorLog

This module needs only numpy (it runs on the board side of ``rpc`` too).

Examples
--------
>>> f = compile_expr(["floordiv", ["add", ["var", "n"], 63], 64])
>>> f({"n": 100})
2
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any, Callable, Sequence

import numpy as np

from tilecraft.errors import TilecraftError

from .device import Device
from .ndarray import NDArray

INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1
UINT32_MAX = 2 ** 32 - 1
ERROR_SLOT = -1


class DeviceKernelError(TilecraftError, ValueError):
    """A run-time check inside a kernel failed (an index out of bounds, ...)."""


class DeviceArgumentError(TilecraftError, ValueError, TypeError):
    """Arguments that do not match a GPU function: count, kind, device, dtype, rank, a
    dimension. A ``ValueError`` (and a ``TypeError``, for a wrong count or kind)."""


# ---------------------------------------------------------------------------------------------
# expressions


def _floordiv(a, b):
    if b == 0:
        raise ValueError("division by zero in a shape expression")
    return a // b


def _floormod(a, b):
    if b == 0:
        raise ValueError("division by zero in a shape expression")
    return a % b


def _truncdiv(a, b):
    if b == 0:
        raise ValueError("division by zero in a shape expression")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _truncmod(a, b):
    return a - _truncdiv(a, b) * b


_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "floordiv": _floordiv, "floormod": _floormod, "div": _truncdiv, "mod": _truncmod,
        "min": min, "max": max, "eq": lambda a, b: int(a == b), "ne": lambda a, b: int(a != b),
        "lt": lambda a, b: int(a < b), "le": lambda a, b: int(a <= b),
        "gt": lambda a, b: int(a > b), "ge": lambda a, b: int(a >= b),
        "and": lambda a, b: int(bool(a) and bool(b)), "or": lambda a, b: int(bool(a) or bool(b))}


def is_const(e) -> bool:
    """Whether a JSON expression has no variables."""
    if isinstance(e, (bool, int, float)):
        return True
    if e[0] == "var":
        return False
    return all(is_const(x) for x in e[1:])


def eval_expr(e, env: dict) -> int:
    """Evaluate a JSON expression with the variables' values in ``env``.

    Examples
    --------
    >>> eval_expr(["mul", ["var", "n"], 4], {"n": 3})
    12
    """
    if isinstance(e, bool):
        return int(e)
    if isinstance(e, (int, float)):
        return e
    op = e[0]
    if op == "var":
        try:
            return env[e[1]]
        except KeyError:
            raise ValueError(f"host program: variable {e[1]} is not bound") from None
    if op == "not":
        return int(not eval_expr(e[1], env))
    if op == "select":
        return eval_expr(e[2], env) if eval_expr(e[1], env) else eval_expr(e[3], env)
    fn = _OPS.get(op)
    if fn is None:
        raise ValueError(f"host program: unknown operator {op!r}")
    return fn(eval_expr(e[1], env), eval_expr(e[2], env))


def compile_expr(e) -> Callable[[dict], Any]:
    """A closure ``env -> value`` for a JSON expression (constants folded)."""
    if is_const(e):
        value = eval_expr(e, {})
        return lambda env: value
    op = e[0]
    if op == "var":
        name = e[1]

        def var(env):
            try:
                return env[name]
            except KeyError:
                raise ValueError(f"host program: variable {name} is not bound") from None
        return var
    if op == "not":
        a = compile_expr(e[1])
        return lambda env: int(not a(env))
    if op == "select":
        c, t, f = (compile_expr(x) for x in e[1:])
        return lambda env: t(env) if c(env) else f(env)
    fn = _OPS.get(op)
    if fn is None:
        raise ValueError(f"host program: unknown operator {op!r}")
    a, b = compile_expr(e[1]), compile_expr(e[2])
    if isinstance(e[2], int) and op in ("add", "sub", "mul"):
        k = e[2]     # the common "n * 64", "n + 63": one closure call fewer
        if op == "add":
            return lambda env: a(env) + k
        if op == "sub":
            return lambda env: a(env) - k
        return lambda env: a(env) * k
    return lambda env: fn(a(env), b(env))


def expr_text(e) -> str:
    """Readable text of a JSON expression (for messages)."""
    if isinstance(e, (bool, int, float)):
        return str(e)
    if e[0] == "var":
        return e[1]
    sym = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "floormod": "%"}.get(e[0])
    if sym and len(e) == 3:
        return f"{expr_text(e[1])} {sym} {expr_text(e[2])}"
    return f"{e[0]}({', '.join(expr_text(x) for x in e[1:])})"


# ---------------------------------------------------------------------------------------------
# kernel errors


class KernelErrorLog:
    """The error words of kernels launched on one device since the last check.

    ``read_words(words) -> list[int]`` (the back end: waits for the queue once and reads all)
    and ``clear_word(word)`` come from the back end.
    """

    def __init__(self, read_words: Callable[[list], list], clear_word: Callable[[Any], None]):
        self._read = read_words
        self._clear = clear_word
        self._pending: dict[int, tuple] = {}   # id(word) -> (word, messages, function, kernel)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def note(self, word, messages: Sequence[str], function: str, kernel: str) -> None:
        """A kernel that reports through ``word`` was launched (first launch order kept)."""
        if id(word) not in self._pending:
            self._pending[id(word)] = (word, messages, function, kernel)

    def discard(self) -> None:
        """Forget the pending words without reading them (their kernels may still set them)."""
        self._pending.clear()

    def check(self) -> None:
        """Read every pending word (one wait); raise ``DeviceKernelError`` for the first set."""
        if not self._pending:
            return
        entries = list(self._pending.values())
        self._pending.clear()
        codes = self._read([e[0] for e in entries])
        failed = None
        for (word, messages, function, kernel), code in zip(entries, codes):
            if code:
                self._clear(word)
                if failed is None:
                    msg = messages[code - 1] if 0 < code <= len(messages) else \
                        f"error code {code}"
                    failed = f"{function}: kernel {kernel}: {msg}"
        if failed is not None:
            raise DeviceKernelError(failed)


# ---------------------------------------------------------------------------------------------
# parameters and argument binding


class ParamSpec:
    """One parameter of a GPU function: a buffer (dtype, shape as JSON expressions) or a
    scalar (dtype)."""

    __slots__ = ("name", "kind", "dtype", "shape", "shape_text", "written")

    def __init__(self, name: str, kind: str, dtype: str, shape: Sequence = (),
                 shape_text: Sequence | None = None, written: bool = False):
        self.name, self.kind, self.dtype = name, kind, dtype
        self.shape = list(shape)
        if shape_text is None:
            shape_text = [d if isinstance(d, int) else expr_text(d) for d in self.shape]
        self.shape_text = [t if isinstance(t, (int, str)) else str(t) for t in shape_text]
        self.written = bool(written)


def _refs(args) -> tuple:
    """What identifies ``args`` without keeping them alive: weak references to arrays,
    scalars by value."""
    return tuple(weakref.ref(a) if isinstance(a, NDArray) else (type(a), a) for a in args)


def _same(refs: tuple, args) -> bool:
    for r, a in zip(refs, args):
        if type(r) is tuple:
            if r[0] is not type(a) or r[1] != a:
                return False
        elif r() is not a:
            return False
    return True


def _int_range(dtype: str) -> tuple[int, int]:
    if dtype == "bool":
        return 0, 1
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


class HostPlan:
    """A GPU function's host program, compiled once: ``bind`` checks a call's arguments,
    ``run`` executes the program with a back end's per-device launchers.

    Parameters
    ----------
    name : str
        The function's name (messages start with it).
    params : list[ParamSpec]
    body : the host program in normal form (module docstring)
    kernels : dict
        ``key -> {"name": str, "error_messages": [...]}`` for every launched kernel.
    device_kind : str
        ``"opencl"`` / ``"webgpu"``: the arrays' device kind.
    float_scalars : bool
        Whether float scalar parameters are allowed (WebGPU's uniforms; not OpenCL).

    Examples
    --------
    >>> n = ["var", "n"]
    >>> plan = HostPlan("main", [ParamSpec("A", "buffer", "float32", [n]),
    ...                          ParamSpec("B", "buffer", "float32", [n], written=True)],
    ...                 ("launch", "k0", [0, 1], [(n, "i32")],
    ...                  [["floordiv", ["add", n, 63], 64], 1, 1]),
    ...                 {"k0": {"name": "main_kernel0", "error_messages": []}}, "opencl")
    >>> device, arrays, env = plan.bind([a, b])            # doctest: +SKIP
    >>> plan.run(loaded, arrays, env, None)                # doctest: +SKIP
    """

    def __init__(self, name: str, params: Sequence[ParamSpec], body, kernels: dict,
                 device_kind: str, float_scalars: bool = False):
        self.name = name
        self.params = list(params)
        self.kernels = kernels
        self.device_kind = device_kind
        self.float_scalars = float_scalars
        self.body = body
        self.has_kernel_checks = any(k["error_messages"] for k in kernels.values())
        self._bound: dict[int, tuple] = {}     # id(loaded) -> (loaded, steps, state)
        # bind_cached's sites: ids of the arguments -> (their weak refs, device, env, memo)
        self._sites: "OrderedDict[tuple, tuple]" = OrderedDict()
        self._compile_binding()
        self._ntemps = self._count_temps()

    def __repr__(self):
        return f"<HostPlan {self.name}({', '.join(p.name for p in self.params)})>"

    # -- arguments ----------------------------------------------------------------------------
    def _compile_binding(self) -> None:
        binds, checks, bound = [], [], set()
        for p in self.params:
            if p.kind == "scalar":
                bound.add(p.name)
        bi = 0
        for p in self.params:
            if p.kind != "buffer":
                continue
            for d, w in enumerate(p.shape):
                if isinstance(w, list) and w[0] == "var" and w[1] not in bound:
                    bound.add(w[1])
                    binds.append((bi, d, w[1]))
                else:
                    checks.append((bi, d, p, compile_expr(w), isinstance(w, int)))
            bi += 1
        self._binds, self._checks = binds, checks
        self._buffer_params = [p for p in self.params if p.kind == "buffer"]
        self._buffer_positions = [i for i, p in enumerate(self.params) if p.kind == "buffer"]

    def bind(self, args: Sequence[Any]) -> tuple[Device, list, dict]:
        """Check ``args``: the device, the buffer parameters' arrays, the variables' values."""
        name, kind = self.name, self.device_kind
        params = self.params
        if len(args) != len(params):
            raise DeviceArgumentError(f"{name} takes {len(params)} argument(s) "
                                      f"({', '.join(p.name for p in params)}), got {len(args)}")
        device = None
        arrays = []
        env: dict[str, Any] = {}
        keys: dict[int, ParamSpec] = {}
        for p, a in zip(params, args):
            if p.kind == "buffer":
                if not isinstance(a, NDArray) or a.device.kind != kind:
                    if isinstance(a, np.ndarray) or (isinstance(a, NDArray) and
                                                     a.device.kind == "cpu"):
                        raise DeviceArgumentError(
                            f"{name}: argument {p.name} is in host memory "
                            f"({type(a).__name__}); this kernel runs on {kind}: copy it there "
                            f"first with targets.array(x, targets.{kind}(i))")
                    where = f"lives on {a.device}" if isinstance(a, NDArray) else \
                        f"is a {type(a).__name__}"
                    raise DeviceArgumentError(f"{name}: argument {p.name} {where}; it must be "
                                              f"an array on a {kind} device")
                if device is None:
                    device = a.device
                elif a.device != device:
                    raise DeviceArgumentError(f"{name}: argument {p.name} is on {a.device}, "
                                              f"the others on {device}")
                if a.dtype != p.dtype:
                    raise DeviceArgumentError(f"{name}: argument {p.name} has dtype {a.dtype}, "
                                              f"expected {p.dtype}")
                shape = a.shape
                if len(shape) != len(p.shape):
                    raise DeviceArgumentError(
                        f"{name}: argument {p.name} has rank {len(shape)} (shape {shape}), "
                        f"expected rank {len(p.shape)} {tuple(p.shape_text)}")
                if a.size > INT32_MAX:
                    raise DeviceArgumentError(
                        f"{name}: argument {p.name} has {a.size} elements; {kind} kernels "
                        f"index with 32-bit integers (at most {INT32_MAX})")
                key = id(a._buffer)
                other = keys.get(key)
                if other is not None and (p.written or other.written):
                    raise DeviceArgumentError(f"{name}: arguments {other.name} and {p.name} are "
                                              f"the same array, and one of them is written; "
                                              f"pass a copy")
                keys[key] = p
                arrays.append(a)
            else:
                env[p.name] = self._scalar(p, a)
        for bi, d, var in self._binds:
            env[var] = arrays[bi].shape[d]
        for bi, d, p, want, const in self._checks:
            n = arrays[bi].shape[d]
            w = want(env)
            if n != w:
                shape = arrays[bi].shape
                raise DeviceArgumentError(
                    f"{name}: argument {p.name}: dimension {d} is {n}, expected "
                    f"{p.shape_text[d]}{'' if const else f' = {w}'} (shape {tuple(shape)}, "
                    f"expected {tuple(p.shape_text)})")
        if device is None:
            device = Device(kind, 0)
        return device, arrays, env

    SITE_CACHE = 64

    def bind_cached(self, args: Sequence[Any]) -> tuple[Device, list, dict, dict]:
        """``bind``, skipping the checks when ``args`` are the very objects of an earlier
        ``bind_cached`` (the GPU VM passes the same planned tensors at a call site on every
        call; a device array's shape, dtype and device never change). Returns ``bind``'s
        result and a *memo*: a dict the launchers keep per-site state in (a kernel object
        with its arguments set, a dispatch), passed to ``run``.

        Arrays are remembered by weak reference: a site whose arrays are gone is a miss, and
        the cache holds no array alive. The last ``SITE_CACHE`` sites are kept."""
        key = tuple([id(a) for a in args])
        sites = self._sites
        hit = sites.get(key)
        if hit is not None:
            refs, device, env, memo = hit
            if _same(refs, args):
                sites.move_to_end(key)
                return device, [args[i] for i in self._buffer_positions], dict(env), memo
            del sites[key]       # other objects at the addresses of dead ones
        device, arrays, env = self.bind(args)
        memo: dict = {}
        sites[key] = (_refs(args), device, dict(env), memo)
        if len(sites) > self.SITE_CACHE:
            sites.popitem(last=False)
        return device, arrays, env, memo

    def _scalar(self, p: ParamSpec, a) -> Any:
        if isinstance(a, np.ndarray) and a.ndim == 0:
            a = a[()]
        if p.dtype.startswith("float"):
            if not self.float_scalars:
                raise DeviceArgumentError(f"{self.name}: float scalar parameters are not "
                                          f"supported on {self.device_kind}")
            if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, float, np.integer,
                                                                     np.floating)):
                raise DeviceArgumentError(f"{self.name}: argument {p.name} must be a number "
                                          f"({p.dtype}), got {type(a).__name__}")
            return float(a)
        if not isinstance(a, (int, np.integer, bool, np.bool_)):
            raise DeviceArgumentError(f"{self.name}: argument {p.name} must be an integer "
                                      f"({p.dtype}), got {type(a).__name__} {a!r}")
        lo, hi = _int_range(p.dtype)
        if not lo <= int(a) <= hi:
            raise DeviceArgumentError(f"{self.name}: argument {p.name} = {int(a)} does not fit "
                                      f"in {p.dtype} [{lo}, {hi}]")
        return int(a)

    # -- running ------------------------------------------------------------------------------
    def run(self, loaded, arrays: list, env: dict, sink, memo: dict | None = None) -> None:
        """Execute the host program: checks, temporaries, launches through ``loaded``'s
        launchers; ``sink`` is passed to every launch (events, a command list), and so is
        ``memo`` (``bind_cached``'s per-site dict, or None)."""
        hit = self._bound.get(id(loaded))
        if hit is None or hit[0] is not loaded:
            state = {"temps": {}, "errors": {}}
            hit = self._bound[id(loaded)] = (loaded, self._compile(self.body, loaded, state),
                                             state)
        table = arrays + [None] * self._ntemps
        for step in hit[1]:
            step(env, table, sink, memo)

    def _count_temps(self) -> int:
        """How many temporary slots follow the buffer parameters in the table."""
        slots = []

        def walk(s):
            if s is None:
                return
            if s[0] == "seq":
                for c in s[1]:
                    walk(c)
            elif s[0] == "alloc":
                slots.append(s[1])
                walk(s[5])
            elif s[0] in ("let", "assert"):
                walk(s[3])
            elif s[0] == "if":
                walk(s[2])
                walk(s[3])
            elif s[0] == "for":
                walk(s[4])
        walk(self.body)
        nbuf = len(self._buffer_params)
        return max([s + 1 for s in slots] + [nbuf]) - nbuf

    def _compile(self, s, loaded, state) -> list:
        """``s`` as a flat list of steps ``step(env, table, sink, memo)``."""
        if s is None:
            return []
        head = s[0]
        name = self.name
        if head == "seq":
            return [st for c in s[1] for st in self._compile(c, loaded, state)]
        if head == "let":
            var, f = s[1], compile_expr(s[2])

            def let(env, table, sink, memo):
                env[var] = f(env)
            return [let] + self._compile(s[3], loaded, state)
        if head == "assert":
            cond, message = compile_expr(s[1]), s[2]

            def check(env, table, sink, memo):
                if not cond(env):
                    raise ValueError(f"{name}: {message}")
            return [check] + self._compile(s[3], loaded, state)
        if head == "if":
            cond = compile_expr(s[1])
            then = tuple(self._compile(s[2], loaded, state))
            other = tuple(self._compile(s[3], loaded, state))

            def if_(env, table, sink, memo):
                for st in (then if cond(env) else other):
                    st(env, table, sink, memo)
            return [if_]
        if head == "for":
            var, lo, ext = s[1], compile_expr(s[2]), compile_expr(s[3])
            body = tuple(self._compile(s[4], loaded, state))

            def for_(env, table, sink, memo):
                start = lo(env)
                for i in range(start, start + ext(env)):
                    env[var] = i
                    for st in body:
                        st(env, table, sink, memo)
            return [for_]
        if head == "alloc":
            return [self._alloc_step(s, loaded, state)] + self._compile(s[5], loaded, state)
        if head == "launch":
            return [self._launch_step(s, loaded, state)]
        if head == "nop":
            return []
        raise ValueError(f"{name}: unknown host-program statement {head!r}")

    def _alloc_step(self, s, loaded, state):
        _, slot, dtype, size, tname, _ = s
        size_fn = compile_expr(size)
        temps, name = state["temps"], self.name

        def alloc(env, table, sink, memo):
            n = max(int(size_fn(env)), 0)
            if n > INT32_MAX:
                raise ValueError(f"{name}: the temporary {tname} needs {n} elements, over the "
                                 f"32-bit indexing limit")
            buf = temps.get((slot, n))
            if buf is None:
                # reused by later calls: the device's queue runs them in order
                buf = temps[(slot, n)] = loaded.alloc_temp(dtype, n, f"temporary {tname} of "
                                                                     f"{name}")
            table[slot] = buf
        return alloc

    def _launch_step(self, s, loaded, state):
        _, key, slots, scalars, grid = s
        meta = self.kernels[key]
        kname, messages = meta["name"], list(meta["error_messages"])
        launch = loaded.launcher(key)
        fname = self.name
        word = None
        if ERROR_SLOT in slots:
            word = state["errors"].get(key)
            if word is None:
                word = state["errors"][key] = loaded.alloc_error_word(key)
        log = loaded.errors
        slot_list = tuple(slots)

        scalar_fns = [(compile_expr(e), t, e) for e, t in scalars]
        const_scalars = all(is_const(e) for e, _ in scalars)
        grid_fns = [compile_expr(g) for g in grid]
        const_grid = all(is_const(g) for g in grid)

        def scalar_values(env):
            out = []
            for f, t, e in scalar_fns:
                v = f(env)
                if t == "f32":
                    out.append(float(v))
                    continue
                v = int(v)
                lo, hi = (0, UINT32_MAX) if t == "u32" else (INT32_MIN, INT32_MAX)
                if not lo <= v <= hi:
                    raise ValueError(f"{fname}: kernel {kname}: the value {v} of "
                                     f"{expr_text(e)} does not fit the kernel's 32-bit scalar "
                                     f"({t})")
                out.append(v)
            return out

        fixed_scalars = scalar_values({}) if const_scalars else None
        site = object()      # this launch's key in a call site's memo
        fixed_grid = tuple(int(f({})) for f in grid_fns) if const_grid else None
        if fixed_grid is not None and min(fixed_grid) <= 0:
            return lambda env, table, sink, memo: None       # an empty grid launches nothing

        def step(env, table, sink, memo):
            g = fixed_grid
            if g is None:
                g = (int(grid_fns[0](env)), int(grid_fns[1](env)), int(grid_fns[2](env)))
                if g[0] <= 0 or g[1] <= 0 or g[2] <= 0:
                    return          # nothing to do (an empty dimension)
            arrays = [table[i] if i >= 0 else word for i in slot_list]
            if word is not None:
                log.note(word, messages, fname, kname)
            launch(arrays, fixed_scalars if fixed_scalars is not None else
                   scalar_values(env), g, sink, None if memo is None else
                   memo.setdefault(site, {}))
        return step


__all__ = ["DeviceArgumentError", "DeviceKernelError", "ERROR_SLOT", "HostPlan",
           "KernelErrorLog", "ParamSpec", "compile_expr", "eval_expr", "expr_text", "is_const"]
