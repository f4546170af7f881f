import numpy as np

import litz
from litz.ssp import SSP


class LinRegSSP(litz.Driver):
    def dispatch_initial_tasks(self):
        # one task per executor and iteration; iteration i is dispatched once i - staleness - 1 has finished
        staleness, iterations = self.config.get("staleness", 1), self.config.get("iterations", 100)
        self.ssp = SSP(self, staleness, iterations)
        self.loss = {}
        self.ssp.start()

    def handle_task_completion(self, result):
        iteration, loss = result
        self.loss[iteration] = self.loss.get(iteration, 0.0) + loss / self.num_executors
        for done in self.ssp.complete(iteration):   # the iterations that just finished, in order
            mean = self.loss.pop(done)
            self.report(iteration=done, loss=mean)
        if self.ssp.done:
            self.finish({"loss": mean, "iterations": self.ssp.iterations})


class Partition(litz.Executor):
    input_attrs = ("X", "y")

    def load_input(self):
        rng = np.random.default_rng(self.executor_id)
        self.X = rng.normal(size=(2000, 10))
        self.y = self.X @ np.arange(10.0) + rng.normal(scale=0.1, size=2000)

    def run_task(self, iteration):              # SSP's task arguments: the iteration number
        w = self.ps_get("w")                    # holds every update of iterations <= iteration - staleness - 1
        w = np.zeros(10) if w is None else w
        grad = self.X.T @ (self.X @ w - self.y) / len(self.y)
        self.ps_update("w", -0.05 * grad)
        return iteration, float(np.mean((self.X @ w - self.y) ** 2))
