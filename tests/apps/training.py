"""Test app for the dashboard: a training loop that reports loss and accuracy once an epoch, declares its total
(``epochs``), and runs each task for ``task_s`` seconds, so a job lasts as long as a test needs (or until
``litzctl stop``). Executors keep a step count as their state, so scale and recovery have something to move."""
import time

import litz


class Training(litz.Driver):
    def dispatch_initial_tasks(self):
        self.epochs = self.config.get("epochs", 1000)
        self.epoch, self.left = 0, self.num_executors
        self.set_total(self.epochs, unit="epoch")
        for e in range(self.num_executors):
            self.dispatch_task(e, self.epoch)

    def handle_task_completion(self, result):
        self.left -= 1
        if self.left:
            return
        self.epoch += 1
        loss = 1.0 / (1 + 0.1 * self.epoch)
        self.report(epoch=self.epoch, loss=loss, accuracy=1.0 - loss / 2)
        if self.epoch == self.epochs:
            self.finish({"epochs": self.epoch})
            return
        self.left = self.num_executors
        for e in range(self.num_executors):
            self.dispatch_task(e, self.epoch)


class TrainingExecutor(litz.Executor):
    def load_input(self):
        self.steps = 0

    def run_task(self, epoch):
        time.sleep(self.config.get("task_s", 0.01))
        self.steps += 1
        self.ps_update("steps", 1.0)
        return epoch
