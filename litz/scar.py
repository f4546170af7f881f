"""SCAR (thesis ch. 5): a running checkpoint of parameter values with prioritised partial saves.

The running checkpoint starts as the initial values (thesis §5.4.2: "initialized to the initial parameter
values"). In Litz a key starts at zero and an app may write its starting values as updates, so with priority
checkpoints on, a server keeps each key's first value as it creates the key (a never-saved key used to be
recovered to zero, which lost such an app's starting values); the next round writes it to disk. Every
priority checkpoint saves, on each server, the fraction ``r`` of its keys whose values moved farthest from
their saved copy; the server keeps that copy in memory (so distances are cheap) and writes the changed
shard files in a background thread. After a server is lost, *partial recovery* reloads only its shards
from here, leaving every surviving parameter (and every executor) as it is.
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


def select_priority(current: dict[Hashable, Any], saved: dict[Hashable, Any], fraction: float) -> list[Hashable]:
    """The ``fraction`` of keys (at least one, if any) that changed most since they were last saved."""
    if not current:
        return []
    keys = list(current)
    dist = np.fromiter((distance(current[k], saved.get(k)) for k in keys), dtype=np.float64, count=len(keys))
    count = max(1, int(round(fraction * len(keys))))
    if count >= len(keys):
        return keys
    top = np.argpartition(-dist, count - 1)[:count]
    return [keys[i] for i in top]


class RunningCheckpoint:
    """A server's view of the running checkpoint: saved copies in memory, one file per shard on disk."""

    def __init__(self) -> None:
        self.saved: dict[int, dict[Hashable, Any]] = {}  # shard -> key -> saved value
        self.meta: dict[int, dict] = {}  # shard -> {bytes, sha256} of its file
        self.seeding = False  # keep each new key's first value (the master turns it on with priority checkpoints)
        self.dirty: set[int] = set()  # shards with values kept since their file was last written
        self._writer: threading.Thread | None = None
        self.error: str | None = None

    def seed(self, shard: int, key: Hashable, value: Any) -> None:
        """A key was just created here with ``value``: its starting value, unless a saved one is held."""
        table = self.saved.setdefault(shard, {})
        if key not in table:
            table[key] = np.array(value) if isinstance(value, np.ndarray) else value
            self.dirty.add(shard)

    def drop(self, shard: int) -> None:
        """The shard moved away: its new owner keeps (and writes) its own copy."""
        self.saved.pop(shard, None)
        self.dirty.discard(shard)

    def save(self, root: str, shards: dict[int, dict[Hashable, Any]], fraction: float) -> tuple[int, int]:
        """Copy the top ``fraction`` of keys into memory now; write the touched shard files in the background.

        Returns (keys saved, keys held)."""
        flat = {(s, k): v for s, table in shards.items() for k, v in table.items()}
        saved_flat = {(s, k): v for s, table in self.saved.items() for k, v in table.items()}
        chosen = select_priority(flat, saved_flat, fraction)
        touched, self.dirty = self.dirty, set()
        for s, k in chosen:
            v = flat[(s, k)]
            self.saved.setdefault(s, {})[k] = np.array(v) if isinstance(v, np.ndarray) else v
            touched.add(s)
        snapshot = {s: dict(self.saved[s]) for s in touched}
        self.wait()
        self._writer = threading.Thread(target=self._write, args=(root, snapshot), daemon=True,
                                        name="litz-running-checkpoint")
        self._writer.start()
        return len(chosen), len(flat)

    def _write(self, root: str, snapshot: dict[int, dict]) -> None:
        try:
            for shard, table in snapshot.items():
                rel = shard_part(shard)
                tmp_rel = rel + ".tmp"
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
