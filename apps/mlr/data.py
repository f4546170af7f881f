"""Data for the MLR app: ``.npz`` and libsvm files, and a deterministic synthetic generator.

Every loader returns ``(X, y)``: ``X`` float32, dense ``numpy.ndarray`` (npz, synthetic) or
``scipy.sparse.csr_matrix`` (libsvm, whose data sets are usually sparse and wide); ``y`` int64 class
indices ``0..classes-1``. Errors name the file (and line) so the runtime's one-line message is actionable.

The synthetic data set is an *indexed stream* of rows: row ``r`` depends only on ``(seed, r)``, generated in
fixed-size chunks with their own seeds. So an executor generates just its own rows, the training set is rows
``0..n-1`` and the test set rows ``n..n+n_test-1`` of the same stream, and everybody (executors, driver,
the tests' scikit-learn baseline) sees identical data without shipping it around. Labels are drawn from a
softmax "teacher" model, so the problem is well-specified for MLR but noisy (Bayes accuracy well below 1).
"""
from __future__ import annotations

import os
import re
import zipfile

import numpy as np
import scipy.sparse as sp

import litz

from .model import Scaler
from .settings import Settings

_CHUNK = 4096  # rows per independently seeded synthetic chunk; part of the stream's definition
_LIBSVM_LINE = re.compile(r"[^\s:]+(?:[ \t]+[^\s:]+:[^\s:]+)*")  # label, then index:value tokens


class DataError(litz.InputError, ValueError):
    """Bad or missing input data; the message names the file (and line); shown as one line, no traceback."""


# --------------------------------------------------------------------------------------------- synthetic
def _teacher(d: int, classes: int, seed: int, signal: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 0])
    weights = rng.standard_normal((d, classes)) * (signal / np.sqrt(d))
    bias = rng.standard_normal(classes) * 0.5
    return weights, bias


def synthetic_rows(lo: int, hi: int, *, d: int, classes: int, seed: int,
                   signal: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``lo..hi-1`` of the synthetic stream: ``X ~ N(0, I_d)``, ``y ~ softmax(X W* + b*)``.

    ``signal`` is the per-class logit scale: larger is easier (Bayes accuracy about 0.78 at 5, 10 classes).
    """
    if not (0 <= lo <= hi):
        raise ValueError(f"bad synthetic row range {lo}..{hi}")
    if d < 1 or classes < 2:
        raise ValueError(f"synthetic data needs d >= 1 and classes >= 2, got d={d}, classes={classes}")
    weights, bias = _teacher(d, classes, seed, signal)
    xs, ys = [], []
    for chunk in range(lo // _CHUNK, (hi + _CHUNK - 1) // _CHUNK):
        rng = np.random.default_rng([seed, 1, chunk])
        x = rng.standard_normal((_CHUNK, d))
        u = rng.random(_CHUNK)
        logits = x @ weights + bias
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        cdf = np.cumsum(p, axis=1)
        y = (cdf > u[:, None] * cdf[:, -1:]).argmax(axis=1)
        start = chunk * _CHUNK
        a, b = max(lo, start) - start, min(hi, start + _CHUNK) - start
        xs.append(x[a:b].astype(np.float32))
        ys.append(y[a:b])
    if not xs:
        return np.zeros((0, d), np.float32), np.zeros(0, np.int64)
    return np.concatenate(xs), np.concatenate(ys).astype(np.int64)


# --------------------------------------------------------------------------------------------- files
def load_npz(path: str) -> tuple[np.ndarray, np.ndarray]:
    """``X`` (2-d, cast to float32) and ``y`` (1-d non-negative ints) from an ``.npz`` file."""
    try:
        with np.load(path, allow_pickle=False) as f:
            if "X" not in f or "y" not in f:
                raise DataError(f"{path}: npz file must hold arrays 'X' and 'y', found {sorted(f.files)}")
            X, y = f["X"], f["y"]
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{path}: not a readable .npz file ({e})") from None
    if X.ndim != 2 or y.ndim != 1 or len(X) != len(y):
        raise DataError(f"{path}: need X of shape (n, d) and y of shape (n,), got {X.shape} and {y.shape}")
    if not np.issubdtype(X.dtype, np.number) or not np.issubdtype(y.dtype, np.number):
        raise DataError(f"{path}: X and y must be numeric, got {X.dtype} and {y.dtype}")
    if len(y) and (np.any(y < 0) or np.any(y != np.round(y))):
        raise DataError(f"{path}: labels y must be non-negative integers")
    return np.ascontiguousarray(X, dtype=np.float32), y.astype(np.int64)


def load_libsvm(path: str) -> tuple[sp.csr_matrix, np.ndarray]:
    """Parse ``label idx:value idx:value ...`` lines (1-based indices; ``#`` starts a comment).

    Labels must be non-negative integers (class indices). Indices are 1-based as in LIBSVM; a file using
    index 0 anywhere is read as 0-based. Each line's shape is checked by one regular expression and split
    in Python; all numbers are converted in one numpy call, and if that fails the bad line is located and
    reported as ``path:line``.
    """
    labels: list[str] = []
    pieces: list[str] = []  # idx, value, idx, value, ...
    counts: list[int] = []  # non-zeros per row
    linenos: list[int] = []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                content = line.split("#", 1)[0].strip()
                if not content:
                    continue
                if not _LIBSVM_LINE.fullmatch(content):
                    raise DataError(f"{path}:{lineno}: malformed libsvm line, expected "
                                    f"'label index:value ...', got {content[:80]!r}")
                tokens = content.replace(":", " ").split()
                labels.append(tokens[0])
                pieces.extend(tokens[1:])
                counts.append((len(tokens) - 1) // 2)
                linenos.append(lineno)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a text (libsvm) file ({e})") from None
    try:
        y = np.array(labels, dtype=np.float64)
        pairs = np.array(pieces, dtype=np.float64).reshape(-1, 2)
    except ValueError:
        _raise_bad_number(path, labels, pieces, counts, linenos)
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    row_of = np.repeat(np.arange(len(counts)), counts)
    idx, val = pairs[:, 0], pairs[:, 1]
    bad = (idx != np.round(idx)) | (idx < 0)
    if len(y):
        bad_label = (y != np.round(y)) | (y < 0)
        if bad_label.any():
            r = int(np.argmax(bad_label))
            raise DataError(f"{path}:{linenos[r]}: label {labels[r]!r} is not a non-negative integer class")
    if bad.any():
        r = int(row_of[np.argmax(bad)])
        raise DataError(f"{path}:{linenos[r]}: feature index must be a non-negative integer")
    cols = idx.astype(np.int64)
    if len(cols) and cols.min() >= 1:
        cols -= 1
    d = int(cols.max()) + 1 if len(cols) else 0
    X = sp.csr_matrix((val.astype(np.float32), cols, bounds), shape=(len(counts), d))
    X.sum_duplicates()
    return X, y.astype(np.int64)


def _raise_bad_number(path: str, labels: list[str], pieces: list[str], counts: list[int],
                      linenos: list[int]) -> None:
    start = 0
    for r, count in enumerate(counts):
        try:
            float(labels[r])
            [float(t) for t in pieces[start:start + 2 * count]]
        except ValueError as e:
            raise DataError(f"{path}:{linenos[r]}: {e}") from None
        start += 2 * count
    raise DataError(f"{path}: unparsable number")  # unreachable: numpy and float() agree


def load_file(path: str) -> tuple[np.ndarray | sp.csr_matrix, np.ndarray]:
    """``.npz`` by extension, anything else as libsvm text."""
    path = os.path.expanduser(str(path))
    if path.endswith(".npz"):
        return load_npz(path)
    return load_libsvm(path)


def fit_features(X: np.ndarray | sp.csr_matrix, d: int, path: str = "") -> np.ndarray | sp.csr_matrix:
    """Make ``X`` exactly ``d`` columns wide: libsvm files drop trailing all-zero features, so a shard or a
    test file can be narrower than the model (pad) or use features it never saw (dropped: weight 0)."""
    if X.shape[1] == d:
        return X
    if sp.issparse(X):
        X = X.tocsr()
        if X.shape[1] > d:
            X = X[:, :d]
        return sp.csr_matrix((X.data, X.indices, X.indptr), shape=(X.shape[0], d))
    raise DataError(f"{path}: expected {d} features, the file has {X.shape[1]}")


def block(n: int, parts: int, part: int) -> tuple[int, int]:
    """Row range ``[lo, hi)`` of contiguous block ``part`` of ``parts`` (sizes differ by at most one)."""
    return n * part // parts, n * (part + 1) // parts


# --------------------------------------------------------------------------------------------- partitions
Partition = tuple[np.ndarray | sp.csr_matrix, np.ndarray, int, int, Scaler | None]


def train_partition(settings: Settings, executor: int, num_executors: int) -> Partition:
    """``(X, y, d, classes, scaler)`` for ``executor``: its contiguous block of the (shuffled) training rows,
    scaled by ``scaler`` (fitted on all training rows; None when there is nothing to scale).

    A synthetic executor generates only its own rows; they are standardised by construction (N(0, 1)
    features), so there is no scaler. A file is read whole by every executor and shuffled with a
    permutation fixed by ``seed`` (files are often sorted by label), so all executors agree on the
    partitioning, on ``d`` (the widest feature index), on the number of classes and on the scaler without
    talking.
    """
    if settings.synthetic:
        lo, hi = block(settings.n, num_executors, executor)
        X, y = synthetic_rows(lo, hi, d=settings.d, classes=settings.classes, seed=settings.seed,
                              signal=settings.signal)
        return X, y, settings.d, settings.classes, None
    path = settings.train
    X, y = load_file(path)
    if not len(y):
        raise DataError(f"{path}: no training rows")
    d = settings.d or X.shape[1]
    X = fit_features(X, d, path)
    classes = settings.classes or int(y.max()) + 1
    if classes < 2:
        classes = 2
    if y.max() >= classes:
        raise DataError(f"{path}: label {int(y.max())} >= classes={classes}")
    lo, hi = block(len(y), num_executors, executor)
    rows = np.random.default_rng([settings.seed, 2]).permutation(len(y))[lo:hi]
    if not settings.scale:
        return X[rows], y[rows], d, classes, None
    scaler = Scaler.fit(X)
    return scaler.transform(X[rows]), y[rows], d, classes, scaler


def test_share(settings: Settings, executor: int, num_executors: int, d: int,
               classes: int) -> tuple[np.ndarray | sp.csr_matrix, np.ndarray] | None:
    """This executor's block of the test set (rows ``n..n+n_test-1`` of the synthetic stream, or of the
    ``test`` file), or None when there is no test set."""
    if settings.synthetic:
        if not settings.n_test:
            return None
        lo, hi = block(settings.n_test, num_executors, executor)
        return synthetic_rows(settings.n + lo, settings.n + hi, d=d, classes=classes, seed=settings.seed,
                              signal=settings.signal)
    if settings.test is None:
        return None
    path = settings.test
    X, y = load_file(path)
    X = fit_features(X, d, path)
    if len(y) and y.max() >= classes:
        raise DataError(f"{path}: label {int(y.max())} is not a class of the training data (< {classes})")
    lo, hi = block(len(y), num_executors, executor)
    return X[lo:hi], y[lo:hi]
