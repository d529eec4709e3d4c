"""Progress bars for long work: tqdm when it is installed and stderr is a terminal, else a plain
line per step (or nothing with ``quiet``)."""
from __future__ import annotations

import sys
import time


class Steps:
    """A bar over named steps: ``with Steps(3, "compile") as p: p.step("import"); ...``.

    Examples
    --------
    >>> with Steps(2, "demo", quiet=True) as p:
    ...     p.step("one"); p.step("two")
    """

    def __init__(self, total: int, desc: str, quiet: bool = False):
        self.total, self.desc, self.quiet = total, desc, quiet
        self._bar = None
        self._t0 = time.perf_counter()
        self._current = None
        if not quiet and sys.stderr.isatty():
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, desc=desc, unit="step", leave=False,
                                 bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed}")
            except ImportError:
                self._bar = None

    def step(self, what: str) -> None:
        """Finish the previous step and start ``what``."""
        if self._bar is not None:
            if self._current is not None:
                self._bar.update(1)
            self._bar.set_description_str(f"{self.desc}: {what}")
        elif not self.quiet:
            print(f"[{self.desc}] {what} ...", file=sys.stderr, flush=True)
        self._current = what

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            if self._current is not None and exc[0] is None:
                self._bar.update(1)
            self._bar.close()
        return False


def iterate(items, desc: str, quiet: bool = False):
    """``items`` with a tqdm bar when possible (and a plain line per item otherwise)."""
    items = list(items)
    if not quiet and sys.stderr.isatty():
        try:
            from tqdm import tqdm
            yield from tqdm(items, desc=desc, leave=False)
            return
        except ImportError:
            pass
    for i, item in enumerate(items):
        if not quiet:
            print(f"[{desc}] {i + 1}/{len(items)}: {item}", file=sys.stderr, flush=True)
        yield item
