"""Test app: each executor runs a numba kernel that the app does not declare in ``KERNELS``, so a worker
compiles it at its first call when numba's cache lacks it (what litz.kernels.watch reports)."""
import numba
import numpy as np

import litz


@numba.njit(cache=True)
def weighted_sum(x, w):  # pragma: no cover
    total = 0.0
    for i in range(x.shape[0]):
        total += x[i] * w
    return total


class Jitted(litz.Driver):
    def dispatch_initial_tasks(self):
        self.left = self.num_executors
        for e in range(self.num_executors):
            self.dispatch_task(e)

    def handle_task_completion(self, result):
        self.left -= 1
        if not self.left:
            self.finish({"ok": True})


class Part(litz.Executor):
    def run_task(self, args):
        return weighted_sum(np.arange(10.0), float(self.executor_id))
