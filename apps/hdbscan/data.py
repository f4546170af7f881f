"""Input for the HDBSCAN app: ``.npy`` and ``.csv`` files, the Table 4.2 synthetic generator, checks.

NN-Descent compares pairs of arbitrary points, so every executor reads the whole (read-only) data matrix,
while the kNN lists, the work and the messages are partitioned. The matrix is loaded once per *process*, and
executors that live in the same worker share it (:data:`_CACHE`). It is a plain writable in-memory array, not a
memory map: numba compiles separate code for read-only arrays, and the kernels are compiled once, for one type.

Errors name the file, and for NaN or infinite values also how many there are and where the first one is.
They are raised as :class:`DataError`, which Litz shows as one line.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

import litz

from .settings import Settings

_CACHE: dict[tuple, Any] = {}  # one entry per process: key -> (X prepared for the metric, shift)


class DataError(litz.InputError, ValueError):
    """Bad or missing input data; the message names the file; shown as one line, no traceback."""


# --------------------------------------------------------------------------------------------- synthetic
def synthetic(n: int, d: int, clusters: int, noise: float, seed: int = 0, std: float = 1.0,
              box: float = 100.0) -> tuple[np.ndarray, np.ndarray]:
    """Data as thesis Table 4.2 describes: ``round(noise * n)`` points uniform in ``[-box, box]^d``; every
    other point picks one of ``clusters`` centres (uniform in the same box) at random and is normally
    distributed about it with standard deviation ``std``. Rows are shuffled. Returns ``(X float32, true
    labels with -1 for noise)``. The thesis does not give the box or the spread. With box 100 and std 1, the
    exact ``hdbscan`` finds 6 254 clusters at d=1 and 894 at d=2 on 100 000 points and 1 000 clusters. The
    thesis reports 6 267 and 840. Box 10 (scikit-learn's ``make_blobs`` default) gives 3 979 at d=2, so
    box 100 is the calibration."""
    rng = np.random.default_rng([seed, 4207])
    centres = rng.uniform(-box, box, (clusters, d))
    n_noise = int(round(noise * n))
    member = rng.integers(0, clusters, n - n_noise)
    X = np.empty((n, d), np.float32)
    X[:n - n_noise] = centres[member] + rng.normal(0.0, std, (n - n_noise, d))
    X[n - n_noise:] = rng.uniform(-box, box, (n_noise, d))
    y = np.concatenate([member, np.full(n_noise, -1)]).astype(np.int64)
    order = rng.permutation(n)
    return X[order], y[order]


# --------------------------------------------------------------------------------------------- files
def load_file(path: str) -> np.ndarray:
    """The N x D matrix of a ``.npy`` or ``.csv`` file, as float32."""
    path = os.path.expanduser(str(path))
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    if os.path.isdir(path):
        raise DataError(f"{path}: is a folder, not a .npy or .csv file")
    lower = path.lower()
    if lower.endswith(".npy"):
        X = _load_npy(path)
    elif lower.endswith((".csv", ".txt")):
        X = _load_csv(path)
    else:
        raise DataError(f"{path}: unknown format: expected a .npy or .csv file")
    if X.ndim != 2:
        raise DataError(f"{path}: expected an N x D matrix (2 dimensions), got shape {X.shape}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise DataError(f"{path}: empty matrix of shape {X.shape}")
    check_finite(X, path)
    return X


def _load_npy(path: str) -> np.ndarray:
    try:
        X = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as e:
        raise DataError(f"{path}: not a plain numeric .npy array ({e})") from None
    except OSError as e:
        raise DataError(f"{path}: not a readable .npy file ({e})") from None
    if not isinstance(X, np.ndarray):
        raise DataError(f"{path}: expected a single array, got {type(X).__name__}")
    if X.dtype.kind not in "fiu" or X.dtype.fields is not None:
        raise DataError(f"{path}: expected a float32 (or other real-number) array, got dtype {X.dtype}")
    if X.ndim != 2:
        raise DataError(f"{path}: expected an N x D matrix (2 dimensions), got shape {X.shape}")
    return np.array(X, dtype=np.float32, order="C")  # in memory and writable (see the module docstring)


def _load_csv(path: str) -> np.ndarray:
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
    except UnicodeDecodeError:
        raise DataError(f"{path}: not a text (.csv) file") from None
    if not first.strip():
        raise DataError(f"{path}: empty file")
    try:
        [float(t) for t in first.split(",")]
        skip = 0
    except ValueError:
        skip = 1  # a header line
    try:
        X = np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=2, skiprows=skip)
    except ValueError as e:
        msg = str(e).replace("\n", " ")
        raise DataError(f"{path}: {msg} (rows counted from 1{', after the header' if skip else ''})") from None
    return np.ascontiguousarray(X, dtype=np.float32)


def check_finite(X: np.ndarray, where: str) -> None:
    """NaN or infinite values: one error saying how many and where the first is."""
    if np.isfinite(X).all():
        return
    nans = int(np.isnan(X).sum())
    infs = int(np.isinf(X).sum())
    row, col = (int(i) for i in np.argwhere(~np.isfinite(X))[0])
    what = " and ".join(s for s in (f"{nans} NaN" if nans else "", f"{infs} infinite" if infs else "") if s)
    raise DataError(f"{where}: {what} value(s) in the data; the first at row {row}, column {col} (0-based)")


def check_sizes(settings: Settings, n: int, where: str) -> None:
    if n < settings.min_cluster_size:
        raise DataError(f"{where}: {n} points, fewer than min_cluster_size={settings.min_cluster_size}")
    if settings.k >= n:
        raise DataError(f"{where}: k={settings.k} neighbours needs more than k points, the data has {n}")


# --------------------------------------------------------------------------------------------- per process
def source_name(settings: Settings) -> str:
    return settings.input if settings.input is not None else "synthetic data"


def matrix(settings: Settings) -> tuple[np.ndarray, float]:
    """``(X, shift)`` ready for the distance kernels (see :mod:`apps.hdbscan.knn`), loaded once per process."""
    if settings.synthetic:
        key: tuple = ("synthetic", settings.n, settings.d, settings.clusters, settings.noise, settings.cluster_std,
                      settings.box, settings.seed, settings.metric)
    else:
        path = os.path.abspath(os.path.expanduser(settings.input))
        try:
            st = os.stat(path)
            key = ("file", path, st.st_mtime_ns, st.st_size, settings.metric)
        except OSError:
            key = ("file", path, None, None, settings.metric)
    if key not in _CACHE:
        _CACHE.clear()
        if settings.synthetic:
            X, _ = synthetic(settings.n, settings.d, settings.clusters, settings.noise, settings.seed,
                             settings.cluster_std, settings.box)
        else:
            X = load_file(settings.input)
        _CACHE[key] = prepare(X, settings.metric)
    return _CACHE[key]


def prepare(X: np.ndarray, metric: str) -> tuple[np.ndarray, float]:
    """Euclidean: as is. Cosine: unit rows (zero rows stay zero), shift 1. Dot: shift = the largest squared
    norm, so ``shift - <x, y>`` is never negative."""
    if metric == "euclidean":
        return X, 0.0
    X = np.ascontiguousarray(X, dtype=np.float32)
    norms = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64))
    if metric == "cosine":
        scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
        return (X * scale[:, None].astype(np.float32)).astype(np.float32), 1.0
    return X, float(norms.max() ** 2) if len(norms) else 0.0
