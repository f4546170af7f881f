"""The MLR app's configuration (``--config key=value``), validated once so a typo is one clear error.

Keys left at None are chosen for the data: ``batch_size`` and ``l2`` from the number of training rows
(:meth:`Settings.for_rows`, in the driver once the executors have counted their rows), ``lr`` and
``decay`` from the optimiser. apps/mlr/README.md says why each default is what it is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from litz.appconfig import ConfigError, with_defaults
from litz.appconfig import boolean as _bool
from litz.appconfig import choice as _choice
from litz.appconfig import integer as _int
from litz.appconfig import number as _float
from litz.appconfig import optional_integer as _opt_int
from litz.appconfig import path as _path

DEFAULTS: dict[str, Any] = {
    "train": None, "test": None, "synthetic": False,
    "n": 200_000, "n_test": 20_000, "d": None, "classes": None, "seed": 0, "signal": 5.0,
    "epochs": 100, "tol": 1e-3, "patience": 3, "optimizer": "adagrad", "lr": None, "decay": None,
    "batch_size": None, "batches_per_task": None, "staleness": 2, "l2": None, "scale": True, "blocks": 8,
    "output": None, "size_by_speed": False, "sampling": "rows",
}
OPTIMIZERS = ("adagrad", "sgd")
# rows: every iteration takes mini-batches of every executor; executors: of a few executors the runtime picks
# (apps/chunkplan.py: under --memory-limit an executor is then loaded about once an epoch, not once an iteration)
SAMPLINGS = ("rows", "executors")
LR = {"adagrad": 0.1, "sgd": 0.5}  # default step size per optimiser
DECAY = {"adagrad": 0.0, "sgd": 1.0}  # default epoch decay: AdaGrad decays per weight already
# The defaults before they adapted to the data: plain SGD as in the thesis' MLR, batches of 256, no scaling or
# L2, exactly ``epochs`` epochs. The runtime's benchmarks (bench/) run with them, so the work their jobs do
# stays the work their results measured.
THESIS_SGD: dict[str, Any] = {"optimizer": "sgd", "lr": 0.5, "decay": 1.0, "batch_size": 256, "tol": 0, "l2": 0,
                              "scale": 0}
SYNTHETIC_D, SYNTHETIC_CLASSES = 100, 10
ITERATION_BATCHES = 8  # default mini-batches per SSP iteration over all executors (see apps/mlr/__init__.py)
BATCHES_PER_EPOCH = 128  # the default batch size gives at least this many mini-batches per epoch ...
MIN_BATCH, MAX_BATCH = 2, 1024  # ... within these bounds (powers of two)


def auto_batch_size(rows: int) -> int:
    """The largest power of two in ``[MIN_BATCH, MAX_BATCH]`` that splits ``rows`` into at least
    ``BATCHES_PER_EPOCH`` mini-batches: small data gets enough steps per epoch to converge in a few dozen
    epochs, large data gets batches of up to 1024 rows, so an epoch takes fewer tasks (the runtime's cost is
    per task) and still has enough steps."""
    size = MAX_BATCH
    while size > MIN_BATCH and rows < BATCHES_PER_EPOCH * size:
        size //= 2
    return size


def _opt_float(v: dict, key: str, low: float) -> float | None:
    return None if v[key] is None else _float(v, key, low)


@dataclass(frozen=True)
class Settings:
    train: str | None
    test: str | None
    synthetic: bool
    n: int
    n_test: int
    d: int | None
    classes: int | None
    seed: int
    signal: float
    epochs: int
    tol: float
    patience: int
    optimizer: str
    lr: float
    decay: float
    batch_size: int | None
    batches_per_task: int | None
    staleness: int
    l2: float | None
    scale: bool
    blocks: int
    output: str | None
    size_by_speed: bool
    sampling: str

    @classmethod
    def from_config(cls, config: dict | None) -> Settings:
        """Defaults filled in, types checked; raises ValueError naming the bad key."""
        v = with_defaults("apps.mlr", config, DEFAULTS)
        optimizer = _choice(v, "optimizer", OPTIMIZERS)
        out: dict[str, Any] = {
            "train": _path(v, "train"), "test": _path(v, "test"), "synthetic": _bool(v, "synthetic"),
            "n": _int(v, "n", 1), "n_test": _int(v, "n_test", 0), "d": _opt_int(v, "d", 1),
            "classes": _opt_int(v, "classes", 2), "seed": _int(v, "seed", 0),
            "signal": _float(v, "signal", 0.0), "epochs": _int(v, "epochs", 0), "tol": _float(v, "tol", 0.0),
            "patience": _int(v, "patience", 1), "optimizer": optimizer,
            "lr": _float(v, "lr", 0.0) if v["lr"] is not None else LR[optimizer],
            "decay": _float(v, "decay", 0.0) if v["decay"] is not None else DECAY[optimizer],
            "batch_size": _opt_int(v, "batch_size", 1), "batches_per_task": _opt_int(v, "batches_per_task", 1),
            "staleness": _int(v, "staleness", 0), "l2": _opt_float(v, "l2", 0.0), "scale": _bool(v, "scale"),
            "blocks": _int(v, "blocks", 1), "output": _path(v, "output"),
            "size_by_speed": _bool(v, "size_by_speed"), "sampling": _choice(v, "sampling", SAMPLINGS),
        }
        if out["synthetic"] == (out["train"] is not None):
            raise ConfigError("apps.mlr needs exactly one of config 'train' (a .npz or libsvm file) "
                             "or 'synthetic=1'")
        if out["size_by_speed"] and out["sampling"] == "executors":
            raise ConfigError("apps.mlr: size_by_speed=1 works with sampling=rows only (with sampling=executors "
                              "the runtime already gives each chunk to the executor that would run it soonest)")
        if out["synthetic"]:
            out["d"] = out["d"] or SYNTHETIC_D
            out["classes"] = out["classes"] or SYNTHETIC_CLASSES
        assert {f.name for f in fields(cls)} == set(out)
        return cls(**out)

    def for_rows(self, rows: int) -> Settings:
        """``batch_size`` and ``l2`` chosen for ``rows`` training rows where the config left them out.

        ``l2 = 1 / rows`` is scikit-learn's default ``LogisticRegression(C=1)``: its penalty
        ``||W||^2 / 2`` on the summed loss is ``||W||^2 / (2 rows)`` on the mean loss we descend.
        """
        return replace(self, batch_size=self.batch_size or auto_batch_size(rows),
                       l2=self.l2 if self.l2 is not None else 1.0 / max(rows, 1))

    def batches_per_task_for(self, num_executors: int) -> int:
        """Mini-batches per task: given, or ~ITERATION_BATCHES per iteration split over the executors."""
        return self.batches_per_task or max(1, ITERATION_BATCHES // max(1, num_executors))

    def tasks_per_iteration(self, num_executors: int) -> int:
        """Tasks an SSP iteration runs: one per executor with ``sampling=rows``; with ``sampling=executors`` a
        quarter of the executors (one per worker at the default of 4 executors a worker), at least 1, as
        apps.kmeans draws its mini-batches. Each of them runs ``batches_per_task_for`` of this many mini-batches,
        so an iteration still covers about ``ITERATION_BATCHES``."""
        if self.sampling == "executors":
            return max(1, math.ceil(num_executors / 4))
        return num_executors

    def unseen_steps(self, num_executors: int) -> int:
        """The most mini-batch steps of other tasks that a task's read of the weights may miss: the other
        tasks' steps of its own iteration and every task's of the ``staleness`` iterations before."""
        tasks = self.tasks_per_iteration(num_executors)
        return ((self.staleness + 1) * tasks - 1) * self.batches_per_task_for(tasks)

    def lr_at(self, epoch: int) -> float:
        """Step size in ``epoch`` (0-based): ``lr / sqrt(1 + decay * epoch)``."""
        return self.lr / math.sqrt(1.0 + self.decay * epoch)
