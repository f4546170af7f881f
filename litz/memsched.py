"""Memory-aware choice of an executor for a task (thesis §4.8: a framework that knows the tasks can order them so
that memory does not thrash). docs/design.md, "Memory-aware scheduling", O1-O5.

A driver that does not mind which of several executors runs a task (``Driver.choose_executor``,
``Driver.dispatch_task_any``) lets the master pick the one cheapest to run now: on the least loaded worker, resident
rather than spilled, least loaded itself. The master learns what is spilled from the workers' ``evict`` and ``load``
events. The choice is made at the call and the task is then an ordinary task of that executor (O1), so nothing here
touches the consistency rule. When the next candidate on the chosen worker is spilled, the worker is told to
prefetch it (O3): it loads it while the chosen executor's tasks run, if it fits in the budget.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence


def rank(candidates: Sequence[int], worker_of: Callable[[int], str], spilled: set[int],
         outstanding: dict[int, int], speeds: Mapping[str, float] | None = None) -> list[int]:
    """``candidates`` best first (O2): the worker that would finish the task soonest first (its outstanding chosen
    tasks plus this one, over its measured speed in ``speeds``; a worker not measured yet counts at the mean of
    those that are, all alike when none is), then resident before spilled (an executor with a task outstanding
    counts as resident: it is loaded for it), then the executor's own outstanding tasks, then the lower id. A pure
    function of its arguments: a seed replays it."""
    load: dict[str, int] = defaultdict(int)
    for eid, n in outstanding.items():
        if n:
            load[worker_of(eid)] += n
    speeds = speeds or {}
    known = [v for v in speeds.values() if v and v > 0]
    usual = sum(known) / len(known) if known else 1.0

    def finish(w: str) -> float:
        v = speeds.get(w)
        return (load[w] + 1) / (v if v and v > 0 else usual)

    return sorted(set(candidates), key=lambda e: (finish(worker_of(e)), e in spilled and not outstanding.get(e),
                                                  outstanding.get(e, 0), e))


class MemoryScheduler:
    """The master's side of memory-aware scheduling: what is spilled where, the chosen tasks outstanding per
    executor, and the prefetch hints to send behind the tasks (O3)."""

    def __init__(self, num_executors: int):
        self.num_executors = num_executors
        self.spilled: set[int] = set()  # executors a worker said it evicted and has not loaded since
        self.outstanding: dict[int, int] = defaultdict(int)  # executor -> tasks dispatched since counting began
        self.tids: set[int] = set()  # the ids of those tasks not yet done
        self.hints: dict[str, tuple[int, int]] = {}  # worker -> (executor to prefetch, the chosen one), behind TASKS
        self.choices = 0
        self.hints_sent = 0

    def choose(self, candidates: Iterable[int], worker_of: Callable[[int], str],
               speeds: Mapping[str, float] | None = None) -> tuple[int, int | None]:
        """The executor to run a task on, and a spilled executor on the same worker to prefetch (or None);
        ``speeds``: the workers' measured speeds (tasks per second), where known."""
        ranked = rank(list(candidates), worker_of, self.spilled, self.outstanding, speeds)
        if not ranked:
            raise ValueError("choose_executor: no candidate executors")
        best = ranked[0]
        self.choices += 1
        worker = worker_of(best)
        nxt = next((e for e in ranked[1:] if worker_of(e) == worker), None)
        hint = nxt if nxt is not None and nxt in self.spilled and not self.outstanding.get(nxt) else None
        return best, hint

    def dispatched(self, tid: int, eid: int) -> None:
        self.tids.add(tid)
        self.outstanding[eid] += 1

    def done(self, results: list) -> None:
        """A DONE's ``(task id, result)`` pairs: the counted ones are no longer outstanding."""
        tids, outstanding, n = self.tids, self.outstanding, self.num_executors
        for tid, _ in results:
            if tid in tids:
                tids.discard(tid)
                outstanding[tid % n] -= 1

    def memory_event(self, kind: str, eid: int) -> None:
        if kind == "evict":
            self.spilled.add(eid)
        elif kind in ("load", "prefetch"):
            self.spilled.discard(eid)

    def moved(self, eid: int) -> None:
        """A moved executor arrives resident (its source loaded it to send it)."""
        self.spilled.discard(eid)

    def take_hints(self) -> dict[str, tuple[int, int]]:
        hints, self.hints = self.hints, {}
        self.hints_sent += len(hints)
        return hints

    def reset(self, num_executors: int) -> None:
        """A full recovery: every task is forgotten and the workers restore every executor into memory."""
        self.num_executors = num_executors
        self.spilled.clear()
        self.outstanding.clear()
        self.tids.clear()
        self.hints.clear()
