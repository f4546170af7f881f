"""Dependent dispatch, the worker's side: tasks the master sent ahead, held until the tasks they wait for have
been flushed here (docs/design.md, A2-A9; the master's side is :mod:`litz.after`).

A held task waits for its *closure*: task ids the master knows ran, or will run, on this worker. It is released
when the last of them has been flushed here (``Worker.flush``: its updates sent to the servers, the local
hand-off, A2), and the keys those flushes wrote become *fresh* for it: while a closure flush is unacknowledged it
reads them as live entries plus this worker's in-flight deltas, or waits for the acknowledgements; after, only
from live entries or fetches asked since (A3). The flushes still unacknowledged at its release are its ``early``
set: its own DONE waits for theirs (A7). A closure task may have been flushed or reported done before the held
task arrived; this worker remembers what it flushed until it is acknowledged, and what it reported until the
master says it has handled those DONE messages (A4).

A closure task of another worker is *handed off*: that worker sends its id and keys once it reported it done, or
the master relays its completion (A9); its keys are fresh for the held task as an acknowledged flush's are.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

ALL = True  # a task's fresh keys: every key (a flush wrote more keys than it names)
FRESH_VERSION = 1 << 62  # looked up at this version, a cache entry serves only if it is live (the version rule never)
# Hand-offs kept for tasks not held here (yet): one may cross its task's TASKS. Dropping one costs only the wait for
# the master's relay of the same completion (A9), so the table is bounded, oldest out first.
MAX_HANDED = 4096


class HeldTasks:
    """One worker's held tasks and its memory of the tasks it reported done."""

    def __init__(self) -> None:
        self.recording = False  # on from the first TASKS that carries the master's DONE count
        self.done_seq = 0  # DONE messages sent this epoch (the master counts those it handled)
        self.acked: dict[int, Any] = {}  # task id reported done -> the keys its flush wrote (None: any)
        self.inflight: dict[int, tuple[Any, int]] = {}  # task id flushed, not yet reported -> (keys written, flush id)
        self.log: deque[tuple[int, list]] = deque()  # (DONE number, its task ids), to forget them in order
        self.waiting: dict[int, list] = {}  # task id not yet done here -> the held tasks that wait for it
        self.held: dict[int, Any] = {}  # held task id -> Task
        self.handed: dict[int, Any] = {}  # task id of another worker handed off here -> its keys, until relayed (A9)
        self.handoff_to: dict[int, list[str]] = {}  # task id here -> workers to hand it off to once done (A9)

    def arrive(self, task: Any, closure: tuple) -> bool:
        """A task sent ahead has arrived: True if its closure is done already (release it now), else it is held."""
        task.fresh, task.deps, task.closure, task.early = set(), 0, closure, set()
        acked, inflight, waiting = self.acked, self.inflight, self.waiting
        for tid in closure:
            if tid in acked:
                add_fresh(task, acked[tid])
            elif tid in self.handed:
                add_fresh(task, self.handed[tid])
            elif tid in inflight:
                written, fid = inflight[tid]
                add_fresh(task, written)
                task.early.add(fid)
            else:
                waiting.setdefault(tid, []).append(task)
                task.deps += 1
        if task.deps:
            self.held[task.tid] = task
            return False
        return True

    def flushed(self, tids: list, written: Any, fid: int) -> list:
        """Flush ``fid``, which wrote ``written`` (a list, or None: any), left with ``tids``' updates: the held tasks
        that now have their whole closure flushed here, to release (A2)."""
        if not self.recording:
            return []
        released: list = []
        for tid in tids:
            self.inflight[tid] = (written, fid)
            self._done_for(tid, written, fid, released)
        return released

    def sent_done(self, tids: list, written: Any) -> list:
        """``tids`` are reported done (queued for the master's next DONE), their flush having written ``written``
        (a list, or None: any): the held tasks that now have their whole closure done, to release."""
        if not self.recording:
            return []
        released: list = []
        for tid in tids:
            self.acked[tid] = written
            self.inflight.pop(tid, None)
            self._done_for(tid, written, None, released)
        return released

    def news(self, tid: int, relayed: bool) -> bool:
        """Whether a hand-off of another worker's task ``tid`` tells something new: not a repeat, nor the master's
        relay of a direct hand-off that came first (then the relay ends its memory here, A9)."""
        handed = self.handed
        if relayed:
            return handed.pop(tid, handed) is handed
        return tid not in handed

    def handed_off(self, tid: int, written: Any, relayed: bool) -> list:
        """Another worker's task ``tid``, which wrote ``written`` (a list, or None: any), is reported done there: by
        its worker (``relayed`` False; kept until the relay) or by the master (True). The held tasks it was the
        last for, to release."""
        if not relayed:
            handed = self.handed
            if len(handed) >= MAX_HANDED:
                del handed[next(iter(handed))]
            handed[tid] = written
        released: list = []
        self._done_for(tid, written, None, released)
        return released

    def hand_off(self, tids: list, written: Any, out: dict[str, list]) -> None:
        """``tids``, which wrote ``written``, are reported done here: the hand-offs they owe go into ``out`` (a
        defaultdict(list) by destination)."""
        handoff_to = self.handoff_to
        for tid in tids:
            for dest in handoff_to.pop(tid, ()):
                out[dest].append((tid, written))

    def drop_handoffs(self, tids: Iterable[int]) -> None:
        """``tids`` leave this worker unfinished (with their executor, or back to the master): their hand-offs are
        the master's relays' to make (A9)."""
        handoff_to = self.handoff_to
        for tid in tids:
            handoff_to.pop(tid, None)

    def numbered(self, results: list) -> None:
        """A DONE message with ``results`` ((task id, result) pairs) left: the master counts messages (A4)."""
        self.done_seq += 1
        if self.recording:
            self.log.append((self.done_seq, [tid for tid, _ in results]))

    def _done_for(self, tid: int, written: Any, fid: int | None, released: list) -> None:
        """``tid`` is flushed (in flush ``fid``, still in flight) or reported done (``fid`` None): the held tasks
        waiting for it count it, and those it was the last for go into ``released``."""
        if not self.waiting:
            return
        for task in self.waiting.pop(tid, ()):
            add_fresh(task, written)
            if fid is not None:
                task.early.add(fid)
            task.deps -= 1
            if task.deps == 0:
                del self.held[task.tid]
                released.append(task)

    def forget(self, seen: int) -> None:
        """The master has handled this worker's first ``seen`` DONE messages: no dispatch will name their tasks."""
        log, acked = self.log, self.acked
        while log and log[0][0] <= seen:
            for tid in log.popleft()[1]:
                acked.pop(tid, None)

    def drop(self, task: Any) -> None:
        """``task`` is no longer held here (it went back to the master)."""
        del self.held[task.tid]
        for tid in task.closure:
            tasks = self.waiting.get(tid)
            if tasks and task in tasks:
                tasks.remove(task)
                if not tasks:
                    del self.waiting[tid]


def add_fresh(task: Any, written: Any) -> None:
    if written is None:
        task.fresh = ALL
    elif task.fresh is not ALL:
        task.fresh.update(written)
