"""The numerical kernels of the k-means app, all vectorised numpy (no per-point Python).

The model on the parameter server is, per centre ``c``, the running sum ``S_c`` of the points assigned to it
(plus its initial position) and their count ``N_c`` (plus one); the centre is ``S_c / N_c``. Adding a
mini-batch's per-centre sums and counts to these is exactly Sculley's (2010) mini-batch update with the
per-centre learning rate ``1 / N_c``, ``c <- (1 - eta) c + eta x`` applied point by point, because the result
of those steps is the running mean. Sums and counts are additive, so deltas from any number of executors
(and in any order) can simply be added up by the servers.
"""
from __future__ import annotations

import math

import numpy as np

EVAL_ENTRIES = 1 << 22  # rows x max(k, d) entries per chunk when scoring a whole partition (32 MB each)


def single_threaded_blas() -> bool:
    """Limit BLAS to one thread in this (worker) process; True if that worked.

    Litz gets its parallelism from worker processes, typically one per core. A multi-threaded BLAS in each
    of them oversubscribes the cores, and for the small products of a mini-batch the threads mostly spin:
    measured on 2 busy cores, a 1024 x 32 by 32 x 32 product took 4.9 ms with OpenBLAS's default threads and
    0.1 ms with one. Uses threadpoolctl (installed with scikit-learn) when available.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    threadpool_limits(limits=1, user_api="blas")
    return True


def centers_of(model: np.ndarray) -> np.ndarray:
    """Centres ``k x d`` (float64) from the parameter-server form ``[S | N]`` (``k x (d + 1)``)."""
    return model[:, :-1] / model[:, -1:]


def initial_model(centers: np.ndarray) -> np.ndarray:
    """``[S | N]`` for initial centres: each counts as one point (so ``S / N`` is always defined)."""
    centers = np.asarray(centers, np.float64)
    return np.hstack([centers, np.ones((len(centers), 1))])


def nearest(X: np.ndarray, centers: np.ndarray, center_sq: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``X``: the index of its nearest centre and the squared distance to it (float64).

    The argmin uses ``|x|^2 - 2 x.c + |c|^2`` (one matrix product); the returned distance is recomputed
    directly as ``|x - c|^2``, which does not lose precision when the data lie far from the origin.
    """
    Xf = np.asarray(X, np.float64)
    if not len(Xf):
        return np.zeros(0, np.int64), np.zeros(0)
    if center_sq is None:
        center_sq = np.einsum("ij,ij->i", centers, centers)
    scores = center_sq[None, :] - 2.0 * (Xf @ centers.T)  # |x|^2 is the same for every centre
    labels = np.argmin(scores, axis=1)
    diff = Xf - centers[labels]
    return labels, np.einsum("ij,ij->i", diff, diff)


def batch_delta(X: np.ndarray, centers: np.ndarray) -> tuple[np.ndarray, float]:
    """The ``[S | N]`` delta of one mini-batch (``k x (d + 1)``: per-centre sums of the rows assigned to it,
    and their counts) and the rows' summed squared distance to their nearest centre before the update. In chunks
    of about ``EVAL_ENTRIES`` (rows x max(k, d)) like :func:`score`: a task of 31 250 rows against 1 024 centres
    otherwise made 256 MB of float64 temporaries (measured: a worker's peak RSS 816 MB instead of ~370 MB)."""
    k, d = centers.shape
    step = max(1, EVAL_ENTRIES // max(k, d, 1))
    if len(X) > step:
        center_sq = np.einsum("ij,ij->i", centers, centers)
        delta, total = np.zeros((k, d + 1)), 0.0
        for lo in range(0, len(X), step):
            part, sse = _batch_delta(X[lo:lo + step], centers, center_sq)
            delta += part
            total += sse
        return delta, total
    return _batch_delta(X, centers)


def _batch_delta(X: np.ndarray, centers: np.ndarray, center_sq: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    k, d = centers.shape
    delta = np.zeros((k, d + 1))
    labels, dist = nearest(X, centers, center_sq)
    if not len(labels):
        return delta, 0.0
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    used, starts = np.unique(sorted_labels, return_index=True)
    delta[used, :d] = np.add.reduceat(np.asarray(X, np.float64)[order], starts, axis=0)
    delta[:, d] = np.bincount(labels, minlength=k)
    return delta, float(dist.sum())


def score(X: np.ndarray, centers: np.ndarray) -> tuple[float, np.ndarray]:
    """Summed squared distance of every row of ``X`` to its nearest centre, and the number of rows per centre;
    in chunks of about ``EVAL_ENTRIES`` float64 temporaries (rows x max(k, d)), so a large partition needs
    little extra memory."""
    k, d = centers.shape
    center_sq = np.einsum("ij,ij->i", centers, centers)
    step = max(1, EVAL_ENTRIES // max(k, d, 1))
    total, sizes = 0.0, np.zeros(k, np.int64)
    for lo in range(0, len(X), step):
        labels, dist = nearest(X[lo:lo + step], centers, center_sq)
        total += float(dist.sum())
        sizes += np.bincount(labels, minlength=k)
    return total, sizes


def kmeans_plus_plus(sample: np.ndarray, k: int, rng: np.random.Generator, trials: int | None = None) -> np.ndarray:
    """Greedy k-means++ (Arthur & Vassilvitskii 2007; ``2 + log k`` candidate draws per centre, keeping the
    one that lowers the potential most, as scikit-learn does) on the rows of ``sample``: ``k x d`` float64."""
    X = np.asarray(sample, np.float64)
    n = len(X)
    if n < k:
        raise ValueError(f"k-means++ needs at least k={k} sample points, got {n}")
    trials = trials or 2 + int(math.log(k))
    x_sq = np.einsum("ij,ij->i", X, X)
    centers = np.empty((k, X.shape[1]))
    first = int(rng.integers(n))
    centers[0] = X[first]
    closest = np.maximum(x_sq - 2 * X @ X[first] + x_sq[first], 0)
    for c in range(1, k):
        potential = closest.sum()
        if potential <= 0:  # every sample point coincides with a centre: pick uniformly
            candidates = rng.integers(n, size=trials)
        else:
            cdf = np.cumsum(closest)
            candidates = np.searchsorted(cdf, rng.random(trials) * cdf[-1], side="right").clip(max=n - 1)
        dist = np.maximum(x_sq[None, :] - 2 * X[candidates] @ X.T + x_sq[candidates, None], 0)
        dist = np.minimum(closest[None, :], dist)
        best = int(np.argmin(dist.sum(axis=1)))
        centers[c] = X[candidates[best]]
        closest = dist[best]
    return centers


def lloyd(X: np.ndarray, centers: np.ndarray, iterations: int) -> tuple[np.ndarray, float]:
    """Up to ``iterations`` rounds of Lloyd's algorithm on ``X`` from ``centers`` (a centre that loses all its
    points stays put); stops early once no assignment changes. Returns the centres and the mean squared
    distance of ``X`` to them."""
    X = np.asarray(X, np.float64)
    centers = np.array(centers, np.float64)
    k = len(centers)
    labels, dist = nearest(X, centers)
    for _ in range(iterations):
        counts = np.bincount(labels, minlength=k)
        sums = np.zeros_like(centers)
        order = np.argsort(labels, kind="stable")
        used, starts = np.unique(labels[order], return_index=True)
        sums[used] = np.add.reduceat(X[order], starts, axis=0)
        moved = counts > 0
        centers[moved] = sums[moved] / counts[moved, None]
        new_labels, dist = nearest(X, centers)
        if np.array_equal(new_labels, labels):
            break
        labels = new_labels
    return centers, float(dist.mean()) if len(dist) else 0.0


def initial_centers(sample: np.ndarray, k: int, method: str, trials: int, iterations: int,
                    rng: np.random.Generator) -> np.ndarray:
    """The best of ``trials`` initialisations (``"k-means++"`` or ``"random"``), each refined by ``iterations``
    Lloyd rounds on ``sample``; best = lowest mean squared distance on the sample, first on ties."""
    best, best_objective = None, math.inf
    for _ in range(trials):
        if method == "random":
            centers = random_points(sample, k, rng)
        else:
            centers = kmeans_plus_plus(sample, k, rng)
        centers, objective = lloyd(sample, centers, iterations)
        if objective < best_objective:
            best, best_objective = centers, objective
    return best


def random_points(sample: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` distinct rows of ``sample`` chosen uniformly (``k x d`` float64)."""
    if len(sample) < k:
        raise ValueError(f"random initialisation needs at least k={k} sample points, got {len(sample)}")
    return np.asarray(sample, np.float64)[np.sort(rng.choice(len(sample), size=k, replace=False))]
