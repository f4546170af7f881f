"""A KV with leases in a local directory: the embedded registry of one-machine jobs.

Each key is a JSON file; each lease is a file whose modification time is its deadline, so refreshing a
lease is one ``utime`` and checking it is one ``stat``. Writes go through a temporary name and a rename,
so a reader never sees half a value. The registry is its user's alone (:mod:`litz.private`): files 0600 in
0700 directories, as it holds local jobs' secrets and takes their litzctl requests.
"""
from __future__ import annotations

import json
import os
from typing import Any

from .. import clock
from ..private import open_private, private_dir, write_private


class FileLease:
    def __init__(self, kv: FileKV, ttl: float):
        self.kv, self.ttl = kv, ttl
        self.id = os.urandom(8).hex()
        self.path = os.path.join(kv.lease_dir, self.id)
        with open_private(self.path):
            pass
        self.refresh()

    def refresh(self) -> bool:
        deadline = clock.time() + self.ttl
        try:
            os.utime(self.path, (deadline, deadline))
            return True
        except FileNotFoundError:
            return False

    def revoke(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class FileKV:
    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.data_dir = os.path.join(self.root, "kv")
        self.lease_dir = os.path.join(self.root, "leases")
        for path in (self.root, self.data_dir, self.lease_dir):  # an older version's, maybe 0755: ours to tighten
            private_dir(path, tighten=True)

    def _path(self, key: str) -> str:
        parts = [p for p in key.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise ValueError(f"bad key {key!r}")
        return os.path.join(self.data_dir, *parts) + ".json"

    def _lease_alive(self, lease_id: str | None) -> bool:
        if lease_id is None:
            return True
        try:
            return os.stat(os.path.join(self.lease_dir, lease_id)).st_mtime >= clock.time()
        except FileNotFoundError:
            return False

    def _encode(self, value: Any, lease: FileLease | None) -> bytes:
        return json.dumps({"v": value, "lease": lease.id if lease else None}).encode()

    def _read(self, path: str) -> Any | None:
        try:
            with open(path, "rb") as f:
                doc = json.loads(f.read())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        if not self._lease_alive(doc.get("lease")):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            return None
        return doc

    def put(self, key: str, value: Any, lease: FileLease | None = None) -> None:
        path = self._path(key)
        private_dir(os.path.dirname(path))
        write_private(path, self._encode(value, lease))

    def create(self, key: str, value: Any, lease: FileLease | None = None) -> bool:
        path = self._path(key)
        private_dir(os.path.dirname(path))
        tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        with open_private(tmp) as f:
            f.write(self._encode(value, lease))
        try:
            for _ in range(2):
                try:
                    os.link(tmp, path)  # atomic: fails if the key exists
                    return True
                except FileExistsError:
                    if self._read(path) is not None:  # a live key; an expired one was just removed
                        return False
            return False
        finally:
            os.unlink(tmp)

    def get(self, key: str) -> Any | None:
        doc = self._read(self._path(key))
        return None if doc is None else doc["v"]

    def get_prefix(self, prefix: str) -> dict[str, Any]:
        base = os.path.join(self.data_dir, *[p for p in prefix.split("/") if p])
        out: dict[str, Any] = {}
        for dirpath, _, files in os.walk(base):
            for name in files:
                if not name.endswith(".json"):
                    continue
                path = os.path.join(dirpath, name)
                doc = self._read(path)
                if doc is not None:
                    key = os.path.relpath(path, self.data_dir)[: -len(".json")].replace(os.sep, "/")
                    out[key] = doc["v"]
        return out

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def delete_prefix(self, prefix: str) -> None:
        for key in self.get_prefix(prefix):
            self.delete(key)

    def lease(self, ttl: float) -> FileLease:
        return FileLease(self, ttl)

    def fail_fast_while_down(self, on: bool = True) -> None:
        """Never unreachable: nothing to change."""

    def close(self) -> None:
        pass
