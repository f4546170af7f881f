"""The HDBSCAN app's configuration (``--config key=value``), validated once so a typo is one clear error."""
from __future__ import annotations

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
    "input": None, "output": None, "synthetic": False,
    "n": 100_000, "d": 10, "clusters": 1000, "noise": 0.2, "cluster_std": 1.0, "box": 100.0,
    "k": None, "min_cluster_size": 5, "min_samples": None, "max_cluster_size": 0, "metric": "euclidean", "seed": 0,
    "check_recall": False, "recall_sample": 1000,
    "max_iters": 30, "delta": 0.001, "max_candidates": None, "rho": 1.0, "rp_trees": None, "leaf_size": None,
    "dmax_filter": True, "partition": "tree", "mst": "auto", "mst_memory": 2 << 30,
}
METRICS = ("euclidean", "cosine", "dot")
MST_METHODS = ("auto", "kruskal", "boruvka")
PARTITIONS = ("tree", "block")
DEFAULT_K = 15
EDGE_BYTES = 20  # Kruskal's memory per kNN-graph edge: (u, v, w) plus its sort index


@dataclass(frozen=True)
class Settings:
    input: str | None
    output: str | None
    synthetic: bool
    n: int
    d: int
    clusters: int
    noise: float
    cluster_std: float
    box: float
    k: int
    min_cluster_size: int
    min_samples: int
    max_cluster_size: int
    metric: str
    seed: int
    check_recall: bool
    recall_sample: int
    max_iters: int
    delta: float
    max_candidates: int
    rho: float
    rp_trees: int | None
    leaf_size: int | None
    dmax_filter: bool
    partition: str
    mst: str
    mst_memory: int

    @classmethod
    def from_config(cls, config: dict | None) -> Settings:
        """Defaults filled in, types checked; raises ConfigError naming the bad key."""
        v = with_defaults("apps.hdbscan", config, DEFAULTS)
        out: dict[str, Any] = {
            "input": _path(v, "input"), "output": _path(v, "output"), "synthetic": _bool(v, "synthetic"),
            "n": _int(v, "n", 2), "d": _int(v, "d", 1), "clusters": _int(v, "clusters", 1),
            "noise": _float(v, "noise", 0.0, 1.0), "cluster_std": _float(v, "cluster_std", 0.0),
            "box": _float(v, "box", 0.0), "k": _opt_int(v, "k", 1),
            "min_cluster_size": _int(v, "min_cluster_size", 2), "min_samples": _opt_int(v, "min_samples", 1),
            "max_cluster_size": _int(v, "max_cluster_size", 0), "metric": _choice(v, "metric", METRICS),
            "seed": _int(v, "seed", 0), "check_recall": _bool(v, "check_recall"),
            "recall_sample": _int(v, "recall_sample", 1), "max_iters": _int(v, "max_iters", 0),
            "delta": _float(v, "delta", 0.0), "max_candidates": _opt_int(v, "max_candidates", 1),
            "rho": _float(v, "rho", 0.0, 1.0), "rp_trees": _opt_int(v, "rp_trees", 0),
            "leaf_size": _opt_int(v, "leaf_size", 2), "dmax_filter": _bool(v, "dmax_filter"),
            "partition": _choice(v, "partition", PARTITIONS),
            "mst": _choice(v, "mst", MST_METHODS), "mst_memory": _int(v, "mst_memory", 0),
        }
        if out["synthetic"] == (out["input"] is not None):
            raise ConfigError("apps.hdbscan needs exactly one of config 'input' (an N x D .npy or .csv file) "
                              "or 'synthetic=1'")
        if out["rho"] == 0:
            raise ConfigError("config 'rho' must be in (0, 1], got 0")
        if out["min_samples"] is None:
            out["min_samples"] = out["min_cluster_size"]
        if out["k"] is None:  # 15 neighbours, or more when the core distance needs them
            out["k"] = max(DEFAULT_K, out["min_samples"])
        if out["min_samples"] > out["k"]:
            raise ConfigError(f"config 'min_samples' ({out['min_samples']}) must be at most 'k' ({out['k']}): "
                              f"the core distance is the distance to the min_samples-th of the k neighbours")
        if out["max_candidates"] is None:  # Dong et al.: rho K forward plus rho K reverse candidates
            out["max_candidates"] = 2 * out["k"]  # (k alone: kNN recall 0.934 at 50 000 x 50; 2k: 0.966)
        assert {f.name for f in fields(cls)} == set(out)
        return cls(**out)

    def trees(self, n: int) -> int:
        """Random-projection trees for the initial graph: given, or about pynndescent's count / 1.5 (max 12)."""
        if self.rp_trees is not None:
            return self.rp_trees
        return max(3, min(12, round(n ** 0.25 / 1.5)))  # 8 at 20 000 points, 10 at 50 000, 12 from 100 000

    def leaf(self) -> int:
        return self.leaf_size or max(2 * self.k, 20)

    def use_kruskal(self, n: int) -> bool:
        if self.mst != "auto":
            return self.mst == "kruskal"
        return n * self.k * EDGE_BYTES <= self.mst_memory
