"""Point-to-point messages between executors, carried by the parameter server.

Parameter-server updates are additive, and a key can never be deleted. A message from executor ``src`` to
executor ``dst`` is an ``(m, 3)`` int32 record array. It is written into a fixed set of reusable *slots*,
the keys ``(name, src, dst, j)``. Slot ``j`` holds ``BASE << j`` records, so a message of ``m`` records
uses the first ``J`` slots with ``BASE * (2**J - 1) >= m``: at most about half of it is padding, and a
small message costs a small slot.

To overwrite a slot, the sender sends ``new - old``: the delta from the content it wrote last time, which
it remembers. Integer addition is exact (it wraps modulo 2**32 in both directions), so after the update
the server holds exactly ``new``, bit for bit. That is also why float32 payloads travel as their bits.
Server memory therefore stays at the largest message ever sent on each (src, dst) pair, and so do the
workers' parameter caches, because the keys are reused and never accumulate.

The receiver learns how many records to read from the driver, which collects the counts from the
senders' task results. It reads only the slots it needs. The consistency rule makes this safe: the
receiving task is dispatched after every sending task has completed, so it sees their updates. A sender
rewrites a slot only in a later phase, dispatched after the receiver has completed.
"""
from __future__ import annotations

from collections.abc import Hashable

import numpy as np

BASE = 512  # records in slot 0; slot j holds BASE << j
RECORD_BYTES = 12


def slots_for(count: int) -> int:
    """Number of slots a message of ``count`` records occupies."""
    j, capacity = 0, 0
    while capacity < count:
        capacity += BASE << j
        j += 1
    return j


def slot_bounds(j: int) -> tuple[int, int]:
    lo = BASE * ((1 << j) - 1)
    return lo, lo + (BASE << j)


class Outbox:
    """The sending side of one executor: remembers what it last wrote into each slot."""

    def __init__(self, name: str, me: int):
        self.name, self.me = name, me
        self.last: dict[tuple[int, int], np.ndarray] = {}
        self.wire_bytes = 0  # slot bytes written, padding included

    def post(self, dst: int, records: np.ndarray) -> list[tuple[Hashable, np.ndarray]]:
        """``(key, delta)`` items that write ``records`` to ``dst``; pass them to ``ps_update_many``."""
        items = []
        records = np.ascontiguousarray(records, dtype=np.int32).reshape(-1, 3)
        for j in range(slots_for(len(records))):
            lo, hi = slot_bounds(j)
            slot = np.zeros((hi - lo, 3), np.int32)
            part = records[lo:hi]
            slot[:len(part)] = part
            old = self.last.get((dst, j))
            delta = slot if old is None else slot - old  # int32: wraps, so old + delta == slot exactly
            self.last[(dst, j)] = slot
            self.wire_bytes += slot.nbytes
            items.append(((self.name, self.me, dst, j), delta))
        return items


def inbox_keys(name: str, me: int, counts: dict[int, int]) -> list[tuple[Hashable, int, int]]:
    """``(key, src, slot)`` of every slot to read, for ``counts[src]`` records from each sender."""
    return [((name, src, me, j), src, j) for src, count in sorted(counts.items()) for j in range(slots_for(count))]


def assemble(keys: list[tuple[Hashable, int, int]], values: list, counts: dict[int, int]) -> np.ndarray:
    """Concatenate the slots read (in :func:`inbox_keys` order) into one ``(m, 3)`` record array."""
    parts = []
    for (_, src, j), value in zip(keys, values, strict=True):
        if value is None:
            raise RuntimeError(f"mailbox slot {j} from executor {src} was never written")
        lo, hi = slot_bounds(j)
        take = min(hi, counts[src]) - lo
        parts.append(np.asarray(value)[:take])
    if not parts:
        return np.zeros((0, 3), np.int32)
    return np.concatenate(parts)
