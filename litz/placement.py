"""Balancing policy: spread items (executors or shards) evenly over active processes, moving as few as possible.

Items on leaving processes all move; a process above its quota gives up only its excess; quotas that
exceed the even share by one go to the processes that already hold the most, so nothing moves that
need not. Processes about to join (started, not ready yet) count in the quotas, but moves to them wait
until they have joined: growing 2 -> 4 workers moves 8 of 16 executors, not 5 for the third worker and
then 4 more (one of them again) for the fourth.

With weights (the ``speed`` policy: docs/design.md, "Placement policy") the quotas are in proportion to them
instead; :func:`speed_plan` decides when the measured speeds are worth a move (hysteresis), and
:class:`SpeedMeter` smooths what the workers report.

The policies themselves are objects (:class:`EvenPolicy`, :class:`SpeedPolicy`, found by name in
:data:`POLICIES`) that :class:`litz.owners.Placement`, the one owner of the maps, consults without knowing which
one it has, as ps-lite's ``set_slicer`` lets a worker slice keys without knowing how.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from .errors import LitzError


def quotas(n: int, ranked: list[str], weights: dict[str, float] | None = None) -> dict[str, int]:
    """Items per process: ``n`` spread evenly, or in proportion to ``weights`` (largest remainder first). Ties and
    the even extras go to processes earlier in ``ranked`` (those holding the most), so nothing moves that need not.
    A process without a weight counts at the mean of the others."""
    if not weights:
        base, extra = divmod(n, len(ranked))
        return {p: base + (1 if i < extra else 0) for i, p in enumerate(ranked)}
    known = [weights[p] for p in ranked if weights.get(p, 0) > 0]
    mean = sum(known) / len(known) if known else 1.0
    w = {p: weights[p] if weights.get(p, 0) > 0 else mean for p in ranked}
    total = sum(w.values())
    ideal = {p: n * w[p] / total for p in ranked}
    quota = {p: int(ideal[p]) for p in ranked}
    rest = n - sum(quota.values())
    order = sorted(range(len(ranked)), key=lambda i: (-(ideal[ranked[i]] - quota[ranked[i]]), i))
    for i in order[:rest]:
        quota[ranked[i]] += 1
    if n >= len(ranked):  # every process keeps one: a worker with no executor is never measured again
        for p in ranked:
            if quota[p] == 0:
                quota[max(ranked, key=lambda q: quota[q])] -= 1
                quota[p] = 1
    return quota


def plan_moves(owner: Sequence[str], moving: dict[int, str], active: list[str],
               pending: list[str] = (), weights: dict[str, float] | None = None) -> list[tuple[int, str, str]]:
    """Moves ``(item, source, dest)`` that balance ``owner`` (item -> process) over ``active`` and ``pending``.

    ``moving`` maps items already in flight to their destination; they count there and are not moved again.
    ``pending`` are processes about to join: they get their quota in the plan, but the moves to them are left
    out (their items stay where they are until the next plan, made once they have joined). ``weights``: quotas
    in proportion to them (see :func:`quotas`) instead of even.
    """
    if not active:
        return []
    ready = set(active)
    active = list(active) + [p for p in pending if p not in ready]
    future = list(owner)
    for item, dest in moving.items():
        future[item] = dest
    held: dict[str, list[int]] = defaultdict(list)
    for item, proc in enumerate(future):
        held[proc].append(item)
    active_set = set(active)
    ranked = sorted(active, key=lambda p: (-len(held[p]), p))
    quota = quotas(len(owner), ranked, weights)
    surplus: list[int] = []
    for proc, items in held.items():
        free = [i for i in items if i not in moving]
        keep = quota.get(proc, 0) if proc in active_set else 0
        excess = len(items) - keep
        if excess > 0:
            surplus.extend(free[len(free) - excess:] if excess <= len(free) else free)
    moves = []
    for proc in ranked:
        for _ in range(quota[proc] - len(held[proc])):
            if not surplus:
                break
            item = surplus.pop()
            moves.append((item, owner[item], proc))
    return [m for m in moves if m[2] in ready]


def leaving_first(started: dict[str, tuple[float, int]], target: int) -> list[str]:
    """The processes a scale-in to ``target`` releases: the newest, by ``started`` = (when the process took its
    id, join order). Start order, not join order: processes started together join in any order, and the
    user who scaled out to w2, w3 expects ``scale --workers 2`` to give back w2 and w3."""
    return sorted(started, key=lambda p: (*started[p], p))[target:]


def predicted_step(counts: dict[str, int], speeds: dict[str, float]) -> float:
    """Time of one synchronous step with ``counts`` executors per worker: the slowest worker's executors / speed."""
    return max((c / speeds[p] for p, c in counts.items() if c), default=0.0)


def speed_plan(owner: Sequence[str], moving: dict[int, str], active: list[str], speeds: dict[str, float],
               threshold: float = 0.1) -> list[tuple[int, str, str]]:
    """Moves that place executors in proportion to ``speeds`` (tasks per second of each worker), or none when they
    would shorten the predicted step by less than ``threshold`` (a fraction): the hysteresis that keeps noise in
    the measured speeds from moving executors back and forth. Fewest moves, as :func:`plan_moves`."""
    if not active or any(speeds.get(p, 0) <= 0 for p in active):
        return []
    moves = plan_moves(owner, moving, active, weights=speeds)
    if not moves:
        return []
    future = list(owner)
    for item, dest in moving.items():
        future[item] = dest
    before = {p: future.count(p) for p in active}
    after = dict(before)
    for _, src, dest in moves:
        after[src] -= 1
        after[dest] += 1
    now, then = predicted_step(before, speeds), predicted_step(after, speeds)
    if now <= 0 or (now - then) / now < threshold:
        return []
    return moves


class Policy(Protocol):
    """What a placement policy tells the owner of the maps: the executor quotas' weights, and whether new speeds
    are worth moving executors for. Shards are always spread evenly: a policy decides the executors' quotas only."""

    name: str
    uses_speeds: bool  # the master offers it the measured speeds (once a second)

    def weights(self) -> dict[str, float] | None:
        """Executor quotas in proportion to these (a worker without one counts at the mean), or None: even."""

    def offer(self, owner: Sequence[str], workers: list[str], speeds: dict[str, float], now: float) -> bool:
        """The measured ``speeds`` of the active ``workers``: True when the policy adopted new weights and executors
        should move to follow them."""


class EvenPolicy:
    """``even``: each active worker holds ``n / workers`` executors, give or take one, whatever their speeds."""

    name = "even"
    uses_speeds = False
    takes_steals = False

    def weights(self) -> dict[str, float] | None:
        return None

    def offer(self, owner: Sequence[str], workers: list[str], speeds: dict[str, float], now: float) -> bool:
        return False


class SpeedPolicy:
    """``speed``: executor quotas in proportion to the *adopted* weights, the measured speeds of the last rebalance.

    New speeds are adopted only when a plan with them shortens the predicted step by more than ``threshold``, and at
    most once per ``every_s`` unless the speeds moved past the threshold since the last adoption (never twice within
    ``min_s``): between adoptions every plan and every re-placement uses the same weights, so noise in the speeds
    never moves an executor back and forth."""

    name = "speed"
    uses_speeds = True
    takes_steals = True  # litz.stealing: idle workers take executors between rebalances (see follow())

    def __init__(self, threshold: float = 0.1, min_s: float = 2.0, every_s: float = 10.0):
        self.threshold, self.min_s, self.every_s = threshold, min_s, every_s
        self.adopted: dict[str, float] | None = None
        self.adopted_at: float | None = None

    def weights(self) -> dict[str, float] | None:
        return self.adopted

    def offer(self, owner: Sequence[str], workers: list[str], speeds: dict[str, float], now: float) -> bool:
        if len(workers) < 2 or any(w not in speeds for w in workers):
            return False  # a worker not measured yet: nothing to compare it with
        if self.adopted_at is not None:
            since, old = now - self.adopted_at, self.adopted or {}
            moved = any(w not in old or abs(speeds[w] - old[w]) > self.threshold * old[w] for w in workers)
            if since < self.min_s or (since < self.every_s and not moved):
                return False
        speeds = {w: speeds[w] for w in workers}
        if not speed_plan(owner, {}, workers, speeds, self.threshold):
            return False
        self.adopted, self.adopted_at = speeds, now
        return True

    def follow(self, weights: dict[str, float]) -> None:
        """Adopt ``weights`` without a rebalance: a steal (:mod:`litz.stealing`) moved an executor, and these make the
        quotas the executor counts it left, so no plan moves it back. The rebalance period still runs from the last
        adoption; the next one settles the steal as any placement."""
        self.adopted = dict(weights)


# the policies by name: what --placement and placement= take (register another here)
POLICIES: dict[str, Callable[[], Policy]] = {"even": EvenPolicy, "speed": SpeedPolicy}


def make_policy(placement: str | Policy) -> Policy:
    """The policy named ``placement`` (a fresh one: a speed policy holds its job's adopted weights), or the
    policy object itself."""
    if not isinstance(placement, str):
        return placement
    factory = POLICIES.get(placement)
    if factory is None:
        raise LitzError(f"unknown placement {placement!r}: choose {' or '.join(POLICIES)}")
    return factory()


class ExecutorCosts:
    """Each executor's smoothed seconds per task inside its worker (running in its greenlet, and CPU), from the
    per-executor part of ``DONE``'s timing: an EMA (``alpha``) over the reports, each sample the time since the
    executor's previous completion over the tasks completed (a task that ran across two reports counts whole).

    Why per executor: the worker's speed says how fast a worker gets through tasks; which of its executors costs
    what (blocks of different sizes, an app's uneven partitions) only these tell. Running time inside the greenlet
    misses a quota's stalls outside it (see :class:`litz.worker.SpeedMeasure`), so these compare executors, and
    the worker's speed stays what placement follows."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.per_task: dict[int, list[float]] = {}  # eid -> [seconds per task, CPU seconds per task]
        self._carry: dict[int, list[float]] = {}  # eid -> [seconds, CPU seconds] ran since its last completion

    def add(self, per_executor: Mapping[int, tuple[int, float, float]]) -> None:
        for eid, (tasks, ran, cpu) in per_executor.items():
            carry = self._carry.setdefault(eid, [0.0, 0.0])
            carry[0] += max(ran, 0.0)
            carry[1] += max(cpu, 0.0)
            if tasks <= 0:
                continue
            sample = [carry[0] / tasks, carry[1] / tasks]
            carry[0] = carry[1] = 0.0
            est = self.per_task.get(eid)
            if est is None:
                self.per_task[eid] = sample
            else:
                est[0] += self.alpha * (sample[0] - est[0])
                est[1] += self.alpha * (sample[1] - est[1])

    def forget(self, eids: Iterable[int]) -> None:
        """``eids`` moved to another worker (or were re-created): what they cost there is measured afresh."""
        for eid in eids:
            self.per_task.pop(eid, None)
            self._carry.pop(eid, None)

    def of(self, eid: int) -> tuple[float, float] | None:
        """``(ms per task, CPU ms per task)`` of ``eid``, or None before it completed a task."""
        est = self.per_task.get(eid)
        return None if est is None else (round(est[0] * 1e3, 3), round(est[1] * 1e3, 3))


class SpeedMeter:
    """A worker's smoothed seconds per task: an EMA (``alpha``) of the mean over each ``window_s`` of reports, the
    mean clipped at ``clip`` times the estimate so one slow task moves it by at most ``alpha * (clip - 1)``.

    Reports are pooled over a window because a CPU quota slows a process in stalls (25 ms running, then 75 ms
    frozen in each 100 ms period): one report of short tasks may hold no stall, the next one all of it.
    The first ``warmup`` windows are dropped (a worker's first reports also hold loading its input).

    A step change (a quota set or lifted, a neighbour arriving) would take the EMA ten windows to follow, and the
    policy would chase it in several small rebalances. So when ``confirm`` windows in a row all lie beyond ``jump``
    times the estimate on the same side, the estimate jumps to their pooled mean: one odd window never does that,
    and a real change is followed within ``confirm`` windows."""

    def __init__(self, alpha: float = 0.2, clip: float = 3.0, window_s: float = 0.5, warmup: int = 0,
                 jump: float = 1.6, confirm: int = 2):
        self.alpha, self.clip, self.window_s, self.warmup = alpha, clip, window_s, warmup
        self.jump, self.confirm = jump, confirm
        self._shifted: list[tuple[int, float, float]] = []  # windows in a row beyond ``jump``, on ``_side``
        self._side = 0
        self.per_task: float | None = None
        self.cpu_per_task = 0.0
        self.tasks = 0
        self._window: list[float] = [0, 0.0, 0.0]  # tasks, wall, cpu since the window opened
        self._opened: float | None = None
        self.cores: float | None = None  # the worker's CPU limit (its cgroup quota), from its STATS

    def add(self, tasks: int, wall: float, cpu: float, now: float = 0.0) -> None:
        """A report at time ``now``: ``tasks`` completed, having run ``wall`` seconds (``cpu`` on a CPU) in all."""
        if tasks <= 0 or wall <= 0:
            return
        win = self._window
        win[0] += tasks
        win[1] += wall
        win[2] += max(cpu, 0.0)
        if self._opened is None:
            self._opened = now
        if now - self._opened < self.window_s:
            return
        tasks, wall, cpu = win
        self._window, self._opened = [0, 0.0, 0.0], None
        if self.warmup > 0:
            self.warmup -= 1
            return
        mean, cpu_mean = wall / tasks, cpu / tasks
        self.tasks += tasks
        if self.per_task is None:
            self.per_task, self.cpu_per_task = mean, cpu_mean
            return
        side = 1 if mean > self.jump * self.per_task else -1 if mean * self.jump < self.per_task else 0
        if side != self._side:
            self._shifted, self._side = [], side
        if side:
            self._shifted.append((tasks, wall, cpu))
            if len(self._shifted) >= self.confirm:  # a step change: follow it at once
                n = sum(t for t, _, _ in self._shifted)
                self.per_task = sum(w for _, w, _ in self._shifted) / n
                self.cpu_per_task = sum(c for _, _, c in self._shifted) / n
                self._shifted, self._side = [], 0
                return
        a = self.alpha
        self.per_task += a * (min(mean, self.clip * self.per_task) - self.per_task)
        self.cpu_per_task += a * (min(cpu_mean, self.clip * self.per_task) - self.cpu_per_task)

    def limit(self, cores: float | None) -> None:
        """The worker may use ``cores`` CPUs at most (None: no limit); see :attr:`speed`."""
        self.cores = float(cores) if type(cores) in (int, float) and 0 < cores < float("inf") else None

    @property
    def measured(self) -> float | None:
        """Tasks per second of running time at the worker's current load, without the CPU limit's bound: how soon
        a task sent now would finish (a lightly loaded worker under a quota does run it within its burst)."""
        return 1.0 / self.per_task if self.per_task else None

    @property
    def speed(self) -> float | None:
        """Tasks per second of running time, or None before any report; under a CPU limit, at most what the limit
        sustains (``cores`` CPU seconds a second over the CPU seconds a task takes). A quota stalls a worker only once
        its demand passes it: lightly loaded, it runs each step within its share and measures as fast as an
        unlimited one, and a policy following that alone would give it executors and take them back in turn."""
        speed = self.measured
        if speed is not None and self.cores is not None and self.cpu_per_task > 0:
            speed = min(speed, self.cores / self.cpu_per_task)
        return speed
