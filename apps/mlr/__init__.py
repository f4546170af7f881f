"""Multinomial logistic regression (softmax regression) by mini-batch SGD under SSP (thesis §4.5 MLR).

Run: ``litz run apps.mlr --config synthetic=1`` (see README.md in this directory for every key).

Model: ``W`` (d x classes) and ``b`` live in the parameter server as float32 row blocks ``("W", k)`` and
``("b",)``; they start at zero (a never-updated key reads as None = zeros). Executors hold a partition of
the rows (``X``, ``y``: input data, re-loaded rather than moved on scale-in).

A task fetches the weights once, runs a few mini-batch SGD steps on its own partition starting from them,
and adds its summed step (``-lr * gradients``) to the server: plain data-parallel SGD, Bösen-style, each
row's gradient counted once. The driver runs iterations through :class:`litz.ssp.SSP` (``staleness``,
default 2): all tasks of one iteration share a version, hence cached weights, and may miss the updates
of the ``staleness`` previous iterations.

Why a few mini-batches per task rather than a whole pass over the partition (iteration = epoch): the
steps that all executors take in up to ``staleness + 1`` iterations start from the same stale weights and
are then summed. With an epoch per iteration those are thousands of steps, and their sum overshoots and
oscillates: simulating worst-case staleness on a 100 000 x 100 synthetic problem with 8 executors, s=2 and
lr=0.1 gave 0.62 test accuracy and loss 3.9, against scikit-learn's 0.78 and 0.57. Averaging the steps
instead is stable but divides the progress per epoch by the number of executors. Bösen bounds this with
"batches per clock", and so do we: an iteration covers about 8 mini-batches summed over all executors
(``batches_per_task`` = max(1, 8 // executors), overridable). That stayed within 0.5 point of
scikit-learn for 1-16 executors and staleness 0-3 in the same simulation. An epoch is then
``ceil(batches of the largest partition / batches_per_task)`` iterations, and every executor visits each
of its mini-batches once per epoch, in an order shuffled per epoch. Tasks take about a millisecond, so
the runtime's per-task overhead matters more than the arithmetic. Executors keep no state apart from
their data, so moving and checkpointing them is cheap.

Protocol (task arguments -> result dicts):
 * ``("info",)`` -> partition size, ``d`` and ``classes``: the driver learns the epoch length.
 * ``("train", iteration, iterations_per_epoch)`` -> summed loss, correct predictions and rows of the
   mini-batches run (measured before each step); the driver reports per-epoch loss and accuracy.
 * ``("eval",)`` once all training completed, so it sees every update (the consistency rule) -> loss and
   correct counts of the final weights on the executor's training rows and its block of the test set.

With ``output=PATH`` the driver reads the final weights itself (``Driver.ps_get_many``, after the last
evaluation completed) and writes them with the labels to that ``.npz`` (:mod:`apps.modelfile`).
"""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

import litz
from litz.ssp import SSP

from ..modelfile import model_path, save_model
from . import data, model
from .settings import Settings


def _train_args(iteration: int, executor: int, *, per_epoch: int) -> tuple:
    return ("train", iteration, per_epoch)


class MLRDriver(litz.Driver):
    """Learns the partition sizes, runs ``epochs`` epochs of SSP iterations, then one evaluation round."""

    def dispatch_initial_tasks(self) -> None:
        self.settings = Settings.from_config(self.config)
        self.output = model_path(self.settings.output)  # a bad path fails now, not after training
        self.infos: list[dict] = []
        self.epoch_stats: dict[int, list[float]] = {}  # epoch -> [loss, correct, rows]
        self.evals: list[dict] = []
        self.ssp: SSP | None = None
        for executor in range(self.num_executors):
            self.dispatch_task(executor, ("info",))

    def handle_task_completion(self, result: dict) -> None:
        kind = result["kind"]
        if kind == "train":
            self._train_done(result)
        elif kind == "info":
            self.infos.append(result)
            if len(self.infos) == self.num_executors:
                self._start_training()
        elif kind == "eval":
            self.evals.append(result)
            if len(self.evals) == self.num_executors:
                self._finish()
        else:
            raise ValueError(f"unexpected task result kind {kind!r}")

    def _start_training(self) -> None:
        shapes = {(r["d"], r["classes"]) for r in self.infos}
        if len(shapes) != 1:
            raise ValueError(f"executors disagree on (features, classes): {sorted(shapes)}")
        (self.d, self.classes), = shapes
        self.rows = sum(r["rows"] for r in self.infos)
        if not self.rows:
            raise ValueError("no training rows")
        s = self.settings
        batches = max(math.ceil(r["rows"] / s.batch_size) for r in self.infos)
        self.per_epoch = max(1, math.ceil(batches / s.batches_per_task_for(self.num_executors)))
        self.ssp = SSP(self, s.staleness, s.epochs * self.per_epoch,
                       task_args=functools.partial(_train_args, per_epoch=self.per_epoch))
        self.set_total(s.epochs, unit="epoch")  # the progress line: epoch 3/10 and an ETA
        self.ssp.start()
        if self.ssp.done:  # epochs=0: evaluate the zero model
            self._start_eval()

    def _train_done(self, result: dict) -> None:
        epoch = result["iteration"] // self.per_epoch
        stats = self.epoch_stats.setdefault(epoch, [0.0, 0, 0])
        stats[0] += result["loss"]
        stats[1] += result["correct"]
        stats[2] += result["count"]
        for iteration in self.ssp.complete(result["iteration"]):
            if (iteration + 1) % self.per_epoch == 0:
                epoch = iteration // self.per_epoch
                loss, correct, count = self.epoch_stats.pop(epoch)
                count = max(count, 1)
                self.report(epoch=epoch + 1, loss=loss / count, train_accuracy=correct / count)
        if self.ssp.done:
            self._start_eval()

    def _start_eval(self) -> None:
        for executor in range(self.num_executors):
            self.dispatch_task(executor, ("eval",))

    def _finish(self) -> None:
        def total(key: str) -> float:
            return sum(r[key] for r in self.evals)

        train_rows, test_rows = total("train_count"), total("test_count")
        has_test = any(r["has_test"] for r in self.evals)
        if self.output:
            self._save_model()
        self.finish({
            "train_loss": total("train_loss") / train_rows,
            "train_accuracy": total("train_correct") / train_rows,
            "test_loss": total("test_loss") / test_rows if has_test and test_rows else None,
            "test_accuracy": total("test_correct") / test_rows if has_test and test_rows else None,
            "epochs": self.settings.epochs,
            "iterations": self.settings.epochs * self.per_epoch,
            "train_rows": int(train_rows),
            "test_rows": int(test_rows),
            "model": self.output,
        })

    def _save_model(self) -> None:
        """The final weights, read from the parameter server after every task completed (so with every update),
        as ``weights`` (d x classes), ``bias`` and ``classes`` (the class indices of ``y``)."""
        blocks = min(self.settings.blocks, self.d)
        W = np.zeros((self.d, self.classes), np.float32)
        b = np.zeros(self.classes, np.float32)
        *values, bias = self.ps_get_many([("W", k) for k in range(blocks)] + [("b",)])
        for k, value in enumerate(values):
            if value is not None:
                lo, hi = data.block(self.d, blocks, k)
                W[lo:hi] = value
        if bias is not None:
            b[:] = bias
        save_model(self.output, {"weights": W, "bias": b, "classes": np.arange(self.classes)})


class MLRExecutor(litz.Executor):
    """Holds one partition of the training rows; runs SGD steps and evaluations against the PS weights."""

    input_attrs = ("X", "y")

    def load_input(self) -> None:
        self.settings = Settings.from_config(self.config)
        self.X, self.y, self.d, self.classes = data.train_partition(self.settings, self.executor_id,
                                                                    self.num_executors)
        self.bounds = [data.block(self.d, min(self.settings.blocks, self.d), k)
                       for k in range(min(self.settings.blocks, self.d))]

    def run_task(self, args: tuple) -> dict[str, Any]:
        kind = args[0]
        if kind == "train":
            return self._train(args[1], args[2])
        if kind == "eval":
            return self._eval()
        if kind == "info":
            return {"kind": "info", "executor": self.executor_id, "rows": len(self.y), "d": self.d,
                    "classes": self.classes}
        raise ValueError(f"unknown MLR task {args!r}")

    # -- parameter server ------------------------------------------------------------------------------
    def _keys(self) -> list:
        return [("W", k) for k in range(len(self.bounds))] + [("b",)]

    def _fetch(self) -> tuple[np.ndarray, np.ndarray]:
        """Current (possibly stale) weights as fresh writable float32 arrays; missing keys are zeros."""
        W = np.zeros((self.d, self.classes), np.float32)
        b = np.zeros(self.classes, np.float32)
        *blocks, bias = self.ps_get_many(self._keys())
        for (lo, hi), value in zip(self.bounds, blocks, strict=True):
            if value is not None:
                W[lo:hi] = value
        if bias is not None:
            b[:] = bias
        return W, b

    def _push(self, dW: np.ndarray, db: np.ndarray) -> None:
        items = [(("W", k), dW[lo:hi]) for k, (lo, hi) in enumerate(self.bounds) if np.any(dW[lo:hi])]
        self.ps_update_many(items + [(("b",), db)])

    # -- tasks -----------------------------------------------------------------------------------------
    def _train(self, iteration: int, per_epoch: int) -> dict[str, Any]:
        s = self.settings
        epoch, clock = divmod(iteration, per_epoch)
        batches = math.ceil(len(self.y) / s.batch_size)
        order = np.random.default_rng([s.seed, 3, epoch, self.executor_id]).permutation(batches)
        mine = order[clock * batches // per_epoch:(clock + 1) * batches // per_epoch] * s.batch_size
        W, b = self._fetch()
        W0, b0 = W.copy(), b.copy()
        loss, correct, count = model.sgd_steps(self.X, self.y, W, b, mine, batch_size=s.batch_size,
                                               lr=s.lr_at(epoch), l2=s.l2)
        if count:
            self._push(W - W0, b - b0)
        return {"kind": "train", "iteration": iteration, "loss": loss, "correct": correct, "count": count}

    def _eval(self) -> dict[str, Any]:
        W, b = self._fetch()
        train_loss, train_correct, train_count = model.evaluate(self.X, self.y, W, b)
        test = data.test_share(self.settings, self.executor_id, self.num_executors, self.d, self.classes)
        test_loss, test_correct, test_count = model.evaluate(*test, W, b) if test else (0.0, 0, 0)
        return {"kind": "eval", "train_loss": train_loss, "train_correct": train_correct,
                "train_count": train_count, "test_loss": test_loss, "test_correct": test_correct,
                "test_count": test_count, "has_test": test is not None}
