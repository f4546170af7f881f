"""Out-of-core execution on a worker (thesis §4.8): a memory budget for executor state, input data included.

Over the budget, idle executors (no task queued, waiting or running) are written to a private spill
directory and dropped, least recently used first. A task for an evicted executor makes it load in a
background thread at once (prefetch), so loading overlaps the other executors' tasks. A budget smaller
than one executor's state still runs: one executor at a time. Spill files carry a checksum; a corrupted
one is an error naming the file, never silently wrong state. Spill files go when the worker ends.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections import OrderedDict
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


class Residency:
    """Which executors are in memory, their sizes, the spilled ones, and loads under way."""

    def __init__(self, owner: str, budget: int | None = None, spill_root: str | None = None):
        self.budget = budget
        self.sizes: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()  # in memory, least recently used first
        self.spilled: dict[int, Spilled] = {}
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

    def refresh(self, executors: dict[int, Any]) -> None:
        for eid in self.dirty:
            if eid in executors:
                self.sizes[eid] = state_bytes(executors[eid])
        self.dirty.clear()

    def resident(self) -> int:
        return sum(self.sizes.get(e, 0) for e in self.lru)

    # -- evicting and loading ------------------------------------------------------------------------
    def evict(self, eid: int, executor: Any) -> tuple[int, float]:
        """Write the whole executor (input data too) to disk; the caller drops it. Returns (bytes, seconds)."""
        t0 = time.perf_counter()
        data = cloudpickle.dumps(executor.__getstate__(), protocol=5)
        path = os.path.join(self._dir(), f"e{eid:05d}.pkl")
        with open(path, "wb") as f:
            f.write(data)
        self.spilled[eid] = Spilled(path, hashlib.sha256(data).hexdigest(), len(data))
        self.sizes.pop(eid, None)
        self.lru.pop(eid, None)
        return len(data), time.perf_counter() - t0

    def start_load(self, eid: int) -> None:
        if eid in self.spilled and eid not in self.loading:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="litz-prefetch")
            self.loading[eid] = self._pool.submit(_read, self.spilled[eid])

    def finished_loads(self) -> list[tuple[int, Any, int, float]]:
        """(eid, state, bytes, seconds) of loads that completed; raises LitzError for a corrupted spill file."""
        done = []
        for eid, fut in list(self.loading.items()):
            if fut.done():
                del self.loading[eid]
                state, seconds = fut.result()
                rec = self.spilled.pop(eid)
                _unlink(rec.path)
                done.append((eid, state, rec.nbytes, seconds))
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


def _read(rec: Spilled) -> tuple[Any, float]:
    t0 = time.perf_counter()
    with open(rec.path, "rb") as f:
        data = f.read()
    if len(data) != rec.nbytes or hashlib.sha256(data).hexdigest() != rec.sha256:
        raise LitzError(f"spill file {rec.path} is corrupted (checksum differs); the executor's state is lost")
    return cloudpickle.loads(data), time.perf_counter() - t0


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
