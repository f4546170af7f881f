"""Test app for SCAR partial recovery: +1 to every key, a quiet phase, +10 to every key, a quiet phase,
then read everything. The quiet phases (tasks that touch no parameter) give a test time to checkpoint and
to kill a server while nothing is in flight, so what a recovery restores can be checked key by key."""
import time

import numpy as np

import litz

KEYS = [("k", i) for i in range(64)]


class Phases(litz.Driver):
    def dispatch_initial_tasks(self):
        self.plan = [("add", 1.0), ("idle", self.config.get("idle1", 120)), ("add", 10.0),
                     ("idle", self.config.get("idle2", 120)), ("read", None)]
        self.step = -1
        self.next_step()

    def next_step(self):
        self.step += 1
        kind, arg = self.plan[self.step]
        self.report(phase=f"{kind}{self.step}")
        if kind == "add":
            self.left = self.num_executors
            for e in range(self.num_executors):
                self.dispatch_task(e, ("add", arg))
        elif kind == "idle":
            self.left = arg
            self.dispatch_task(0, ("idle",))
        else:
            self.left = 1
            self.dispatch_task(0, ("read",))

    def handle_task_completion(self, result):
        if result[0] == "read":
            self.finish({"values": result[1]})
            return
        self.left -= 1
        if self.left > 0 and result[0] == "idle":
            self.dispatch_task(0, ("idle",))
        elif self.left == 0:
            self.next_step()


class PhaseExecutor(litz.Executor):
    def run_task(self, args):
        if args[0] == "add":
            mine = KEYS[self.executor_id::self.num_executors]
            self.ps_update_many((k, np.full(4, args[1])) for k in mine)
        elif args[0] == "idle":
            time.sleep(0.05)
        else:
            values = self.ps_get_many(KEYS)
            return ("read", {f"{k[0]}{k[1]}": (None if v is None else float(v[0])) for k, v in zip(KEYS, values,
                                                                                                    strict=True)})
        return (args[0],)
