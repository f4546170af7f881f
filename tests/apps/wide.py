"""Test app: many 64 KiB parameters spread over all shards; every task adds 1 to a rotating subset, so a
small server budget makes shards spill and load back while totals must stay exact."""
import numpy as np

import litz

KEYS = 64


class Wide(litz.Driver):
    def dispatch_initial_tasks(self):
        self.tasks, self.sent, self.done = self.config.get("tasks", 200), 0, 0
        for _ in range(min(4, self.tasks)):
            self.send()

    def send(self):
        self.dispatch_task(self.sent % self.num_executors, ("add", self.sent))
        self.sent += 1

    def handle_task_completion(self, result):
        if result[0] == "read":
            self.finish({"sums": result[1]})
            return
        self.done += 1
        if self.sent < self.tasks:
            self.send()
        elif self.done == self.tasks:
            self.dispatch_task(0, ("read",))


class WideExecutor(litz.Executor):
    def run_task(self, args):
        if args[0] == "read":
            return ("read", [None if v is None else float(v.sum()) for v in self.ps_get_many(range(KEYS))])
        start = (args[1] * 7) % KEYS
        self.ps_update_many((k % KEYS, np.ones(8192)) for k in range(start, start + 8))
        return ("add",)


def expected_sums(tasks: int) -> list[float]:
    sums = [0.0] * KEYS
    for t in range(tasks):
        start = (t * 7) % KEYS
        for k in range(start, start + 8):
            sums[k % KEYS] += 8192.0
    return sums
