"""The worker process's versioned parameter cache and its update log (thesis §4.4).

Cache rule: a value fetched by a task of version v reflects every update of every task completed before
any task of version <= v was dispatched, so it may serve any task of version <= v. Update log rule:
``ps_update`` deltas are summed per key in the process and sent in one flush, which must be acknowledged
before the results of the tasks that made them go back to the master.
"""
from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

MISS = object()


class ParamCache:
    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[int, Any]] = {}

    def lookup(self, key: Hashable, version: int) -> Any:
        entry = self._entries.get(key)
        if entry is not None and version <= entry[0]:
            return entry[1]
        return MISS

    def store(self, key: Hashable, version: int, value: Any) -> None:
        entry = self._entries.get(key)
        if entry is None or version >= entry[0]:
            self._entries[key] = (version, value)

    def __len__(self) -> int:
        return len(self._entries)

    def nbytes(self) -> int:
        return sum(v.nbytes for _, v in self._entries.values() if isinstance(v, np.ndarray))


def check_delta(key: Hashable, delta: Any) -> Any:
    """Deltas are numbers or numpy arrays; anything array-like becomes an array."""
    if isinstance(delta, (np.ndarray, int, float, np.number)) and not isinstance(delta, bool):
        return delta
    try:
        arr = np.asarray(delta)
    except Exception:
        arr = None
    if arr is None or arr.dtype == object:
        raise TypeError(f"ps_update({key!r}): delta must be a number or numpy array, "
                        f"not {type(delta).__name__}")
    return arr


def add_into(key: Hashable, current: Any, delta: Any, in_place: bool) -> Any:
    """``current + delta``, in place when allowed; a shape mismatch names the key."""
    if isinstance(current, np.ndarray):
        if isinstance(delta, np.ndarray) and delta.shape != current.shape:
            raise ValueError(f"ps_update({key!r}): delta shape {delta.shape} does not match "
                             f"value shape {current.shape}")
        if in_place and current.flags.writeable:
            np.add(current, delta, out=current, casting="same_kind")
            return current
        return np.add(current, delta).astype(current.dtype, copy=False)
    if isinstance(delta, np.ndarray) and not isinstance(current, np.ndarray):
        return np.add(delta, current)
    return current + delta


class UpdateLog:
    """Per-process sum of deltas per key since the last flush."""

    def __init__(self) -> None:
        self._log: dict[Hashable, Any] = {}

    def add(self, key: Hashable, delta: Any) -> None:
        delta = check_delta(key, delta)
        cur = self._log.get(key)
        if cur is None:
            # own copy: the app may reuse its delta buffer; the log then adds into it in place
            self._log[key] = np.array(delta) if isinstance(delta, np.ndarray) else delta
        else:
            self._log[key] = add_into(key, cur, delta, in_place=True)

    def merge(self, other: UpdateLog) -> None:
        """Add another log's sums into this one (a finished task's staged updates)."""
        mine = self._log
        for key, delta in other._log.items():
            cur = mine.get(key)
            mine[key] = delta if cur is None else add_into(key, cur, delta, in_place=True)

    def take(self) -> dict[Hashable, Any]:
        log, self._log = self._log, {}
        return log

    def __len__(self) -> int:
        return len(self._log)
