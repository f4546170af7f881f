"""Dependent dispatch, the master's side: ``dispatch_task(e, args, after=tids)`` (docs/design.md, A1-A7).

A task dispatched after tasks that have not completed goes to its worker at once, with its *closure* (the pending
tasks it must wait for, transitively), when that worker can settle the wait alone: every closure task was sent
there and no executor involved is moving. The worker starts it as soon as their flushes are acknowledged, with no
message through the master (``litz/worker.py``, the held-task functions). Otherwise the master holds the task and
routes it, at the version of that moment, once its whole closure has completed: the ordinary dispatch.

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

    __slots__ = ("task", "where", "closure", "remaining", "gen", "capped")

    def __init__(self, task: tuple, where: str | None, closure: tuple, capped: bool = False):
        self.task = task          # (task id, executor, version, args)
        self.where = where        # the worker it was sent to; None: held here (by this table, a pause or a move)
        self.closure = closure    # pending task ids it waits for (empty once sent the ordinary way)
        self.remaining = 0        # waited-for tasks not yet complete, while held here
        self.gen = 0              # bumped when it stops waiting here: older entries in the waiting lists are stale
        self.capped = capped      # its closure was longer than MAX_CLOSURE: only the tasks it named, never ahead


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
        where = None if p.capped else self.settles_alone(p.task[1], p.closure)
        if where is not None:
            p.where = where
            self.ahead[where].append((*p.task, p.closure))
            self.sent_ahead += 1
            self.master.sent_in_flight += 1
            return
        self.hold(p, waits)

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

    def settles_alone(self, eid: int, closure: tuple) -> str | None:
        """The worker that can release a task of ``eid`` after ``closure`` by itself (A1), or None."""
        m = self.master
        moving = m.moving_executors
        if eid in moving or len(m.executor_owner) != m.num_executors:
            return None
        where = m.executor_owner[eid]
        n, pending, since = m.num_executors, self.pending, self.since
        for tid in closure:
            if tid == EARLY:
                return None
            p = pending[tid]
            e = tid % n
            if p.where != where or e in moving or m.executor_owner[e] != where or tid // n < since:
                return None
        return where

    def route(self, p: Pending) -> None:
        """Send ``p`` the ordinary way, at the current version (A1): a dispatch made now."""
        m = self.master
        tid, eid, _, args = p.task
        p.task = (tid, eid, m.version, args)
        p.closure = ()
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
                where = self.settles_alone(q.task[1], closure) if closure else None
                if where is None:
                    continue
                qtid, eid, _, args = q.task
                q.task, q.closure, q.where, q.remaining = (qtid, eid, m.version, args), closure, where, 0
                q.gen += 1  # its entries in the waiting lists are stale now
                self.ahead[where].append((*q.task, closure))
                self.sent_ahead += 1
                m.sent_in_flight += 1
                if self.waiting.get(qtid):
                    stack.append(iter(self.waiting[qtid]))
                    break
            else:
                stack.pop()

    # -- completions ---------------------------------------------------------------------------------------------
    def completed(self, tid: int) -> None:
        """``tid`` completed (its DONE handled, the version counted): release what waited for it here."""
        if self.pending.pop(tid, None) is None and self.early_left:
            self.early_left -= 1  # not in the table: one of the tasks from before it
            if self.early_left == 0:
                self._release(EARLY)
        self._release(tid)

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
        """A task held here whose closure has completed: a dispatch made now (A1)."""
        m = self.master
        if m.recovery.paused:
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
            p.closure = tuple(t for t in p.closure if t in self.pending or (t == EARLY and self.early_left))
            if p.closure:
                self.hold(p)
            else:
                p.gen += 1
                p.remaining = 0
                self._send_now(p)

    def take_ahead(self, worker: str) -> list:
        return self.ahead.pop(worker, [])

    def reset(self) -> None:
        """A full recovery: every task of the epoch is forgotten (the restored driver dispatches again)."""
        self.pending.clear()
        self.waiting.clear()
        self.ahead.clear()
        self.since = self.master.next_tid
        self.early_left = 0
