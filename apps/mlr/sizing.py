"""``size_by_speed``: each executor's mini-batches per task in proportion to its speed, as LB-BSP sizes work
(``x_i = v_i / sum(v) * X``), so that under bulk synchronous iterations a slow worker's executors finish with
the others instead of holding every iteration up.

Why mini-batches per task and not rows per mini-batch: a step then stays what it is without the option (the
mean gradient of ``batch_size`` rows, the same ``lr``), and an iteration still takes ``executors x
batches_per_task`` steps in all; only who takes them changes. Each executor walks its own mini-batches in passes
shuffled as the epochs are without the option, carrying on where its last task stopped, so a slow executor's rows
are still all visited, less often.

The speed is ``Driver.executor_speed``, in tasks per second; a task's size changes with its share, so the rate in
mini-batches per second is that speed times the mini-batches its recent tasks held. The master smooths the speeds
over a few seconds, so that is the share in effect over those seconds (``effective``, an average that follows the
dispatched share as slowly), not the latest one: with the latest, a share just cut would look slower still and be
cut again. A resize moves the shares half way to the measured ones, at most once a second.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

RESIZE_S = 1.0  # shares are recomputed at most this often: the master's speeds move about as slowly
DAMPING = 0.5  # a resize moves the shares this far towards the measured rates
FOLLOW = 0.4  # per resize, how far the share the measured speeds reflect moves towards the dispatched one
MIN_SHARE = 0.1  # of the even share: a slow executor keeps running some steps, so it is still measured


class SpeedSizing:
    """Shares of each iteration's ``per_iteration`` mini-batches per executor, and where each executor's next task
    starts in its stream of mini-batches. Plain numbers: checkpointed with the driver."""

    def __init__(self, executors: int, per_iteration: int) -> None:
        self.per_iteration = per_iteration
        self.share = [1.0 / executors] * executors
        self.effective = list(self.share)
        self.credit = [0.0] * executors
        self.taken = [0] * executors  # mini-batches dispatched to each executor so far
        self.resized_at: float | None = None
        self.resizes = 0

    def resize(self, speeds: Sequence[float | None], now: float) -> bool:
        """Move the shares towards ``speeds`` (each executor's tasks per second; None: not measured yet, and then
        nothing changes). True if they moved."""
        if self.resized_at is not None and now - self.resized_at < RESIZE_S:
            return False
        if any(v is None or not v > 0 for v in speeds):
            return False
        self.resized_at = now
        self.effective = [f + FOLLOW * (s - f) for f, s in zip(self.effective, self.share, strict=True)]
        rates = [v * f for v, f in zip(speeds, self.effective, strict=True)]  # mini-batches/s, over per_iteration
        total = sum(rates)
        share = [(1 - DAMPING) * s + DAMPING * r / total for s, r in zip(self.share, rates, strict=True)]
        floor = MIN_SHARE / len(share)
        share = [max(s, floor) for s in share]
        self.share = [s / sum(share) for s in share]
        self.resizes += 1
        return True

    def take(self, executor: int) -> tuple[int, int]:
        """``(first, count)``: the mini-batches of ``executor``'s next task, numbered along its stream. The share's
        fractions carry over from task to task, so the counts average ``per_iteration x share``."""
        self.credit[executor] += self.per_iteration * self.share[executor]
        count = math.floor(self.credit[executor] + 1e-9)
        self.credit[executor] -= count
        first = self.taken[executor]
        self.taken[executor] += count
        return first, count


def batch_starts(first: int, count: int, batches: int, order_of_pass) -> list[int]:
    """Mini-batch numbers ``first .. first + count - 1`` of a stream of passes over ``batches`` mini-batches, each
    pass in the order ``order_of_pass(p)`` (a permutation of ``range(batches)``)."""
    out, orders = [], {}
    for g in range(first, first + count):
        p, i = divmod(g, batches)
        if p not in orders:
            orders[p] = order_of_pass(p)
        out.append(int(orders[p][i]))
    return out
