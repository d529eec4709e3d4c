"""Packaging: the repository's top-level folders install as one ``tilecraft`` namespace.

``relax/`` becomes ``tilecraft.relax``, ``tensorir/`` ``tilecraft.tensorir``, and so on; nothing
else goes to the top level of site-packages. Everything else (metadata, dependencies, extras,
the console script) is in pyproject.toml.
"""
from setuptools import find_packages, setup

LAYERS = ("tensorir", "targets", "rpc", "metaschedule", "relax")


def packages() -> list[str]:
    out = ["tilecraft"] + [f"tilecraft.{p}" for p in find_packages("tilecraft")]
    for layer in LAYERS:
        out += [f"tilecraft.{layer}"] + [f"tilecraft.{layer}.{p}" for p in find_packages(layer)]
    return out


setup(packages=packages(),
      package_dir={"tilecraft": "tilecraft", **{f"tilecraft.{layer}": layer for layer in LAYERS}})
