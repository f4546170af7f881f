"""The scikit-learn references the apps' results are checked against, on the apps' own synthetic data."""
from __future__ import annotations

import numpy as np

MLR_CONFIG = {"synthetic": 1, "n": 40_000, "n_test": 10_000, "d": 50, "classes": 10, "seed": 0}


def sklearn_accuracy(config: dict) -> float:
    """LogisticRegression's test accuracy on apps.mlr's synthetic split of ``config``."""
    from sklearn.linear_model import LogisticRegression

    from apps.mlr.data import synthetic_rows

    kw = dict(d=config["d"], classes=config["classes"], seed=config["seed"])
    X, y = synthetic_rows(0, config["n"], **kw)
    Xt, yt = synthetic_rows(config["n"], config["n"] + config["n_test"], **kw)
    return LogisticRegression(max_iter=1000).fit(X, y).score(Xt, yt)


def full_kmeans_data(config: dict) -> np.ndarray:
    """Every point of apps.kmeans's synthetic data for ``config``."""
    from apps.kmeans import data
    from apps.kmeans.settings import Settings

    s = Settings.from_config(config)
    return data.synthetic_rows(0, s.n, d=s.d, blobs=s.blobs, seed=s.seed, spread=s.spread)


def sklearn_objective(config: dict) -> float:
    """scikit-learn KMeans's mean squared distance to the nearest centre on the same data (3 starts)."""
    from sklearn.cluster import KMeans

    X = full_kmeans_data(config)
    return KMeans(config["k"], n_init=3, random_state=0).fit(X).inertia_ / len(X)


def rel(a: float, b: float) -> float:
    """``a``'s relative difference from ``b``."""
    return abs(a - b) / abs(b)
