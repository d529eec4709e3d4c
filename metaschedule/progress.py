"""Live progress of a tuning run: one line per task — trials done / total, best GFLOP/s, ETA.

With ``tqdm`` installed and a terminal on stderr, every task gets a bar that updates in place;
otherwise a plain line is printed after each batch. ``format_line`` gives the text of a
line (also written to ``tune.log``).
"""
from __future__ import annotations

import sys
import time

__all__ = ["Progress", "format_line", "format_eta"]


def format_eta(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def format_line(name: str, done: int, total: int, best_secs: float | None, flop: float,
                eta: float | None) -> str:
    """``"matmul: 64/256 trials  best 0.512 ms  120.3 GFLOP/s  ETA 1m05s"``."""
    if best_secs is None or best_secs == float("inf"):
        best = "best -"
    else:
        best = f"best {best_secs * 1e3:.4g} ms"
        if flop > 0:
            best += f"  {flop / best_secs / 1e9:.4g} GFLOP/s"
    return f"{name}: {done}/{total} trials  {best}  ETA {format_eta(eta)}"


class Progress:
    """Progress display of the tasks of a tuning run.

    Parameters
    ----------
    names, totals, flops : one per task.
    enabled : bool
        False: nothing is shown.
    stream : file, optional
        Where plain lines go (stderr).
    """

    def __init__(self, names, totals, flops, enabled: bool = True, stream=None):
        self.names, self.totals, self.flops = list(names), list(totals), list(flops)
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.start = time.time()
        self.bars = None
        if enabled and _isatty(self.stream):
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                width = max(len(n) for n in self.names) if self.names else 8
                self.bars = [tqdm(total=t, desc=n.ljust(width), position=i, leave=True,
                                  unit="trial", file=self.stream, dynamic_ncols=True)
                             for i, (n, t) in enumerate(zip(self.names, self.totals))]

    def update(self, task: int, done: int, best_secs: float | None, total_done: int,
               total_trials: int) -> str:
        """Show task ``task``'s state; returns the line (for the log)."""
        elapsed = time.time() - self.start
        eta = elapsed / total_done * (total_trials - total_done) if total_done else None
        line = format_line(self.names[task], done, self.totals[task], best_secs,
                           self.flops[task], eta)
        if not self.enabled:
            return line
        if self.bars is not None:
            bar = self.bars[task]
            bar.n = min(done, bar.total)
            if best_secs is not None and best_secs != float("inf"):
                post = f"{best_secs * 1e3:.4g} ms"
                if self.flops[task] > 0:
                    post += f", {self.flops[task] / best_secs / 1e9:.4g} GFLOP/s"
                bar.set_postfix_str(f"best {post}, ETA {format_eta(eta)}", refresh=False)
            bar.refresh()
        else:
            print(line, file=self.stream, flush=True)
        return line

    def close(self) -> None:
        if self.bars is not None:
            for b in self.bars:
                b.close()
            self.bars = None


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
