"""SCAR (thesis ch. 5): a running checkpoint of parameter values with prioritised partial saves.

The running checkpoint starts as the initial values (thesis §5.4.2: "initialized to the initial parameter
values"). In Litz a key starts at zero and an app may write its starting values as updates, so with priority
checkpoints on, a server keeps each key's first value as it creates the key (a never-saved key used to be
recovered to zero, which lost such an app's starting values); the next round writes it to disk. Every
priority checkpoint saves the fraction ``r`` of all keys whose values moved farthest from their saved copy,
chosen as the thesis' checkpoint coordinator does (§5.4.3): every server measures the distance of each of
its keys from its saved copy (kept in memory, so this is cheap), the master takes the global top ``r`` of
those distances and tells each server how many of its own farthest keys that is, and the servers copy them
and write the changed shard files in a background thread. After a server is lost, *partial recovery*
reloads only its shards from here, leaving every surviving parameter (and every executor) as it is.
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


def global_top_counts(distances: dict[str, np.ndarray], fraction: float) -> dict[str, int]:
    """How many of each server's keys are in the ``fraction`` (at least one key, if any) of all keys farthest
    from their saved copies: the coordinator's top-k over every server's distances (thesis §5.4.3, step 3)."""
    names = list(distances)
    sizes = [len(distances[n]) for n in names]
    every = np.concatenate([np.asarray(distances[n], dtype=np.float64) for n in names] or [np.empty(0)])
    owner = np.repeat(np.arange(len(names)), sizes)
    per = np.bincount(owner[farthest(every, top_count(fraction, len(every)))], minlength=len(names))
    return {n: int(c) for n, c in zip(names, per, strict=True)}


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

    def drop(self, shard: int) -> None:
        """The shard moved away: its new owner keeps (and writes) its own copy."""
        self.saved.pop(shard, None)
        self.dirty.discard(shard)

    def measure(self, shards: Any) -> np.ndarray:
        """Step 1 of a round: the distance of every key held here from its saved copy (kept for ``save_top``)."""
        refs, dist = [], []
        for s, table in shards.items():
            saved = self.saved.get(s, {})
            for k, v in table.items():
                refs.append((s, k))
                dist.append(distance(v, saved.get(k)))
        self.pending = (refs, np.array(dist, dtype=np.float64))
        return self.pending[1]

    def save_top(self, root: str, shards: Any, count: int) -> tuple[int, int]:
        """Step 4: copy the ``count`` keys measured farthest (the coordinator's pick here) into memory now, with
        their current values; write the touched shard files in the background. Returns (saved, measured)."""
        refs, dist = self.pending or ([], np.empty(0))
        self.pending = None
        touched, self.dirty = self.dirty, set()
        saved = 0
        for i in farthest(dist, count):
            s, k = refs[i]
            table = shards.get(s)  # None: it moved away since measure()
            if table is None or k not in table:
                continue
            v = table[k]
            self.saved.setdefault(s, {})[k] = _copy(v)
            touched.add(s)
            saved += 1
        snapshot = {s: dict(self.saved[s]) for s in touched if s in self.saved}
        self.wait()
        self._writer = threading.Thread(target=self._write, args=(root, snapshot), daemon=True,
                                        name="litz-running-checkpoint")
        self._writer.start()
        return saved, len(refs)

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


def load_running_shard(root: str, shard: int) -> dict:
    """A shard from the running checkpoint (empty if it was never saved: every key starts at zero)."""
    path = os.path.join(root, RUNNING, shard_part(shard))
    if not os.path.exists(path):
        return {}
    import cloudpickle

    with open(path, "rb") as f:
        return cloudpickle.loads(f.read())
