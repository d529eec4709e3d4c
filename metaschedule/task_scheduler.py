"""Task schedulers: which task of a model gets the next batch of trials.

A model's end-to-end latency is ``sum(weight_i * latency_i)`` over its kernels (weight: how
often the kernel runs). ``GradientTaskScheduler`` (TVM's ``GradientBased``, after Ansor) spends
trials where they are expected to cut that sum the most: after a warm-up round in which every
task is tuned once, it picks the task with the largest

    weight * (alpha * backward + (1 - alpha) * forward)

where ``backward`` is how much the task's best latency fell per round over the last
``window_size`` rounds and ``forward = best / rounds`` the optimistic guess that latency keeps
falling like ``1 / rounds``. ``RoundRobin`` takes the tasks in turn.

``tune_tasks`` starts a task's history with its baseline's time (``Task.baseline``, measured
first) or, on a resumed run, the database's best: such a task needs no warm-up batch, and the
first trials go to the tasks with the largest ``weight * latency``.

Examples
--------
>>> sched = GradientTaskScheduler()
>>> hist = [[3.0, 2.0], [5.0, 4.9]]       # best latency after each round of two tasks
>>> sched.next_task(hist, weights=[1, 1], done=[False, False])
0
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["TaskScheduler", "RoundRobin", "GradientTaskScheduler", "make_task_scheduler"]


class TaskScheduler:
    """Picks the next task from each task's best-latency history (one entry per round)."""

    def next_task(self, history: Sequence[Sequence[float]], weights: Sequence[float],
                  done: Sequence[bool]) -> int | None:
        raise NotImplementedError


class RoundRobin(TaskScheduler):
    """Tasks in turn, skipping finished ones."""

    def __init__(self):
        self._next = 0

    def next_task(self, history, weights, done) -> int | None:
        n = len(done)
        for k in range(n):
            i = (self._next + k) % n
            if not done[i]:
                self._next = i + 1
                return i
        return None


class GradientTaskScheduler(TaskScheduler):
    """Trials where the weighted latency is expected to fall fastest (see the module
    docstring).

    Parameters
    ----------
    alpha : float
        Weight of the observed (backward) gradient against the optimistic forward one.
    window_size : int
        Rounds the backward gradient looks back.
    seed : int, optional
        Breaks ties.
    """

    def __init__(self, alpha: float = 0.2, window_size: int = 3, seed: int | None = None):
        self.alpha = float(alpha)
        self.window_size = int(window_size)
        self.rng = np.random.default_rng(seed)

    def next_task(self, history, weights, done) -> int | None:
        live = [i for i, d in enumerate(done) if not d]
        if not live:
            return None
        # warm-up: every task once, in order
        for i in live:
            if len(history[i]) == 0:
                return i
        grads = {}
        for i in live:
            h = [x for x in history[i]]
            best = h[-1]
            n = len(h)
            if not np.isfinite(best):       # nothing valid yet: a very promising task
                grads[i] = np.inf
                continue
            if n > self.window_size and np.isfinite(h[-1 - self.window_size]):
                backward = (h[-1 - self.window_size] - best) / self.window_size
            else:
                first = next((x for x in h if np.isfinite(x)), best)
                backward = (first - best) / max(n - 1, 1)
            forward = best / n
            grads[i] = float(weights[i]) * (self.alpha * backward + (1 - self.alpha) * forward)
        top = max(grads.values())
        ties = [i for i, g in grads.items() if g == top]
        return int(ties[0] if len(ties) == 1 else self.rng.choice(ties))


def make_task_scheduler(kind: "str | TaskScheduler", seed: int | None = None) -> TaskScheduler:
    """``"gradient"`` / ``"round-robin"`` or a TaskScheduler instance."""
    if isinstance(kind, TaskScheduler):
        return kind
    if kind == "gradient":
        return GradientTaskScheduler(seed=seed)
    if kind in ("round-robin", "round_robin"):
        return RoundRobin()
    raise ValueError(f"unknown task scheduler {kind!r}; use 'gradient' or 'round-robin'")
