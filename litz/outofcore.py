"""Out-of-core execution on a worker (thesis §4.8): a memory budget for executor state, input data included.

Over the budget, idle executors (no task queued, waiting or running) are written to a private spill
directory and dropped, least recently used first. Input data (``input_attrs``, read-only by contract) is
written once and its file kept across later evictions and loads; only the rest of the state is rewritten
each time, so evicting an executor that holds mostly input costs almost nothing. A task for an evicted
executor makes it load in a background thread at once (prefetch), so loading overlaps the other
executors' tasks. A budget smaller than one executor's state still runs: one executor at a time. Spill
files carry a checksum; a corrupted one is an error naming the file, never silently wrong state. Spill
files go when the worker ends.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np

from .errors import LitzError


def state_bytes(obj: Any) -> int:
    """Bytes an executor holds: numpy buffers exactly, containers one level deep, other objects by size."""
    total = 0
    for value in vars(obj).values():
        total += _bytes(value, depth=1)
    return total


def _bytes(value: Any, depth: int) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    if depth > 0 and isinstance(value, (list, tuple)):
        return sys.getsizeof(value) + sum(_bytes(v, depth - 1) for v in value)
    if depth > 0 and isinstance(value, dict):
        return sys.getsizeof(value) + sum(_bytes(v, depth - 1) for v in value.values())
    return sys.getsizeof(value)


def parse_bytes(text: str | int) -> int:
    """'512M', '2G', '1.5g', '1000000' -> bytes."""
    if isinstance(text, int):
        return text
    s = str(text).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:], 1)
    try:
        value = float(s[:-1] if scale > 1 else s)
    except ValueError:
        raise LitzError(f"bad memory size {text!r}: expected bytes, or a number with K, M, G or T") from None
    if value <= 0:
        raise LitzError(f"memory size must be positive, got {text!r}")
    return int(value * scale)


@dataclass
class Spilled:
    path: str
    sha256: str
    nbytes: int


def _write(path: str, data: bytes, kept: bool = False) -> Spilled:
    """A spill file. A ``kept`` one (input data) stays on disk between loads: its pages are dropped from the
    page cache, which would otherwise hold a second copy of the input in the memory being saved."""
    with open(path, "wb") as f:
        f.write(data)
        if kept:
            f.flush()
            os.fdatasync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return Spilled(path, hashlib.sha256(data).hexdigest(), len(data))


class Residency:
    """Which executors are in memory, their sizes, the spilled ones, and loads under way."""

    def __init__(self, owner: str, budget: int | None = None, spill_root: str | None = None):
        self.budget = budget
        self.sizes: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()  # in memory, least recently used first
        self.spilled: dict[int, Spilled] = {}
        # input data kept on disk per executor, with the ids of the objects it holds: a reassigned input
        # attribute (another object) is written again, so a stale file is never loaded
        self.inputs: dict[int, tuple[Spilled, dict[str, int]]] = {}
        self.loading: dict[int, Future] = {}
        self.dirty: set[int] = set()
        self._pool: ThreadPoolExecutor | None = None
        root = spill_root or os.environ.get("LITZ_SPILL_DIR") or tempfile.gettempdir()
        self._root, self._owner = root, owner
        self.spill_dir: str | None = None

    def _dir(self) -> str:
        if self.spill_dir is None:
            try:
                self.spill_dir = tempfile.mkdtemp(prefix=f"litz-spill-{self._owner}-", dir=self._root)
            except OSError as exc:
                raise LitzError(f"spill directory under {self._root} is not writable: {exc.strerror}") from None
        return self.spill_dir

    # -- bookkeeping ---------------------------------------------------------------------------------
    def add(self, eid: int, executor: Any) -> None:
        self.sizes[eid] = state_bytes(executor)
        self.lru[eid] = None
        self.lru.move_to_end(eid)

    def touch(self, eid: int) -> None:
        if eid in self.lru:
            self.lru.move_to_end(eid)
            self.dirty.add(eid)

    def remove(self, eid: int) -> None:
        self.sizes.pop(eid, None)
        self.lru.pop(eid, None)
        self.dirty.discard(eid)
        rec = self.spilled.pop(eid, None)
        if rec is not None:
            _unlink(rec.path)
        self._drop_input(eid)

    def _drop_input(self, eid: int) -> None:
        kept = self.inputs.pop(eid, None)
        if kept is not None:
            _unlink(kept[0].path)

    def refresh(self, executors: dict[int, Any]) -> None:
        for eid in self.dirty:
            if eid in executors:
                self.sizes[eid] = state_bytes(executors[eid])
        self.dirty.clear()

    def resident(self) -> int:
        return sum(self.sizes.get(e, 0) for e in self.lru)

    # -- evicting and loading ------------------------------------------------------------------------
    def evict(self, eid: int, executor: Any) -> tuple[int, float]:
        """Write the executor to disk (its input data only if not already there); the caller drops it.
        Returns (bytes written, seconds)."""
        t0 = time.perf_counter()
        state = executor.__getstate__()
        written = 0
        names = [a for a in getattr(executor, "input_attrs", ()) if a in state] if isinstance(state, dict) else []
        if names:
            ids = {a: id(state[a]) for a in names}
            kept = self.inputs.get(eid)
            if kept is None or kept[1] != ids:
                data = cloudpickle.dumps({a: state[a] for a in names}, protocol=5)
                rec = _write(os.path.join(self._dir(), f"e{eid:05d}-input.pkl"), data, kept=True)
                self.inputs[eid] = (rec, ids)
                written += rec.nbytes
            state = {k: v for k, v in state.items() if k not in ids}
        else:
            self._drop_input(eid)
        rec = _write(os.path.join(self._dir(), f"e{eid:05d}.pkl"), cloudpickle.dumps(state, protocol=5))
        self.spilled[eid] = rec
        self.sizes.pop(eid, None)
        self.lru.pop(eid, None)
        return written + rec.nbytes, time.perf_counter() - t0

    def load_bytes(self, eid: int) -> int:
        """What loading ``eid`` brings back into memory (state and input data)."""
        kept = self.inputs.get(eid)
        return self.spilled[eid].nbytes + (kept[0].nbytes if kept else 0)

    def start_load(self, eid: int) -> None:
        if eid in self.spilled and eid not in self.loading:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="litz-prefetch")
            kept = self.inputs.get(eid)
            self.loading[eid] = self._pool.submit(_read, self.spilled[eid], kept[0] if kept else None)

    def finished_loads(self) -> list[tuple[int, Any, int, float]]:
        """(eid, state, bytes, seconds) of loads that completed; raises LitzError for a corrupted spill file."""
        done = []
        for eid, fut in list(self.loading.items()):
            if fut.done():
                del self.loading[eid]
                state, seconds = fut.result()
                nbytes = self.load_bytes(eid)
                rec = self.spilled.pop(eid)
                _unlink(rec.path)
                if eid in self.inputs:  # the objects now in the executor are the ones the kept file holds
                    kept, ids = self.inputs[eid]
                    self.inputs[eid] = (kept, {a: id(state[a]) for a in ids})
                done.append((eid, state, nbytes, seconds))
        return done

    def load_now(self, eid: int) -> tuple[Any, int, float]:
        self.start_load(eid)
        self.loading[eid].result()
        for got in self.finished_loads():
            if got[0] == eid:
                return got[1], got[2], got[3]
        raise LitzError(f"executor {eid} did not load")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self.spill_dir:
            shutil.rmtree(self.spill_dir, ignore_errors=True)


def _read(rec: Spilled, input_rec: Spilled | None = None) -> tuple[Any, float]:
    t0 = time.perf_counter()
    state = _checked_load(rec)
    if input_rec is not None:
        state.update(_checked_load(input_rec, kept=True))
    return state, time.perf_counter() - t0


def _checked_load(rec: Spilled, kept: bool = False) -> Any:
    with open(rec.path, "rb") as f:
        data = f.read()
        if kept:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if len(data) != rec.nbytes or hashlib.sha256(data).hexdigest() != rec.sha256:
        raise LitzError(f"spill file {rec.path} is corrupted (checksum differs); the executor's state is lost")
    return cloudpickle.loads(data)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class ShardTables(MutableMapping):
    """A server's shards (shard -> key -> value) under an optional memory budget.

    Over the budget, the least recently used shards are written to a spill directory and dropped; touching
    one loads it back (on the server's own thread: a request for a spilled shard waits for that read).
    """

    def __init__(self, owner: str, budget: int | None = None):
        self._mem: dict[int, dict] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.residency = Residency(owner, budget)
        self._next_check = 0.0

    @property
    def budget(self) -> int | None:
        return self.residency.budget

    @budget.setter
    def budget(self, value: int | None) -> None:
        self.residency.budget = value

    def __getitem__(self, shard: int) -> dict:
        table = self._mem.get(shard)
        if table is None:
            if shard not in self.residency.spilled:
                raise KeyError(shard)
            table, _, _ = self.residency.load_now(shard)
            self._mem[shard] = table
        self._lru[shard] = None
        self._lru.move_to_end(shard)
        return table

    def __setitem__(self, shard: int, table: dict) -> None:
        self.residency.remove(shard)
        self._mem[shard] = table
        self._lru[shard] = None
        self._lru.move_to_end(shard)

    def __delitem__(self, shard: int) -> None:
        if shard not in self._mem and shard not in self.residency.spilled:
            raise KeyError(shard)
        self._mem.pop(shard, None)
        self._lru.pop(shard, None)
        self.residency.remove(shard)

    def __iter__(self):
        return iter(list(self._mem) + [s for s in self.residency.spilled if s not in self._mem])

    def __len__(self) -> int:
        return len(self._mem) + sum(1 for s in self.residency.spilled if s not in self._mem)

    def __contains__(self, shard: object) -> bool:
        return shard in self._mem or shard in self.residency.spilled

    def resident_bytes(self) -> int:
        return sum(_table_bytes(t) for t in self._mem.values())

    def enforce(self) -> list[tuple[int, int, float]]:
        """Spill least recently used shards until under budget (keeping the most recent); (shard, bytes, s)."""
        budget = self.residency.budget
        now = time.time()
        if budget is None or now < self._next_check:
            return []
        self._next_check = now + 0.05
        sizes = {s: _table_bytes(t) for s, t in self._mem.items()}
        total = sum(sizes.values())
        spilled = []
        for shard in list(self._lru)[:-1]:
            if total <= budget:
                break
            table = self._mem.pop(shard)
            self._lru.pop(shard)
            holder = type("Shard", (), {"__getstate__": lambda self, t=table: t})()
            nbytes, seconds = self.residency.evict(shard, holder)
            total -= sizes[shard]
            spilled.append((shard, nbytes, seconds))
        return spilled

    def close(self) -> None:
        self.residency.close()


def _table_bytes(table: dict) -> int:
    return sum(v.nbytes if isinstance(v, np.ndarray) else 32 for v in table.values())
