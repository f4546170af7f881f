"""Test app: what ``Driver.executor_speed`` says while the job runs.

``rounds`` rounds of one task per executor (bulk synchronous); a task sleeps ``sleep`` seconds (the slow-worker
hook stretches that) and returns its executor and the pid of the worker that ran it. After each round the driver
reports ``round``, every executor's ``executor_speed`` (None while unknown) and the pid each ran on, so a test can
line the speeds up with the workers and with the job's events (the metrics rows carry the job time ``t``)."""
import os
import time

import litz


class SpeedProbe(litz.Driver):
    def dispatch_initial_tasks(self):
        self.rounds, self.round, self.left = self.config.get("rounds", 50), 0, self.num_executors
        self.pids = [None] * self.num_executors
        for e in range(self.num_executors):
            self.dispatch_task(e)

    def handle_task_completion(self, result):
        executor, pid = result
        self.pids[executor] = pid
        self.left -= 1
        if self.left:
            return
        self.round += 1
        speeds = [self.executor_speed(e) for e in range(self.num_executors)]
        self.report(round=self.round, speeds=speeds, pids=list(self.pids))
        if self.round == self.rounds:
            self.finish({"rounds": self.round})
            return
        self.left = self.num_executors
        for e in range(self.num_executors):
            self.dispatch_task(e)


class ProbeExecutor(litz.Executor):
    def run_task(self, args):
        time.sleep(self.config.get("sleep", 0.004))
        return self.executor_id, os.getpid()
