"""Micro-task throughput app: no-op tasks, a fixed number in flight, each completion dispatches another.

Config: ``tasks`` (total to run), ``inflight`` (kept in flight), ``warmup`` (completions before the clock
used for the steady-state rate starts). The result holds the task count and the driver-side timings.
"""
from __future__ import annotations

import time

import litz


class NoopDriver(litz.Driver):
    def __init__(self):
        self.total = int(self.config.get("tasks", 200_000))
        self.inflight = int(self.config.get("inflight", 2000))
        self.warmup = int(self.config.get("warmup", self.total // 20))
        self.dispatched = 0
        self.completed = 0
        self.next_executor = 0

    def _dispatch(self):
        self.dispatch_task(self.next_executor)
        self.next_executor = (self.next_executor + 1) % self.num_executors
        self.dispatched += 1

    def dispatch_initial_tasks(self):
        self.t0 = time.perf_counter()
        self.t_warm = None
        for _ in range(min(self.inflight, self.total)):
            self._dispatch()

    def handle_task_completion(self, result):
        self.completed += 1
        if self.completed == self.warmup:
            self.t_warm = time.perf_counter()
        if self.dispatched < self.total:
            self._dispatch()
        elif self.completed == self.total:
            t1 = time.perf_counter()
            steady = None
            if self.t_warm is not None and self.total > self.warmup:
                steady = (self.total - self.warmup) / (t1 - self.t_warm)
            self.finish({"tasks": self.total, "seconds": t1 - self.t0, "rate": self.total / (t1 - self.t0),
                         "steady_rate": steady, "inflight": self.inflight})


class NoopExecutor(litz.Executor):
    def run_task(self, args):
        return None
