"""litz.sklearn: scikit-learn's own estimator checks for each estimator (every fit a real Litz job), and fitted
models as good as scikit-learn's on data where the answer is known."""
from __future__ import annotations

import os
import tempfile
import warnings

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")

from sklearn import cluster, decomposition, linear_model  # noqa: E402
from sklearn.datasets import load_digits, make_blobs  # noqa: E402
from sklearn.metrics import adjusted_rand_score  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.utils.estimator_checks import check_estimator  # noqa: E402

import litz.sklearn as ls  # noqa: E402

# Small jobs for the checks: one worker and server. One executor where the result would otherwise depend on
# timing (the checks fit twice and compare); two where the app is deterministic anyway, so the checks also
# cover data split over executors.
CHECKED = [ls.LogisticRegression(workers=1, servers=1, executors=1), ls.KMeans(workers=1, servers=1, executors=2),
           ls.LatentDirichletAllocation(workers=1, servers=1, executors=1),
           ls.HDBSCAN(workers=1, servers=1, executors=2)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("estimator", CHECKED, ids=lambda e: type(e).__name__)
def test_check_estimator(estimator) -> None:
    expected = estimator.expected_failed_checks()
    assert len(expected) <= 3 and all(reason for reason in expected.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(estimator, expected_failed_checks=expected, on_fail=None)
    failed = [(r["check_name"], repr(r["exception"])[:300]) for r in results if r["status"] == "failed"]
    assert failed == []
    assert sum(r["status"] == "passed" for r in results) >= 40


@pytest.mark.timeout(120)
def test_logistic_regression_on_digits_matches_sklearn() -> None:
    """8 executors on 2 workers, SSP with staleness 2: as accurate as scikit-learn's own solver."""
    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0)
    ours = ls.LogisticRegression(staleness=2, random_state=0).fit(Xtr, ytr)
    ref = linear_model.LogisticRegression(max_iter=5000).fit(Xtr, ytr)
    assert ours.coef_.shape == ref.coef_.shape == (10, 64) and list(ours.classes_) == list(range(10))
    assert ours.score(Xte, yte) >= ref.score(Xte, yte) - 0.02, (ours.score(Xte, yte), ref.score(Xte, yte))
    proba = ours.predict_proba(Xte)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_array_equal(ours.classes_[proba.argmax(axis=1)], ours.predict(Xte))


@pytest.mark.timeout(120)
def test_binary_labels_keep_their_values() -> None:
    X, y = make_blobs(400, centers=2, cluster_std=2.0, random_state=3)
    labels = np.where(y == 1, "yes", "no")
    model = ls.LogisticRegression(random_state=0).fit(X, labels)
    assert model.coef_.shape == (1, 2) and list(model.classes_) == ["no", "yes"]
    assert model.score(X, labels) >= linear_model.LogisticRegression().fit(X, labels).score(X, labels) - 0.02


@pytest.mark.timeout(120)
def test_kmeans_inertia_close_to_minibatch_kmeans() -> None:
    X, _ = make_blobs(4000, n_features=8, centers=10, random_state=1)
    ours = ls.KMeans(10, random_state=0).fit(X)
    ref = cluster.MiniBatchKMeans(10, n_init=3, random_state=0).fit(X)
    assert ours.cluster_centers_.shape == (10, 8) and ours.labels_.shape == (4000,)
    assert ours.inertia_ <= 1.05 * ref.inertia_, (ours.inertia_, ref.inertia_)
    assert ours.score(X) == pytest.approx(-ours.inertia_)
    np.testing.assert_array_equal(ours.predict(X), ours.labels_)


@pytest.mark.timeout(120)
def test_hdbscan_agrees_with_sklearn_on_separated_blobs() -> None:
    X, y = make_blobs(1500, n_features=4, centers=6, cluster_std=0.5, center_box=(-30, 30), random_state=2)
    ours = ls.HDBSCAN(min_cluster_size=15).fit_predict(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ref = cluster.HDBSCAN(min_cluster_size=15).fit_predict(X)
    assert adjusted_rand_score(ours, ref) >= 0.95 and adjusted_rand_score(ours, y) >= 0.95


@pytest.mark.timeout(120)
def test_lda_topics_and_perplexity_match_sklearn() -> None:
    """On a corpus drawn from 5 known topics: both recover them; scored the same way (this module's held-out
    perplexity), our topics are within 3% of scikit-learn's, and far below the vocabulary's 200."""
    rng = np.random.default_rng(0)
    K, V = 5, 200
    topics = rng.dirichlet(np.full(V, 0.05), K)
    counts = np.array([rng.multinomial(80, th @ topics) for th in rng.dirichlet(np.full(K, 0.3), 600)])
    train, held_out = counts[:500], counts[500:]
    ours = ls.LatentDirichletAllocation(K, max_iter=50, random_state=0).fit(train)
    ref = decomposition.LatentDirichletAllocation(K, learning_method="batch", max_iter=50, random_state=0).fit(train)

    def recovery(components: np.ndarray) -> float:
        learned = components / np.linalg.norm(components, axis=1, keepdims=True)
        true = topics / np.linalg.norm(topics, axis=1, keepdims=True)
        return float((true @ learned.T).max(axis=1).mean())

    assert recovery(ours.components_) >= 0.95 and recovery(ref.components_) >= 0.95
    theirs = ls.LatentDirichletAllocation(K)  # scikit-learn's topics, scored by our transform and score
    theirs.components_, theirs._alpha, theirs.n_features_in_ = ref.components_, 1 / K, V
    ours_p, theirs_p = ours.perplexity(held_out), theirs.perplexity(held_out)
    assert ours_p <= 1.03 * theirs_p and ours_p < V / 2, (ours_p, theirs_p, ref.perplexity(held_out))
    theta = ours.transform(held_out)
    assert theta.shape == (100, K) and np.allclose(theta.sum(axis=1), 1.0)


@pytest.mark.timeout(120)
def test_fit_in_fresh_interpreters_leaves_no_files(tmp_path, monkeypatch) -> None:
    """LITZ_SPAWN=exec: the workers are new interpreters, which find the data through its file; the temporary
    directory is gone after fit."""
    monkeypatch.setenv("LITZ_SPAWN", "exec")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    X, _ = make_blobs(300, centers=3, random_state=0)
    model = ls.KMeans(3, random_state=0, workers=1).fit(X)
    ref = cluster.KMeans(3, n_init=3, random_state=0).fit(X)
    assert model.inertia_ <= 1.05 * ref.inertia_
    assert [p for p in os.listdir(tmp_path) if p.startswith("litz-sklearn-")] == []
