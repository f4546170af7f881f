"""SCAR (thesis ch. 5): a running checkpoint of parameter values with prioritised partial saves.

The running checkpoint starts as the initial values (thesis §5.4.2: "initialized to the initial parameter
values"). In Litz a key starts at zero and an app may write its starting values as updates, so with priority
checkpoints on, a server keeps each key's first value as it creates the key (a never-saved key used to be
recovered to zero, which lost such an app's starting values); the next round writes it to disk.

Every priority checkpoint saves the fraction ``r`` of all parameter *values* that moved farthest from their
saved copies: the elements of the keys' arrays, as the thesis ranks parameters, not whole keys. A key is
an app's unit of transfer (MLR: a block of rows), and within one the values move very differently; ranked by
whole keys, MLR's priority checkpoints saved 74% of the rework instead of 87% (bench/scar_rework.py). A value
that is not a numeric array counts as one value. The choice is the thesis' checkpoint coordinator's
(§5.4.3): every server measures how far each of its values moved (the saved copies are in memory, so this is
cheap) and sends a histogram of those distances; the master finds the global top ``r`` from the histograms
and tells each server how many of its own farthest values that is; the servers copy those values and write
the changed shard files in a background thread. After a server is lost, *partial recovery* reloads only its
shards from here, leaving every surviving parameter (and every executor) as it is.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Hashable
from typing import Any

import numpy as np

from .checkpoint import shard_part, write_part

RUNNING = "running"


def distance(current: Any, saved: Any) -> float:
    """How far a parameter moved since it was saved (L2 norm of the difference; never saved: its norm)."""
    if saved is None:
        return float(np.linalg.norm(np.asarray(current, dtype=np.float64)))
    return float(np.linalg.norm(np.asarray(current, dtype=np.float64) - np.asarray(saved, dtype=np.float64)))


def top_count(fraction: float, n: int) -> int:
    """How many of ``n`` keys a round saves: the ``fraction`` of them, at least one if there are any."""
    return max(1, int(round(fraction * n))) if n else 0


def farthest(dist: np.ndarray, count: int) -> np.ndarray:
    """Indices of the ``count`` largest distances (all of them if ``count`` covers every one), in no order."""
    if count <= 0:
        return np.empty(0, dtype=np.intp)
    if count >= len(dist):
        return np.arange(len(dist))
    return np.argpartition(-dist, count - 1)[:count]


def select_priority(current: dict[Hashable, Any], saved: dict[Hashable, Any], fraction: float) -> list[Hashable]:
    """The ``fraction`` of keys (at least one, if any) that changed most since they were last saved."""
    keys = list(current)
    dist = np.fromiter((distance(current[k], saved.get(k)) for k in keys), dtype=np.float64, count=len(keys))
    return [keys[i] for i in farthest(dist, top_count(fraction, len(keys)))]


# Histogram bins: a distance's float32 bit pattern without its 18 lowest bits (sign 0, 8 exponent bits, 5 mantissa
# bits). Non-negative floats sort as their bit patterns, so the bins keep the order of the distances, each 1/32 of
# an octave wide, and binning costs a cast and a shift (log2 of every value cost 5x more).
_BIN_SHIFT = 18
HISTOGRAM_BINS = 1 << (31 - _BIN_SHIFT)


def element_distances(current: Any, saved: Any) -> np.ndarray:
    """How far each value of a key moved since it was saved (never saved: from zero, the starting value). A key
    that is not a numeric array, or whose saved copy has another shape, counts as one value (its L2 distance)."""
    cur = current if isinstance(current, np.ndarray) else None
    if cur is not None and cur.dtype.kind in "biuf":
        work = cur.astype(np.float64 if cur.dtype == np.float64 else np.float32, copy=False)
        if saved is None:
            return np.abs(work).ravel()
        if isinstance(saved, np.ndarray) and saved.shape == cur.shape:
            diff = np.subtract(work, saved, dtype=work.dtype)
            return np.abs(diff, out=diff).ravel()
        if isinstance(saved, np.ndarray):  # its shape changed: the saved copy says nothing about it
            saved = None
    return np.array([distance(current, saved)])


def histogram(dist: np.ndarray) -> np.ndarray:
    """Counts of ``dist`` per bin (``HISTOGRAM_BINS`` of them, in the order of the distances): what a server
    sends the coordinator, a few kB however many values it holds."""
    bits = np.abs(np.asarray(dist, dtype=np.float32)).view(np.int32) >> _BIN_SHIFT
    return np.bincount(bits.ravel(), minlength=HISTOGRAM_BINS).astype(np.int64)


def global_top_counts(histograms: dict[str, np.ndarray], fraction: float) -> dict[str, int]:
    """How many of each server's values are in the ``fraction`` (at least one value, if any) of all values
    farthest from their saved copies: the coordinator's top-k over every server (thesis §5.4.3, step 3).

    Exact but for the bin where the cut falls (1/32 of an octave wide): its share of the cut is split over the
    servers by how many values each has in it."""
    names = list(histograms)
    if not names:
        return {}
    hists = np.array([np.asarray(histograms[n], dtype=np.int64) for n in names])
    want = top_count(fraction, int(hists.sum()))
    above = np.cumsum(hists.sum(axis=0)[::-1])[::-1]  # values in this bin or higher, over all servers
    cut = int(np.nonzero(above >= want)[0][-1]) if want else HISTOGRAM_BINS  # the bin where the top ends
    counts = hists[:, cut + 1:].sum(axis=1) if cut + 1 < HISTOGRAM_BINS else np.zeros(len(names), np.int64)
    if want and cut < HISTOGRAM_BINS:
        rest, edge = want - int(counts.sum()), hists[:, cut]
        in_edge = max(int(edge.sum()), 1)
        share = rest * edge // in_edge
        order = np.argsort(-(rest * edge - share * in_edge), kind="stable")  # largest remainders
        share[order[:rest - int(share.sum())]] += 1
        counts = counts + share
    return {n: int(c) for n, c in zip(names, counts, strict=True)}


def _copy(value: Any) -> Any:
    """A saved copy that later in-place updates of the live value do not change."""
    return np.array(value) if isinstance(value, np.ndarray) else value


class RunningCheckpoint:
    """A server's view of the running checkpoint: saved copies in memory, one file per shard on disk."""

    def __init__(self) -> None:
        self.saved: dict[int, dict[Hashable, Any]] = {}  # shard -> key -> saved value
        self.meta: dict[int, dict] = {}  # shard -> {bytes, sha256} of its file
        self.pending: tuple[list[tuple[int, Hashable]], np.ndarray] | None = None  # the last measure()
        self.seeding = False  # keep each new key's first value (on with priority checkpoints, see roles.serve)
        self.dirty: set[int] = set()  # shards with values kept since their file was last written
        self._writer: threading.Thread | None = None
        self.error: str | None = None

    def seed(self, shard: int, key: Hashable, value: Any) -> None:
        """A key was just created here with ``value``: its starting value, unless a saved one is held."""
        table = self.saved.setdefault(shard, {})
        if key not in table:
            table[key] = _copy(value)
            self.dirty.add(shard)

    def reset(self, shard: int, table: dict) -> None:
        """The shard was just restored to ``table``: that is its saved state now, in copies (the server adds
        updates into its live values in place), and its file is rewritten by the next round."""
        self.wait()
        self.saved[shard] = {k: _copy(v) for k, v in table.items()}
        self.dirty.add(shard)

    def drop(self, shard: int) -> None:
        """The shard moved away: its new owner keeps (and writes) its own copy."""
        self.saved.pop(shard, None)
        self.dirty.discard(shard)

    def measure(self, shards: Any) -> np.ndarray:
        """Step 1 of a round: how far every value held here moved from its saved copy, as a histogram (the
        distances are kept for ``save_top``)."""
        refs, dists = [], []
        for s, table in shards.items():
            saved = self.saved.get(s, {})
            for k, v in table.items():
                refs.append((s, k))
                dists.append(element_distances(v, saved.get(k)))
        sizes = np.array([len(d) for d in dists], dtype=np.int64)
        flat = np.concatenate(dists) if dists else np.empty(0)
        self.pending = (refs, sizes, flat)
        return histogram(flat)

    def save_top(self, root: str, shards: Any, count: int) -> tuple[int, int, int, int]:
        """Step 4: copy the ``count`` values measured farthest (the coordinator's pick here) into memory now, as
        they are now; write the touched shard files in the background.
        Returns (values saved, values measured, keys touched, keys measured)."""
        refs, sizes, flat = self.pending or ([], np.empty(0, np.int64), np.empty(0))
        self.pending = None
        self.wait()  # saved copies change in place below: not while the last round's files are being written
        touched, self.dirty = self.dirty, set()
        picked = np.sort(farthest(flat, count))
        starts = np.concatenate([[0], np.cumsum(sizes)])
        owner = np.searchsorted(starts, picked, side="right") - 1
        saved = keys = 0
        uniq, first = np.unique(owner, return_index=True)  # owner is sorted: each key's picks are one slice
        ends = np.append(first[1:], len(owner)) if len(first) else first
        for i, lo, hi in zip(uniq, first, ends, strict=True):
            s, k = refs[i]
            table = shards.get(s)  # None: it moved away since measure()
            if table is None or k not in table:
                continue
            v, mine = table[k], self.saved.setdefault(s, {})
            at = picked[lo:hi] - starts[i]
            old = mine.get(k)
            if not (isinstance(v, np.ndarray) and v.size == sizes[i] and len(at) < v.size):
                mine[k] = _copy(v)  # the whole value: measured as one value, or every element of it picked
            else:
                if not (isinstance(old, np.ndarray) and old.shape == v.shape and old.dtype == v.dtype):
                    old = np.zeros_like(v)  # never saved: its starting value is zero
                old.flat[at] = v.flat[at]
                mine[k] = old
            touched.add(s)
            saved += len(at)
            keys += 1
        snapshot = {s: dict(self.saved[s]) for s in touched if s in self.saved}
        self._writer = threading.Thread(target=self._write, args=(root, snapshot), daemon=True,
                                        name="litz-running-checkpoint")
        self._writer.start()
        return saved, len(flat), keys, len(refs)

    def _write(self, root: str, snapshot: dict[int, dict]) -> None:
        try:
            for shard, table in snapshot.items():
                rel = shard_part(shard)
                tmp_rel = f"{rel}.{os.getpid()}.tmp"  # a shard's old and new owner may both write it during a move
                meta = write_part(os.path.join(root, RUNNING), tmp_rel, table)
                os.replace(os.path.join(root, RUNNING, tmp_rel), os.path.join(root, RUNNING, rel))
                self.meta[shard] = meta
        except Exception as exc:  # reported by the next save or recovery; the previous files stay intact
            self.error = f"running checkpoint write failed: {exc}"

    def wait(self) -> None:
        if self._writer is not None:
            self._writer.join()
            self._writer = None


def clear_running(root: str) -> None:
    """A new job (not --resume) starts without a running checkpoint: an earlier run's values are not its own."""
    import shutil

    shutil.rmtree(os.path.join(root, RUNNING), ignore_errors=True)


def load_running_shard(root: str, shard: int) -> dict:
    """A shard from the running checkpoint (empty if it was never saved: every key starts at zero)."""
    path = os.path.join(root, RUNNING, shard_part(shard))
    if not os.path.exists(path):
        return {}
    import cloudpickle

    with open(path, "rb") as f:
        return cloudpickle.loads(f.read())
