"""Test app: causal chains of tasks hopping across executors, plus concurrent updates to shared keys.

Chain c runs ``steps`` tasks; step t runs on executor (c + t) % E, reads counter ("chain", c), which
must equal t if every earlier step's update is visible (the consistency rule), then adds 1. Every task
also adds 1 to "total" and a block of ones to arrays of several dtypes, so lost or doubled updates show.
Executors count the tasks they ran (state that must survive migration and recovery) and check their
input data (which is re-loaded, never moved, on scale-in).

With ``ahead`` = k in the config each chain keeps k steps dispatched beyond the one running, each with
``after=`` the step before (consecutive steps run on neighbouring executors, often on two workers: the
worker-to-worker hand-off); the result then also counts the steps sent ahead with a predecessor on another worker.
"""
import os
import time

import numpy as np

import litz

DTYPES = ("float32", "float64", "int64", "int32")
SHAPE = (3, 5)  # the default; config 'shape' overrides it


class Chains(litz.Driver):
    def dispatch_initial_tasks(self):
        self.chains = self.config.get("chains", 16)
        self.steps = self.config.get("steps", 40)
        self.violations = []
        self.left = self.chains
        self.counts = {}
        self.runs = {}  # log_runs: worker pid -> [start, end] wall times of every task its executors ran
        if self.config.get("log_runs"):
            self.report(log_runs=1)  # a --metrics row: its "time" - "t" is the job log's start (events' clock)
        self.ahead = self.config.get("ahead", 0)
        if self.ahead:
            self.sent, self.done, self.last = [0] * self.chains, [0] * self.chains, [None] * self.chains
        for c in range(self.chains):
            if self.ahead:
                self.send_ahead(c)
            else:
                self.dispatch_task(c % self.num_executors, ("step", c, 0))

    def send_ahead(self, c):
        """Chain c's steps up to ``ahead`` beyond the one running, each after the step before."""
        while self.sent[c] < self.steps and self.sent[c] <= self.done[c] + self.ahead:
            t = self.sent[c]
            self.last[c] = self.dispatch_task((c + t) % self.num_executors, ("step", c, t), after=self.last[c])
            self.sent[c] += 1

    def handle_partial_recovery(self, info):
        return False if self.config.get("refuse_partial") else None  # as an app that cannot recount would

    def handle_task_completion(self, result):
        kind = result[0]
        if kind == "check":
            ran = sum(self.counts.values())
            runs = {"runs": self.runs} if self.config.get("log_runs") else {}
            after = self._litz.after  # runtime internals (the master's table of pending tasks): tests only
            remote = {"remote": after.sent_ahead_remote} if self.ahead and after is not None else {}
            self.finish({"violations": self.violations, "tasks_ran": ran, **result[1], **runs, **remote})
        elif kind == "count":
            self.counts[result[1]] = result[2]
            for pid, spans in result[3].items():
                self.runs.setdefault(str(pid), []).extend(spans)
            if len(self.counts) == self.num_executors:
                self.dispatch_task(self.num_executors - 1, ("check",))
        else:
            _, c, t, seen = result
            if seen != t:
                self.violations.append([c, t, seen])
            if t + 1 == self.steps:
                self.left -= 1
                if self.left == 0:
                    for e in range(self.num_executors):
                        self.dispatch_task(e, ("count",))
            elif self.ahead:
                self.done[c] += 1
                self.send_ahead(c)
            else:
                self.dispatch_task((c + t + 1) % self.num_executors, ("step", c, t + 1))


class ChainExecutor(litz.Executor):
    input_attrs = ("data",)

    def load_input(self):
        self.data = np.arange(1000, dtype=np.float64) + self.executor_id
        time.sleep(self.config.get("load_sleep", 0))  # a slow input source: recoveries take longer

    def run_task(self, args):
        assert self.data[0] == self.executor_id and len(self.data) == 1000, "input data lost or wrong"
        kind = args[0]
        if kind == "count":
            return ("count", self.executor_id, getattr(self, "ran", 0), getattr(self, "runs", {}))
        if kind == "check":
            arrays = self.ps_get_many([("arr", d) for d in DTYPES])
            return ("check", {
                "total": self.ps_get("total"),
                "arrays": {d: [str(a.dtype), list(a.shape), float(a.sum()), float(a.min()), float(a.max())]
                           for d, a in zip(DTYPES, arrays, strict=True)},
                "missing": self.ps_get("never-updated"),
            })
        _, c, t = args
        start = time.time()
        gate = self.config.get("gate")  # a file: while it exists, the second half of the executors wait
        while gate and self.executor_id >= self.num_executors // 2 and os.path.exists(gate):
            time.sleep(0.01)
        value = self.ps_get(("chain", c))
        seen = 0 if value is None else int(value)
        if self.config.get("sleep"):
            time.sleep(self.config["sleep"])
        if self.config.get("spin"):  # CPU work instead of a sleep: what a CPU quota slows down
            end = time.thread_time() + self.config["spin"]
            while time.thread_time() < end:
                pass
        self.ps_update(("chain", c), 1)
        self.ps_update("total", 1)
        shape = tuple(self.config.get("shape", SHAPE))  # large shapes travel through shared-memory rings
        self.ps_update_many((("arr", d), np.ones(shape, dtype=d)) for d in DTYPES)
        self.ran = getattr(self, "ran", 0) + 1
        if self.config.get("log_runs"):  # state: moves and checkpoints keep it, as they keep "ran"
            self.runs = getattr(self, "runs", {})
            self.runs.setdefault(os.getpid(), []).append([start, time.time()])
        return ("step", c, t, seen)
