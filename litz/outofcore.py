"""Out-of-core execution on a worker (thesis §4.8): a memory budget for executor state, input data included.

Over the budget, idle executors (no task queued, waiting or running) are written to a private spill
directory and dropped, least recently used first. Input data (``input_attrs``, read-only by contract) is
written once, one file per attribute, and the files are kept across later evictions and loads; only the
rest of the state, and an input attribute the app reassigned, are rewritten, so evicting an executor that
holds mostly input costs almost nothing. A task for an evicted executor queues its load in a background
thread (prefetch), so loading overlaps the other executors' tasks; a load starts when it fits in the
budget next to what is resident or loading (the worker evicts idle executors for it, and otherwise waits
for a task to end). A budget smaller than one executor's state still runs: one executor at a time.

Spill files hold a pickle stream followed by the raw numpy buffers it refers to (protocol 5, out of band):
writing copies no array, and a load reads the file into one buffer that the arrays are views of. Every
file carries a CRC-32, checked at every load; a corrupted one is an error naming the file, never silently
wrong state. Spill files go when the worker ends.
"""
from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile
import weakref
import zlib
from collections import OrderedDict
from collections.abc import MutableMapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np

from . import clock
from .api import held_input
from .errors import LitzError


def background_pool(name: str) -> Executor:
    """The one-thread pool that loads (and reads ahead) spilled executors. :mod:`litz.sim` replaces this
    function with one whose pool runs each load at once, so a seed replays the same schedule."""
    return ThreadPoolExecutor(1, thread_name_prefix=name)


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
    """One spill file: a pickle stream, then the raw bytes of the numpy buffers it refers to (out of band)."""
    path: str
    crc32: int
    nbytes: int
    header: int  # bytes of the pickle stream at the start of the file
    buffers: list[tuple[int, int]]  # (offset, length) of each out-of-band buffer


_ALIGN = 64  # buffers start at 64-byte offsets, so the arrays loaded onto them are aligned


def _write(path: str, obj: Any, kept: bool = False) -> Spilled:
    """Write ``obj`` to a spill file without copying its numpy buffers: pickle protocol 5 keeps them out of
    band and they go to the file as they are (an eviction of 8 MB used to copy them twice: into the pickle,
    then into the file). A ``kept`` file (input data) stays on disk between loads: its pages are dropped
    from the page cache, which would otherwise hold a second copy of the input in the memory being saved."""
    buffers: list[pickle.PickleBuffer] = []
    try:  # the file is read back by this process: classes and functions can go by reference (~10x faster)
        header = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    except (pickle.PicklingError, TypeError, AttributeError):  # a lambda, a class of an app pickled by value
        buffers = []
        header = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    crc = zlib.crc32(header)
    layout, offset = [], len(header)
    try:
        with open(path, "wb") as f:
            f.write(header)
            for buf in buffers:
                raw = buf.raw()
                pad = -offset % _ALIGN
                if pad:
                    f.write(bytes(pad))
                    crc = zlib.crc32(bytes(pad), crc)
                    offset += pad
                f.write(raw)
                crc = zlib.crc32(raw, crc)
                layout.append((offset, raw.nbytes))
                offset += raw.nbytes
            if kept:
                f.flush()
                os.fdatasync(f.fileno())
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    except BaseException:  # a full disk: leave no partial file taking the room the next attempt needs
        _unlink(path)
        raise
    return Spilled(path, crc, offset, len(header), layout)


class _Loaded:
    """The object a kept input file holds, as loaded into the executor: compared by identity at the next
    eviction. Never by ``id()``: once the app reassigns the attribute the loaded object may be freed and
    its address reused by a newer one, whose data the file does not hold. A weak reference where the type
    allows (numpy arrays do): a freed object then reads as None, never as a newer one. Otherwise (list,
    dict, tuple, int, str) a strong one, which keeps the loaded object alive while the executor is
    resident even if the app replaced it: a small memory cost, until the next eviction drops it."""

    __slots__ = ("_ref", "_obj")

    def __init__(self, obj: Any):
        try:
            self._ref, self._obj = weakref.ref(obj), None
        except TypeError:
            self._ref, self._obj = None, obj

    def get(self) -> Any:
        return self._obj if self._ref is None else self._ref()


class Residency:
    """Which executors are in memory, their sizes, the spilled ones, and loads under way."""

    def __init__(self, owner: str, budget: int | None = None, spill_root: str | None = None):
        self.budget = budget
        self.sizes: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()  # in memory, least recently used first
        self.spilled: dict[int, Spilled] = {}
        # input data kept on disk per executor, one file per input attribute with a reference to the object
        # the file holds (see _Loaded): a reassigned attribute (another object) is written again, so a stale
        # file is never loaded, and only that attribute (an app's per-epoch index need not rewrite its rows)
        self.inputs: dict[int, dict[str, tuple[Spilled, _Loaded | None]]] = {}
        self.loading: dict[int, Future] = {}
        self.prefetches: set[int] = set()  # loads started on a hint (no task yet): their event says "prefetch"
        self.dirty: set[int] = set()
        self._pool: Executor | None = None
        self._readahead: Executor | None = None
        self._wake: tuple[int, int] | None = None  # a pipe the loader writes a byte to after each load
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
        for rec, _ in self.inputs.pop(eid, {}).values():
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
        """Write the executor to disk (its input data only if not already there); the caller drops it.
        Returns (bytes written, seconds)."""
        t0 = clock.perf_counter()
        state = executor.__getstate__()
        written = 0
        inputs = held_input(executor) if isinstance(state, dict) else {}
        kept = self.inputs.setdefault(eid, {})
        for a in set(kept) - set(inputs):  # no longer held
            _unlink(kept.pop(a)[0].path)
        for a, value in inputs.items():
            if a not in kept or kept[a][1] is None or kept[a][1].get() is not value:
                rec = _write(os.path.join(self._dir(), f"e{eid:05d}-{a}-input.pkl"), value, kept=True)
                kept[a] = (rec, None)
                written += rec.nbytes
            else:  # current: the executor is dropped now, and the reference with it (nothing is kept alive)
                kept[a] = (kept[a][0], None)
        if inputs:
            state = {k: v for k, v in state.items() if k not in kept}
        rec = _write(os.path.join(self._dir(), f"e{eid:05d}.pkl"), state)
        self.spilled[eid] = rec
        self.sizes.pop(eid, None)
        self.lru.pop(eid, None)
        return written + rec.nbytes, clock.perf_counter() - t0

    def loading_bytes(self) -> int:
        """What the loads under way bring into memory."""
        return sum(self.load_bytes(e) for e in self.loading)

    def load_bytes(self, eid: int) -> int:
        """What loading ``eid`` brings back into memory (state and input data)."""
        return self.spilled[eid].nbytes + sum(rec.nbytes for rec, _ in self.inputs.get(eid, {}).values())

    def prefetch_fits(self, eid: int, pinned: set[int]) -> bool:
        """Whether loading spilled ``eid`` fits in the budget next to the ``pinned`` executors (those with a task,
        which are never spilled) and the loads under way, once every other executor is spilled: a prefetch that
        cannot fit must not spill idle executors for nothing (docs/design.md, O4)."""
        if self.budget is None or eid not in self.spilled or eid in self.loading:
            return False
        kept = sum(self.sizes.get(e, 0) for e in self.lru if e in pinned)
        return kept + self.loading_bytes() + self.load_bytes(eid) <= self.budget

    def start_prefetch(self, eid: int) -> None:
        """:meth:`start_load` for an executor with no task yet (a hint, docs/design.md O3)."""
        if eid in self.spilled and eid not in self.loading:
            self.prefetches.add(eid)
            self.start_load(eid)

    def load_kind(self, eid: int) -> str:
        """The event a finished load of ``eid`` is told as: ``prefetch`` if a hint started it, else ``load``."""
        if eid in self.prefetches:
            self.prefetches.discard(eid)
            return "prefetch"
        return "load"

    def start_load(self, eid: int) -> None:
        if eid in self.spilled and eid not in self.loading:
            if self._pool is None:
                self._pool = background_pool("litz-prefetch")
                self.wake_fd()
            kept = {a: rec for a, (rec, _) in self.inputs.get(eid, {}).items()}
            if kept:
                if self._readahead is None:  # its own thread: the call blocks while it queues the reads
                    self._readahead = background_pool("litz-readahead")
                self._readahead.submit(_will_need, list(kept.values()))
            self.loading[eid] = self._pool.submit(_read, self.spilled[eid], kept)
            self.loading[eid].add_done_callback(self._signal)

    def wake_fd(self) -> int:
        """A file descriptor that turns readable when a load completes, for the owner's poll loop: a load
        takes ~1 ms for a small executor, so polling for it every millisecond would double its latency."""
        if self._wake is None:
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            self._wake = (r, w)
        return self._wake[0]

    def _signal(self, _future: Future) -> None:
        try:
            os.write(self._wake[1], b"\0")
        except (OSError, TypeError):
            pass  # the pipe is full (it is drained before every wait) or closed

    def clear_wake(self) -> None:
        try:
            while os.read(self._wake[0], 4096):
                pass
        except (OSError, TypeError):
            pass

    def finished_loads(self) -> list[tuple[int, Any, int, float]]:
        """(eid, state, bytes, seconds) of loads that completed; raises LitzError for a corrupted spill file."""
        return [self._finish(eid) for eid, fut in list(self.loading.items()) if fut.done()]

    def _finish(self, eid: int) -> tuple[int, Any, int, float]:
        """Take ``eid``'s load (waiting for it): its spill file goes, its state comes back."""
        state, seconds = self.loading.pop(eid).result()
        nbytes = self.load_bytes(eid)
        rec = self.spilled.pop(eid)
        _unlink(rec.path)
        kept = self.inputs.get(eid, {})  # the objects now in the executor are the ones the files hold
        for a, (rec, _) in kept.items():
            kept[a] = (rec, _Loaded(state[a]))
        return eid, state, nbytes, seconds

    def load_now(self, eid: int) -> tuple[Any, int, float]:
        """Load ``eid`` at once (a move or a checkpoint needs it). Only its own load is taken: the others that
        finish meanwhile stay for the owner's :meth:`finished_loads`, which installs them."""
        self.start_load(eid)
        _, state, nbytes, seconds = self._finish(eid)
        return state, nbytes, seconds

    def close(self) -> None:
        for pool in (self._readahead, self._pool):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        if self._wake is not None:
            for fd in self._wake:
                os.close(fd)
            self._wake = None
        if self.spill_dir:
            shutil.rmtree(self.spill_dir, ignore_errors=True)


def _read(rec: Spilled, inputs: dict[str, Spilled] | None = None) -> tuple[Any, float]:
    t0 = clock.perf_counter()
    state = _checked_load(rec)
    for a, input_rec in (inputs or {}).items():
        state[a] = _checked_load(input_rec, kept=True)
    return state, clock.perf_counter() - t0


def _checked_load(rec: Spilled, kept: bool = False) -> Any:
    """Read a spill file into one buffer, check it, and unpickle it onto that buffer: the arrays are views of
    it, so the data is copied once (from the file) instead of twice (read, then unpickled into new arrays)."""
    view = memoryview(np.empty(rec.nbytes, np.uint8))  # not a bytearray: that would zero it first
    with open(rec.path, "rb") as f:
        got = f.readinto(view)
        if kept:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if got != rec.nbytes or f"{zlib.crc32(view):08x}" != f"{rec.crc32:08x}":
        raise LitzError(f"spill file {rec.path} is corrupted (checksum differs); the executor's state is lost")
    return pickle.loads(view[:rec.header], buffers=[view[o:o + n] for o, n in rec.buffers])


def _will_need(recs: list[Spilled]) -> None:
    """Ask the kernel to start reading ``rec`` now: the files of every queued load are then read in parallel
    (measured ~2 GB/s here against 0.4-0.9 GB/s for one file at a time) while the loader thread works
    through them in order."""
    for rec in recs:
        try:
            fd = os.open(rec.path, os.O_RDONLY)
        except OSError:
            continue  # the loader reports it
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)


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
        now = clock.time()
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
