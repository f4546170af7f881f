"""Test app for the running checkpoint's starting values: the app writes its starting values as updates
(cold keys 1, hot keys 1000), then only the hot keys keep moving (+10 per task) until ``drift_s`` seconds have
passed, then everything is read. With a tiny priority fraction every round picks hot keys, so a cold key is
never chosen: only the running checkpoint's starting values can bring a lost one back."""
import time

import numpy as np

import litz

COLD = [("c", i) for i in range(16)]
HOT = [("h", i) for i in range(48)]


class Starting(litz.Driver):
    def dispatch_initial_tasks(self):
        self.phase, self.left = "init", self.num_executors
        self.report(phase="init")
        for e in range(self.num_executors):
            self.dispatch_task(e, ("init",))

    def handle_task_completion(self, result):
        if result[0] == "read":
            self.finish({"values": result[1]})
            return
        if self.phase == "init":
            self.left -= 1
            if self.left == 0:
                self.phase, self.until = "drift", time.time() + self.config.get("drift_s", 8.0)
                self.report(phase="drift")
                for e in range(self.num_executors):
                    self.dispatch_task(e, ("drift",))
        elif time.time() < self.until:
            self.dispatch_task(result[1], ("drift",))
        elif self.phase == "drift":
            self.phase = "read"
            self.report(phase="read")
            self.dispatch_task(0, ("read",))


class StartingExecutor(litz.Executor):
    def run_task(self, args):
        if args[0] == "init":
            self.ps_update_many((k, np.full(4, 1.0)) for k in COLD[self.executor_id::self.num_executors])
            self.ps_update_many((k, np.full(4, 1000.0)) for k in HOT[self.executor_id::self.num_executors])
        elif args[0] == "drift":
            self.ps_update_many((k, np.full(4, 10.0)) for k in HOT[self.executor_id::self.num_executors])
            time.sleep(0.002)
        else:
            values = self.ps_get_many(COLD)
            return ("read", {f"{k[0]}{k[1]}": (None if v is None else float(v[0])) for k, v in zip(COLD, values,
                                                                                                    strict=True)})
        return (args[0], self.executor_id)
