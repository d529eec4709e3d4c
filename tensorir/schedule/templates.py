"""Kernel templates: whole-function schedules built directly, by name, as one trace instruction.

Some kernels are not a sequence of loop and block primitives but are written out whole by a
builder from a few parameters (the tensor-core GEMM of ``relax.backend.gpu.tensor_core``: its
fragment loads, ``mma`` calls and shared-memory staging are not the result of ``split`` /
``bind`` / ``cache_read``). A ``KernelTemplate`` names such a builder, ``build(func, target,
params) -> PrimFunc``; ``Schedule.apply_template(name, target, params)`` replaces the scheduled
function by what it builds and records the call in the trace (name, target string, params:
plain ints, strings and lists), so a trace that ends in it replays — like ``tensorize``'s
intrinsics, the builder is found by name in the registry, which the module that defines it
fills on import. The tuner makes templates' parameters decisions of a ``KnobSpace``
(``relax.tensor_core_space``).

Examples
--------
>>> from tilecraft.tensorir.schedule.templates import KernelTemplate
>>> KernelTemplate.register("scaled", lambda func, target, params: func,
...                         override=True)                         # doctest: +SKIP
>>> sch.apply_template("scaled", "opencl", {"factor": 2})          # doctest: +SKIP
"""
from __future__ import annotations

from typing import Callable

from ..expr import TIRError
from ..function import PrimFunc
from ..structural import structural_equal
from .error import ScheduleError
from .rv import traced

__all__ = ["KernelTemplate", "TemplatePrimitives"]


class KernelTemplate:
    """A named builder of a whole scheduled function: ``build(func, target, params)`` returns
    ``func`` (the unscheduled function) as a kernel for ``target`` (a target string) at
    ``params`` (a dict of plain values), with the same parameters, or raises ``ValueError``
    naming why it does not apply.

    Examples
    --------
    >>> KernelTemplate.register("identity", lambda f, t, p: f, override=True)  # doctest: +SKIP
    >>> KernelTemplate.get("identity").name                                  # doctest: +SKIP
    'identity'
    """

    _registry: dict[str, "KernelTemplate"] = {}

    def __init__(self, name: str, build: Callable[[PrimFunc, str, dict], PrimFunc]):
        self.name = name
        self.build = build

    def __repr__(self):
        return f"KernelTemplate({self.name!r})"

    @staticmethod
    def register(name: str, build: Callable[[PrimFunc, str, dict], PrimFunc],
                 override: bool = False) -> "KernelTemplate":
        """Register ``build`` under ``name`` (``override=True`` replaces an existing one)."""
        if not isinstance(name, str) or not name:
            raise TIRError(f"KernelTemplate.register: the name must be a non-empty string, got "
                           f"{name!r}")
        if not callable(build):
            raise TIRError(f"KernelTemplate.register: {name!r}: build must be callable")
        if name in KernelTemplate._registry and not override:
            raise TIRError(f"KernelTemplate.register: a template named {name!r} is already "
                           f"registered (override=True replaces it)")
        template = KernelTemplate(name, build)
        KernelTemplate._registry[name] = template
        return template

    @staticmethod
    def get(name: str) -> "KernelTemplate":
        """The template registered as ``name`` (``KeyError`` naming the known ones)."""
        try:
            return KernelTemplate._registry[name]
        except KeyError:
            raise KeyError(f"no kernel template {name!r} (registered: "
                           f"{sorted(KernelTemplate._registry)}; the module defining it "
                           f"registers it when imported)") from None


def _same_signature(a: PrimFunc, b: PrimFunc) -> bool:
    if len(a.params) != len(b.params):
        return False
    bufs_a, bufs_b = dict(a.buffer_map), dict(b.buffer_map)
    for pa, pb in zip(a.params, b.params):
        ba, bb = bufs_a.get(pa), bufs_b.get(pb)
        if (ba is None) != (bb is None) or pa.dtype != pb.dtype:
            return False
        if ba is not None and (ba.dtype != bb.dtype or len(ba.shape) != len(bb.shape) or
                               not all(structural_equal(x, y)
                                       for x, y in zip(ba.shape, bb.shape))):
            return False
    return True


class TemplatePrimitives:
    """The ``apply_template`` primitive (mixed into ``Schedule``)."""

    @traced
    def apply_template(self, name: str, target: str, params: dict) -> None:
        """Replace the scheduled function by kernel template ``name``'s build of it for
        ``target`` at ``params`` (see the module docstring). Apply it to the unscheduled
        function: the template builds the whole kernel from it.

        Parameters
        ----------
        name : str
            A name registered with ``KernelTemplate.register``.
        target : str
            The target the kernel is built for (its string form, recorded in the trace).
        params : dict
            The template's parameters: ints, strings and lists of them.

        Raises
        ------
        ScheduleError
            The template is unknown, does not apply to the function at ``params`` (its
            ``ValueError`` / ``TIRError``, e.g. a tile over the target's threads or shared
            memory), or returns a function with other parameters; the schedule is unchanged.

        Examples
        --------
        >>> sch = Schedule(fp16_dense)                                        # doctest: +SKIP
        >>> sch.apply_template("tensor_core_fp16", "opencl -device=nvidia",
        ...                    {"tile": [64, 64, 32, 32], "ldmatrix": 1})      # doctest: +SKIP
        """
        prim = "apply_template"
        if not isinstance(target, str) or not target:
            raise ScheduleError(prim, f"target must be a target string, got {target!r}")
        if not isinstance(params, dict):
            raise ScheduleError(prim, f"params must be a dict, got {type(params).__name__}")
        try:
            template = KernelTemplate.get(name)
        except KeyError as err:
            raise ScheduleError(prim, str(err.args[0])) from None
        try:
            out = template.build(self.func, target, dict(params))
        except (ValueError, TIRError) as err:
            raise ScheduleError(prim, f"template {name!r} at {params}: {err}") from None
        if not isinstance(out, PrimFunc):
            raise ScheduleError(prim, f"template {name!r} returned {type(out).__name__}, not a "
                                f"PrimFunc")
        if not _same_signature(self.func, out):
            raise ScheduleError(prim, f"template {name!r} returned a function with other "
                                f"parameters than the scheduled one")
        self._set_func(out)
