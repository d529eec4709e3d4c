"""What every frontend shares: the error raised for operators and attributes we cannot import."""
from __future__ import annotations

from typing import Iterable, Sequence

from tilecraft.errors import TilecraftError
from tilecraft.tensorir.function import IRModule

from ..expr import Function


class UnsupportedError(TilecraftError, NotImplementedError):
    """A model uses operators or attributes that the frontend cannot express in Relax.

    ``problems`` lists every unsupported use in the model (not only the first one), each a short
    line naming the node, its op type and the opset; the message holds them all.

    Examples
    --------
    >>> try:
    ...     relax.frontend.from_onnx(model)
    ... except relax.frontend.UnsupportedError as err:
    ...     for line in err.problems:
    ...         print(line)
    """

    def __init__(self, frontend: str, problems: Sequence[str],
                 constant_inputs: Sequence[str] = ()):
        self.frontend = frontend
        self.problems = list(problems)
        # graph inputs that would have to be constants (initializers) for the model to import
        self.constant_inputs = list(constant_inputs)
        count = len(self.problems)
        head = (f"{frontend}: the model uses {count} unsupported "
                f"{'operator' if count == 1 else 'operators'} or attributes:")
        super().__init__("\n  ".join([head] + self.problems))


def unique_in_order(items: Iterable[str]) -> list:
    """``items`` without repeats, first occurrence first."""
    seen = {}
    for item in items:
        seen.setdefault(item, None)
    return list(seen)


def detach_params(mod):
    """Take the weights that ``from_onnx(..., keep_params_in_input=True)`` attached to each
    function (the ``"params"`` attribute) out of the module.

    Returns ``(mod_without_params, {"main": [numpy arrays, in parameter order]})``; call the
    function with its inputs followed by those arrays.

    Examples
    --------
    >>> mod = relax.frontend.from_onnx(model, keep_params_in_input=True)   # doctest: +SKIP
    >>> mod, params = relax.frontend.detach_params(mod)                    # doctest: +SKIP
    >>> vm["main"](x, *params["main"])                                     # doctest: +SKIP
    """
    funcs, params = {}, {}
    for name, func in mod.functions.items():
        if isinstance(func, Function) and "params" in func.attr_dict:
            attrs = func.attr_dict
            params[name] = [c.data for c in attrs.pop("params")]
            func = func.replace(attrs=attrs)
        funcs[name] = func
    return IRModule(funcs), params
