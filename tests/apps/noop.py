"""Test app: ``tasks`` no-op micro-tasks with ``inflight`` kept in flight (each sleeping ``sleep`` s)."""
import time

import litz


class Noop(litz.Driver):
    def dispatch_initial_tasks(self):
        self.total = self.config.get("tasks", 1000)
        self.sent = self.done = 0
        for _ in range(min(self.config.get("inflight", 100), self.total)):
            self._send()

    def _send(self):
        self.dispatch_task(self.sent % self.num_executors, self.sent)
        self.sent += 1

    def handle_task_completion(self, result):
        self.done += 1
        self.report(done=self.done)
        if self.done == self.total:
            self.finish({"done": self.done})
        elif self.sent < self.total:
            self._send()


class NoopExecutor(litz.Executor):
    def run_task(self, args):
        if self.config.get("sleep"):
            time.sleep(self.config["sleep"])
        return args
