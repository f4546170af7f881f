"""Test app for out-of-core execution: executors with large input data (``mb`` MiB each) and a running
state (a counter and a random vector they update), visited round-robin so that a small memory budget
forces evictions and loads. The result lets a test check every executor's state exactly."""
import time

import numpy as np

import litz


class Sweep(litz.Driver):
    def dispatch_initial_tasks(self):
        self.rounds = self.config.get("rounds", 6)
        self.done = {}
        self.left = self.rounds * self.num_executors
        for e in range(min(self.config.get("inflight", 2), self.num_executors)):
            self.dispatch_task(e, ("work", e))
        self.next = min(self.config.get("inflight", 2), self.num_executors)

    def handle_task_completion(self, result):
        if result[0] == "final":
            self.done[result[1]] = result[2:]
            if len(self.done) == self.num_executors:
                self.finish({"states": {str(e): v for e, v in sorted(self.done.items())}})
            return
        self.left -= 1
        self.report(done=self.rounds * self.num_executors - self.left)
        if self.next < self.rounds * self.num_executors:
            e = self.next % self.num_executors
            self.dispatch_task(e, ("work", e))
            self.next += 1
        elif self.left == 0:
            for e in range(self.num_executors):
                self.dispatch_task(e, ("final",))


class Heavy(litz.Executor):
    input_attrs = ("X",)

    def load_input(self):
        n = self.config.get("mb", 4) * (1 << 20) // 8
        self.X = np.random.default_rng(self.executor_id).random(n)

    def run_task(self, args):
        if args[0] == "final":
            return ("final", self.executor_id, getattr(self, "count", 0), float(self.vec.sum()))
        self.count = getattr(self, "count", 0) + 1
        if not hasattr(self, "vec"):
            self.vec = np.zeros(1000)
        self.vec += np.random.default_rng(self.executor_id * 1000 + self.count).random(1000)
        self.ps_update("sum", float(self.X[:1000].sum()))
        time.sleep(self.config.get("sleep", 0.0))
        return ("work", self.executor_id)


def expected_state(executor_id: int, rounds: int) -> tuple[int, float]:
    vec = np.zeros(1000)
    for count in range(1, rounds + 1):
        vec += np.random.default_rng(executor_id * 1000 + count).random(1000)
    return rounds, float(vec.sum())
