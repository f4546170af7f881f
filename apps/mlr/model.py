"""Softmax-regression math for the MLR app: vectorised numpy, dense or CSR inputs, float32 weights.

Also the feature scaler (fitted on the whole training set, applied to every partition and folded back into
the weights for a model on raw features) and AdaGrad, whose accumulators live next to the weights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

Matrix = np.ndarray | sp.csr_matrix
ADAGRAD_EPS = np.float32(1e-7)  # keeps a never-moved weight's first step finite (Keras' default)


@dataclass(frozen=True)
class Scaler:
    """``x -> (x - shift) * mult`` column by column; ``shift`` is None for sparse data (centring would fill it).

    Why: SGD's step size is one number for every feature, so features on different scales (digits' pixel
    counts 0..16, or a feature that is always 0.001) are learnt at very different speeds; standardised
    features let one default step size fit all. Dense data is standardised (mean 0, variance 1). Sparse
    data is divided by the root mean square of each column's non-zero values: it stays sparse, a column
    that is mostly non-zero gets about unit variance, and a rare feature keeps values of about 1 instead
    of being blown up by its tiny standard deviation (which counts all its zeros). Constant (or empty)
    columns are not scaled.
    """

    shift: np.ndarray | None
    mult: np.ndarray

    @classmethod
    def fit(cls, X: Matrix) -> Scaler:
        """Statistics of all training rows (every executor computes the same from the same file)."""
        if sp.issparse(X):
            X = sp.csr_matrix(X)
            present = np.bincount(X.indices, minlength=X.shape[1])
            squares = np.bincount(X.indices, weights=np.square(X.data, dtype=np.float64), minlength=X.shape[1])
            spread = np.sqrt(squares / np.maximum(present, 1))
            shift = None
        else:
            X64 = np.asarray(X, dtype=np.float64)
            shift = X64.mean(axis=0)
            spread = X64.std(axis=0)
        mult = np.ones(X.shape[1])
        mult[spread > 0] = 1.0 / spread[spread > 0]
        return cls(None if shift is None else shift.astype(np.float32), mult.astype(np.float32))

    def transform(self, X: Matrix) -> Matrix:
        """Scaled copy of ``X`` (float32; CSR stays CSR with the same pattern)."""
        if sp.issparse(X):
            X = sp.csr_matrix(X, dtype=np.float32, copy=True)
            X.data *= self.mult[X.indices]
            return X
        X = np.array(X, dtype=np.float32)
        if self.shift is not None:
            X -= self.shift
        X *= self.mult
        return X

    def raw_model(self, W: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The same classifier on unscaled features: ``scaled(x) @ W + b == x @ W' + b'``."""
        W_raw = W * self.mult[:, None]
        b_raw = b if self.shift is None else b - self.shift @ W_raw
        return W_raw.astype(np.float32), np.asarray(b_raw, dtype=np.float32)


class Plateau:
    """The stopping rule (scikit-learn's SGD rule): stop after ``patience`` epochs in a row whose training
    loss is not ``tol`` below the best so far. ``tol = 0`` never stops."""

    def __init__(self, tol: float, patience: int) -> None:
        self.tol, self.patience = tol, patience
        self.best, self.flat = math.inf, 0

    def stop(self, loss: float) -> bool:
        """Record one epoch's loss; True once training should stop."""
        self.flat = self.flat + 1 if loss > self.best - self.tol else 0
        self.best = min(self.best, loss)
        return bool(self.tol) and self.flat >= self.patience


def _log_softmax(X: Matrix, W: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shifted logits and log-normaliser: ``log p = z - lse[:, None]``."""
    z = np.asarray(X @ W, dtype=np.float32) + b
    z -= z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1))
    return z, lse


def evaluate(X: Matrix, y: np.ndarray, W: np.ndarray, b: np.ndarray,
             batch_size: int = 8192) -> tuple[float, int, int]:
    """``(summed cross-entropy, correct predictions, rows)`` of the model ``(W, b)`` on ``(X, y)``."""
    loss, correct = 0.0, 0
    for lo in range(0, X.shape[0], batch_size):
        Xb, yb = X[lo:lo + batch_size], y[lo:lo + batch_size]
        z, lse = _log_softmax(Xb, W, b)
        rows = np.arange(len(yb))
        loss += float((lse - z[rows, yb]).sum())
        correct += int((z.argmax(axis=1) == yb).sum())
    return loss, correct, int(X.shape[0])


def sgd_steps(X: Matrix, y: np.ndarray, W: np.ndarray, b: np.ndarray, starts: np.ndarray, *,
              batch_size: int, lr: float, l2: float = 0.0,
              adagrad: tuple[np.ndarray, np.ndarray] | None = None, peers: float = 1.0) -> tuple[float, int, int]:
    """Mini-batch steps on the batches ``X[s:s+batch_size]`` for ``s`` in ``starts``, in that order,
    updating ``W`` and ``b`` in place.

    Plain SGD (``W -= lr * grad``), or AdaGrad when ``adagrad = (GW, Gb)`` holds the running sums of
    squared gradients (updated in place too): ``G += grad**2; W -= lr * grad / (sqrt(G) + eps)``. Each
    weight's step then shrinks as its gradients add up (a per-weight 1/sqrt(t) schedule), so one ``lr``
    suits data of any size, and rarely active (sparse) features keep large steps. ``peers`` counts each
    squared gradient that many times: a task passes 1 + the steps of other tasks its stale read may miss,
    as if they had the same gradient, so that many first steps taken from the same zero sums do not add up
    to an overshoot (the caller sends the servers the true sums).

    Returns ``(summed loss, correct predictions, rows)``, each batch measured just before the step it
    causes (the usual running training loss). Batches are contiguous slices (views, no copies), so rows
    should be in random order already; the caller randomises the batch order.
    """
    loss, correct, count = 0.0, 0, 0
    lr32, peers32 = np.float32(lr), np.float32(peers)
    for lo in starts:
        Xb, yb = X[lo:lo + batch_size], y[lo:lo + batch_size]
        if not len(yb):
            continue
        rows = np.arange(len(yb))
        z, lse = _log_softmax(Xb, W, b)
        loss += float((lse - z[rows, yb]).sum())
        correct += int((z.argmax(axis=1) == yb).sum())
        count += len(yb)
        g = np.exp(z - lse[:, None])  # probabilities; d loss / d logits = p - onehot(y)
        g[rows, yb] -= 1.0
        g *= np.float32(1.0 / len(yb))
        grad_w = np.asarray(Xb.T @ g, dtype=np.float32)
        grad_b = g.sum(axis=0)
        if l2:
            grad_w += np.float32(l2) * W
        if adagrad is None:
            W -= lr32 * grad_w
            b -= lr32 * grad_b
            continue
        GW, Gb = adagrad
        GW += peers32 * grad_w * grad_w
        Gb += peers32 * grad_b * grad_b
        W -= lr32 * grad_w / (np.sqrt(GW) + ADAGRAD_EPS)
        b -= lr32 * grad_b / (np.sqrt(Gb) + ADAGRAD_EPS)
    return loss, correct, count
