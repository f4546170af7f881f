"""``apps.mlr`` plus a test-accuracy curve, for bench/mlr_time_to_accuracy.py.

The driver is apps.mlr's, unchanged, except that whenever an epoch finishes (its ``report(epoch=...)``)
it notes the time and dispatches one extra ``("test", epoch)`` task, round-robin over the executors. Such
a task is dispatched after every task of the epoch completed, so by the consistency rule it sees at least
every update of the epoch; it scores the weights it reads on the whole test set, which each executor
generates in ``load_input`` (before the clock starts). The result of ``apps.mlr`` gains ``curve``: per
epoch, the seconds from ``dispatch_initial_tasks`` to the epoch's end and the test accuracy.
"""
from __future__ import annotations

import time

import apps.mlr as mlr
from apps.mlr import data, model


class TimedMLRDriver(mlr.MLRDriver):
    def dispatch_initial_tasks(self):
        self.t0 = time.perf_counter()
        self.curve = {}
        self.tests_pending = 0
        self.final = None
        super().dispatch_initial_tasks()

    def report(self, **metrics):
        super().report(**metrics)
        epoch = metrics.get("epoch")
        if epoch is not None:
            self.curve[epoch] = {"epoch": epoch, "t": time.perf_counter() - self.t0,
                                 "train_accuracy": metrics.get("train_accuracy")}
            self.tests_pending += 1
            self.dispatch_task((epoch - 1) % self.num_executors, ("test", epoch))

    def handle_task_completion(self, result):
        if result["kind"] != "test":
            super().handle_task_completion(result)
            return
        self.curve[result["epoch"]]["test_accuracy"] = result["accuracy"]
        self.tests_pending -= 1
        if self.final is not None and not self.tests_pending:
            self.finish(self.final)

    def finish(self, result=None):
        if self.final is None and isinstance(result, dict):
            self.final = {**result, "train_seconds": time.perf_counter() - self.t0}
        if self.tests_pending:
            return  # finish once the last test-accuracy task is in
        self.final["curve"] = [self.curve[e] for e in sorted(self.curve)]
        super().finish(self.final)


class TimedMLRExecutor(mlr.MLRExecutor):
    def load_input(self):
        super().load_input()
        s = self.settings
        self.X_test, self.y_test = data.test_share(s, 0, 1, self.d, self.classes)
        if self.scaler:
            self.X_test = self.scaler.transform(self.X_test)

    def run_task(self, args):
        if args[0] != "test":
            return super().run_task(args)
        W, b = self.weights()
        _, correct, count = model.evaluate(self.X_test, self.y_test, W, b)
        return {"kind": "test", "epoch": args[1], "accuracy": correct / max(count, 1)}
