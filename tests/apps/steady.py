"""Test app for malformed messages: an exact count, held open until a file appears.

``rounds`` rounds of one task per executor, each adding 1 to its executor's key and to "total"; then tasks that
touch nothing keep the job running until the file named by ``stop`` exists (a test sends its messages
meanwhile); then every executor reads every key. The result is exact whatever happened in between: a lost or
doubled completion or update, or a read that missed one, shows in it."""
import os
import time

import litz


class Steady(litz.Driver):
    def dispatch_initial_tasks(self):
        self.rounds, self.round, self.left = self.config.get("rounds", 5), 0, self.num_executors
        self.stop, self.reads = self.config["stop"], []
        for e in range(self.num_executors):
            self.dispatch_task(e, ("add",))

    def handle_task_completion(self, result):
        kind = result[0]
        if kind == "add":
            self.left -= 1
            if self.left:
                return
            self.round += 1
            self.left = self.num_executors
            for e in range(self.num_executors):
                self.dispatch_task(e, ("add",) if self.round < self.rounds else ("idle",))
        elif kind == "idle":
            if not os.path.exists(self.stop):
                self.dispatch_task(result[1], ("idle",))
                return
            self.left -= 1
            if not self.left:
                self.left = self.num_executors
                for e in range(self.num_executors):
                    self.dispatch_task(e, ("read",))
        else:
            self.reads.append(result[1])
            if len(self.reads) == self.num_executors:
                first = self.reads[0]
                self.finish({"keys": first[0], "total": first[1], "all_reads_equal": all(r == first
                                                                                         for r in self.reads)})


class SteadyExecutor(litz.Executor):
    def run_task(self, args):
        if args[0] == "add":
            self.ps_update(("k", self.executor_id), 1.0)
            self.ps_update("total", 1.0)
            return ("add",)
        if args[0] == "idle":
            time.sleep(0.005)
            return ("idle", self.executor_id)
        keys = [float(v) for v in self.ps_get_many([("k", e) for e in range(self.num_executors)])]
        return ("read", (keys, float(self.ps_get("total"))))
