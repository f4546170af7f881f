"""The key-value-with-leases interface membership is built on (etcd's model, reduced to what Litz uses)."""
from __future__ import annotations

from typing import Any, Protocol


class Lease(Protocol):
    ttl: float
    # True: the registry itself keeps the lease while its owner lives (litz.sim), so no keep-alive thread runs
    renews_itself: bool = False

    def refresh(self) -> bool:
        """Extend the lease; False if it had already expired (the process counts as lost)."""

    def revoke(self) -> None:
        """End the lease now, deleting every key attached to it."""


class KV(Protocol):
    """JSON values under '/'-separated string keys; keys attached to a lease vanish when it expires."""

    def put(self, key: str, value: Any, lease: Lease | None = None) -> None: ...

    def create(self, key: str, value: Any, lease: Lease | None = None) -> bool:
        """Put only if ``key`` is absent; True if this call created it."""

    def get(self, key: str) -> Any | None: ...

    def get_prefix(self, prefix: str) -> dict[str, Any]: ...

    def delete(self, key: str) -> None: ...

    def delete_prefix(self, prefix: str) -> None: ...

    def lease(self, ttl: float) -> Lease: ...

    def fail_fast_while_down(self, on: bool = True) -> None:
        """Calls made while the registry is known to be unreachable raise at once from now on (a registry that
        cannot be unreachable does nothing)."""

    def close(self) -> None: ...
