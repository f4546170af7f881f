"""Softmax-regression math for the MLR app: vectorised numpy, dense or CSR inputs, float32 weights."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

Matrix = np.ndarray | sp.csr_matrix


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
              batch_size: int, lr: float, l2: float = 0.0) -> tuple[float, int, int]:
    """Mini-batch SGD steps on the batches ``X[s:s+batch_size]`` for ``s`` in ``starts``, in that order,
    updating ``W`` and ``b`` in place.

    Returns ``(summed loss, correct predictions, rows)``, each batch measured just before the step it
    causes (the usual running training loss). Batches are contiguous slices (views, no copies), so rows
    should be in random order already; the caller randomises the batch order.
    """
    loss, correct, count = 0.0, 0, 0
    lr32 = np.float32(lr)
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
        if l2:
            grad_w += np.float32(l2) * W
        W -= lr32 * grad_w
        b -= lr32 * g.sum(axis=0)
    return loss, correct, count
