"""The MLR app's configuration (``--config key=value``), validated once so a typo is one clear error."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from litz.appconfig import ConfigError, with_defaults
from litz.appconfig import boolean as _bool
from litz.appconfig import integer as _int
from litz.appconfig import number as _float
from litz.appconfig import optional_integer as _opt_int
from litz.appconfig import path as _path

DEFAULTS: dict[str, Any] = {
    "train": None, "test": None, "synthetic": False,
    "n": 200_000, "n_test": 20_000, "d": None, "classes": None, "seed": 0, "signal": 5.0,
    "epochs": 10, "lr": 0.5, "decay": 1.0, "batch_size": 256, "batches_per_task": None,
    "staleness": 2, "l2": 0.0, "blocks": 8,
    "output": None,
}
SYNTHETIC_D, SYNTHETIC_CLASSES = 100, 10
ITERATION_BATCHES = 8  # default mini-batches per SSP iteration over all executors (see apps/mlr/__init__.py)



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
    lr: float
    decay: float
    batch_size: int
    batches_per_task: int | None
    staleness: int
    l2: float
    blocks: int
    output: str | None

    @classmethod
    def from_config(cls, config: dict | None) -> Settings:
        """Defaults filled in, types checked; raises ValueError naming the bad key."""
        v = with_defaults("apps.mlr", config, DEFAULTS)
        out: dict[str, Any] = {
            "train": _path(v, "train"), "test": _path(v, "test"), "synthetic": _bool(v, "synthetic"),
            "n": _int(v, "n", 1), "n_test": _int(v, "n_test", 0), "d": _opt_int(v, "d", 1),
            "classes": _opt_int(v, "classes", 2), "seed": _int(v, "seed", 0),
            "signal": _float(v, "signal", 0.0), "epochs": _int(v, "epochs", 0), "lr": _float(v, "lr", 0.0),
            "decay": _float(v, "decay", 0.0), "batch_size": _int(v, "batch_size", 1),
            "batches_per_task": _opt_int(v, "batches_per_task", 1), "staleness": _int(v, "staleness", 0),
            "l2": _float(v, "l2", 0.0), "blocks": _int(v, "blocks", 1),
            "output": _path(v, "output"),
        }
        if out["synthetic"] == (out["train"] is not None):
            raise ConfigError("apps.mlr needs exactly one of config 'train' (a .npz or libsvm file) "
                             "or 'synthetic=1'")
        if out["synthetic"]:
            out["d"] = out["d"] or SYNTHETIC_D
            out["classes"] = out["classes"] or SYNTHETIC_CLASSES
        assert {f.name for f in fields(cls)} == set(out)
        return cls(**out)

    def batches_per_task_for(self, num_executors: int) -> int:
        """Mini-batches per task: given, or ~ITERATION_BATCHES per iteration split over the executors."""
        return self.batches_per_task or max(1, ITERATION_BATCHES // max(1, num_executors))

    def lr_at(self, epoch: int) -> float:
        """Step size in ``epoch`` (0-based): ``lr / sqrt(1 + decay * epoch)``."""
        return self.lr / math.sqrt(1.0 + self.decay * epoch)





