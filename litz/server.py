"""Server process: holds parameter-server shards, applies additive updates, forwards for moved shards.

Values are stored as received: a new key keeps the array decoded from the update frame (zero-copy,
read-only); the next update to it allocates a writable result, later ones add in place. An array
handed to ZeroMQ for a reply is never mutated afterwards (it may still be in flight): an update to an
exported key builds a new array instead.

Moving a shard never pauses workers (thesis §4.4): the old owner ships the table, remembers where it
went, and forwards every later request or update for it, keeping the original worker as the one to
answer. Updates are acknowledged per item by whichever server applied them, so a worker's flush
completes however many hops its items took.
"""
from __future__ import annotations

import traceback
from collections import defaultdict
from collections.abc import Hashable
from typing import Any

import numpy as np

from . import clock, process
from . import protocol as P
from .cache import add_into
from .checkpoint import pause_for_test, read_part, shard_part, sync_filesystem, write_part
from .errors import LitzError
from .guard import BadMessage
from .outofcore import ShardTables
from .process import Process
from .scar import RunningCheckpoint, load_running_shard

# A request this server forwarded to another is answered by that one within milliseconds; one forwarded to
# a server that is lost less than this long after may never have been: partial recovery cannot be exact.
FORWARD_SETTLE_S = 10.0
INF = float("inf")


def _own(value: Any) -> Any:
    """A copy of a received array: deltas may be borrowed ring memory, valid only while handled."""
    return np.array(value) if isinstance(value, np.ndarray) else value


class Server(Process):
    role = "server"
    borrows_frames = True  # updates are added into the stored values straight from the ring

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.shards = ShardTables(self.ident)  # shard -> key -> value, spilled to disk beyond a budget
        self.forward: dict[int, str] = {}  # shard -> the server it was sent to
        self.last_forward: dict[str, float] = {}  # server -> when a request was last forwarded to it, or from it
        self.forwarded_to: set[str] = set()  # every server a request went to from here: fenced when this one exits
        self.forwarded = 0  # requests forwarded from here (for moved shards), in the status
        self.exported: set = set()  # (shard, key) of arrays handed to ZeroMQ since their last update
        self.running = True
        self.retire_waiting: set[str] | None = None  # workers and servers whose fence we need before exiting
        self.leaving = False  # RETIRED was sent: exit once nothing is held for the registry
        self.retire_since = -1  # the last shard-map version that gave this server a shard (from RETIRE)
        # who fenced this server -> the map version of its latest fence (a worker's: the map that dropped this
        # server; inf: one that sends nothing more whatever the map, a server or a retired worker)
        self.fences: dict[str, float] = {}
        self.running_ckpt = RunningCheckpoint()

    def run(self, start_timeout: float = 600.0) -> None:
        self.send("master", (P.HELLO, P.VERSION, "server", {"address": self.endpoint.address, "stats": self.stats()}))
        self.await_welcome(start_timeout)
        ep = self.endpoint
        last_check = clock.time()
        while self.running:
            if ep.poll(200):
                for sender, msg in self.receive():
                    self.handle_message(sender, msg)
                for shard, nbytes, seconds in self.shards.enforce():
                    self.exported = {ref for ref in self.exported if ref[0] != shard}
                    self.send("master", (P.MEMORY_EVENT, "evict_shard", shard, nbytes, round(seconds, 6)))
            if self.drain_requested and self.retire_waiting is None and not self.leaving and self.leave_on_request():
                break
            now = clock.time()
            if now - last_check > 1.0:
                last_check = now
                if not self.job_goes_on():
                    break
                self.send("master", (P.STATS, self.stats()))
                self.maybe_retire()  # it may have waited for messages held for the registry
            if self.leaving and not self._held:
                break

    def stats(self) -> dict:
        last = max(self.last_forward.values(), default=None)
        return {"rss": process.resident_bytes(), "state_bytes": self.shards.resident_bytes(),
                "budget": self.shards.budget, "evicted": sorted(self.shards.residency.spilled),
                "forwarded": self.forwarded,
                "forwarded_ago_s": None if last is None else round(clock.monotonic() - last, 3)}

    def handle(self, sender: str, msg: tuple) -> None:
        tag = msg[0]
        if tag == P.GETS:
            self.on_gets(sender, msg[1])
        elif tag == P.UPDATES:
            self.on_updates(sender, msg[1], msg[2])
        elif tag == P.FWD_GETS:
            self.last_forward[sender] = clock.monotonic()
            self.on_gets(msg[1], msg[2], forwarded=True)
        elif tag == P.FWD_UPDATES:
            self.last_forward[sender] = clock.monotonic()
            self.on_updates(msg[1], msg[2], msg[3], forwarded=True)
        elif tag == P.SHARDS:
            for shard, owner in enumerate(msg[2]):
                if owner == self.ident and shard not in self.forward:
                    self.shards.setdefault(shard, {})
        elif tag == P.MOVE_SHARD:
            self.move_shard(msg[1], msg[2])
        elif tag == P.SHARD_DATA:
            self.receive_shard(msg[1], msg[2])
        elif tag == P.FENCE:  # from a worker, or from the master for a worker that already retired
            who, version = (msg[2], INF) if len(msg) > 2 else (sender, msg[1] if msg[1] >= 0 else INF)
            self.fences[who] = max(version, self.fences.get(who, -1))
            self.maybe_retire()
        elif tag == P.UNFORWARD:
            self.unforward(msg[1], msg[2])
        elif tag == P.RETIRE:
            self.retire_waiting = set(msg[1])
            self.retire_since = msg[2] if len(msg) > 2 else -1
            self.maybe_retire()
        elif tag == P.CHECKPOINT:
            self.checkpoint(msg[1])
        elif tag == P.RESTORE:
            self.restore(msg[1], msg[2])
        elif tag == P.PRIORITY_CHECKPOINT:  # SCAR §5.4.3 steps 1-2: how far every value moved from its saved copy
            self.send("master", (P.PRIORITY_DISTANCES, self.running_ckpt.measure(self.shards), self.running_ckpt.error))
        elif tag == P.PRIORITY_SAVE:  # step 4: the coordinator's pick here: this server's count farthest values
            self.send("master", (P.PRIORITY_SAVED, *self.running_ckpt.save_top(msg[1], self.shards, msg[2]), None))
        elif tag == P.RESTORE_SHARDS:
            self.restore_lost_shards(msg[1], msg[2], msg[3], set(msg[4]), msg[5])
        elif not self.handle_lifecycle(tag, msg):
            raise BadMessage("unexpected tag", repr(tag))  # the shapes let none through

    # -- requests ------------------------------------------------------------------------------------
    def _split(self, items: list, shard_index: int) -> tuple[list, dict[str, list]]:
        """Items for shards held here, and the rest grouped by the server to forward them to."""
        mine, away = [], None
        forward = self.forward
        for item in items:
            dest = forward.get(item[shard_index])
            if dest is None:
                mine.append(item)
            else:
                if away is None:
                    away = defaultdict(list)
                away[dest].append(item)
        return mine, away or {}

    def on_gets(self, origin: str, items: list, forwarded: bool = False) -> None:
        mine, away = self._split(items, 1) if self.forward else (items, {})
        for dest, fwd in away.items():
            self.send(dest, (P.FWD_GETS, origin, fwd))
            self._forwarded(dest)
        if mine:
            values = [(rid, self.get(shard, key)) for rid, shard, key in mine]
            # answers and acks for forwarded requests say so: they are in no order with the answers and acks of
            # the server the worker asked, so the worker's cache must not count on that order for them
            self.send(origin, (P.VALUES, values, True) if forwarded else (P.VALUES, values))

    def on_updates(self, origin: str, fid: int, items: list, forwarded: bool = False) -> None:
        mine, away = self._split(items, 0) if self.forward else (items, {})
        for dest, fwd in away.items():
            fwd = [(shard, key, _own(delta)) for shard, key, delta in fwd]  # borrowed: sent after we return
            self.send(dest, (P.FWD_UPDATES, origin, fid, fwd))
            self._forwarded(dest)
        if mine:
            errors = []
            for shard, key, delta in mine:
                try:
                    self.update(shard, key, delta)
                except Exception as exc:  # reported to the task's worker, which fails the job
                    errors.append(str(exc))
            self.send(origin, (P.ACK, fid, len(mine), errors, True) if forwarded else (P.ACK, fid, len(mine), errors))

    def get(self, shard: int, key: Hashable) -> Any:
        value = self.shards.setdefault(shard, {}).get(key)
        if isinstance(value, np.ndarray):
            self.exported.add((shard, key))
        return value

    def update(self, shard: int, key: Hashable, delta: Any) -> None:
        table = self.shards.setdefault(shard, {})
        cur = table.get(key)
        if cur is None:
            table[key] = value = _own(delta)
            if self.running_ckpt.seeding:
                self.running_ckpt.seed(shard, key, value)
            return
        ref = (shard, key)
        in_place = ref not in self.exported
        self.exported.discard(ref)
        try:
            table[key] = add_into(key, cur, delta, in_place)
        except Exception:
            raise ValueError(traceback.format_exc(limit=0).strip()) from None

    # -- elasticity ----------------------------------------------------------------------------------
    def move_shard(self, shard: int, dest: str) -> None:
        table = self.shards.pop(shard, {})
        self.running_ckpt.drop(shard)  # the destination keeps the values it receives as its starting copy
        self.exported = {ref for ref in self.exported if ref[0] != shard}
        self.forward[shard] = dest
        self.send(dest, (P.SHARD_DATA, shard, table))  # before anything forwarded for it: same channel

    def _forwarded(self, dest: str) -> None:
        """A request was just forwarded to ``dest``: partial recovery and retirement look back at this."""
        self.last_forward[dest] = clock.monotonic()
        self.forwarded_to.add(dest)
        self.forwarded += 1

    def redirect_forwards(self, gone: set[str], owners: list[str]) -> None:
        """What would be forwarded to a server that is gone (or going) goes to its shard's owner instead."""
        for shard, dest in list(self.forward.items()):
            if dest in gone:
                if owners[shard] == self.ident:
                    del self.forward[shard]
                else:
                    self.forward[shard] = owners[shard]

    def unforward(self, retiring: str, owners: list[str]) -> None:
        """A server is about to retire: forward nothing more to it, and fence it. Every request forwarded there
        is ahead of the fence on this channel, so it exits only after it has passed them on (workers fence
        their own channels; a request can also reach it through an older move, from here)."""
        self.redirect_forwards({retiring}, owners)
        self.send(retiring, (P.FENCE, -1))

    def receive_shard(self, shard: int, table: dict) -> None:
        self.forward.pop(shard, None)
        self.shards.setdefault(shard, {})
        for key, value in table.items():  # additive values merge exactly, should any have arrived first
            self.update(shard, key, value)
        nbytes = sum(v.nbytes if isinstance(v, np.ndarray) else 8 for v in table.values())
        self.send("master", (P.SHARD_MOVED, shard, nbytes))

    # -- checkpoints and recovery --------------------------------------------------------------------
    def close(self) -> None:
        self.shards.close()  # spill files go with the server
        super().close()

    def checkpoint(self, root: str) -> None:
        """Write every shard held here; the master sends this only when no update is in flight."""
        try:
            parts = {}
            for shard, table in self.shards.items():
                rel = shard_part(shard)
                parts[rel] = write_part(root, rel, table, sync=False)
                if len(parts) == 1:
                    pause_for_test(self.ident, root)
            sync_filesystem(root)
        except Exception as exc:
            self.send("master", (P.CHECKPOINT_FAILED, f"server {self.ident}: {exc}"))
            return
        self.send("master", (P.CHECKPOINTED, parts))

    def restore(self, root: str, parts: dict[int, dict]) -> None:
        self.shards.clear()
        self.forward, self.exported = {}, set()
        self.retire_waiting, self.retire_since, self.fences = None, -1, {}
        try:
            for shard, meta in parts.items():
                self.shards[shard] = table = read_part(root, shard_part(shard), meta)
                if self.running_ckpt.seeding:  # a shard new to this server starts from the restored values
                    for key, value in table.items():
                        self.running_ckpt.seed(shard, key, value)
        except LitzError as exc:
            self.shards.clear()
            self.send("master", (P.RESTORE_FAILED, str(exc)))
            return
        self.send("master", (P.RESTORED,))

    def restore_lost_shards(self, source: str, root: str, parts: dict[int, dict | None], lost: set[str],
                            owners: list[str]) -> None:
        """SCAR partial recovery: load only the shards of a lost server; everything held here stays.

        Requests still arrive under older shard maps (nothing is reset), so what was forwarded to a lost
        server now goes to its shard's new owner, or stays here if that is this server. What was forwarded
        to it shortly before may never have been answered, and the worker that asked cannot know it went
        there: then this server refuses, and the master restores the whole job from a full checkpoint. So it
        does when a lost server forwarded requests to it shortly before: the worker that asked the lost server
        sends them again, here, and an update would be applied twice."""
        now = clock.monotonic()
        recent = sorted(d for d in lost if now - self.last_forward.get(d, now - FORWARD_SETTLE_S) < FORWARD_SETTLE_S)
        if recent:
            why = f"less than {FORWARD_SETTLE_S:.0f} s before: the workers cannot know what was answered"
            self.send("master", (P.RESTORE_FAILED, f"server {self.ident} exchanged forwarded requests with "
                                                   f"{', '.join(recent)} {why}"))
            return
        self.redirect_forwards(lost, owners)
        if self.retire_waiting is not None:  # a lost server sends no fence: what it forwarded here is lost anyway
            self.retire_waiting -= lost
        try:
            for shard, meta in parts.items():
                if source == "running":
                    table = load_running_shard(root, shard)
                else:
                    table = read_part(root, shard_part(shard), meta)
                # held here again: an old forward (it moved away before it reached the lost server) would send
                # its requests to a live server that forwards them back here, for ever
                self.forward.pop(shard, None)
                self.shards[shard] = table
                if self.running_ckpt.seeding:  # priority checkpoints on: their saved copy is what was restored
                    self.running_ckpt.reset(shard, table)
                self.exported = {ref for ref in self.exported if ref[0] != shard}
        except Exception as exc:  # a damaged file (a running checkpoint's has no checksum): refuse, do not die
            self.send("master", (P.RESTORE_FAILED, f"server {self.ident}: {exc}"))
            return
        self.send("master", (P.RESTORED,))
        self.maybe_retire()

    def maybe_retire(self) -> None:
        """Exit once every worker promised (by a fence behind its last request) to send nothing more. A worker's
        fence counts only if the map it came with is later than the last one that gave this server a shard: a
        server given shards again after a worker fenced it gets that worker's requests again (docs/design.md,
        M3)."""
        if (self.retire_waiting is not None and not self.shards and not self._held
                and all(self.fences.get(w, -1) > self.retire_since for w in self.retire_waiting)):
            fenced = sorted(self.forwarded_to)
            for dest in fenced:  # behind what was forwarded there: a retiring one may be waiting for this
                self.send(dest, (P.FENCE, -1))
            self.send("master", (P.RETIRED, fenced))
            self.retire_waiting = None
            self.leaving = True  # exits once nothing waits for the registry to name its peer (R1)
            self.running = bool(self._held)
