"""Dependent dispatch, the master's side: ``dispatch_task(e, args, after=tids)`` (docs/design.md, A1-A9).

A task dispatched after tasks that have not completed goes to its worker at once, with its *closure* (the pending
tasks it must wait for, transitively), when every closure task was sent to a worker and no executor involved is
moving. The worker starts it as soon as their flushes are acknowledged (its own closure tasks') or handed off
(those of other workers, which this table tells to do so and whose completions it relays as well, A9), with no
message through the master (``litz/worker.py``, the held-task functions). Otherwise the master holds the task and
routes it, at the version of that moment, once its whole closure has completed: the ordinary dispatch. A task sent
ahead with closure tasks on other workers completes here only after all of them have (A9).

The table of pending tasks is kept only once the driver has used ``after=``: a job that never does pays nothing.
The tasks in flight when the table was made are not in it: a task named in ``after=`` from before is waited for
as "every task dispatched before the table" (:data:`EARLY`), which all complete in time.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

EARLY = -1  # in a closure: every task dispatched before the table was made (not one by one: nothing recorded them)
# A longer closure is not kept: the task waits here for the tasks it names and never goes ahead (docs/design.md, A1).
# A chain dispatched ahead grows its closures by one task a link; kept whole, 10 000 links took 4.7 s to dispatch
# and 440 MB, and a worker would get every closure with its task.
MAX_CLOSURE = 256


class Pending:
    """A task dispatched and not yet seen complete: where it went and what it waits for."""

    __slots__ = ("task", "where", "closure", "remaining", "gen", "capped", "remote")

    def __init__(self, task: tuple, where: str | None, closure: tuple, capped: bool = False):
        self.task = task          # (task id, executor, version, args)
        self.where = where        # the worker it was sent to; None: held here (by this table, a pause or a move)
        self.closure = closure    # pending task ids it waits for (empty once sent the ordinary way)
        self.remaining = 0        # waited-for tasks not yet complete, while held here
        self.gen = 0              # bumped when it stops waiting here: older entries in the waiting lists are stale
        self.capped = capped      # its closure was longer than MAX_CLOSURE: only the tasks it named, never ahead
        self.remote = False       # sent ahead with closure tasks on other workers: its completion waits for them (A9)


class Dependencies:
    """The master's table of pending tasks, for ``after=`` (one per master, made at the first ``after=``)."""

    def __init__(self, master: Any):
        self.master = master
        self.since = master.next_tid  # task sequence numbers from here on were sent in counted TASKS (A4)
        self.early_left = master.in_flight  # tasks dispatched before the table and not yet complete
        self.pending: dict[int, Pending] = {}
        # task id -> (task held here until it completes, the task's gen when it began to wait)
        self.waiting: dict[int, list[tuple[Pending, int]]] = defaultdict(list)
        self.ahead: dict[str, list] = defaultdict(list)  # worker -> (tid, eid, version, args, closure) to send ahead
        self.sent_ahead = 0  # tasks ever sent ahead (tests and benchmarks read it)
        self.sent_ahead_remote = 0  # of them, with closure tasks on other workers (A9)
        self.handoffs: dict[str, list] = defaultdict(list)  # worker -> (task id, destination): hand it off (A9)
        self.relays: dict[str, list] = defaultdict(list)  # worker -> (task id, keys) completed, it may wait (A9)
        self.written: dict[int, Any] = {}  # task id with destinations, reported done -> the keys its DONE names
        # task id -> workers told to expect its hand-off (A9); a dict, not a set: the relays go out in this order,
        # which a set of strings would leave to the hash seed (a simulated schedule must replay exactly)
        self.destinations: dict[int, dict[str, None]] = {}
        self.parked: dict[int, list] = defaultdict(list)  # task id -> completions waiting for it (A9)
        self.ready: list = []  # parked completions whose closure has completed: the master handles them next
        # worker -> {number of its DONE message: completions of it parked}: not handled yet, for A4's count (A9)
        self.unsettled: dict[str, dict[int, int]] = defaultdict(dict)

    # -- dispatch ------------------------------------------------------------------------------------------------
    def closure_of(self, after: Iterable[int]) -> tuple:
        """The pending tasks a task dispatched after ``after`` must wait for: those named, and theirs."""
        m, pending = self.master, self.pending
        out: dict[int, None] = {}
        for tid in after:
            if not isinstance(tid, int) or isinstance(tid, bool) or not 0 <= tid < m.next_tid * m.num_executors:
                raise ValueError(f"dispatch_task: after= names {tid!r}, which is not the id of a dispatched task")
            p = pending.get(tid)
            if p is None:
                if self.early_left and tid // m.num_executors < self.since:
                    out[EARLY] = None  # from before the table: complete, or among the early ones still running
                continue  # else completed: the ordinary rule covers it
            out[tid] = None
            for t in p.closure:
                if t in pending or (t == EARLY and self.early_left):
                    out[t] = None
        return tuple(out)

    def dispatch(self, task: tuple, after: Iterable[int] | None) -> None:
        """Route a task just dispatched (its id, executor, version, args), after the tasks ``after`` names."""
        # read twice below (an iterator would be spent); a numpy integer is the id it equals (ids kept in an array)
        after = None if after is None else [int(t) if isinstance(t, np.integer) else t for t in after]
        closure = self.closure_of(after) if after is not None else ()
        named = set(after) if closure else ()
        waits = tuple(t for t in closure if t == EARLY or t in named)
        capped = len(closure) > MAX_CLOSURE
        p = Pending(task, None, waits if capped else closure, capped)
        self.pending[task[0]] = p
        m = self.master
        if m.recovery.paused:  # a checkpoint holds dispatch: sent after it (unpaused), or kept in it (A6)
            m.paused_tasks.append(task)
            if closure:
                m.paused_after[task[0]] = p.closure
            return
        self.place(p, waits)

    def unpause(self, task: tuple) -> None:
        """A task dispatched during a checkpoint's pause goes now."""
        closure = self.master.paused_after.pop(task[0], None)
        p = self.pending.get(task[0])
        if p is None:  # not in the table (dispatched before it): the ordinary way
            self.master.route(task)
            return
        if closure is None:
            self.master.route(task)  # at its dispatch version: no closure, a dispatch like any other
            p.where = self.master.executor_owner[task[1]] if task[1] not in self.master.moving_executors else None
            return
        # a dispatch made now: tasks of its closure that completed during the pause are covered by the version
        tid, eid, _, args = task
        p.task = (tid, eid, self.master.version, args)
        p.closure = tuple(t for t in closure if t in self.pending or (t == EARLY and self.early_left))
        self.place(p)

    def place(self, p: Pending, waits: tuple | None = None) -> None:
        """Send ``p`` ahead if its worker can settle its closure alone, the ordinary way if nothing is pending, else
        hold it here until its closure has completed (``waits``: the tasks of the closure it names, see hold)."""
        if not p.closure:
            self.route(p)
            return
        placed = None if p.capped else self.ahead_to(p.task[1], p.closure)
        if placed is not None:
            self.go_ahead(p, *placed)
            return
        self.hold(p, waits)

    def go_ahead(self, p: Pending, where: str, remote: list) -> None:
        """Send ``p`` ahead to ``where`` with its closure; the workers of its closure tasks on other workers
        (``remote``: (task id, worker)) hand those off to ``where`` (A9)."""
        p.where = where
        p.remaining = 0
        p.remote = bool(remote)
        self.ahead[where].append((*p.task, p.closure))
        self.sent_ahead += 1
        self.master.sent_in_flight += 1
        if remote:
            self.sent_ahead_remote += 1
            destinations, handoffs = self.destinations, self.handoffs
            for tid, worker in remote:
                told = destinations.setdefault(tid, {})
                if where not in told:
                    told[where] = None
                    handoffs[worker].append((tid, where))

    def hold(self, p: Pending, waits: tuple | None = None) -> None:
        """Hold ``p`` here until every task of its closure has completed: until those of ``waits`` (default: the
        whole closure) have. Waiting for the tasks the dispatch named is enough (docs/design.md, A1): a task
        completes here only after its own closure has, so theirs are complete by then. A chain dispatched ahead
        then costs one wait a task, not one for each task before it (a closure grows with the chain)."""
        waits = p.closure if waits is None else waits
        p.gen += 1
        p.remaining = len(waits)
        for tid in waits:
            self.waiting[tid].append((p, p.gen))

    def ahead_to(self, eid: int, closure: tuple) -> tuple[str, list] | None:
        """Where a task of ``eid`` after ``closure`` goes ahead, and its closure tasks on other workers as
        (task id, worker) (A1, A9); None if it cannot: a closure task not sent (or from before the table, or before
        the worker counted), or an executor moving."""
        m = self.master
        moving, owner = m.moving_executors, m.executor_owner
        if eid in moving or len(owner) != m.num_executors:
            return None
        where = owner[eid]
        n, pending, since = m.num_executors, self.pending, self.since
        remote = []
        for tid in closure:
            if tid == EARLY:
                return None
            p = pending[tid]
            e = tid % n
            if p.where is None or e in moving or owner[e] != p.where or tid // n < since:
                return None
            if p.where != where:
                remote.append((tid, p.where))
        return where, remote

    def route(self, p: Pending) -> None:
        """Send ``p`` the ordinary way, at the current version (A1): a dispatch made now."""
        m = self.master
        tid, eid, _, args = p.task
        p.task = (tid, eid, m.version, args)
        p.closure = ()
        p.remote = False
        eid_moving = eid in m.moving_executors
        m.route(p.task)
        p.where = None if eid_moving else m.executor_owner[eid]
        if p.where is not None and self.waiting.get(tid):
            self.promote(tid)

    def promote(self, tid: int) -> None:
        """``tid`` was just sent: the tasks held here for it may go ahead now, if their worker can settle what they
        still wait for (A1), as a dispatch made now (at the current version, with the tasks still pending)."""
        m = self.master
        # depth first, each task's waiters right after it (the order recursion gave), on a stack of iterators: a
        # chain held here goes ahead link by link, as deep as it is long (recursion failed past 1 000 links)
        stack = [iter(self.waiting.get(tid, ()))]
        while stack:
            for q, gen in stack[-1]:
                if gen != q.gen or q.remaining <= 0 or q.capped:
                    continue
                closure = tuple(t for t in q.closure if t in self.pending or (t == EARLY and self.early_left))
                placed = self.ahead_to(q.task[1], closure) if closure else None
                if placed is None:
                    continue
                qtid, eid, _, args = q.task
                q.task, q.closure = (qtid, eid, m.version, args), closure
                q.gen += 1  # its entries in the waiting lists are stale now
                self.go_ahead(q, *placed)
                if self.waiting.get(qtid):
                    stack.append(iter(self.waiting[qtid]))
                    break
            else:
                stack.pop()

    # -- completions ---------------------------------------------------------------------------------------------
    def note_written(self, results: list, keys: Any) -> None:
        """A DONE whose tasks wrote ``keys`` (None: any) came: kept for those whose completion is relayed (A9)."""
        destinations = self.destinations
        for tid, _ in results:
            if tid in destinations:
                self.written[tid] = keys

    def parks(self, tid: int, result: Any, origin: tuple[str, int] | None = None, again: bool = False) -> bool:
        """Whether the completion of ``tid`` (from ``origin``: the worker and the number of its DONE message) must
        wait (then it is parked here): it went ahead with closure tasks on other workers, and one of its closure has
        not completed yet (A9). Its DONE message does not count as handled meanwhile (A4: its worker still
        remembers the task, which a task sent ahead there later may name)."""
        p = self.pending.get(tid)
        if p is None or not p.remote:
            return False
        pending = self.pending
        for t in p.closure:
            if t in pending:
                self.parked[t].append((tid, result, origin))
                if origin is not None and not again:
                    counts = self.unsettled[origin[0]]
                    counts[origin[1]] = counts.get(origin[1], 0) + 1
                return True
        return False

    def settled(self, origin: tuple[str, int] | None) -> None:
        """A parked completion from ``origin`` was handled."""
        if origin is None:
            return
        counts = self.unsettled.get(origin[0])
        if counts is not None and origin[1] in counts:
            counts[origin[1]] -= 1
            if counts[origin[1]] == 0:
                del counts[origin[1]]

    def handled(self, worker: str, received: int) -> int:
        """How many of ``worker``'s DONE messages are handled (A4): the ``received`` ones but from the first with a
        completion still parked on."""
        counts = self.unsettled.get(worker)
        return min(received, min(counts) - 1) if counts else received

    def completed(self, tid: int) -> None:
        """``tid`` completed (its DONE handled, the version counted): release what waited for it here, relay it to
        the workers told to expect its hand-off, and make ready the completions parked for it (A9)."""
        if self.pending.pop(tid, None) is None and self.early_left:
            self.early_left -= 1  # not in the table: one of the tasks from before it
            if self.early_left == 0:
                self._release(EARLY)
        told = self.destinations.pop(tid, None)
        if told:
            keys = self.written.pop(tid, None)  # None: any key (its DONE came before a destination was told)
            for worker in told:
                self.relays[worker].append((tid, keys))
        parked = self.parked.pop(tid, None)
        if parked:
            self.ready.extend(c for c in parked if not self.parks(*c, again=True))
        self._release(tid)

    def take_ready(self) -> list:
        ready, self.ready = self.ready, []
        return ready

    def _release(self, tid: int) -> None:
        held = self.waiting.pop(tid, None)
        if not held:
            return
        for p, gen in held:
            if gen != p.gen:
                continue  # it went ahead, or came back and waits anew
            p.remaining -= 1
            if p.remaining == 0 and p.task[0] in self.pending:
                self._send_now(p)

    def _send_now(self, p: Pending) -> None:
        """A task held here whose closure has completed: a dispatch made now (A1); during a checkpoint's pause
        too if a task sent ahead to another worker waits for it (it came back from there, A9)."""
        m = self.master
        if m.recovery.paused and p.task[0] not in self.destinations:
            tid, eid, _, args = p.task
            p.task = (tid, eid, m.version, args)
            m.paused_tasks.append(p.task)
        else:
            self.route(p)

    def held_tasks(self) -> list[tuple]:
        """For a checkpoint (A6): ``(tid, eid, args, closure)`` of every task dispatched and not sent, in id order:
        those of the pause, and those held here (whose closures are among them: the job is quiet)."""
        m = self.master
        # the early tasks not yet complete are all paused now (the job is quiet): named one by one
        early = tuple(t[0] for t in m.paused_tasks if t[0] not in self.pending)

        def named(closure: tuple) -> tuple:
            return tuple(t for c in closure for t in (early if c == EARLY else (c,)))

        out = [(t[0], t[1], t[3], named(m.paused_after.get(t[0], ()))) for t in m.paused_tasks]
        out += [(p.task[0], p.task[1], p.task[3], named(p.closure)) for p in self.pending.values() if p.remaining > 0]
        return sorted(out, key=lambda h: h[0])

    def given_back(self, tids: list) -> None:
        """Tasks sent ahead came back (their executor moves, A5): held here until their closures complete."""
        m = self.master
        for tid in tids:
            p = self.pending.get(tid)
            if p is None or p.where is None:
                continue
            m.sent_in_flight -= 1
            if m.stealing is not None:
                m.stealing.done([(tid, None)])
            p.where = None
            p.remote = False
            p.closure = tuple(t for t in p.closure if t in self.pending or (t == EARLY and self.early_left))
            if p.closure:
                self.hold(p)
            else:
                p.gen += 1
                p.remaining = 0
                self._send_now(p)

    def take_ahead(self, worker: str) -> tuple[list, list, list]:
        """What goes to ``worker`` on its next TASKS: tasks sent ahead, hand-offs to make, completions relayed."""
        return self.ahead.pop(worker, []), self.handoffs.pop(worker, []), self.relays.pop(worker, [])

    def has_news(self) -> bool:
        return bool(self.ahead or self.handoffs or self.relays)

    def reset(self) -> None:
        """A full recovery: every task of the epoch is forgotten (the restored driver dispatches again)."""
        self.pending.clear()
        self.waiting.clear()
        self.ahead.clear()
        self.handoffs.clear()
        self.relays.clear()
        self.destinations.clear()
        self.written.clear()
        self.parked.clear()
        self.ready.clear()
        self.unsettled.clear()
        self.since = self.master.next_tid
        self.early_left = 0
