"""The executor map (executor -> worker) and the shard map (shard -> server), and their one owner.

:class:`Placement` is the only code that writes either map or the moves in flight (docs/design.md, "Placement
policy"): the master asks it to place, re-place, re-home, plan and record, and does the sending. Where the
executors go is up to the :class:`~litz.placement.Policy` it was given; it calls the policy without knowing which
one it has.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from types import MappingProxyType

from .placement import Policy, plan_moves, quotas


class Placement:
    """The executor and shard maps and the moves in flight, with the operations that change them.

    The maps are tuples and the in-flight moves read-only views: whoever reads them (the master, the simulator,
    tests) cannot change them by mistake, and the master's messages carry a map that later moves do not alter."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.executor_owner: tuple[str, ...] = ()
        self.shard_owner: tuple[str, ...] = ()
        self._moving_executors: dict[int, str] = {}  # executor -> destination, its state on the way
        self._copying_input: dict[int, str] = {}  # scale-out moves: the input data first, the executor runs on
        self._moving_shards: dict[int, str] = {}
        self.moving_executors = MappingProxyType(self._moving_executors)
        self.copying_input = MappingProxyType(self._copying_input)
        self.moving_shards = MappingProxyType(self._moving_shards)
        self._destinations: tuple[tuple[str, ...], Counter[str]] | None = None  # see destinations()

    # -- placing everything at once: nothing runs, so nothing moves ------------------------------------
    def place(self, workers: Sequence[str], servers: Sequence[str], num_executors: int, num_shards: int) -> None:
        """First placement and a full recovery's re-placement: executors in contiguous blocks, one per worker in
        ``workers``' order, sized by the policy's quotas (a speed policy's adopted weights: a recovered job keeps
        them for the workers that survived, and a worker without one counts at the mean); shards round robin.
        Forgets every move in flight (the job starts over from this map)."""
        self.clear_moves()
        self.shard_owner = tuple(servers[s % len(servers)] for s in range(num_shards))
        quota = quotas(num_executors, list(workers), self.policy.weights())
        self.executor_owner = tuple(w for w in workers for _ in range(quota[w]))
        self._destinations = None

    def rehome_shards(self, lost: Sequence[str], active: Sequence[str]) -> list[int]:
        """Partial recovery: give the shards of the ``lost`` servers to the ``active`` survivors, each next to the
        one that holds the fewest (ties in ``active``'s order); no other shard and no executor changes owner.
        Returns the shards re-homed."""
        gone = set(lost)
        rehomed = [s for s, owner in enumerate(self.shard_owner) if owner in gone]
        held = {a: 0 for a in active}
        for owner in self.shard_owner:
            if owner in held:
                held[owner] += 1
        owners = list(self.shard_owner)
        for shard in rehomed:
            dest = min(active, key=lambda a: held[a])  # min keeps the first of equals
            owners[shard] = dest
            held[dest] += 1
        self.shard_owner = tuple(owners)
        return rehomed

    # -- moving some while the job runs ----------------------------------------------------------------
    def plan(self, workers: list[str], servers: list[str], pending_workers: Sequence[str] = (),
             pending_servers: Sequence[str] = ()) -> tuple[list, list]:
        """Executor and shard moves ``(item, source, dest)`` that balance the active ``workers`` and ``servers``
        (``pending_*``: about to join, see :func:`.placement.plan_moves`); executors by the policy's quotas,
        shards evenly. Items in flight count at their destination."""
        ex_moves = plan_moves(self.executor_owner, {**self._moving_executors, **self._copying_input}, workers,
                              pending_workers, weights=self.policy.weights())
        shard_moves = plan_moves(self.shard_owner, self._moving_shards, servers, pending_servers)
        return ex_moves, shard_moves

    def reconsider(self, workers: list[str], speeds: dict[str, float], now: float) -> bool:
        """Offer the policy the measured speeds of the active workers: True when it adopted new quotas and
        :meth:`plan` now moves executors to follow them."""
        return self.policy.offer(self.executor_owner, workers, speeds, now)

    def start_executor_move(self, eid: int, dest: str, copy_input: bool) -> None:
        """A planned executor move begins: its input data first (``copy_input``), or the executor at once."""
        (self._copying_input if copy_input else self._moving_executors)[eid] = dest
        self._destinations = None

    def input_copied(self, eid: int) -> str:
        """The input of ``eid`` reached its destination: the executor itself moves next. Returns the destination."""
        dest = self._moving_executors[eid] = self._copying_input.pop(eid)
        self._destinations = None
        return dest

    def call_off_copy(self, eid: int) -> None:
        """A move whose destination is leaving: ``eid`` stays where it is."""
        self._copying_input.pop(eid, None)

    def executor_moved(self, eid: int, dest: str) -> str:
        """``eid`` arrived at ``dest``. Returns where it came from."""
        self._moving_executors.pop(eid, None)
        owners = list(self.executor_owner)
        src, owners[eid] = owners[eid], dest
        self.executor_owner = tuple(owners)
        self._destinations = None
        return src

    def start_shard_move(self, shard: int, dest: str) -> None:
        self._moving_shards[shard] = dest

    def shard_moved(self, shard: int, dest: str) -> None:
        self._moving_shards.pop(shard, None)
        owners = list(self.shard_owner)
        owners[shard] = dest
        self.shard_owner = tuple(owners)

    def clear_moves(self) -> None:
        """A restore: the processes forgot every move, and so does the map."""
        self._moving_executors.clear()
        self._copying_input.clear()
        self._moving_shards.clear()
        self._destinations = None

    def destinations(self) -> tuple[tuple[str, ...], Counter[str]]:
        """Where each executor is, or goes if it is moving, and how many each worker holds so. Kept until the map or
        a move changes: a driver may ask for every executor's speed each step (``Driver.executor_speed``)."""
        if self._destinations is None:
            where = tuple(self._moving_executors.get(e, w) for e, w in enumerate(self.executor_owner))
            self._destinations = (where, Counter(where))
        return self._destinations

    def executors_of(self, worker: str) -> list[int]:
        return [e for e, w in enumerate(self.executor_owner) if w == worker]
