"""Test app: one task at a time, on executors chosen at random, so consecutive tasks run on the same worker
or on different ones. Every task reads a counter and a float array, checks them against what the driver
expects (every earlier task's updates: each was completed before this one was dispatched), then adds to
both. A worker that served a cached value without hearing that another worker wrote the key since, or
that added its own acknowledged updates into its cache wrongly (twice, or not at all), shows here.
Float increments of 0.1 make the array check bitwise: the cache's sums must be the server's.
"""
import random

import numpy as np

import litz

SHAPE = (4, 3)


class ForeignWrites(litz.Driver):
    def dispatch_initial_tasks(self):
        self.rng = random.Random(self.config.get("seed", 0))
        self.steps = self.config.get("steps", 200)
        self.step = 0
        self.count = 0
        self.arr = None
        self.violations = []
        self.live_hits = {}
        self._next()

    def _next(self):
        self.dispatch_task(self.rng.randrange(self.num_executors), ("step", self.step, 1 + self.rng.randrange(3)))

    def handle_task_completion(self, result):
        step, add, count, arr, worker, hits = result
        if count != self.count:
            self.violations.append(["count", step, count, self.count])
        if (arr is None) != (self.arr is None) or (arr is not None and not np.array_equal(arr, self.arr)):
            self.violations.append(["array", step])
        self.count += add
        delta = np.full(SHAPE, 0.1 * add)
        self.arr = delta.copy() if self.arr is None else np.add(self.arr, delta)
        self.live_hits[worker] = hits
        self.step += 1
        if self.step < self.steps:
            self._next()
        else:
            self.finish({"violations": self.violations, "live_hits": sum(self.live_hits.values()),
                         "workers": len(self.live_hits)})


class ForeignWritesExecutor(litz.Executor):
    def run_task(self, args):
        _, step, add = args
        count, arr = self.ps_get_many(["count", "arr"])
        self.ps_update("count", add)
        self.ps_update("arr", np.full(SHAPE, 0.1 * add))
        worker = self._litz  # test-only peek at the runtime: did live cache entries serve reads?
        return (step, add, 0 if count is None else int(count), None if arr is None else np.array(arr),
                worker.ident, worker.cache.live_hits)
