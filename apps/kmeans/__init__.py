"""Mini-batch k-means (Sculley 2010) with data partitions in executors and the centres in the parameter server
(thesis §4.8.2, the app of the out-of-core experiments).

Run: ``litz run apps.kmeans --config synthetic=1`` (see README.md in this directory for every key).

Model: for centre rows ``[lo, hi)`` of block ``b`` the parameter server holds key ``("c", slot, b)``, a
float64 array ``(hi - lo) x (d + 1)``: the running sum of the points assigned to each centre and, in the last
column, their count, both including the initial centre as one point. The centre is sum / count (see
``model.py`` for why this makes Sculley's per-centre learning rate ``1 / count`` exact with purely additive
updates).

Schedule: bulk synchronous by default (``staleness=0``, through :class:`litz.ssp.SSP`). Iteration ``i`` is one
*global* mini-batch: every executor assigns its rows of that batch to the centres as they were at the end of
iteration ``i - 1`` and adds its per-centre sums and counts. The consistency rule alone does not give that
snapshot: a task of iteration ``i`` sees all of iteration ``i - 1`` but may also see some updates of other
iteration-``i`` tasks (measured: with 2 workers the late half of an iteration often did). So the model is
double-buffered: iteration ``i`` reads slot ``(i - 1) % 2`` and writes slot ``i % 2``, and no task writes the
slot being read. Slot ``i % 2`` last held the model after iteration ``i - 2``, so each executor adds to it its
delta of iteration ``i - 1`` (kept from its previous task, the only state an executor carries) together
with its delta of iteration ``i``: one update, as many bytes as without double-buffering. The centres
after each iteration then depend only on the seed and the config, not on timing, the number of workers or
executors, or evictions (up to float64 rounding in the order the servers add deltas: measured identical
to ~1e-15 relative). That is what lets a memory-limited run be compared with an unlimited one.

``staleness=s > 0`` uses one slot and lets iteration ``i`` start before iterations ``i-s..i-1`` complete:
less waiting with slow or many executors, and still sound (a stale read only makes some assignments stale;
the update adds points to sums, it does not step away from a stale centre), but the result then depends on
timing (measured: within 0.2% of the BSP objective with s=2).

Mini-batches are defined per row, not per executor: row ``r`` is in batch ``hash(seed, epoch, r) mod B``
(``B = ceil(N / batch)`` batches per epoch), so every row is visited once per epoch and a batch holds about
``batch`` rows drawn uniformly from all executors.

Protocol (task arguments -> result dicts):
 * ``("sample", p)`` -> the executor's rows with ``uniform(seed, row) < p``, its number of rows and ``d`` (with
   ``p`` None the first time, each executor works out the rate from N, which it knows: one round over the
   data instead of two, which under a memory limit is a load of every executor): the driver learns N, checks
   ``k <= N`` and gathers a uniform
   sample of about ``init_sample`` rows (the same rows whatever the partitioning). On it, it runs
   ``init_trials`` k-means++ (or random-point) initialisations, refines each by ``init_iters`` Lloyd rounds
   and keeps the best by sample objective, deterministically per seed. Without the refinement the best
   of several k-means++ draws cannot be told apart (their potentials are all far from the optimum).
 * ``("init", model)`` to executor 0 only: adds the initial ``[centres | 1]`` to the slot(s).
 * ``("train", iteration, batches_per_epoch)`` -> summed squared distance and count of the batch rows before
   the update; the driver reports a running per-epoch objective.
 * ``("eval", slot)`` once training completed, so it sees every update: squared distances over ALL the
   executor's rows and cluster sizes; executor 0 also returns the centres, which the driver writes to
   ``output`` (an ``.npz``, :mod:`apps.modelfile`).
"""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

import litz
from litz.ssp import SSP

from ..chunkplan import ChunkPlan
from ..modelfile import model_path, save_model
from . import data, model
from .settings import Settings


def _train_args(iteration: int, executor: int, *, per_epoch: int) -> tuple:
    return ("train", iteration, per_epoch)


def read_slot(iteration: int, staleness: int, double: bool = True) -> int:
    """The model slot iteration ``iteration`` reads: the one the previous iteration wrote (one slot under SSP, or
    when mini-batches come from a few executors: ``double`` False)."""
    return (iteration - 1) % 2 if staleness == 0 and double else 0


def write_slot(iteration: int, staleness: int, double: bool = True) -> int:
    return iteration % 2 if staleness == 0 and double else 0


def sample_rate(s: Settings, n: int) -> float:
    """The rate of the initialisation sample: about ``init_sample`` rows of ``n`` (at least 2k + 100)."""
    return min(1.0, max(s.init_sample, 2 * s.k + 100) / n)


class KMeansDriver(litz.Driver):
    """info round -> sample round -> initial centres -> ``epochs`` epochs of BSP/SSP iterations -> evaluation."""

    def dispatch_initial_tasks(self) -> None:
        self.settings = Settings.from_config(self.config)
        self.output = model_path(self.settings.output)  # a bad path fails now, not after training
        self.infos: dict[int, dict] = {}
        self.samples: dict[int, np.ndarray] = {}
        self.evals: dict[int, dict] = {}
        self.epoch_stats: dict[int, list[float]] = {}  # epoch -> [summed squared distance, rows]
        self.ssp: SSP | None = None
        self.plan: ChunkPlan | None = None
        self.sample_p: float | None = None
        self._broadcast(("sample", None))

    def handle_task_completion(self, result: dict) -> None:
        kind = result["kind"]
        if kind == "train":
            self._train_done(result)
        elif kind == "info":
            self.infos[result["executor"]] = result
            if len(self.infos) == self.num_executors:
                self._start_sampling()
        elif kind == "sample":
            self.samples[result["executor"]] = result["rows"]
            self.infos[result["executor"]] = {"rows": result["rows_held"], "d": result["d"]}
            if len(self.samples) == self.num_executors:
                if self.sample_p is None:
                    self._learn_size()
                self._initialise()
        elif kind == "init":
            self._start_training()
        elif kind == "eval":
            self.evals[result["executor"]] = result
            if len(self.evals) == self.num_executors:
                self._finish()
        else:
            raise ValueError(f"unexpected task result kind {kind!r}")

    def _broadcast(self, args: tuple) -> None:
        for executor in range(self.num_executors):
            self.dispatch_task(executor, args)

    # -- initialisation ------------------------------------------------------------------------------
    def _start_sampling(self) -> None:
        self._learn_size()
        self._broadcast(("sample", self.sample_p))

    def _learn_size(self) -> None:
        """N, d and the sample rate from the executors' answers; ``k <= N`` checked."""
        s = self.settings
        dims = {r["d"] for r in self.infos.values()}
        if len(dims) != 1:
            raise ValueError(f"executors disagree on the number of features: {sorted(dims)}")
        (self.d,) = dims
        self.n = sum(r["rows"] for r in self.infos.values())
        if s.k > self.n:
            where = s.input if s.input is not None else "the synthetic data"
            raise data.DataError(f"k={s.k} is larger than the number of points in {where} (n={self.n})")
        self.per_epoch = math.ceil(self.n / s.batch)
        self.sample_p = sample_rate(s, self.n)

    def _initialise(self) -> None:
        s = self.settings
        sample = np.concatenate([self.samples[e] for e in range(self.num_executors)])  # global row order
        self.samples = {}
        if len(sample) < s.k:  # unlucky draw (or a tiny data set): sample at a higher rate
            self.sample_p = min(1.0, 2 * self.sample_p)
            self._broadcast(("sample", self.sample_p))
            return
        rng = np.random.default_rng([s.seed, 7])
        centers = model.initial_centers(sample, s.k, s.init, s.init_trials, s.init_iters, rng)
        self.sample_rows = len(sample)
        self.dispatch_task(0, ("init", model.initial_model(centers)))

    # -- training ------------------------------------------------------------------------------------
    def _start_training(self) -> None:
        s = self.settings
        if s.sampling == "executors":
            self.plan = ChunkPlan({e: r["rows"] for e, r in self.infos.items()}, s.batch,
                                  s.tasks_per_batch(self.num_executors), s.epochs, s.staleness)
            self.per_epoch = self.plan.per_epoch
            if self.plan.start(self):
                self._start_eval()
            return
        self.ssp = SSP(self, s.staleness, s.epochs * self.per_epoch,
                       task_args=functools.partial(_train_args, per_epoch=self.per_epoch))
        self.set_total(s.epochs, unit="epoch")  # the progress line: epoch 3/10 and an ETA
        self.ssp.start()
        if self.ssp.done:  # epochs=0: evaluate the initial centres
            self._start_eval()

    def _train_done(self, result: dict) -> None:
        epoch = result["iteration"] // self.per_epoch
        stats = self.epoch_stats.setdefault(epoch, [0.0, 0])
        stats[0] += result["sse"]
        stats[1] += result["count"]
        schedule = self.plan if self.plan is not None else self.ssp
        finished = schedule.complete(result["iteration"])
        if self.plan is not None and finished:
            self.plan.advance(self)
        for iteration in finished:
            if (iteration + 1) % self.per_epoch == 0:
                sse, count = self.epoch_stats.pop(iteration // self.per_epoch)
                self.report(epoch=iteration // self.per_epoch + 1, batch_objective=sse / max(count, 1))
        if schedule.done:
            self._start_eval()

    def _start_eval(self) -> None:
        s = self.settings
        self._broadcast(("eval", read_slot(s.epochs * self.per_epoch, s.staleness, s.sampling == "rows")))

    # -- result --------------------------------------------------------------------------------------
    def _finish(self) -> None:
        s = self.settings
        evals = [self.evals[e] for e in range(self.num_executors)]
        count = sum(r["count"] for r in evals)
        sizes = np.sum([r["sizes"] for r in evals], axis=0)
        if self.output is not None:
            save_model(self.output, {"centers": self.evals[0]["centers"], "sizes": sizes})
        self.finish({
            "objective": sum(r["sse"] for r in evals) / count,
            "epochs": s.epochs,
            "iterations": s.epochs * self.per_epoch,
            "n": int(count), "d": int(self.d), "k": s.k, "batch": s.batch, "staleness": s.staleness,
            "sampling": s.sampling, "batch_tasks": self.plan.tasks if self.plan is not None else None,
            "init": s.init, "init_sample_rows": int(self.sample_rows),
            "empty_clusters": int(np.sum(sizes == 0)),
            "model": self.output,
        })


class KMeansExecutor(litz.Executor):
    """Holds one contiguous block of rows (``X``, float32) and runs mini-batch and evaluation steps on it.

    Its state is ``X`` plus a few scalars, its last delta (BSP double-buffering: at most one row per centre
    that received points) and a per-epoch batch index (re-derivable, so also in ``input_attrs``). Moving,
    checkpointing or evicting it costs about the size of its rows.
    """

    # settings are re-derived from the config too: as input they are written once when evicted, not every
    # time (the app's classes are pickled by value, so a Settings in the evicted state cost ~1 ms each)
    input_attrs = ("X", "settings", "_index")

    def __init__(self) -> None:
        # BSP: this executor's delta of its last iteration as (iteration, centre indices, their delta rows)
        self.last_delta: tuple[int, np.ndarray, np.ndarray] | None = None

    def load_input(self) -> None:
        self.settings = Settings.from_config(self.config)
        model.single_threaded_blas()
        self.X, self.lo, self.n = data.partition(self.settings, self.executor_id, self.num_executors)
        self._index: tuple[int, np.ndarray, np.ndarray] | None = None  # (epoch, rows in batch order, bounds)

    def run_task(self, args: tuple) -> dict[str, Any]:
        kind = args[0]
        if kind == "chunk":
            return self._train_chunk(*args[1:])
        if kind == "train":
            return self._train(args[1], args[2])
        if kind == "eval":
            return self._eval(args[1])
        if kind == "sample":
            p = sample_rate(self.settings, self.n) if args[1] is None else args[1]
            keep = data.row_uniform(self.lo, self.lo + len(self.X), self.settings.seed, data.SAMPLE) < p
            return {"kind": "sample", "executor": self.executor_id, "rows": self.X[keep], "d": self.X.shape[1],
                    "rows_held": len(self.X)}
        if kind == "init":
            double = self.settings.staleness == 0 and self.settings.sampling == "rows"
            for slot in ((0, 1) if double else (0,)):
                self._push(args[1], slot)
            return {"kind": "init"}
        if kind == "info":
            return {"kind": "info", "executor": self.executor_id, "rows": len(self.X), "d": self.X.shape[1]}
        raise ValueError(f"unknown k-means task {args!r}")

    # -- parameter server ------------------------------------------------------------------------------
    def _bounds_of_blocks(self) -> list[tuple[int, int]]:
        blocks = self.settings.blocks_for(self.X.shape[1])
        return [data.block(self.settings.k, blocks, b) for b in range(blocks)]

    def _fetch(self, slot: int) -> np.ndarray:
        """The centres (``k x d`` float64) in ``slot`` as of this task's version."""
        values = self.ps_get_many([("c", slot, b) for b in range(len(self._bounds_of_blocks()))])
        if any(v is None for v in values):
            raise RuntimeError("k-means centres missing on the parameter server (the init task did not run)")
        return model.centers_of(np.vstack(values))

    def _push(self, delta: np.ndarray, slot: int) -> None:
        """Add a ``k x (d + 1)`` delta to ``slot``, skipping blocks of centres that received no points."""
        self.ps_update_many([(("c", slot, b), delta[lo:hi])
                             for b, (lo, hi) in enumerate(self._bounds_of_blocks()) if np.any(delta[lo:hi, -1])])

    # -- tasks -----------------------------------------------------------------------------------------
    def _batch_rows(self, epoch: int, t: int, per_epoch: int) -> np.ndarray:
        # one attribute, not three: an out-of-core load reads a file per input attribute
        if self._index is None or self._index[0] != epoch or self._index[2] is None \
                or len(self._index[2]) != per_epoch + 1:
            slots = data.batch_of_rows(self.lo, self.lo + len(self.X), self.settings.seed, epoch, per_epoch)
            order = np.argsort(slots, kind="stable")
            self._index = (epoch, order.astype(np.int32 if len(order) < 2 ** 31 else np.int64),
                           np.searchsorted(slots[order], np.arange(per_epoch + 1)))
        _, order, bounds = self._index
        return order[bounds[t]:bounds[t + 1]]

    def _train(self, iteration: int, per_epoch: int) -> dict[str, Any]:
        epoch, t = divmod(iteration, per_epoch)
        rows = self._batch_rows(epoch, t, per_epoch)
        staleness = self.settings.staleness
        sse, delta = 0.0, None
        if len(rows):
            delta, sse = model.batch_delta(self.X[rows], self._fetch(read_slot(iteration, staleness)))
        if staleness:
            if delta is not None:
                self._push(delta, 0)
            return {"kind": "train", "iteration": iteration, "sse": sse, "count": len(rows)}
        # BSP, double-buffered: the slot written now lacks our delta of the previous iteration
        last = self.last_delta
        if iteration > 0 and (last is None or last[0] != iteration - 1):
            raise RuntimeError(f"k-means executor {self.executor_id}: BSP iteration {iteration} follows "
                               f"{'no iteration' if last is None else f'iteration {last[0]}'}")
        if delta is None:
            delta = np.zeros((self.settings.k, self.X.shape[1] + 1))
        total = delta.copy()
        if iteration > 0:
            total[last[1]] += last[2]
        used = np.flatnonzero(delta[:, -1])
        mine = (iteration, used, delta[used])
        # allocate everything first: a task that fails before its first ps_update can be retried safely
        self._push(total, write_slot(iteration, staleness))
        self.last_delta = mine
        return {"kind": "train", "iteration": iteration, "sse": sse, "count": len(rows)}

    def _train_chunk(self, iteration: int, epoch: int, chunk: int, size: int) -> dict[str, Any]:
        """``sampling=executors``: chunk ``chunk`` of this executor's rows shuffled for ``epoch``, against the one
        model slot (the batch's other chunks may or may not have been added yet: SSP's rule, timing-dependent)."""
        if self._index is None or self._index[0] != epoch or self._index[2] is not None:
            order = np.argsort(data.row_hash(self.lo, self.lo + len(self.X), self.settings.seed, data.BATCH, epoch))
            self._index = (epoch, order.astype(np.int32 if len(order) < 2 ** 31 else np.int64), None)
        rows = self._index[1][chunk * size:(chunk + 1) * size]
        sse = 0.0
        if len(rows):
            delta, sse = model.batch_delta(self.X[np.sort(rows)], self._fetch(0))
            self._push(delta, 0)
        return {"kind": "train", "iteration": iteration, "sse": sse, "count": len(rows)}

    def _eval(self, slot: int) -> dict[str, Any]:
        centers = self._fetch(slot)
        sse, sizes = model.score(self.X, centers)
        result = {"kind": "eval", "executor": self.executor_id, "sse": sse, "count": len(self.X), "sizes": sizes}
        if self.executor_id == 0:
            result["centers"] = centers
        return result
