"""Multinomial logistic regression (softmax regression) by mini-batch SGD under SSP (thesis §4.5 MLR).

Run: ``litz run apps.mlr --config synthetic=1`` (see README.md in this directory for every key).

Model: ``W`` (d x classes) and ``b`` live in the parameter server as float32 row blocks ``("W", k)`` and
``("b",)``, with AdaGrad's sums of squared gradients stacked under them; they start at zero (a
never-updated key reads as None = zeros). Executors hold a partition of the rows (``X``, ``y``, and the
feature ``scaler`` fitted on all training rows: input data, re-loaded rather than moved on scale-in).

A task fetches the parameters once, runs a few mini-batch steps (AdaGrad by default, or plain SGD) on its
own partition starting from them, and adds its summed step and squared gradients to the server:
data-parallel, Bösen-style, each row's gradient counted once. A step divides by the root of the summed
squares as if the steps its stale read may miss (``Settings.unseen_steps``) had the same gradient, so the
first steps of many executors, all taken from zero sums, do not add up to an overshoot. The driver runs
iterations through :class:`litz.ssp.SSP` (``staleness``, default 2): all tasks of one iteration share a
version, hence cached parameters, and may miss the updates of the ``staleness`` previous iterations. It
stops once the training loss has not improved by ``tol`` for ``patience`` epochs (``epochs`` is the cap).

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
 * ``("info",)`` -> partition size, ``d`` and ``classes``: the driver learns the number of rows, picks the
   batch size and ``l2`` for it, and the epoch length.
 * ``("train", iteration, iterations_per_epoch, batch_size, l2)`` -> summed loss, correct predictions and
   rows of the mini-batches run (measured before each step); the driver reports per-epoch loss and accuracy.
   With ``size_by_speed=1`` two more arguments, ``first, count``: run mini-batches ``first .. first + count - 1``
   of the executor's stream of shuffled passes over its own (apps/mlr/sizing.py).
 * ``("chunk", iteration, epoch, chunk, size, batch_size, l2)`` with ``sampling=executors``: the same result for
   mini-batches ``chunk * size .. (chunk + 1) * size - 1`` of the executor's shuffled order for ``epoch``. The
   driver dispatches ``Settings.tasks_per_iteration`` of them an iteration, each to an executor the runtime picks
   among those with chunks left this epoch (:class:`apps.chunkplan.ChunkPlan`, as apps.kmeans does), under the
   same staleness bound: under a memory limit an executor is then loaded about once an epoch, not once every
   ``staleness + 1`` iterations.
 * ``("eval",)`` once all training completed, so it sees every update (the consistency rule) -> loss and
   correct counts of the final weights on the executor's training rows and its block of the test set.

``size_by_speed=1`` (off by default) sizes each task by its executor's speed (``Driver.executor_speed``), as
LB-BSP does: an iteration's ``executors x batches_per_task`` mini-batches are shared out in proportion to the
executors' speeds, so a worker slowed by a noisy neighbour holds no iteration up, without moving any executor
(``--placement speed`` moves executors instead; with both, the moves leave the speeds even and the sizes follow).
The result then also holds ``batches_run`` (mini-batches each executor ran) and ``resizes``.

With ``output=PATH`` the driver reads the final weights itself (``Driver.ps_get_many``, after the last
evaluation completed) and writes them with the labels to that ``.npz`` (:mod:`apps.modelfile`).
"""
from __future__ import annotations

import functools
import math
import time
from typing import Any

import numpy as np

import litz
from litz.ssp import SSP

from ..chunkplan import ChunkPlan
from ..modelfile import model_path, save_model
from . import data, model
from .settings import Settings
from .sizing import SpeedSizing, batch_starts


def _train_args(iteration: int, executor: int, *, per_epoch: int, batch_size: int, l2: float) -> tuple:
    return ("train", iteration, per_epoch, batch_size, l2)


# Parameter-server layout: key ("W", k) holds rows ``bounds[k]`` of the stacked parameters, shape
# (depth, rows, classes): the weights, and with AdaGrad below them its sums of squared gradients; ("b",)
# holds (depth, classes). The sums are updated additively like the weights, so each executor scales its
# steps by what every executor has seen (stale as the weights are), not by its own share of it; stacked
# in the same keys, they cost a task no more keys (the runtime's cost is per key) than plain SGD.
def param_bounds(settings: Settings, d: int) -> list[tuple[int, int]]:
    """Row ranges of ``W``'s ``blocks`` keys."""
    blocks = min(settings.blocks, d)
    return [data.block(d, blocks, k) for k in range(blocks)]


def param_keys(bounds: list[tuple[int, int]]) -> list:
    return [("W", k) for k in range(len(bounds))] + [("b",)]


def stacked(values: list, bounds: list[tuple[int, int]], settings: Settings, d: int,
            classes: int) -> tuple[np.ndarray, np.ndarray]:
    """The values of ``param_keys(bounds)`` as fresh writable float32 arrays ``(P, B)``, ``P[0]`` the weights
    ``W`` (d x classes) and ``B[0]`` the biases; missing keys are zeros."""
    depth = 2 if settings.optimizer == "adagrad" else 1
    P = np.zeros((depth, d, classes), np.float32)
    B = np.zeros((depth, classes), np.float32)
    *blocks, bias = values
    for (lo, hi), value in zip(bounds, blocks, strict=True):
        if value is not None:
            P[:, lo:hi] = value
    if bias is not None:
        B[:] = bias
    return P, B


class MLRDriver(litz.Driver):
    """Learns the partition sizes, runs SSP iterations until the training loss stops improving (at most
    ``epochs`` epochs), then one evaluation round."""

    def dispatch_initial_tasks(self) -> None:
        self.settings = Settings.from_config(self.config)
        self.output = model_path(self.settings.output)  # a bad path fails now, not after training
        self.infos: list[dict] = []
        self.epoch_stats: dict[int, list[float]] = {}  # epoch -> [loss, correct, rows]
        self.evals: list[dict] = []
        self.ssp: SSP | None = None
        self.plan: ChunkPlan | None = None  # sampling=executors
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
        self.scaler = next(r["scaler"] for r in self.infos if r["executor"] == 0)  # for the model file
        self.rows = sum(r["rows"] for r in self.infos)
        if not self.rows:
            raise ValueError("no training rows")
        s = self.settings = self.settings.for_rows(self.rows)
        self.epochs_run, self.plateau = 0, model.Plateau(s.tol, s.patience)
        self.sizing = None
        if s.sampling == "executors":
            tasks = s.tasks_per_iteration(self.num_executors)
            per_task = s.batches_per_task_for(tasks)  # a chunk: this many mini-batches of one executor
            self.plan = ChunkPlan({r["executor"]: math.ceil(r["rows"] / s.batch_size) for r in self.infos},
                                  tasks * per_task, tasks, s.epochs, s.staleness, extra=(s.batch_size, s.l2))
            self.per_epoch = self.plan.per_epoch
            if self.plan.start(self):
                self._start_eval()
            return
        batches = max(math.ceil(r["rows"] / s.batch_size) for r in self.infos)
        self.per_epoch = max(1, math.ceil(batches / s.batches_per_task_for(self.num_executors)))
        task_args = functools.partial(_train_args, per_epoch=self.per_epoch, batch_size=s.batch_size, l2=s.l2)
        if s.size_by_speed:
            self.sizing = SpeedSizing(self.num_executors, self.num_executors * s.batches_per_task_for(
                self.num_executors))
            task_args = self._sized_train_args
        self.ssp = SSP(self, s.staleness, s.epochs * self.per_epoch, task_args=task_args)
        self.set_total(s.epochs, unit="epoch")  # the progress line: epoch 3/100 (the cap) and an ETA
        self.ssp.start()
        if self.ssp.done:  # epochs=0: evaluate the zero model
            self._start_eval()

    def _sized_train_args(self, iteration: int, executor: int) -> tuple:
        """``size_by_speed``: the task's mini-batches in proportion to the executor's speed (apps/mlr/sizing.py);
        the shares are looked at once per iteration, as its first task is dispatched."""
        if executor == 0:
            self.sizing.resize([self.executor_speed(e) for e in range(self.num_executors)], time.time())
        first, count = self.sizing.take(executor)
        return ("train", iteration, self.per_epoch, self.settings.batch_size, self.settings.l2, first, count)

    def _train_done(self, result: dict) -> None:
        epoch = result["iteration"] // self.per_epoch
        stats = self.epoch_stats.setdefault(epoch, [0.0, 0, 0])
        stats[0] += result["loss"]
        stats[1] += result["correct"]
        stats[2] += result["count"]
        schedule = self.plan if self.plan is not None else self.ssp
        finished = schedule.complete(result["iteration"])
        for iteration in finished:
            if (iteration + 1) % self.per_epoch == 0:
                epoch = iteration // self.per_epoch
                loss, correct, count = self.epoch_stats.pop(epoch)
                count = max(count, 1)
                self.epochs_run = epoch + 1
                self.report(epoch=epoch + 1, loss=loss / count, train_accuracy=correct / count)
                if self.plateau.stop(loss / count):  # the iterations already dispatched still run
                    schedule.stop()
                    self.set_total(epoch + 1, unit="epoch")  # the progress line: done, not 8/100
        if self.plan is not None and finished:  # after the stopping rule: a stop dispatches nothing more
            self.plan.advance(self)
        if schedule.done:
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
            "epochs": self.epochs_run,
            "iterations": (self.plan or self.ssp).iterations,
            "sampling": self.settings.sampling,
            "batch_size": self.settings.batch_size,
            "train_rows": int(train_rows),
            "test_rows": int(test_rows),
            "model": self.output,
            **({"batches_run": list(self.sizing.taken), "resizes": self.sizing.resizes} if self.sizing else {}),
        })

    def _save_model(self) -> None:
        """The final weights, read from the parameter server after every task completed (so with every update),
        as ``weights`` (d x classes), ``bias`` and ``classes`` (the class indices of ``y``), for raw features:
        the feature scaling is folded in."""
        bounds = param_bounds(self.settings, self.d)
        P, B = stacked(self.ps_get_many(param_keys(bounds)), bounds, self.settings, self.d, self.classes)
        W, b = self.scaler.raw_model(P[0], B[0]) if self.scaler else (P[0], B[0])
        save_model(self.output, {"weights": W, "bias": b, "classes": np.arange(self.classes)})


class MLRExecutor(litz.Executor):
    """Holds one partition of the training rows; runs SGD steps and evaluations against the PS weights."""

    input_attrs = ("X", "y", "scaler")

    def load_input(self) -> None:
        self.settings = Settings.from_config(self.config)
        self.X, self.y, self.d, self.classes, self.scaler = data.train_partition(
            self.settings, self.executor_id, self.num_executors)
        self.bounds = param_bounds(self.settings, self.d)

    def run_task(self, args: tuple) -> dict[str, Any]:
        kind = args[0]
        if kind == "train":
            return self._train(*args[1:])
        if kind == "chunk":
            return self._train_chunk(*args[1:])
        if kind == "eval":
            return self._eval()
        if kind == "info":
            return {"kind": "info", "executor": self.executor_id, "rows": len(self.y), "d": self.d,
                    "classes": self.classes, "scaler": self.scaler if self.executor_id == 0 else None}
        raise ValueError(f"unknown MLR task {args!r}")

    # -- parameter server (layout: see ``stacked``) ---------------------------------------------------
    def _fetch(self) -> tuple[np.ndarray, np.ndarray]:
        """Current (possibly stale) stacked parameters ``(P, B)``, see :func:`stacked`."""
        return stacked(self.ps_get_many(param_keys(self.bounds)), self.bounds, self.settings, self.d, self.classes)

    def _push(self, dP: np.ndarray, dB: np.ndarray) -> None:
        """Add ``(dP, dB)``; blocks that are all zero (sparse data leaves many) are not sent."""
        items = [(("W", k), np.ascontiguousarray(dP[:, lo:hi])) for k, (lo, hi) in enumerate(self.bounds)
                 if np.any(dP[:, lo:hi])]
        self.ps_update_many(items + [(("b",), dB)])

    def weights(self) -> tuple[np.ndarray, np.ndarray]:
        """``(W, b)`` as trained, for scaled features (what the training and evaluation tasks use)."""
        P, B = self._fetch()
        return P[0], B[0]

    # -- tasks -----------------------------------------------------------------------------------------
    def _order(self, p: int, batches: int) -> np.ndarray:
        """Pass ``p`` over this executor's ``batches`` mini-batches: their order, shuffled per pass (epoch)."""
        return np.random.default_rng([self.settings.seed, 3, p, self.executor_id]).permutation(batches)

    def _train(self, iteration: int, per_epoch: int, batch_size: int, l2: float, first: int | None = None,
               count: int = 0) -> dict[str, Any]:
        epoch, clock = divmod(iteration, per_epoch)
        batches = math.ceil(len(self.y) / batch_size)
        order = functools.partial(self._order, batches=batches)
        if first is None:  # this epoch's share of its mini-batches
            mine = order(epoch)[clock * batches // per_epoch:(clock + 1) * batches // per_epoch] * batch_size
        else:  # size_by_speed: the next ``count`` of its stream of passes
            mine = np.array(batch_starts(first, count, batches, order) if batches else [], np.int64) * batch_size
        return self._steps(iteration, epoch, mine, batch_size, l2)

    def _train_chunk(self, iteration: int, epoch: int, chunk: int, size: int, batch_size: int,
                     l2: float) -> dict[str, Any]:
        """``sampling=executors``: mini-batches ``chunk * size .. (chunk + 1) * size - 1`` of this executor's pass
        for ``epoch`` (apps/chunkplan.py), in the order a ``sampling=rows`` task would take its share of them."""
        batches = math.ceil(len(self.y) / batch_size)
        mine = self._order(epoch, batches)[chunk * size:(chunk + 1) * size] * batch_size
        return self._steps(iteration, epoch, mine, batch_size, l2)

    def _steps(self, iteration: int, epoch: int, mine: np.ndarray, batch_size: int, l2: float) -> dict[str, Any]:
        """SGD steps on the mini-batches starting at rows ``mine``, from the parameters as read now; their summed
        step and squared gradients are added to the servers."""
        s = self.settings
        P, B = self._fetch()
        P0, B0 = P.copy(), B.copy()
        unseen = s.unseen_steps(self.num_executors)
        loss, correct, count = model.sgd_steps(self.X, self.y, P[0], B[0], mine, batch_size=batch_size,
                                               lr=s.lr_at(epoch), l2=l2, peers=1 + unseen,
                                               adagrad=(P[1], B[1]) if len(P) > 1 else None)
        if count:
            dP, dB = P - P0, B - B0
            dP[1:] /= np.float32(1 + unseen)  # the servers sum true squared gradients, not the step's guess
            dB[1:] /= np.float32(1 + unseen)
            self._push(dP, dB)
        return {"kind": "train", "iteration": iteration, "loss": loss, "correct": correct, "count": count}

    def _eval(self) -> dict[str, Any]:
        W, b = self.weights()
        train_loss, train_correct, train_count = model.evaluate(self.X, self.y, W, b)
        test = data.test_share(self.settings, self.executor_id, self.num_executors, self.d, self.classes)
        if test and self.scaler:
            test = self.scaler.transform(test[0]), test[1]
        test_loss, test_correct, test_count = model.evaluate(*test, W, b) if test else (0.0, 0, 0)
        return {"kind": "eval", "train_loss": train_loss, "train_correct": train_correct,
                "train_count": train_count, "test_loss": test_loss, "test_correct": test_correct,
                "test_count": test_count, "has_test": test is not None}
