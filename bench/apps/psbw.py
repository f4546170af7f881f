"""Parameter-server bandwidth app: ps_update and ps_get of large float32 arrays (default 1 MiB each).

Phases, each a barrier: ``warm`` (every key is updated once, untimed, so the server holds all of them),
``update`` (timed: tasks ps_update ``keys_per_task`` distinct keys each), ``get`` (timed: tasks fetch
``keys_per_task`` distinct keys each with ``ps_get_many``, or one ``ps_get`` at a time with
``get_mode="single"``).

Every get is a cache miss by construction when live cache entries are off (``LITZ_LIVE_CACHE=0``, which
``bench/ps_bandwidth.py`` sets): the driver keeps ``inflight`` tasks running and dispatches the next one from
``handle_task_completion``, so it carries a version newer than every value any earlier task fetched; tasks in
flight together touch disjoint keys. (With live entries on, a worker serves again the keys no other worker
wrote since it fetched them, from memory.) Each task checks one element of every value it got.

Config: ``tasks`` (per timed phase), ``inflight``, ``keys_per_task``, ``num_keys``, ``nbytes`` (per array),
``get_mode`` ("many" or "single"), ``phases`` (timed phases to run, default ``["update", "get"]``).
"""
from __future__ import annotations

import time

import numpy as np

import litz


class PSBandwidthDriver(litz.Driver):
    def __init__(self):
        c = self.config
        self.tasks = int(c.get("tasks", 256))
        self.inflight = int(c.get("inflight", self.num_executors))
        self.kpt = int(c.get("keys_per_task", 8))
        self.num_keys = int(c.get("num_keys", 2 * self.inflight * self.kpt))
        if self.num_keys < self.inflight * self.kpt:
            raise ValueError("num_keys must be >= inflight * keys_per_task (keys in flight must be distinct)")
        self.nbytes = int(c.get("nbytes", 1 << 20))
        timed = c.get("phases", ["update", "get"])
        self.phases = [("warm", -(-self.num_keys // self.kpt))] + [(p, self.tasks) for p in timed]
        self.phase = -1
        self.timings = {}

    def _start_phase(self):
        self.phase += 1
        if self.phase == len(self.phases):
            self.finish(self._result())
            return
        self.name, self.count = self.phases[self.phase]
        self.dispatched = self.completed = 0
        self.t0 = time.perf_counter()
        for _ in range(min(self.inflight, self.count)):
            self._dispatch()

    def _dispatch(self):
        i = self.dispatched
        first = (i * self.kpt) % self.num_keys
        keys = [(first + j) % self.num_keys for j in range(self.kpt)]
        # round-robin over executors: consecutive tasks land on alternating workers' executors
        self.dispatch_task(i % self.num_executors, (self.name, keys, self.phase))
        self.dispatched += 1

    def dispatch_initial_tasks(self):
        self._start_phase()

    def handle_task_completion(self, result):
        self.completed += 1
        if self.dispatched < self.count:
            self._dispatch()
        elif self.completed == self.count:
            seconds = time.perf_counter() - self.t0
            moved = self.count * self.kpt * self.nbytes
            self.timings[self.name] = {"tasks": self.count, "bytes": moved, "seconds": seconds,
                                       "MB_per_s": moved / seconds / 1e6}
            self._start_phase()

    def _result(self):
        return {"phases": self.timings, "keys_per_task": self.kpt, "num_keys": self.num_keys,
                "nbytes": self.nbytes, "inflight": self.inflight, "tasks": self.tasks,
                "get_mode": self.config.get("get_mode", "many")}


class PSBandwidthExecutor(litz.Executor):
    def __init__(self):
        self.delta = np.ones(int(self.config.get("nbytes", 1 << 20)) // 4, np.float32)
        self.single = self.config.get("get_mode", "many") == "single"

    def run_task(self, args):
        phase, keys, _ = args
        if phase in ("warm", "update"):
            for key in keys:
                self.ps_update(key, self.delta)
            return None
        values = [self.ps_get(k) for k in keys] if self.single else self.ps_get_many(keys)
        for key, value in zip(keys, values, strict=True):
            if value is None or value.shape != self.delta.shape or not value[0] >= 1.0:
                raise AssertionError(f"bad value for key {key}: {None if value is None else value[:3]}")
        return None
