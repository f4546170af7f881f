"""apps.mlr data loaders and settings: npz, libsvm (errors name file:line), synthetic determinism."""
from __future__ import annotations

import numpy as np
import pytest

from apps.mlr import data
from apps.mlr.settings import Settings

pytestmark = pytest.mark.timeout(30)


def test_npz_roundtrip(tmp_path) -> None:
    X = np.arange(12, dtype=np.float64).reshape(4, 3)
    y = np.array([0, 2, 1, 2])
    path = tmp_path / "d.npz"
    np.savez(path, X=X, y=y)
    X2, y2 = data.load_file(str(path))
    assert X2.dtype == np.float32 and y2.dtype == np.int64
    np.testing.assert_array_equal(X2, X.astype(np.float32))
    np.testing.assert_array_equal(y2, y)


def test_npz_errors_name_the_file(tmp_path) -> None:
    with pytest.raises(data.DataError, match="missing.npz: no such file"):
        data.load_file(str(tmp_path / "missing.npz"))
    bad = tmp_path / "bad.npz"
    np.savez(bad, X=np.zeros((3, 2)))
    with pytest.raises(data.DataError, match="bad.npz: npz file must hold arrays 'X' and 'y'"):
        data.load_file(str(bad))
    shape = tmp_path / "shape.npz"
    np.savez(shape, X=np.zeros((3, 2)), y=np.zeros(4, int))
    with pytest.raises(data.DataError, match="shape.npz: need X of shape"):
        data.load_file(str(shape))
    neg = tmp_path / "neg.npz"
    np.savez(neg, X=np.zeros((2, 2)), y=np.array([0, -1]))
    with pytest.raises(data.DataError, match="neg.npz: labels"):
        data.load_file(str(neg))
    junk = tmp_path / "junk.npz"
    junk.write_text("not a zip")
    with pytest.raises(data.DataError, match="junk.npz: not a readable .npz"):
        data.load_file(str(junk))


def test_libsvm_parses_sparse_rows(tmp_path) -> None:
    path = tmp_path / "d.svm"
    path.write_text("# header comment\n1 1:0.5 3:2\n\n0 2:-1.5  # trailing comment\n2\n1 3:1e-1 1:1\n")
    X, y = data.load_file(str(path))
    assert X.shape == (4, 3) and X.dtype == np.float32
    np.testing.assert_array_equal(y, [1, 0, 2, 1])
    np.testing.assert_allclose(X.toarray(), [[0.5, 0, 2], [0, -1.5, 0], [0, 0, 0], [1, 0, 0.1]])


def test_libsvm_zero_based_indices(tmp_path) -> None:
    path = tmp_path / "z.svm"
    path.write_text("0 0:1 2:3\n1 1:2\n")
    X, _ = data.load_file(str(path))
    np.testing.assert_array_equal(X.toarray(), [[1, 0, 3], [0, 2, 0]])


@pytest.mark.parametrize("line", ["1 3:", "1 :4", "1 2:3:4", "1 2 3", "1 x:2", "1 2:y", "one 2:3",
                                  "-1 2:3", "1.5 2:3", "1 2.5:3"])
def test_libsvm_malformed_line_names_file_and_line(tmp_path, line: str) -> None:
    path = tmp_path / "bad.svm"
    path.write_text(f"0 1:1\n\n1 2:1\n{line}\n0 1:2\n")
    with pytest.raises(data.DataError, match=r"bad\.svm:4: "):
        data.load_file(str(path))


def test_libsvm_missing_file(tmp_path) -> None:
    with pytest.raises(data.DataError, match=r"nope\.svm: no such file"):
        data.load_file(str(tmp_path / "nope.svm"))


def test_synthetic_is_deterministic_and_sliceable() -> None:
    kw = dict(d=7, classes=4, seed=3)
    X, y = data.synthetic_rows(0, 10_000, **kw)
    assert X.shape == (10_000, 7) and X.dtype == np.float32 and y.dtype == np.int64
    X2, y2 = data.synthetic_rows(0, 10_000, **kw)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)
    for lo, hi in [(0, 1), (4095, 4097), (5000, 9999), (8192, 8192)]:  # across chunk boundaries
        Xs, ys = data.synthetic_rows(lo, hi, **kw)
        np.testing.assert_array_equal(Xs, X[lo:hi])
        np.testing.assert_array_equal(ys, y[lo:hi])
    X3, _ = data.synthetic_rows(0, 100, d=7, classes=4, seed=4)
    assert not np.array_equal(X3, X[:100])
    counts = np.bincount(y, minlength=4)
    assert counts.min() > 0.05 * len(y)  # every class occurs


def test_synthetic_is_learnable_but_noisy() -> None:
    from sklearn.linear_model import LogisticRegression

    X, y = data.synthetic_rows(0, 6000, d=20, classes=5, seed=0)
    clf = LogisticRegression(max_iter=500).fit(X[:5000], y[:5000])
    acc = clf.score(X[5000:], y[5000:])
    assert 0.5 < acc < 0.97, acc


def test_partitions_cover_rows_exactly_once(tmp_path) -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((103, 4)).astype(np.float32)
    y = np.sort(rng.integers(0, 3, 103))  # sorted by label, as files often are
    path = tmp_path / "t.npz"
    np.savez(path, X=X, y=y)
    s = Settings.from_config({"train": str(path), "scale": 0})
    parts = [data.train_partition(s, e, 4) for e in range(4)]
    assert all(p[2:4] == (4, 3) for p in parts)
    got = np.concatenate([p[0] for p in parts])
    assert sorted(map(tuple, got)) == sorted(map(tuple, X))
    assert len(set(parts[0][1].tolist())) > 1  # shuffled: a block is not one label
    syn = Settings.from_config({"synthetic": 1, "n": 1000, "d": 5, "classes": 3})
    ys = np.concatenate([data.train_partition(syn, e, 3)[1] for e in range(3)])
    np.testing.assert_array_equal(ys, data.synthetic_rows(0, 1000, d=5, classes=3, seed=0)[1])
    test = np.concatenate([data.test_share(syn, e, 3, 5, 3)[1] for e in range(3)])
    expected = data.synthetic_rows(1000, 1000 + syn.n_test, d=5, classes=3, seed=0)[1]
    np.testing.assert_array_equal(test, expected)


def test_partitions_are_scaled_by_statistics_of_all_training_rows(tmp_path) -> None:
    import scipy.sparse as sp

    from apps.mlr.model import Scaler

    rng = np.random.default_rng(1)
    X = rng.normal(loc=[0, 5, -3, 7], scale=[1, 10, 0.01, 0], size=(203, 4)).astype(np.float32)
    y = rng.integers(0, 3, 203)
    np.savez(tmp_path / "t.npz", X=X, y=y)
    s = Settings.from_config({"train": str(tmp_path / "t.npz")})
    parts = [data.train_partition(s, e, 3) for e in range(3)]
    got = np.concatenate([p[0] for p in parts]).astype(np.float64)
    np.testing.assert_allclose(got.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(got.std(axis=0), [1, 1, 1, 0], atol=1e-4)  # a constant column stays 0
    # the folded-back model scores raw rows exactly as the trained one scores scaled rows
    scaler = parts[0][4]
    W, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    W_raw, b_raw = scaler.raw_model(W, b)
    np.testing.assert_allclose(X @ W_raw + b_raw, scaler.transform(X) @ W + b, rtol=1e-4, atol=1e-3)
    # sparse: each column divided by the root mean square of its non-zero values, the pattern kept
    S = sp.csr_matrix(np.where(X > 0.5, X, 0))
    sparse = Scaler.fit(S)
    T = sparse.transform(S)
    assert sparse.shift is None and T.nnz == S.nnz
    rms = np.sqrt(T.multiply(T).sum(axis=0).A1 / np.maximum(S.getnnz(axis=0), 1))
    np.testing.assert_allclose(rms, [1, 1, 0, 1], rtol=1e-5)
    W_raw, b_raw = sparse.raw_model(W, b)
    np.testing.assert_allclose(S @ W_raw + b_raw, T @ W + b, rtol=1e-4, atol=1e-3)


def test_test_file_narrower_than_training_is_padded(tmp_path) -> None:
    train, test = tmp_path / "train.svm", tmp_path / "test.svm"
    train.write_text("0 1:1 5:1\n1 2:1\n")
    test.write_text("1 2:1\n0 1:1 7:3\n")
    s = Settings.from_config({"train": str(train), "test": str(test)})
    X, y, d, classes, _ = data.train_partition(s, 0, 1)
    assert (d, classes) == (5, 2)
    Xt, yt = data.test_share(s, 0, 1, d, classes)
    assert Xt.shape == (2, 5)
    np.testing.assert_array_equal(Xt.toarray(), [[0, 1, 0, 0, 0], [1, 0, 0, 0, 0]])


def test_settings_validation() -> None:
    s = Settings.from_config({"synthetic": 1})
    assert (s.d, s.classes, s.staleness, s.epochs) == (100, 10, 2, 100)
    assert s.batches_per_task_for(2) == 4 and s.batches_per_task_for(16) == 1
    with pytest.raises(ValueError, match="unknown config key"):
        Settings.from_config({"synthetic": 1, "learning_rate": 0.1})
    with pytest.raises(ValueError, match="'lr' must be a number"):
        Settings.from_config({"synthetic": 1, "lr": "fast"})
    with pytest.raises(ValueError, match="'staleness' must be an integer >= 0"):
        Settings.from_config({"synthetic": 1, "staleness": -1})
    with pytest.raises(ValueError, match="exactly one of"):
        Settings.from_config({})
    with pytest.raises(ValueError, match="exactly one of"):
        Settings.from_config({"synthetic": 1, "train": "x.npz"})
