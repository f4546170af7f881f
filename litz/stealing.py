"""Work stealing between speed rebalances: an idle worker takes an executor with queued tasks from one behind.

The policy is an extension of the master, as work stealing is of dask's scheduler: :func:`decide` is the pure
decision (which executor, from whom, to whom, or none), :func:`steal_weights` the quotas a steal leaves, and
:class:`Stealing` the master's hooks (tasks routed and completed, a batch handled, an executor moved). A steal is a
rebalance's live move of one executor (``COPY_INPUT``, then ``MOVE_EXECUTOR`` with its state and queued tasks), so
it keeps the consistency rule as a rebalance does. Why each rule: docs/design.md, "Placement policy".
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter, mod
from typing import TYPE_CHECKING

from . import clock
from .placement import quotas

if TYPE_CHECKING:
    from .master import Master

STEAL_COST_S = 0.05  # a move's cost before any steal was measured: a few round trips and the executor's state
COST_ALPHA = 0.3  # the EMA of measured steal durations that stands for the next one's cost
CHECK_S = 0.02  # least time between two looks for a steal (each one goes over every executor)
_TASK_ID, _EXECUTOR = itemgetter(0), itemgetter(1)  # of a task (tid, eid, version, args) or a result (tid, result)


@dataclass(frozen=True)
class Steal:
    """Move ``executor`` (with ``queued`` tasks waiting) from ``victim`` to the idle ``thief``; ``backlog_s``: the
    victim's outstanding tasks times its time per task, what the steal shortens."""

    executor: int
    victim: str
    thief: str
    queued: int
    backlog_s: float


@dataclass
class View:
    """What the master knows when it looks for a steal.

    ``owner``: executor -> worker. ``outstanding``: executor -> tasks routed to its worker and not completed.
    ``workers``: the active, ready
    workers. ``per_task``: measured seconds per task of each worker that has a speed. ``cost_s``: what a move is
    expected to cost. The flags: why no steal may start now."""

    owner: Sequence[str]
    outstanding: Mapping[int, int]
    workers: list[str]
    per_task: Mapping[str, float]
    cost_s: float = STEAL_COST_S
    threshold: float = 0.1
    steal_in_flight: bool = False
    operation: bool = False  # a scale-out, scale-in or rebalance, one asked for, or a worker joining or leaving
    recovery: bool = False  # a recovery, a restore, or a checkpoint (taken, or waiting for the job to be quiet)
    moving: bool = False  # an executor or shard in flight
    # an executor is stolen only with this many outstanding tasks: one may be running, the rest are queued (the
    # simulator also takes 1, which moves executors whose only task may have started: the move waits for it)
    min_outstanding: int = 2


def toward_quotas(after: dict[str, int], thief: str, victim: str, speeds: dict[str, float], threshold: float) -> bool:
    """Whether ``after`` (executors per worker once ``thief`` has taken one of ``victim``'s) is still on the way to
    the quotas of ``speeds`` shaded by ``threshold`` against the steal: the thief ``threshold`` slower, the victim
    that much faster. The thief then holds no more than its quota and the victim no less, so a rebalance at these
    speeds never moves the executor back; and taking it back needs the speeds to move past the threshold both
    ways: the hysteresis a rebalance has, for one executor (one move of ``c`` shortens a step by ``1 / c`` at most,
    so a threshold on the step alone would forbid every steal from a worker with more than ten)."""
    shaded = {**speeds, thief: speeds[thief] / (1 + threshold), victim: speeds[victim] * (1 + threshold)}
    ranked = sorted(after, key=lambda w: (-after[w], w))  # as the plan ranks them
    quota = quotas(sum(after.values()), ranked, shaded)
    return after[thief] <= quota[thief] and after[victim] >= quota[victim]


def stealable(outstanding: int, min_outstanding: int) -> bool:
    """Whether an executor with ``outstanding`` tasks may be stolen: ``min_outstanding`` of them, and one at least."""
    return outstanding >= max(min_outstanding, 1)


def decide(view: View) -> Steal | None:
    """The steal to start now, or None (docs/design.md, "Placement policy": stealing between rebalances)."""
    if view.steal_in_flight or view.operation or view.recovery or view.moving:
        return None
    workers, per_task = view.workers, view.per_task
    if len(workers) < 2 or any(per_task.get(w, 0) <= 0 for w in workers):
        return None
    held: dict[str, list[int]] = defaultdict(list)
    for eid, w in enumerate(view.owner):
        held[w].append(eid)
    backlog = {w: sum(view.outstanding.get(e, 0) for e in held[w]) for w in workers}
    thieves = sorted((w for w in workers if backlog[w] == 0), key=lambda w: (per_task[w], w))
    victims = sorted((w for w in workers if backlog[w] and len(held[w]) >= 2),
                     key=lambda w: (-backlog[w] * per_task[w], w))
    if not thieves or not victims:
        return None
    counts = {w: len(held[w]) for w in workers}
    speeds = {w: 1.0 / per_task[w] for w in workers}
    for victim in victims:
        queued = {e: view.outstanding.get(e, 0) - 1 for e in held[victim]
                  if stealable(view.outstanding.get(e, 0), view.min_outstanding)}
        if not queued:
            continue
        eid = max(queued, key=lambda e: (queued[e], -e))
        backlog_s = backlog[victim] * per_task[victim]
        for thief in thieves:
            if backlog_s <= view.cost_s + queued[eid] * per_task[thief]:
                continue  # the thief would not be done with the queue sooner: a nearly empty one stays
            after = dict(counts)
            after[victim] -= 1
            after[thief] += 1
            if toward_quotas(after, thief, victim, speeds, view.threshold):
                return Steal(eid, victim, thief, queued[eid], backlog_s)
    return None


def steal_weights(counts: dict[str, int], speeds: dict[str, float]) -> dict[str, float]:
    """Weights whose quotas are exactly ``counts`` (executors per worker after a steal), in the unit of the
    measured ``speeds`` (their sum), so a plan keeps the stolen executor where it is."""
    n = sum(counts.values())
    total = sum(speeds.get(w, 0.0) for w in counts) or float(n)
    return {w: total * c / n for w, c in counts.items()}


class Stealing:
    """The master's stealing extension: it counts the tasks outstanding per executor from the master's own
    dispatches and completions, looks for a steal after each batch of messages, starts it as a scale-out move,
    and logs it (event ``steal``) when the executor has arrived."""

    def __init__(self, master: Master, threshold: float, cost_s: float = STEAL_COST_S, check_s: float = CHECK_S):
        """``threshold``: the rebalance's hysteresis (a fraction of the predicted step)."""
        self.master = master
        self.threshold, self.cost_s, self.check_s = threshold, cost_s, check_s
        self.learn = True  # the cost follows measured steal durations (the simulator fixes it instead)
        self.min_outstanding = 2  # see View.min_outstanding
        # executor -> tasks sent and not completed. Counted a batch at a time, in C for tasks sent (Counter over map)
        # and from the worker's count per executor for those completed: these hooks see every task, and the
        # throughput benchmark's 150 000 tasks/s leave the master about 6 us a task (a dict of task ids cost 170 ns
        # of it, 3 %).
        self.outstanding: Counter[int] = Counter()
        self.current: tuple[Steal, float] | None = None  # the steal in flight, and when it started
        self.count = 0
        self._last_check = float("-inf")

    # -- the master's hooks ----------------------------------------------------------------------------------
    def sent(self, tasks: list) -> None:
        """Tasks ``(tid, eid, version, args)`` on their way to a worker (the master's flush of its outbox)."""
        self.outstanding.update(map(_EXECUTOR, tasks))

    def done(self, results: list, per_executor: Mapping[int, tuple] | None = None) -> None:
        """A DONE's ``(tid, result)`` pairs (of this epoch: the master drops older messages) and its timing per
        executor, ``{eid: (completions, ...)}``. The worker counts those completions from the tasks whose results
        these are, so the master takes them as they come, a step per executor instead of one per task (counting
        the results' executors was 2 % of the master on the throughput benchmark's no-op tasks)."""
        out = self.outstanding
        if per_executor is None:  # a DONE without timing: count the results' executors
            out.subtract(Counter(map(mod, map(_TASK_ID, results), repeat(self.master.num_executors))))
            return
        for eid, timing in per_executor.items():
            if timing[0]:
                out[eid] -= timing[0]

    def reset(self) -> None:
        """A restore: every task and move of the previous epoch is gone."""
        self.outstanding.clear()
        self.current = None

    def moved(self, eid: int, dest: str, nbytes: int) -> None:
        """An executor arrived (MOVED): if it was the steal's, log it and learn what a move costs."""
        if self.current is None or self.current[0].executor != eid or self.current[0].thief != dest:
            return
        steal, t0 = self.current
        self.current = None
        took = clock.time() - t0
        if self.learn:
            self.cost_s += COST_ALPHA * (took - self.cost_s)
        self.count += 1
        self.master.joblog.event("steal", executor=eid, **{"from": steal.victim, "to": steal.thief},
                                 bytes=nbytes, queued=steal.queued, backlog_s=round(steal.backlog_s, 4),
                                 duration_s=round(took, 4))

    def tick(self) -> None:
        """After a batch of messages: start a steal if :func:`decide` finds one (at most every ``check_s``)."""
        m = self.master
        if self.current is not None:
            eid = self.current[0].executor
            if eid in m.copying_input or eid in m.moving_executors:
                return
            self.current = None  # called off (its thief began to leave) or lost to a recovery
        now = clock.time()
        if now - self._last_check < self.check_s or not m.started or m.finished:
            return
        self._last_check = now
        # decide() needs an executor with min_outstanding tasks (a victim's queue): without one, which is always the
        # case in a synchronous job of one task per executor a step, skip building the view (max() runs in C)
        if not stealable(max(self.outstanding.values(), default=0), self.min_outstanding):
            return
        steal = decide(self.view())
        if steal is not None:
            self.start(steal)

    # -- inside ----------------------------------------------------------------------------------------------
    def view(self) -> View:
        m = self.master
        workers = sorted(w.ident for w in m.workers.values() if w.state == "active" and w.ready and not w.retire_sent)
        speeds = m.speeds()
        rec = m.recovery
        return View(
            owner=m.executor_owner, outstanding={e: n for e, n in self.outstanding.items() if n > 0}, workers=workers,
            min_outstanding=self.min_outstanding,
            per_task={w: 1.0 / speeds[w] for w in workers if w in speeds}, cost_s=self.cost_s,
            threshold=self.threshold, steal_in_flight=self.current is not None,
            operation=(m.operation is not None or m.deferred_scale is not None or bool(m.pending("worker"))
                       or any(w.state != "active" for w in m.workers.values())),
            recovery=(rec.in_progress is not None or rec.restoring is not None or rec.paused),
            moving=bool(m.moving_executors or m.copying_input or m.moving_shards or m.copied_ready or m.map_dirty))

    def start(self, steal: Steal) -> None:
        """Have the policy adopt the quotas the steal leaves (so no plan moves it back), then copy the input ahead, as
        a scale-out does; the executor itself moves once its input has arrived (:meth:`Master.on_input_copied`)."""
        m = self.master
        counts = dict.fromkeys(m.workers, 0)  # every worker is active and ready: decide() saw to it
        for w in m.executor_owner:
            counts[w] += 1
        counts[steal.victim] -= 1
        counts[steal.thief] += 1
        m.owners.policy.follow(steal_weights(counts, m.speeds()))
        self.current = (steal, clock.time())
        m.owners.start_executor_move(steal.executor, steal.thief, copy_input=True)
        m.start_copies()
