"""The KV-with-leases interface on etcd v3 (via ``etcd-sdk-python``, imported as ``pyetcd``).

Values are JSON. ``create`` is an etcd transaction (put if the key's create revision is 0), so two masters
for one job cannot both register. Calls retry with backoff while etcd is briefly unreachable; an etcd that
stays unreachable ends in a clear :class:`LitzError`.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from ..errors import LitzError

RETRY_FOR_S = 10.0


class EtcdLease:
    def __init__(self, kv: EtcdKV, ttl: float):
        self.kv, self.ttl = kv, ttl
        self._lease = kv._call(lambda c: c.lease(max(1, round(ttl))), "create a lease")

    def refresh(self) -> bool:
        try:
            replies = list(self._lease.refresh())
        except Exception:
            raise  # transient: the keepalive loop retries
        return bool(replies) and replies[0].TTL > 0

    def revoke(self) -> None:
        self._lease.revoke()


class EtcdKV:
    def __init__(self, endpoint: str, timeout: float = 5.0):
        import pyetcd

        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise LitzError(f"bad --etcd {endpoint!r}: expected HOST:PORT")
        self.endpoint = endpoint
        self.client = pyetcd.client(host=host, port=int(port), timeout=timeout)
        self._call(lambda c: c.status(), "connect")

    def _call(self, fn: Callable, what: str) -> Any:
        delay, deadline = 0.1, time.time() + RETRY_FOR_S
        while True:
            try:
                return fn(self.client)
            except Exception as exc:
                if time.time() + delay > deadline:
                    raise LitzError(f"etcd at {self.endpoint} is unreachable ({what}: "
                                    f"{type(exc).__name__})") from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def put(self, key: str, value: Any, lease: EtcdLease | None = None) -> None:
        data = json.dumps(value)
        self._call(lambda c: c.put(key, data, lease=lease._lease if lease else None), f"put {key}")

    def create(self, key: str, value: Any, lease: EtcdLease | None = None) -> bool:
        data = json.dumps(value)

        def txn(c: Any) -> bool:
            ok, _ = c.transaction(compare=[c.transactions.create(key) == 0],
                                  success=[c.transactions.put(key, data, lease=lease._lease if lease else None)],
                                  failure=[])
            return ok

        return self._call(txn, f"create {key}")

    def get(self, key: str) -> Any | None:
        value, _ = self._call(lambda c: c.get(key), f"get {key}")
        return None if value is None else json.loads(value)

    def get_prefix(self, prefix: str) -> dict[str, Any]:
        items = self._call(lambda c: list(c.get_prefix(prefix)), f"list {prefix}")
        return {meta.key.decode(): json.loads(value) for value, meta in items}

    def delete(self, key: str) -> None:
        self._call(lambda c: c.delete(key), f"delete {key}")

    def delete_prefix(self, prefix: str) -> None:
        self._call(lambda c: c.delete_prefix(prefix), f"delete {prefix}")

    def lease(self, ttl: float) -> EtcdLease:
        return EtcdLease(self, ttl)

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass
