"""Test app: SSP through the real runtime. Each task of iteration i first reads the completion counter
of iteration i-s-1, which must be complete (every executor's increment visible), then sleeps and increments
the counter of its own iteration. Executor 0 sleeps 40 ms a task and the others at most 2 ms, so the others
run ahead until the bound holds them (random sleeps alone left that to chance: under CPU load the executors
sometimes never drifted two iterations apart). The driver records how far ahead of the oldest unfinished
iteration a task completed: exactly s, whatever s is."""
import random
import time

import litz
from litz.ssp import SSP

SLOW_S = 0.04  # executor 0's task: the others' are far shorter, whatever the load


class SSPDriver(litz.Driver):
    def dispatch_initial_tasks(self):
        self.s = self.config["staleness"]
        self.ssp = SSP(self, staleness=self.s, iterations=self.config["iterations"])
        self.bad = []
        self.max_spread = 0
        self.ssp.start()

    def handle_task_completion(self, result):
        iteration, seen = result
        if iteration - self.s - 1 >= 0 and seen != self.num_executors:
            self.bad.append([iteration, seen])
        # how far this task ran ahead of the oldest unfinished iteration: s at most, and s as executor 0 lags
        self.max_spread = max(self.max_spread, iteration - self.ssp.finished_iterations)
        self.ssp.complete(iteration)
        if self.ssp.done:
            self.finish({"bad": self.bad, "max_spread": self.max_spread})


class SSPExecutor(litz.Executor):
    def run_task(self, iteration):
        s = self.config["staleness"]
        prev = self.ps_get(("done", iteration - s - 1)) if iteration - s - 1 >= 0 else None
        time.sleep(SLOW_S if self.executor_id == 0 else random.random() * 0.002)
        self.ps_update(("done", iteration), 1)
        return iteration, (0 if prev is None else int(prev))
