"""The worker process's versioned parameter cache and its update log (thesis §4.4).

Cache rule: a value fetched by a task of version v reflects every update of every task completed before
any task of version <= v was dispatched, so it may serve any task of version <= v. Update log rule:
``ps_update`` deltas are summed per key in the process and sent in one flush, which must be acknowledged
before the results of the tasks that made them go back to the master.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

import numpy as np

MISS = object()


def read_only(value: Any) -> Any:
    """``value`` as tasks may get it: a numpy array is marked read-only (not copied). One cached object
    serves every task on the worker, so a task writing into it would change what later tasks read while
    the servers keep the old value; it gets a ValueError instead."""
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    return value


class ParamCache:
    """Values by key, each with the version it was fetched for; some also *live*.

    A live entry is the server's value as of its fetch plus every update this worker has since flushed
    and had acknowledged for the key (applied here in the order the server applied them: a server answers
    a worker's gets and acknowledges its updates in the order it sent them, on one channel), and no other
    worker has written the key since the fetch as far as the master has told this worker. The master sends
    with every dispatch the keys other workers' completed tasks wrote since its previous dispatch here
    (:meth:`invalidate`), so a live entry reflects every update of every task completed before the
    dispatch of a task that reads it, whatever the task's version: it may serve any task the master
    dispatched to this worker directly. A fetch records a :meth:`ticket`; its value is stored live only if
    no invalidation of its key came after the ticket (the value may predate the foreign write).
    """

    def __init__(self, live: bool = True) -> None:
        self._live_on = live  # off: no entry is ever live, only the version rule serves (LITZ_LIVE_CACHE=0)
        self._entries: dict[Hashable, tuple[int, Any]] = {}
        self._live: set[Hashable] = set()
        self._seq = 0  # invalidations so far
        self._invalidated: dict[Hashable, int] = {}  # key -> seq of its latest invalidation
        self._all_invalidated = 0  # seq of the latest invalidation of every key
        self.live_hits = 0  # lookups only a live entry could serve (the version rule alone would miss)

    def lookup(self, key: Hashable, version: int, live_ok: bool = False) -> Any:
        entry = self._entries.get(key)
        if entry is not None:
            if version <= entry[0]:
                return entry[1]
            if live_ok and key in self._live:
                self.live_hits += 1
                return entry[1]
        return MISS

    def ticket(self) -> int:
        """For a fetch about to be sent: pass it to :meth:`store` with the fetched value."""
        return self._seq

    def store(self, key: Hashable, version: int, value: Any, ticket: int | None = None) -> None:
        entry = self._entries.get(key)
        if entry is None or version >= entry[0]:
            self._entries[key] = (version, value)
            if (ticket is not None and self._live_on and self._all_invalidated <= ticket
                    and self._invalidated.get(key, 0) <= ticket):
                self._live.add(key)
            else:
                self._live.discard(key)

    def invalidate(self, keys: Iterable[Hashable] | None) -> None:
        """Another process wrote ``keys`` (None: any key): their entries and fetches in flight are not live."""
        self._seq += 1
        if keys is None:
            self._all_invalidated = self._seq
            self._live.clear()
            self._invalidated.clear()
            return
        seq, invalidated, live = self._seq, self._invalidated, self._live
        for key in keys:
            invalidated[key] = seq
            live.discard(key)

    def write_through(self, items: Iterable[tuple]) -> None:
        """This worker's acknowledged updates ``(shard, key, delta)``, added into their live entries (into new
        objects, read-only as every value a task gets: a task may still hold the old value)."""
        entries, live = self._entries, self._live
        for _, key, delta in items:
            if key in live:
                version, value = entries[key]
                try:
                    value = plus(key, value, delta)
                except Exception:  # the server refuses it too and the job fails; just stop serving it
                    live.discard(key)
                    continue
                entries[key] = (version, read_only(value))

    def live_plus(self, key: Hashable, deltas: list) -> Any:
        """The live entry of ``key`` plus ``deltas`` (this worker's updates in flight for it), computed the way
        :meth:`write_through` will add them at their acknowledgements; MISS if the entry is not live or a delta
        does not add (docs/design.md, A3)."""
        if key not in self._live:
            return MISS
        value = self._entries[key][1]
        try:
            for delta in deltas:
                value = plus(key, value, delta)
        except Exception:
            return MISS
        self.live_hits += 1
        return read_only(value)

    def is_live(self, key: Hashable) -> bool:
        return key in self._live

    def __len__(self) -> int:
        return len(self._entries)

    def nbytes(self) -> int:
        return sum(v.nbytes for _, v in self._entries.values() if isinstance(v, np.ndarray))


def plus(key: Hashable, value: Any, delta: Any) -> Any:
    """``value + delta`` into a new object, as a server adds it (``None``: a key never written, which the delta
    sets)."""
    if value is None:
        return np.array(delta) if isinstance(delta, np.ndarray) else delta
    return add_into(key, value, delta, in_place=False)


def check_delta(key: Hashable, delta: Any) -> Any:
    """Deltas are numbers or numeric numpy arrays; anything array-like becomes an array. A string, bytes or object
    array is refused here: as a key's first update it would be stored as the value, and every later addition
    would fail far from the task that wrote it."""
    if isinstance(delta, (int, float, np.number)) and not isinstance(delta, bool):
        return delta
    if isinstance(delta, np.ndarray):
        arr = delta
    else:
        try:
            arr = np.asarray(delta)
        except Exception:
            arr = None
    if arr is None or arr.dtype.kind not in "biufc":
        what = type(delta).__name__ if arr is None or not isinstance(delta, np.ndarray) else f"{arr.dtype} array"
        raise TypeError(f"ps_update({key!r}): delta must be a number or numeric numpy array, not {what}")
    return arr


def add_into(key: Hashable, current: Any, delta: Any, in_place: bool) -> Any:
    """``current + delta`` under the update rule, the same on every path (server in place or not, the
    worker's write-through): a numpy array value keeps its dtype and shape, and the delta is added under
    numpy's "same_kind" casting into the value's dtype (an int delta into a float value, a float64 one into
    float32: yes; a float delta, Python float included, into an int value: refused, naming the key and both
    dtypes). Numbers as values follow ordinary arithmetic. In place when ``in_place`` and the array is
    writable, else into a new array, computed the same way either way."""
    if isinstance(current, np.ndarray):
        if isinstance(delta, np.ndarray) and delta.shape != current.shape:
            raise ValueError(f"ps_update({key!r}): delta shape {delta.shape} does not match "
                             f"value shape {current.shape}")
        out = current if in_place and current.flags.writeable else np.empty_like(current)
        try:
            return np.add(current, delta, out=out, casting="same_kind")
        except TypeError:  # numpy's UFuncTypeError: the delta's dtype does not cast into the value's
            raise TypeError(f"ps_update({key!r}): cannot add a {_dtype_name(delta)} delta to a {current.dtype} "
                            f"value: a delta is cast to the value's dtype under numpy's 'same_kind' rule "
                            f"(the first update of a key fixes its dtype)") from None
    if isinstance(delta, np.ndarray):
        return np.add(delta, current)
    return current + delta


def _dtype_name(delta: Any) -> str:
    dtype = getattr(delta, "dtype", None)
    return str(dtype) if dtype is not None else f"Python {type(delta).__name__}"


def sum_deltas(key: Hashable, total: Any, delta: Any) -> Any:
    """``total + delta`` for an update log, which does not know the value's dtype: summed losslessly (numpy's
    type promotion, in place into ``total`` when its dtype holds the result), the servers then apply the sum
    under :func:`add_into`'s rule. Promotion takes the widest kind of the parts, so the sum is refused
    where a part would be (bar uint64 with int64, which numpy promotes to float64). Casting here into the
    first delta's dtype would refuse an int then a float delta to a float value, which are accepted one by
    one, and would make the outcome depend on which tasks' deltas one flush happens to sum."""
    if isinstance(total, np.ndarray):
        if isinstance(delta, np.ndarray) and delta.shape != total.shape:
            raise ValueError(f"ps_update({key!r}): delta shape {delta.shape} does not match "
                             f"the shape {total.shape} of an earlier delta")
        if np.result_type(total, delta) == total.dtype:
            return np.add(total, delta, out=total)
        return np.add(total, delta)
    if isinstance(delta, np.ndarray):
        return np.add(delta, total)
    return total + delta


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
            self._log[key] = sum_deltas(key, cur, delta)

    def merge(self, other: UpdateLog) -> None:
        """Add another log's sums into this one (a finished task's staged updates)."""
        mine = self._log
        for key, delta in other._log.items():
            cur = mine.get(key)
            mine[key] = delta if cur is None else sum_deltas(key, cur, delta)

    def take(self) -> dict[Hashable, Any]:
        log, self._log = self._log, {}
        return log

    def __len__(self) -> int:
        return len(self._log)
