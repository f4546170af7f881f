"""scikit-learn estimators that train with a Litz job: each ``fit`` runs one of the bundled apps through
:func:`litz.run` on this machine, and ``predict`` / ``transform`` run here, in numpy, from the model file the app
wrote (``--config output=PATH``, :mod:`apps.modelfile`).

- :class:`LogisticRegression`: ``apps.mlr`` (multinomial logistic regression by mini-batch SGD);
- :class:`KMeans`: ``apps.kmeans`` (mini-batch k-means, as scikit-learn's ``MiniBatchKMeans``);
- :class:`LatentDirichletAllocation`: ``apps.lda`` (collapsed Gibbs sampling);
- :class:`HDBSCAN`: ``apps.hdbscan`` (NN-Descent kNN graph, its minimum spanning tree).

Parameters keep scikit-learn's names where the app has the same knob (``max_iter``, ``random_state``,
``n_clusters``, ``batch_size``, ``n_components``, ``min_cluster_size``, ``C``...); ``workers``, ``servers`` and
``executors`` size the job as in :func:`litz.run`. The data reaches the executors as a file in a temporary
directory (``.npz`` for MLR, ``.npy`` for k-means and HDBSCAN, a UCI ``docword.txt`` for LDA), which works for
forked and fresh worker processes alike and is removed when ``fit`` returns.

A fit is reproducible for a given ``random_state`` when its result does not depend on timing: always for
:class:`KMeans` (bulk synchronous, double-buffered), :class:`HDBSCAN` (barrier phases) and
:class:`LatentDirichletAllocation` (block-scheduled: each task reads the blocks and topic totals of the tasks
before it in the schedule, so a fixed number of executors gives the same topics), and with ``executors=1`` for
:class:`LogisticRegression`, whose executors read each other's updates as they happen to arrive (its
``non_deterministic`` tag says so otherwise).
"""
from __future__ import annotations

import importlib
import math
import os
import shutil
import tempfile
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin, ClusterMixin, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, check_non_negative, validate_data

from .errors import InputError

__all__ = ["LogisticRegression", "KMeans", "LatentDirichletAllocation", "HDBSCAN"]


class _LitzEstimator(BaseEstimator):
    """What every estimator here shares: running its app as a Litz job on files in a temporary directory."""

    _app = ""
    # check name -> why it fails: pass to sklearn.utils.estimator_checks.check_estimator(expected_failed_checks=)
    _xfail: dict[str, str] = {}

    def expected_failed_checks(self) -> dict[str, str]:
        """scikit-learn's ``check_estimator`` checks this estimator fails, each with the reason (README.md)."""
        return dict(self._xfail)

    def _seed(self) -> int:
        return int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))

    def _job(self, config: dict, files: dict[str, Any]) -> tuple[dict, dict[str, np.ndarray]]:
        """Write ``files`` (config key -> writer(path) returning the file name) into a temporary directory, run the
        app on them with ``output`` there too, and return (its result, its model's arrays); the directory goes."""
        import litz
        from apps.modelfile import load_model

        tmp = tempfile.mkdtemp(prefix="litz-sklearn-")
        try:
            config = dict(config)
            for key, write in files.items():
                config[key] = write(tmp)
            config["output"] = os.path.join(tmp, "model.npz")
            try:
                result = litz.run(importlib.import_module(self._app), workers=self.workers, servers=self.servers,
                                  executors=self.executors, config=config, progress=False)
            except InputError as exc:  # bad data or parameters: what scikit-learn users catch
                raise ValueError(str(exc)) from None
            return result, load_model(config["output"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _npy_writer(X: np.ndarray, name: str):  # noqa: ANN202
    def write(tmp: str) -> str:
        path = os.path.join(tmp, name)
        np.save(path, np.ascontiguousarray(X, dtype=np.float32))
        return path

    return write


def _sq_distances(X: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """Squared euclidean distances, rows of ``X`` x ``centers``, in float64, never negative."""
    X = np.asarray(X, np.float64)
    d = (X * X).sum(1)[:, None] - 2.0 * X @ centers.T + (centers * centers).sum(1)[None, :]
    return np.maximum(d, 0.0)


class LogisticRegression(ClassifierMixin, _LitzEstimator):
    """Multinomial logistic regression trained by ``apps.mlr`` (mini-batch SGD on a parameter server).

    ``C``: inverse L2 strength, as in scikit-learn (the penalty ``||W||^2 / (2 C n)`` on the mean loss).
    ``max_iter``: most epochs (the app stops earlier once its training loss stops improving). ``batch_size``: rows
    per SGD step (None: the app's choice for the number of rows).
    ``staleness``: the app's SSP bound (0: bulk synchronous). The features are standardised for training and the
    scaling folded back into ``coef_`` and ``intercept_``, so the model applies to ``X`` as given; the intercept
    is not penalised. Fitted: ``classes_``, ``coef_`` (1 x features for two classes, else classes x features),
    ``intercept_``, ``n_features_in_``, ``n_iter_``.
    """

    _app = "apps.mlr"

    def __init__(self, C: float = 1.0, max_iter: int = 100, batch_size: int | None = None, staleness: int = 0,
                 random_state: Any = None, workers: int = 2, servers: int = 1, executors: int | None = None):
        self.C = C
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.staleness = staleness
        self.random_state = random_state
        self.workers = workers
        self.servers = servers
        self.executors = executors

    def __sklearn_tags__(self):  # noqa: ANN204
        tags = super().__sklearn_tags__()
        tags.non_deterministic = self.executors != 1
        return tags

    def fit(self, X: Any, y: Any) -> LogisticRegression:
        """Train on ``X`` (n x features) and labels ``y`` with one Litz job."""
        X, y = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"LogisticRegression needs samples of at least 2 classes in the data, but the data "
                             f"contains only one class: {self.classes_[0]!r}")
        if not (isinstance(self.C, (int, float)) and self.C > 0):
            raise ValueError(f"C must be a number > 0, got {self.C!r}")
        n = len(y)
        mean, scale = X.mean(axis=0), X.std(axis=0)
        scale[scale == 0] = 1.0
        Xs = ((X - mean) / scale).astype(np.float32)

        def write(tmp: str) -> str:
            path = os.path.join(tmp, "train.npz")
            np.savez(path, X=Xs, y=codes.astype(np.int64))
            return path

        config = {"epochs": self.max_iter, "staleness": self.staleness, "l2": 1.0 / (self.C * n),
                  "seed": self._seed()}
        if self.batch_size:
            config["batch_size"] = self.batch_size
        result, model = self._job(config, {"train": write})
        W = model["weights"].astype(np.float64) / scale[:, None]  # features x classes, for unscaled X
        b = model["bias"].astype(np.float64) - mean @ W
        if len(self.classes_) == 2:  # scikit-learn's binary form: one row, the second class's log-odds
            self.coef_, self.intercept_ = (W[:, 1] - W[:, 0])[None, :], np.array([b[1] - b[0]])
        else:
            self.coef_, self.intercept_ = W.T.copy(), b
        self.n_iter_ = np.array([result["epochs"]])
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        scores = X @ self.coef_.T + self.intercept_
        return scores.ravel() if scores.shape[1] == 1 else scores

    def predict_proba(self, X: Any) -> np.ndarray:
        scores = self.decision_function(X)
        if scores.ndim == 1:
            p = 1.0 / (1.0 + np.exp(-scores))
            return np.column_stack([1.0 - p, p])
        scores = scores - scores.max(axis=1, keepdims=True)
        e = np.exp(scores)
        return e / e.sum(axis=1, keepdims=True)

    def predict_log_proba(self, X: Any) -> np.ndarray:
        return np.log(self.predict_proba(X))

    def predict(self, X: Any) -> np.ndarray:
        scores = self.decision_function(X)
        return self.classes_[(scores > 0).astype(int) if scores.ndim == 1 else scores.argmax(axis=1)]


class KMeans(ClusterMixin, TransformerMixin, _LitzEstimator):
    """Mini-batch k-means trained by ``apps.kmeans`` (Sculley's algorithm, as scikit-learn's ``MiniBatchKMeans``).

    ``max_iter``: epochs (passes over the data). ``batch_size``: rows per global mini-batch, drawn from every
    executor. ``init``: "k-means++" or "random", ``n_init`` initialisations on a sample, the best kept. Fitted:
    ``cluster_centers_``, ``labels_``, ``inertia_`` (of the final centres, on the training data), ``n_iter_``,
    ``n_steps_``, ``n_features_in_``.
    """

    _app = "apps.kmeans"

    def __init__(self, n_clusters: int = 8, init: str = "k-means++", n_init: int = 3, max_iter: int = 20,
                 batch_size: int = 1024, random_state: Any = None, workers: int = 2, servers: int = 1,
                 executors: int | None = None):
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.random_state = random_state
        self.workers = workers
        self.servers = servers
        self.executors = executors

    def fit(self, X: Any, y: Any = None) -> KMeans:
        """Cluster ``X`` (n x features) with one Litz job."""
        X = validate_data(self, X, dtype=[np.float64, np.float32])
        if len(X) < self.n_clusters:
            raise ValueError(f"n_samples={len(X)} should be >= n_clusters={self.n_clusters}.")
        config = {"k": self.n_clusters, "init": self.init, "init_trials": self.n_init, "epochs": self.max_iter,
                  "batch": self.batch_size, "seed": self._seed()}
        _, model = self._job(config, {"input": _npy_writer(X, "X.npy")})
        self.cluster_centers_ = model["centers"].astype(np.float64)
        d = _sq_distances(X, self.cluster_centers_)
        self.labels_ = d.argmin(axis=1)
        self.inertia_ = float(d[np.arange(len(X)), self.labels_].sum())
        self.n_iter_ = self.max_iter
        self.n_steps_ = self.max_iter * math.ceil(len(X) / self.batch_size)
        return self

    def predict(self, X: Any) -> np.ndarray:
        """The index of the closest centre for each row."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=[np.float64, np.float32])
        return _sq_distances(X, self.cluster_centers_).argmin(axis=1)

    def transform(self, X: Any) -> np.ndarray:
        """Euclidean distances to every centre (n x n_clusters)."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=[np.float64, np.float32])
        return np.sqrt(_sq_distances(X, self.cluster_centers_))

    def score(self, X: Any, y: Any = None) -> float:
        """Minus the inertia of ``X`` against the centres (higher is better, as in scikit-learn)."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=[np.float64, np.float32])
        return -float(_sq_distances(X, self.cluster_centers_).min(axis=1).sum())


_LDA_READER_WARM = False


def _warm_lda_reader(tmp: str) -> None:
    """Parse a one-word corpus here, once per process, before the first LDA job: the app's docword parser is a
    numba function, and the job's processes, forked from this one, then start with it loaded instead of each
    loading it again (measured: a small fit took 1.2 s before, 0.2 s after)."""
    global _LDA_READER_WARM
    if not _LDA_READER_WARM:
        from apps.lda import data

        path = os.path.join(tmp, "warm.txt")
        with open(path, "w") as f:
            f.write("1\n1\n1\n1 1 1\n")
        data.read_docword(path)
        _LDA_READER_WARM = True


class LatentDirichletAllocation(TransformerMixin, _LitzEstimator):
    """LDA trained by ``apps.lda`` (collapsed Gibbs sampling, block-scheduled over the executors).

    ``X``: document-word counts (dense or sparse, non-negative; rounded to whole tokens for sampling; documents
    without words are left out of training). ``n_components``: topics (with one, every token is in it and
    ``fit`` counts without a job). ``doc_topic_prior`` and
    ``topic_word_prior``: the Dirichlet priors, ``1 / n_components`` if None, as in scikit-learn. ``max_iter``:
    Gibbs sweeps. Fitted: ``components_`` (topic-word counts plus ``topic_word_prior``, as scikit-learn's
    pseudo-counts), ``n_iter_``, ``n_features_in_``. ``transform`` estimates each document's topic proportions
    against the fixed topics by expectation-maximisation (``max_doc_update_iter`` steps at most, until the mean
    change is below ``mean_change_tol``); ``score`` is the log-likelihood of ``X`` under those proportions and
    the topics, and ``perplexity`` ``exp(-score / tokens)``.
    """

    _app = "apps.lda"

    def __init__(self, n_components: int = 10, doc_topic_prior: float | None = None,
                 topic_word_prior: float | None = None, max_iter: int = 10, max_doc_update_iter: int = 100,
                 mean_change_tol: float = 1e-3, random_state: Any = None, workers: int = 2, servers: int = 1,
                 executors: int | None = None):
        self.n_components = n_components
        self.doc_topic_prior = doc_topic_prior
        self.topic_word_prior = topic_word_prior
        self.max_iter = max_iter
        self.max_doc_update_iter = max_doc_update_iter
        self.mean_change_tol = mean_change_tol
        self.random_state = random_state
        self.workers = workers
        self.servers = servers
        self.executors = executors

    def __sklearn_tags__(self):  # noqa: ANN204
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True
        tags.input_tags.sparse = True
        return tags

    def _counts(self, X: Any, reset: bool, whom: str) -> sp.csr_matrix:
        X = validate_data(self, X, reset=reset, accept_sparse=("csr", "csc", "coo"), dtype=[np.float64, np.float32])
        check_non_negative(X, whom)
        return sp.csr_matrix(X, dtype=np.float64)

    def fit(self, X: Any, y: Any = None) -> LatentDirichletAllocation:
        """Sample topics for the documents of ``X`` with one Litz job."""
        counts = self._counts(X, True, "LatentDirichletAllocation.fit")
        tokens = counts.copy()
        tokens.data = np.rint(tokens.data)
        tokens.eliminate_zeros()
        docs = np.flatnonzero(np.diff(tokens.indptr))  # documents with at least one word
        if not len(docs):
            raise ValueError("LatentDirichletAllocation needs at least one document with a word count >= 0.5")
        tokens = tokens[docs].tocoo()
        self._alpha = self.doc_topic_prior or 1.0 / self.n_components
        self._beta = self.topic_word_prior or 1.0 / self.n_components

        def write(tmp: str) -> str:
            _warm_lda_reader(tmp)
            path = os.path.join(tmp, "docword.txt")
            with open(path, "w") as f:
                f.write(f"{len(docs)}\n{counts.shape[1]}\n{tokens.nnz}\n")
                np.savetxt(f, np.column_stack([tokens.row + 1, tokens.col + 1, tokens.data]), fmt="%d")
            return path

        if self.n_components == 1:  # every token is in the one topic: nothing to sample, the counts are exact
            topic_word = np.asarray(tokens.sum(axis=0), np.float64).reshape(1, -1)
        else:
            config = {"topics": self.n_components, "alpha": self._alpha, "beta": self._beta,
                      "epochs": self.max_iter, "seed": self._seed(), "top_words": 0}
            topic_word = self._job(config, {"corpus": write})[1]["topic_word"].astype(np.float64)
        self.components_ = topic_word + self._beta
        self.n_iter_ = self.max_iter
        return self

    def _doc_topics(self, counts: sp.csr_matrix) -> np.ndarray:
        """Each document's topic proportions against the fixed topics: EM on ``theta`` with a Dirichlet
        ``doc_topic_prior`` as pseudo-counts."""
        phi = self.components_ / self.components_.sum(axis=1, keepdims=True)  # topics x words
        X = counts.toarray()
        theta = np.full((X.shape[0], phi.shape[0]), 1.0 / phi.shape[0])
        for _ in range(self.max_doc_update_iter):
            expected = theta * ((X / np.maximum(theta @ phi, 1e-300)) @ phi.T) + self._alpha
            new = expected / expected.sum(axis=1, keepdims=True)
            change = np.abs(new - theta).mean()
            theta = new
            if change < self.mean_change_tol:
                break
        return theta

    def transform(self, X: Any) -> np.ndarray:
        """Topic proportions of each document (rows sum to 1)."""
        check_is_fitted(self)
        return self._doc_topics(self._counts(X, False, "LatentDirichletAllocation.transform"))

    def score(self, X: Any, y: Any = None) -> float:
        """Log-likelihood of the word counts of ``X`` given their topic proportions and the topics."""
        check_is_fitted(self)
        counts = self._counts(X, False, "LatentDirichletAllocation.score")
        theta = self._doc_topics(counts)
        phi = self.components_ / self.components_.sum(axis=1, keepdims=True)
        coo = counts.tocoo()
        p = np.einsum("ik,ik->i", theta[coo.row], phi[:, coo.col].T)
        return float((coo.data * np.log(np.maximum(p, 1e-300))).sum())

    def perplexity(self, X: Any) -> float:
        """``exp(-score(X) / tokens of X)``: lower is better."""
        check_is_fitted(self)
        counts = self._counts(X, False, "LatentDirichletAllocation.perplexity")
        return float(np.exp(-self.score(counts) / max(counts.sum(), 1e-300)))


class HDBSCAN(ClusterMixin, _LitzEstimator):
    """HDBSCAN by ``apps.hdbscan``: an approximate kNN graph by NN-Descent and its minimum spanning tree under
    mutual reachability, then scikit-learn's cluster extraction rules (excess of mass, noise = -1).

    ``n_neighbors``: the kNN graph's K (at most ``n_samples - 1``); ``min_samples`` (None: ``min_cluster_size``)
    sets the core distance and is at most K. ``max_cluster_size``: None for no limit. ``metric``: "euclidean" or
    "cosine". Fitted: ``labels_``, ``n_features_in_``; the app computes no membership probabilities.
    """

    _app = "apps.hdbscan"

    def __init__(self, min_cluster_size: int = 5, min_samples: int | None = None,
                 max_cluster_size: int | None = None, metric: str = "euclidean", n_neighbors: int = 15,
                 random_state: Any = None, workers: int = 2, servers: int = 1, executors: int | None = None):
        self.min_cluster_size = min_cluster_size
        self.min_samples = min_samples
        self.max_cluster_size = max_cluster_size
        self.metric = metric
        self.n_neighbors = n_neighbors
        self.random_state = random_state
        self.workers = workers
        self.servers = servers
        self.executors = executors

    def fit(self, X: Any, y: Any = None) -> HDBSCAN:
        """Cluster ``X`` (n x features) with one Litz job."""
        X = validate_data(self, X, dtype=[np.float64, np.float32])
        n = len(X)
        if n < 2:
            raise ValueError(f"n_samples={n}: HDBSCAN needs at least 2 samples")
        if self.metric not in ("euclidean", "cosine"):
            raise ValueError(f"metric must be 'euclidean' or 'cosine', got {self.metric!r}")
        k = min(self.n_neighbors, n - 1)
        config = {"k": k, "min_cluster_size": self.min_cluster_size,
                  "min_samples": min(self.min_samples or self.min_cluster_size, k),
                  "max_cluster_size": self.max_cluster_size or 0, "metric": self.metric, "seed": self._seed()}
        _, model = self._job(config, {"input": _npy_writer(X, "X.npy")})
        self.labels_ = model["labels"].astype(np.int64)
        return self
