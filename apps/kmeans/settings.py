"""The k-means app's configuration (``--config key=value``), validated once so a typo is one clear error."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from litz.appconfig import ConfigError, with_defaults
from litz.appconfig import boolean as _bool
from litz.appconfig import choice as _choice
from litz.appconfig import integer as _int
from litz.appconfig import number as _float
from litz.appconfig import optional_integer as _opt_int
from litz.appconfig import path as _path

DEFAULTS: dict[str, Any] = {
    "input": None, "synthetic": False,
    "n": 200_000, "d": 32, "blobs": None, "spread": 1.0,
    "k": 16, "epochs": 5, "batch": 4096, "seed": 0,
    "init": "k-means++", "init_sample": 10_000, "init_trials": 3, "init_iters": 10,
    "staleness": 0, "blocks": None, "output": None, "sampling": "executors", "batch_tasks": None,
}
INITS = ("k-means++", "random")
SAMPLINGS = ("executors", "rows")  # a mini-batch from a few executors the runtime picks, or from every row
BLOCK_BYTES = 1 << 20  # default parameter-server key size: ~1 MB of centroid rows per key


@dataclass(frozen=True)
class Settings:
    input: str | None
    synthetic: bool
    n: int
    d: int
    blobs: int
    spread: float
    k: int
    epochs: int
    batch: int
    seed: int
    init: str
    init_sample: int
    init_trials: int
    init_iters: int
    staleness: int
    blocks: int | None
    output: str | None
    sampling: str
    batch_tasks: int | None

    @classmethod
    def from_config(cls, config: dict | None) -> Settings:
        """Defaults filled in, types checked; raises :class:`ConfigError` naming the bad key."""
        v = with_defaults("apps.kmeans", config, DEFAULTS)
        out: dict[str, Any] = {
            "input": _path(v, "input"), "synthetic": _bool(v, "synthetic"),
            "n": _int(v, "n", 1), "d": _int(v, "d", 1), "blobs": _opt_int(v, "blobs", 1),
            "spread": _float(v, "spread", 0.0), "k": _int(v, "k", 1), "epochs": _int(v, "epochs", 0),
            "batch": _int(v, "batch", 1), "seed": _int(v, "seed", 0), "init": _choice(v, "init", INITS),
            "init_sample": _int(v, "init_sample", 1), "init_trials": _int(v, "init_trials", 1),
            "init_iters": _int(v, "init_iters", 0), "staleness": _int(v, "staleness", 0),
            "blocks": _opt_int(v, "blocks", 1), "output": _path(v, "output"),
            "sampling": _choice(v, "sampling", SAMPLINGS), "batch_tasks": _opt_int(v, "batch_tasks", 1),
        }
        if out["synthetic"] == (out["input"] is not None):
            raise ConfigError("apps.kmeans needs exactly one of config 'input' (an N x D .npy file) "
                              "or 'synthetic=1'")
        if out["synthetic"]:
            out["blobs"] = out["blobs"] or out["k"]
            if out["k"] > out["n"]:
                raise ConfigError(f"k={out['k']} is larger than the number of points n={out['n']}")
        assert {f.name for f in fields(cls)} == set(out)
        return cls(**out)

    def tasks_per_batch(self, num_executors: int) -> int:
        """Tasks (executors) a mini-batch is drawn from with ``sampling=executors``: given, or a quarter of the
        executors (one per worker at the default of 4 executors a worker), at least 1."""
        if self.batch_tasks is not None:
            return min(self.batch_tasks, max(1, self.batch))
        return max(1, min(math.ceil(num_executors / 4), self.batch))

    def blocks_for(self, d: int) -> int:
        """Parameter-server keys the k centroid rows are split into: given, or ~1 MB each (at most k)."""
        if self.blocks is not None:
            return min(self.blocks, self.k)
        return max(1, min(self.k, math.ceil(self.k * (d + 1) * 8 / BLOCK_BYTES)))
