"""Eviction/load cost app (``bench/evict_cost.py``): executors that are nothing but a block of bytes.

Config: ``mb`` (executor size, 10^6 bytes), ``rounds`` (passes over the executors). Every executor holds
``mb`` MB of pseudo-random bytes (incompressible, generated from its id). The driver runs ``rounds`` passes,
one task at a time, executor 0, 1, ..., E-1, 0, 1, ...: a cyclic order, so under a budget of a few
executors the executor each task needs is always the one least recently used, i.e. spilled. Each task
checks a sample of its bytes against the value recorded at ``load_input``, so a load that returned other
state fails the job. The result holds the task count and the driver-side time.
"""
from __future__ import annotations

import time

import numpy as np

import litz

STRIDE = 4096  # checked bytes: one per page


def _blob(executor: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng([executor, 17]).integers(0, 256, nbytes, dtype=np.uint8)


class SpillDriver(litz.Driver):
    def dispatch_initial_tasks(self) -> None:
        self.total = int(self.config.get("rounds", 4)) * self.num_executors
        self.done = 0
        self.t0 = time.perf_counter()
        self.dispatch_task(0, ("touch", 0))

    def handle_task_completion(self, result: dict) -> None:
        if not result["ok"]:
            raise RuntimeError(f"executor {result['executor']}: its bytes changed after a load")
        self.done += 1
        if self.done < self.total:
            self.dispatch_task(self.done % self.num_executors, ("touch", self.done))
        else:
            seconds = time.perf_counter() - self.t0
            self.finish({"tasks": self.done, "seconds": seconds, "mb": float(self.config.get("mb", 8))})


class SpillExecutor(litz.Executor):
    def load_input(self) -> None:
        nbytes = int(float(self.config.get("mb", 8)) * 1e6)
        self.data = _blob(self.executor_id, nbytes)
        self.check = int(self.data[::STRIDE].sum(dtype=np.int64))

    def run_task(self, args: tuple) -> dict:
        ok = int(self.data[::STRIDE].sum(dtype=np.int64)) == self.check
        return {"executor": self.executor_id, "ok": ok}
