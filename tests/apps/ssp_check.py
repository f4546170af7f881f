"""Test app: SSP through the real runtime. Each task of iteration i first reads the completion counter
of iteration i-s-1, which must be complete (every executor's increment visible), then sleeps a little
(executors drift apart) and increments the counter of its own iteration."""
import random
import time

import litz
from litz.ssp import SSP


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
        self.ssp.complete(iteration)
        if self.ssp.done:
            self.finish({"bad": self.bad})


class SSPExecutor(litz.Executor):
    def run_task(self, iteration):
        s = self.config["staleness"]
        prev = self.ps_get(("done", iteration - s - 1)) if iteration - s - 1 >= 0 else None
        time.sleep(random.random() * 0.004 * (1 + self.executor_id % 3))
        self.ps_update(("done", iteration), 1)
        return iteration, (0 if prev is None else int(prev))
