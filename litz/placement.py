"""Balancing policy: spread items (executors or shards) evenly over active processes, moving as few as possible.

Items on leaving processes all move; a process above its quota gives up only its excess; quotas that
exceed the even share by one go to the processes that already hold the most, so nothing moves that
need not. Processes about to join (started, not ready yet) count in the quotas, but moves to them wait
until they have joined: growing 2 -> 4 workers moves 8 of 16 executors, not 5 for the third worker and
then 4 more (one of them again) for the fourth.
"""
from __future__ import annotations

from collections import defaultdict


def plan_moves(owner: list[str], moving: dict[int, str], active: list[str],
               pending: list[str] = ()) -> list[tuple[int, str, str]]:
    """Moves ``(item, source, dest)`` that balance ``owner`` (item -> process) over ``active`` and ``pending``.

    ``moving`` maps items already in flight to their destination; they count there and are not moved again.
    ``pending`` are processes about to join: they get their quota in the plan, but the moves to them are left
    out (their items stay where they are until the next plan, made once they have joined).
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
    base, extra = divmod(len(owner), len(active))
    ranked = sorted(active, key=lambda p: (-len(held[p]), p))
    quota = {p: base + (1 if i < extra else 0) for i, p in enumerate(ranked)}
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
