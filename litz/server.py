"""Server process: holds parameter-server shards and applies additive updates.

Values are stored as received: a new key keeps the array decoded from the update frame (zero-copy,
read-only); the next update to it allocates a writable result, later ones add in place. An array
handed to ZeroMQ for a reply is never mutated afterwards (it may still be in flight): an update to an
exported key builds a new array instead.
"""
from __future__ import annotations

import time
import traceback
from collections.abc import Hashable
from typing import Any

import numpy as np

from . import protocol as P
from .cache import add_into
from .process import Process


class Server(Process):
    role = "server"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.shards: dict[int, dict[Hashable, Any]] = {}
        self.exported: set = set()  # (shard, key) of arrays handed to ZeroMQ since their last update
        self.running = True
        self.bytes_in = 0

    def run(self) -> None:
        self.send("master", (P.HELLO, "server", {"address": self.endpoint.address}))
        ep = self.endpoint
        last_check = time.time()
        while self.running:
            if ep.poll(200):
                for sender, msg in ep.drain():
                    self.handle(sender, msg)
            now = time.time()
            if now - last_check > 1.0:
                last_check = now
                if self.membership.lost.is_set() or self.membership.master() is None:
                    break  # master gone or we were declared dead: nothing left to serve

    def handle(self, sender: str, msg: tuple) -> None:
        tag = msg[0]
        if tag == P.GETS:
            self.send(sender, (P.VALUES, [(rid, self.get(shard, key)) for rid, shard, key in msg[1]]))
        elif tag == P.UPDATES:
            errors = []
            for shard, key, delta in msg[2]:
                try:
                    self.update(shard, key, delta)
                except Exception as exc:  # reported to the task's worker, which fails the job
                    errors.append(str(exc))
            self.send(sender, (P.ACK, msg[1], errors))
        elif tag == P.SHARDS:
            for shard, owner in enumerate(msg[2]):
                if owner == self.ident:
                    self.shards.setdefault(shard, {})
        elif tag == P.STOP:
            self.running = False
        else:
            self.send("master", (P.FAIL, f"server {self.ident}", f"unexpected message {tag!r}"))

    def get(self, shard: int, key: Hashable) -> Any:
        value = self.shards.setdefault(shard, {}).get(key)
        if isinstance(value, np.ndarray):
            self.exported.add((shard, key))
        return value

    def update(self, shard: int, key: Hashable, delta: Any) -> None:
        table = self.shards.setdefault(shard, {})
        cur = table.get(key)
        if cur is None:
            table[key] = delta
            return
        ref = (shard, key)
        in_place = ref not in self.exported
        self.exported.discard(ref)
        try:
            table[key] = add_into(key, cur, delta, in_place)
        except Exception:
            raise ValueError(traceback.format_exc(limit=0).strip()) from None
