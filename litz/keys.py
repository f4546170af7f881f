"""Parameter-server keys: validation and a hash that is the same in every process.

Python's ``hash`` of a str differs between processes, so shard placement uses its own stable hash.
"""
from __future__ import annotations

import zlib
from collections.abc import Hashable

_MASK = (1 << 64) - 1


def stable_hash(key: Hashable) -> int:
    if isinstance(key, bool):
        raise TypeError("parameter keys are str, int or tuples of them, not bool")
    if isinstance(key, int):
        return (key * 0x9E3779B97F4A7C15) & _MASK
    if isinstance(key, str):
        return zlib.crc32(key.encode()) * 0x100000001B3 & _MASK
    if isinstance(key, tuple):
        h = 0xCBF29CE484222325
        for part in key:
            h = ((h ^ stable_hash(part)) * 0x100000001B3) & _MASK
        return h
    raise TypeError(f"parameter keys are str, int or tuples of them, not {type(key).__name__}")


class ShardMap:
    """Key -> logical shard (fixed for a job) -> server process (changes as servers come and go)."""

    def __init__(self, num_shards: int, owners: list[str]):
        self.num_shards = num_shards
        self.owners = owners  # shard -> server id
        self._shard_of: dict = {}

    def shard(self, key: Hashable) -> int:
        s = self._shard_of.get(key)
        if s is None:
            s = self._shard_of[key] = (stable_hash(key) >> 11) % self.num_shards
        return s
