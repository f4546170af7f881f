import numpy as np

import litz


class LinReg(litz.Driver):
    def dispatch_initial_tasks(self):
        self.steps_left = {e: self.config.get("steps", 100) for e in range(self.num_executors)}
        for e in self.steps_left:
            self.dispatch_task(e)

    def handle_task_completion(self, result):
        executor, loss = result
        self.report(loss=loss)
        self.steps_left[executor] -= 1
        if self.steps_left[executor]:
            self.dispatch_task(executor)       # sees every update made so far
        elif not any(self.steps_left.values()):
            self.finish({"loss": loss})


class Partition(litz.Executor):
    input_attrs = ("X", "y")                   # re-loaded, never checkpointed or migrated on scale-in

    def load_input(self):
        rng = np.random.default_rng(self.executor_id)
        self.X = rng.normal(size=(2000, 10))
        self.y = self.X @ np.arange(10.0) + rng.normal(scale=0.1, size=2000)

    def run_task(self, args):
        w = self.ps_get("w")
        w = np.zeros(10) if w is None else w
        grad = self.X.T @ (self.X @ w - self.y) / len(self.y)
        self.ps_update("w", -0.05 * grad)       # additive update, summed on the servers
        return self.executor_id, float(np.mean((self.X @ w - self.y) ** 2))
