"""Data for the k-means app: ``.npy`` files, deterministic synthetic Gaussian blobs, and per-row hashing.

Every row has a *global index* ``0..N-1``, and everything random about a row is a function of ``(seed,
index)`` only: which mini-batch it falls into in each epoch, whether it is in the initialisation sample,
and (for synthetic data) its values. So the algorithm's result does not depend on how the rows are split
into executors, and an executor generates or reads just its own rows.
"""
from __future__ import annotations

import os

import numpy as np

import litz

from .settings import Settings

_CHUNK = 4096  # rows per independently seeded synthetic chunk; part of the stream's definition
_BOX = 10.0  # synthetic blob centres are uniform in [-_BOX, _BOX]^d, as in sklearn's make_blobs

# Purposes of the per-row hash streams (part of the definition of a run: changing them changes results).
SAMPLE, BATCH = 1, 2


class DataError(litz.InputError, ValueError):
    """Bad or missing input data; the message names the file; shown as one line, no traceback."""


# --------------------------------------------------------------------------------------------- row hashes
def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def row_hash(lo: int, hi: int, seed: int, *purpose: int) -> np.ndarray:
    """64-bit pseudo-random words for global rows ``lo..hi-1``, one stream per ``(seed, *purpose)``."""
    key = np.random.SeedSequence([seed, *purpose]).generate_state(1, np.uint64)
    rows = np.arange(lo, hi, dtype=np.uint64)
    return _splitmix64(rows * np.uint64(0x9E3779B97F4A7C15) + key)


def row_uniform(lo: int, hi: int, seed: int, *purpose: int) -> np.ndarray:
    """Uniform floats in [0, 1) for global rows ``lo..hi-1`` (53 bits of :func:`row_hash`)."""
    return (row_hash(lo, hi, seed, *purpose) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def batch_of_rows(lo: int, hi: int, seed: int, epoch: int, batches: int) -> np.ndarray:
    """Mini-batch (``0..batches-1``) of each global row ``lo..hi-1`` in ``epoch``: a fresh uniform draw per
    row and epoch, so every row is visited once per epoch and batches hold about ``N / batches`` rows."""
    return (row_hash(lo, hi, seed, BATCH, epoch) % np.uint64(batches)).astype(np.int64)


def block(n: int, parts: int, part: int) -> tuple[int, int]:
    """Row range ``[lo, hi)`` of contiguous block ``part`` of ``parts`` (sizes differ by at most one)."""
    return n * part // parts, n * (part + 1) // parts


# --------------------------------------------------------------------------------------------- synthetic
def blob_centers(d: int, blobs: int, seed: int) -> np.ndarray:
    """The true centres of the synthetic blobs, ``blobs x d`` float64."""
    return np.random.default_rng([seed, 0]).uniform(-_BOX, _BOX, size=(blobs, d))


def synthetic_rows(lo: int, hi: int, *, d: int, blobs: int, seed: int, spread: float = 1.0,
                   labels: bool = False):
    """Rows ``lo..hi-1`` of the synthetic stream: isotropic Gaussian blobs (std ``spread``) around
    :func:`blob_centers`, each row's blob uniform at random. float32 ``X``; with ``labels``, ``(X, blob)``."""
    if not (0 <= lo <= hi):
        raise ValueError(f"bad synthetic row range {lo}..{hi}")
    centers = blob_centers(d, blobs, seed)
    xs, ys = [], []
    for chunk in range(lo // _CHUNK, (hi + _CHUNK - 1) // _CHUNK):
        rng = np.random.default_rng([seed, 1, chunk])
        y = rng.integers(0, blobs, _CHUNK)
        x = centers[y] + rng.standard_normal((_CHUNK, d)) * spread
        start = chunk * _CHUNK
        a, b = max(lo, start) - start, min(hi, start + _CHUNK) - start
        xs.append(x[a:b].astype(np.float32))
        ys.append(y[a:b])
    X = np.concatenate(xs) if xs else np.zeros((0, d), np.float32)
    if labels:
        return X, (np.concatenate(ys) if ys else np.zeros(0, np.int64))
    return X


# --------------------------------------------------------------------------------------------- files
def open_npy(path: str) -> np.ndarray:
    """The array in ``path``, memory-mapped (nothing is read yet), after checking shape and dtype."""
    path = os.path.expanduser(str(path))
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
        if magic.startswith(b"PK"):
            raise DataError(f"{path}: expected a .npy file holding one N x D array, got an .npz (zip) archive")
        if magic != b"\x93NUMPY":
            raise DataError(f"{path}: not a .npy file (no NumPy header; save the data with numpy.save)")
        X = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a .npy file") from None
    except PermissionError:
        raise DataError(f"{path}: permission denied") from None
    except (OSError, ValueError, EOFError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{path}: not a readable .npy file ({e})") from None
    if X.ndim != 2:
        raise DataError(f"{path}: expected an N x D array, got shape {X.shape}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise DataError(f"{path}: the array is empty (shape {X.shape})")
    if X.dtype.kind != "f":
        raise DataError(f"{path}: expected float32 data, got {X.dtype} (convert with X.astype(np.float32))")
    return X


def load_rows(path: str, lo: int, hi: int) -> np.ndarray:
    """Rows ``lo..hi-1`` of the ``.npy`` file as a float32 array; only those rows are read."""
    X = np.ascontiguousarray(open_npy(path)[lo:hi], dtype=np.float32)
    finite = np.isfinite(X).all(axis=1)
    if not finite.all():
        raise DataError(f"{os.path.expanduser(path)}: row {lo + int(np.argmin(finite))} has a NaN or "
                        f"infinite value")
    return X


def partition(settings: Settings, executor: int, num_executors: int) -> tuple[np.ndarray, int, int]:
    """``(X, lo, n)``: executor ``executor``'s contiguous block of rows, its first global row index, and the
    total number of rows N. Blocks are contiguous because mini-batches are drawn per row (:func:`row_hash`):
    a file sorted by cluster still gives every mini-batch a uniform sample."""
    if settings.synthetic:
        n = settings.n
        lo, hi = block(n, num_executors, executor)
        X = synthetic_rows(lo, hi, d=settings.d, blobs=settings.blobs, seed=settings.seed, spread=settings.spread)
        return X, lo, n
    n = open_npy(settings.input).shape[0]
    lo, hi = block(n, num_executors, executor)
    return load_rows(settings.input, lo, hi), lo, n
