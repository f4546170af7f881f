"""Test app: chains of dependent tasks dispatched ahead with ``after=`` (docs/design.md, "Dependent dispatch").

Chain c runs ``steps`` tasks; step t runs on executor ``c * span + t % span`` (mod E: ``span`` executors take
turns) and must read counter ("chain", c) equal to t:
every earlier step's update visible, although step t was dispatched before step t - 1 completed (``ahead`` steps
are kept dispatched beyond the one running, each after the one before). Each task also reports whether it was
released on its worker from a held state (it ran with fresh keys: the path without the master), and whether it started
before its predecessor's flush was acknowledged (handed off early: it read the update from its worker's in-flight
flush), and the driver counts the steps sent ahead with a predecessor on another worker (handed off from worker to
worker), so a test can see every path was taken.
"""
import litz


class AfterChains(litz.Driver):
    def dispatch_initial_tasks(self):
        self.chains = self.config.get("chains", 2)
        self.steps = self.config.get("steps", 60)
        self.ahead = self.config.get("ahead", 2)
        self.span = self.config.get("span", 2)  # executors a chain takes turns on
        self.violations, self.released, self.early = [], 0, 0
        self.sent, self.done = [0] * self.chains, [0] * self.chains
        self.last = [None] * self.chains
        for c in range(self.chains):
            self._send(c)

    def _send(self, c):
        while self.sent[c] < self.steps and self.sent[c] <= self.done[c] + self.ahead:
            t = self.sent[c]
            e = (c * self.span + t % self.span) % self.num_executors
            self.last[c] = self.dispatch_task(e, (c, t), after=self.last[c])
            self.sent[c] += 1

    def handle_task_completion(self, result):
        c, t, seen, released, early = result
        if seen != t:
            self.violations.append([c, t, seen])
        self.released += released
        self.early += early
        self.done[c] += 1
        self._send(c)
        if all(d == self.steps for d in self.done):
            after = self._litz.after  # runtime internals (the master's table of pending tasks): tests only
            self.finish({"violations": self.violations, "released": self.released, "early": self.early,
                         "tasks": self.chains * self.steps, "remote": after.sent_ahead_remote if after else 0})


class AfterChainExecutor(litz.Executor):
    def run_task(self, args):
        c, t = args
        worker = self._litz  # runtime internals: tests only
        early = int(worker.current in worker.early_tasks)
        seen = self.ps_get(("chain", c))
        self.ps_update(("chain", c), 1)
        released = int(getattr(worker.current, "fresh", None) is not None)
        return c, t, 0 if seen is None else int(seen), released, early
