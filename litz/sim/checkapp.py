"""The app every simulated schedule runs: small tasks whose reads prove the consistency rule.

Each executor runs ``rounds`` tasks. Without ``staleness`` in the config they run one after another (the
driver dispatches an executor's next task when its last completes); with it, the driver dispatches whole
iterations through :class:`litz.ssp.SSP`, so up to ``staleness + 1`` tasks of one executor are in flight and
may interleave on their worker. Task ``r`` of executor ``e`` reads a few counter keys, adds one to each, and
reports what it read. The driver knows, for every key, how many completed tasks wrote it before each dispatch
and how many tasks that write it were dispatched at all, so every read is checked against both bounds:

- at least the writes of every task completed before the reader's dispatch (the consistency rule);
- at most the writes of every task dispatched before the reader completed (nothing applied twice).

With ``after`` in the config (and no SSP) each executor's next round is dispatched ahead, before its previous
round completes, with ``after=`` naming that round and the latest task of the next executor (docs/design.md,
"Dependent dispatch"): its lower bound then also counts the writes of its closure, the tasks it waits for that
had not completed at its dispatch (those named and, transitively, theirs), and each completion must come after
those of its closure.

Under SSP a task of iteration ``i`` must also see every write of iterations ``<= i - s - 1`` and none of
iterations ``>= i + s + 1`` (the SSP bound), counted from the plan itself, not from the dispatch
order, so a dispatch frontier that runs ahead is caught even where the consistency rule still holds.

The driver also reads keys itself (``ps_get_many`` on the driver) after every third completion and at the
end, with the same bounds: at least every write completed so far, at most every write dispatched.

Executor state (``ran``) must equal the tasks the driver saw complete for it: it survived moves, evictions
and recoveries intact. Input data (``data``, fixed, and ``tag``, re-assigned by every task) must be what the
executor last held, or freshly loaded, never an older assignment. Under SCAR partial recovery the keys of
the restored shards keep only the upper bounds, and every other key must stay exact. Violations go to
:mod:`litz.sim.checks`, outside the driver, so that a recovery (which rolls the driver back) cannot hide them.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

import litz
from litz.keys import ShardMap
from litz.sim import checks
from litz.ssp import SSP

WIDTH = 3  # entries per counter: all must agree (a torn or partial update shows)


def keys_of(executor: int, round_: int, num_keys: int) -> list:
    """The keys task ``round_`` of ``executor`` reads and writes: its own, and two shared ones."""
    a = (executor * 7 + round_ * 3) % num_keys
    b = (executor * 5 + round_ * 11 + 1) % num_keys
    return [("own", executor), ("k", a)] + ([("k", b)] if b != a else [])


class CheckDriver(litz.Driver):
    def dispatch_initial_tasks(self) -> None:
        self.rounds = int(self.config.get("rounds", 10))
        self.num_keys = int(self.config.get("keys", 8))
        self.done = [0] * self.num_executors
        self.completed: dict = defaultdict(int)  # key -> writes by completed tasks
        self.dispatched: dict = defaultdict(int)  # key -> writes by dispatched tasks
        self.tainted: set = set()  # keys of shards SCAR partial recovery put back to a checkpoint
        staleness = self.config.get("staleness")
        self.ssp = None if staleness is None else SSP(self, int(staleness), self.rounds, task_args=self.task_args)
        self.seen: set = set()  # (executor, round) completed, under SSP (rounds of one executor end in any order)
        if self.ssp is not None:
            self.ssp.start()
            return
        self.after = bool(self.config.get("after"))
        self.pending: dict[int, tuple] = {}  # after=: task id -> (keys, closure) until it completes
        self.latest: dict[int, int] = {}  # after=: executor -> id of its latest dispatched task
        self.tid_of: dict[tuple, int] = {}  # after=: (executor, round) -> task id, until it completes
        self._closure_now: tuple = ()
        self.choose = bool(self.config.get("choose"))
        self.busy: set = set()
        if self.choose:  # half as many tasks as executors at a time, each to one the runtime picks among the idle
            for _ in range((self.num_executors + 1) // 2):
                self.dispatch_next()
            return
        for e in range(self.num_executors):
            self.dispatch_task(e, self.task_args(0, e))
        if self.after:
            for e in range(self.num_executors):
                self.dispatch_ahead(e, 1)

    def dispatch_next(self) -> None:
        """``choose``: the next round of an executor the runtime picks among those idle with rounds left (its tasks
        stay one after another, so executor state is checked as without the choice)."""
        idle = [e for e in range(self.num_executors) if e not in self.busy and self.done[e] < self.rounds]
        if idle:
            e = self.choose_executor(idle)
            if e not in idle:
                checks.violation(f"choose_executor gave executor {e}, not one of {idle}")
            self.busy.add(e)
            self.dispatch_task(e, self.task_args(self.done[e], e))

    def task_args(self, r: int, e: int, closure: tuple = ()) -> tuple:
        """Round ``r`` of executor ``e``, called as it is dispatched: what it may read is fixed now (with after=,
        also every write of the tasks in its closure)."""
        keys = keys_of(e, r, self.num_keys)
        for k in keys:
            self.dispatched[k] += 1
        lows = [self.completed[k] + sum(k in self.pending[t][0] for t in closure) for k in keys]
        return r, keys, lows

    def dispatch_task(self, executor: int, args: Any = None, after: Any = None) -> int:
        tid = super().dispatch_task(executor, args, after)
        if getattr(self, "after", False) and args[0] != "verify":
            self.latest[executor] = tid
            self.tid_of[(executor, args[0])] = tid
            self.pending[tid] = (args[1], self._closure_now)
        return tid

    def dispatch_ahead(self, e: int, r: int) -> None:
        """Round ``r`` of ``e`` after its round ``r - 1`` and the latest task of the next executor."""
        if r >= self.rounds:
            return
        after = [self.latest[e]]
        nxt = (e + 1) % self.num_executors
        if nxt != e and self.latest.get(nxt) in self.pending:
            after.append(self.latest[nxt])
        closure: dict = {}
        for t in after:
            if t in self.pending:
                closure[t] = None
                closure.update(dict.fromkeys(c for c in self.pending[t][1] if c in self.pending))
        self._closure_now = tuple(closure)
        self.dispatch_task(e, self.task_args(r, e, self._closure_now), after=after)
        self._closure_now = ()

    def writes_before(self, key: tuple, r: int) -> int:
        """How many tasks of rounds ``< r`` write ``key``: the plan's count, independent of any dispatch."""
        return sum(key in keys_of(e, j, self.num_keys) for e in range(self.num_executors)
                   for j in range(max(0, min(r, self.rounds))))

    def handle_task_completion(self, result: tuple) -> None:
        if result[0] == "verify":
            self.verified(*result[1:])
            return
        e, r, ran, reads, lows = result
        if self.ssp is None:
            if r != self.done[e]:
                checks.violation(f"executor {e}: completion of round {r}, expected round {self.done[e]}")
            if ran != r:
                checks.violation(f"executor {e} round {r}: executor state says {ran} tasks ran before it")
        else:
            if (e, r) in self.seen:
                checks.violation(f"executor {e}: round {r} completed twice")
            self.seen.add((e, r))
            self.check_ssp_bound(e, r, reads)
        for (k, value), low in zip(reads, lows, strict=True):
            if value < low and k not in self.tainted:
                checks.violation(f"consistency: executor {e} round {r} read {k} = {value}, but {low} writes "
                                  "had completed before its dispatch")
            if value > self.dispatched[k] - 1:  # its own write is not yet applied when it reads
                checks.violation(f"double apply: executor {e} round {r} read {k} = {value}, only "
                                  f"{self.dispatched[k] - 1} other writes were ever dispatched")
        for k, _ in reads:
            self.completed[k] += 1
        self.done[e] += 1
        if self.ssp is None and self.after:
            _, closure = self.pending.pop(self.tid_of.pop((e, r), None), ((), ()))
            first = [t for t in closure if t in self.pending]
            if first:  # the master must see a completion after those of the tasks it read from (A7, A9)
                checks.violation(f"order: executor {e} round {r} completed before task(s) {first} it waited for")
        if sum(self.done) % 3 == 0:
            self.driver_read([k for k, _ in reads], f"after executor {e} round {r}")
        if self.ssp is not None:
            self.ssp.complete(r)
            if self.ssp.done:
                self.verify()
        elif self.after:
            self.dispatch_ahead(e, r + 2)
            if all(d >= self.rounds for d in self.done):
                self.verify()
        elif self.choose:
            self.busy.discard(e)
            self.dispatch_next()
            if all(d >= self.rounds for d in self.done):
                self.verify()
        elif self.done[e] < self.rounds:
            self.dispatch_task(e, self.task_args(self.done[e], e))
        elif all(d >= self.rounds for d in self.done):
            self.verify()

    def check_ssp_bound(self, e: int, r: int, reads: list) -> None:
        s = self.ssp.staleness
        for k, value in reads:
            low, high = self.writes_before(k, r - s), self.writes_before(k, r + s + 1) - 1  # -1: its own write
            if value < low and k not in self.tainted:
                checks.violation(f"ssp: executor {e} round {r} read {k} = {value}, but rounds <= {r - s - 1} "
                                  f"write it {low} times (staleness {s})")
            if value > high:
                checks.violation(f"ssp: executor {e} round {r} read {k} = {value}, but rounds <= {r + s} write "
                                  f"it only {high} times besides it (staleness {s})")

    def handle_partial_recovery(self, info: dict) -> Any:
        """SCAR partial recovery puts the lost servers' shards back to a checkpoint: their keys lose the writes
        since (the documented rule), so from now on only the upper bounds hold for them; every other key must
        stay exact, since the live servers see every update once. The lost shards are read off the master,
        which is this driver's context (a simulation may look; an app would recount from executor state)."""
        master = self._litz
        lost = set(info["lost"])
        shards = ShardMap(len(master.shard_owner), list(master.shard_owner))
        keys = [("own", e) for e in range(self.num_executors)] + [("k", j) for j in range(self.num_keys)]
        self.tainted |= {k for k in keys if shards.owners[shards.shard(k)] in lost}
        return None

    def driver_read(self, keys: list, when: str) -> None:
        """The driver reads ``keys`` itself (docs/design.md, D1): each must hold at least every write of the tasks
        completed so far (the completion just handled included), and at most those of the tasks dispatched."""
        for k, v in zip(keys, self.ps_get_many(keys), strict=True):
            value = 0 if v is None else int(v[0])
            if isinstance(v, np.ndarray) and (v.flags.writeable or not np.all(v == v[0])):
                checks.violation(f"driver read {when}: {k} is writable or torn: {v.tolist()}")
            if value < self.completed[k] and k not in self.tainted:
                checks.violation(f"driver read {when}: {k} = {value}, but {self.completed[k]} writes had completed")
            if value > self.dispatched[k]:
                checks.violation(f"driver read {when}: {k} = {value}, only {self.dispatched[k]} writes dispatched")

    def verify(self) -> None:
        """Nothing is in flight now: every executor reads every key, and each must be exactly the writes of the
        completed tasks (nothing lost, nothing applied twice), through each worker's cache."""
        keys = [("own", e) for e in range(self.num_executors)] + [("k", j) for j in range(self.num_keys)]
        self.driver_read(keys, "at the end")
        self.verifying = self.num_executors
        for e in range(self.num_executors):
            self.dispatch_task(e, ("verify", keys, [self.completed[k] for k in keys]))

    def verified(self, e: int, ran: int, reads: list, expected: list) -> None:
        if ran != self.rounds:
            checks.violation(f"executor {e}: executor state says {ran} tasks ran, {self.rounds} completed")
        for (k, value), n in zip(reads, expected, strict=True):
            if value > n or (value != n and k not in self.tainted):
                checks.violation(f"total: executor {e} read {k} = {value} at the end, {n} writes completed")
        self.verifying -= 1
        if not self.verifying:
            self.finish({"tasks": sum(self.done)})


class CheckExecutor(litz.Executor):
    input_attrs = ("data", "tag")

    def __init__(self) -> None:
        self.ran = 0
        self.last_tag = -1

    def load_input(self) -> None:
        self.data = np.arange(64, dtype=np.int64) + 1000 * self.executor_id
        self.tag = np.full(4, -1, dtype=np.int64)

    def run_task(self, args: tuple) -> tuple:
        r, keys, lows = args
        e = self.executor_id
        if r == "verify":
            return "verify", e, self.ran, self.read(keys, r), lows
        if not np.array_equal(self.data, np.arange(64, dtype=np.int64) + 1000 * e):
            checks.violation(f"executor {e} round {r}: input data changed")
        tag = int(self.tag[0])
        # -1: loaded afresh (after a drain, or a recovery that had to reload); later than the state's own
        # last assignment: a recovery rolled the state back and kept the input in memory (read-only by contract,
        # so it need not be reloaded); earlier: an older assignment came back, stale
        if tag != -1 and tag < self.last_tag:
            checks.violation(f"executor {e} round {r}: input tag is {tag}, last assigned {self.last_tag}")
        ran = self.ran
        reads = self.read(keys, r)  # may switch to another task of this executor (under SSP)
        self.ps_update_many((k, np.ones(WIDTH, dtype=np.int64)) for k in keys)
        self.ran += 1
        self.last_tag = self.ran
        self.tag = np.full(4, self.ran, dtype=np.int64)  # a new object each task: the out-of-core id trap
        return e, r, ran, reads, lows

    def read(self, keys: list, r: object) -> list:
        e = self.executor_id
        reads = []
        for k, v in zip(keys, self.ps_get_many(keys), strict=True):
            if v is None:
                reads.append((k, 0))
                continue
            if isinstance(v, np.ndarray) and v.flags.writeable:
                checks.violation(f"executor {e} round {r}: ps_get({k}) returned a writable array")
            if not np.all(v == v[0]):
                checks.violation(f"executor {e} round {r}: {k} has torn entries {v.tolist()}")
            reads.append((k, int(v[0])))
        return reads
