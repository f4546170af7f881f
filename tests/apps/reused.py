"""Test app: tasks that wait for values (so several are under way on a worker at once) report how many tasks the
greenlet they ran in has run, and count themselves into a parameter-server key, read back at the end."""
import greenlet

import litz

ROUNDS = 50


class Reused(litz.Driver):
    def dispatch_initial_tasks(self):
        self.done = self.rounds = 0
        self.most = 0  # the most tasks one greenlet ran
        self.dispatch_round()

    def dispatch_round(self):
        for e in range(self.num_executors):
            self.dispatch_task(e, self.rounds)

    def handle_task_completion(self, ran):
        self.done += 1
        self.most = max(self.most, ran)
        if self.done % self.num_executors:
            return
        self.rounds += 1
        if self.rounds < ROUNDS:
            self.dispatch_round()
        else:
            self.finish({"tasks": self.done, "most_per_greenlet": self.most, "counted": self.ps_get("count")})


class ReusedExecutor(litz.Executor):
    def run_task(self, rnd):
        self.ps_get(("seen", self.executor_id, rnd))  # never written: a fetch, so the task waits for it
        self.ps_update("count", 1.0)
        me = greenlet.getcurrent()
        me.litz_test_ran = getattr(me, "litz_test_ran", 0) + 1
        return me.litz_test_ran
