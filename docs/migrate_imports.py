#!/usr/bin/env python3
"""Rewrite imports of tilecraft's packages to the ``tilecraft`` namespace (see docs/migration.md).

Until version 0.2, tilecraft installed its packages at the top level of site-packages
(``import relax``, ``from tensorir import te``); they now live in one namespace
(``from tilecraft import relax``, ``from tilecraft.tensorir import te``). This script made that
change in tilecraft itself and makes it in your code::

    python docs/migrate_imports.py my_project/          # rewrites .py and .md files in place
    python docs/migrate_imports.py --check my_project/  # lists what it would change, exit 1 if any

It rewrites, line by line (so import lines inside docstrings, doctests, strings of generated
code and Markdown code blocks are rewritten too):

====================================  ===================================================
``import relax``                      ``from tilecraft import relax``
``import relax as rx``                ``from tilecraft import relax as rx``
``import relax.frontend``             ``from tilecraft import relax`` and
                                      ``import tilecraft.relax.frontend``
``import rpc.client as c``            ``from tilecraft.rpc import client as c``
``from tensorir.expr import Var``     ``from tilecraft.tensorir.expr import Var``
``python -m rpc.server``              ``python -m tilecraft.rpc.server``
====================================  ===================================================

Anything else that names a module (``importlib.import_module("relax.x")``, a plugin name given
to ``tilecraft rpc server --plugin``) it leaves for you to change by hand.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

PACKAGES = ("tensorir", "targets", "rpc", "metaschedule", "relax")
_PKG = "|".join(PACKAGES)
# An optional doctest prompt, then the statement.
_PROMPT = r"(?P<indent>\s*(?:(?:>>>|\.\.\.) )?\s*)"
FROM_RE = re.compile(_PROMPT + rf"from (?P<mod>(?:{_PKG})(?:\.\w+)*) import ")
IMPORT_RE = re.compile(_PROMPT + rf"import (?P<mod>(?:{_PKG})(?:\.\w+)*)"
                       r"(?: as (?P<alias>\w+))?(?P<rest>\s*(?:#.*)?)$")
RUN_RE = re.compile(rf"(-m[\s'\",]+)(?P<mod>(?:{_PKG})\.\w+)")


def rewrite_line(line: str) -> str:
    """One line with its tilecraft imports moved into the namespace (unchanged otherwise)."""
    body = line.rstrip("\n")
    newline = line[len(body):]
    m = FROM_RE.match(body)
    if m:
        return f"{m['indent']}from tilecraft.{m['mod']} import {body[m.end():]}{newline}"
    m = IMPORT_RE.match(body)
    if m:
        ind, mod, alias, rest = m["indent"], m["mod"], m["alias"], m["rest"]
        top, _, sub = mod.partition(".")
        if alias:
            if sub:
                parent, _, leaf = mod.rpartition(".")
                return f"{ind}from tilecraft.{parent} import {leaf} as {alias}{rest}{newline}"
            return f"{ind}from tilecraft import {top} as {alias}{rest}{newline}"
        if not sub:
            return f"{ind}from tilecraft import {top}{rest}{newline}"
        # `import relax.frontend` binds `relax` and loads the submodule: keep both effects.
        cont = ind.replace(">>>", "...")
        return f"{ind}from tilecraft import {top}{rest}\n{cont}import tilecraft.{mod}{newline}"
    return RUN_RE.sub(lambda r: f"{r.group(1)}tilecraft.{r['mod']}", line)


def rewrite_text(text: str) -> str:
    return "".join(rewrite_line(line) for line in text.splitlines(keepends=True))


def files(paths: list[str]):
    for path in paths:
        if os.path.isfile(path):
            yield path
            continue
        for dirpath, dirnames, names in os.walk(path):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
            for name in names:
                if name.endswith((".py", ".md")):
                    yield os.path.join(dirpath, name)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("paths", nargs="+", help="files or folders (.py and .md files are read)")
    p.add_argument("--check", action="store_true", help="only list the files that would change")
    args = p.parse_args(argv)
    changed = []
    for path in files(args.paths):
        with open(path, encoding="utf-8") as f:
            old = f.read()
        new = rewrite_text(old)
        if new != old:
            changed.append(path)
            if not args.check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
    for path in changed:
        print(("would rewrite " if args.check else "rewrote ") + path)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
