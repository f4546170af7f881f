"""apps.mlr end to end: matches scikit-learn's LogisticRegression on the same synthetic split.

``test_in_process_*`` drive the app's Driver and Executors in this process against a dict parameter server,
completing tasks in random order and letting each task read the weights as of its dispatch (the stalest
view the consistency rule allows), so the algorithm is checked without the runtime. ``test_litz_run_*``
run the real thing through ``litz.run``.
"""
from __future__ import annotations

import numpy as np
import pytest

import apps.mlr as mlr
import litz
from apps.mlr.data import synthetic_rows
from tests.support import inprocess
from tests.support.reference import MLR_CONFIG as CONFIG
from tests.support.reference import sklearn_accuracy


def in_process(config: dict, num_executors: int, **kw) -> inprocess.InProcess:
    return inprocess.InProcess(mlr.MLRDriver, mlr.MLRExecutor, config, num_executors, **kw)


@pytest.mark.timeout(30)
def test_sgd_step_is_minus_lr_times_gradient_dense_and_sparse() -> None:
    import scipy.sparse as sp

    from apps.mlr import model

    rng = np.random.default_rng(0)
    X = rng.standard_normal((7, 4)).astype(np.float32)
    X[X < 0] = 0  # some zeros, so the CSR copy is really sparse
    y = rng.integers(0, 3, 7)
    W0 = rng.standard_normal((4, 3)).astype(np.float32) * 0.1
    b0 = rng.standard_normal(3).astype(np.float32) * 0.1

    def mean_loss(w: np.ndarray, b: np.ndarray) -> float:
        return model.evaluate(X.astype(np.float64), y, w, b)[0] / len(y)

    grad, eps = np.zeros((4, 3)), 1e-2  # evaluate() works in float32: a wide central difference
    W64 = W0.astype(np.float64)
    for i in range(4):
        for j in range(3):
            hi, lo = W64.copy(), W64.copy()
            hi[i, j] += eps
            lo[i, j] -= eps
            grad[i, j] = (mean_loss(hi, b0) - mean_loss(lo, b0)) / (2 * eps)
    for data in (X, sp.csr_matrix(X)):
        W, b = W0.copy(), b0.copy()
        loss, correct, count = model.sgd_steps(data, y, W, b, np.array([0]), batch_size=7, lr=0.5)
        assert count == 7 and loss == pytest.approx(mean_loss(W64, b0) * 7, rel=1e-5)
        np.testing.assert_allclose((W0 - W) / 0.5, grad, atol=1e-4)


@pytest.mark.timeout(30)
def test_adagrad_step_divides_by_the_root_of_the_summed_squares() -> None:
    from apps.mlr import model

    rng = np.random.default_rng(1)
    X = rng.standard_normal((6, 4)).astype(np.float32)
    y = rng.integers(0, 3, 6)
    W0 = rng.standard_normal((4, 3)).astype(np.float32) * 0.1
    b0 = rng.standard_normal(3).astype(np.float32) * 0.1
    G0, Gb0 = rng.random((4, 3)).astype(np.float32), rng.random(3).astype(np.float32)
    W, b = W0.copy(), b0.copy()
    model.sgd_steps(X, y, W, b, np.array([0]), batch_size=6, lr=1.0)  # plain SGD, lr 1: minus the gradient
    grad_w, grad_b = W0 - W, b0 - b
    W, b, G, Gb = W0.copy(), b0.copy(), G0.copy(), Gb0.copy()
    model.sgd_steps(X, y, W, b, np.array([0]), batch_size=6, lr=0.3, adagrad=(G, Gb), peers=3)
    np.testing.assert_allclose(G, G0 + 3 * grad_w ** 2, rtol=1e-5)
    np.testing.assert_allclose(Gb, Gb0 + 3 * grad_b ** 2, rtol=1e-5)
    np.testing.assert_allclose(W, W0 - 0.3 * grad_w / (np.sqrt(G) + model.ADAGRAD_EPS), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(b, b0 - 0.3 * grad_b / (np.sqrt(Gb) + model.ADAGRAD_EPS), rtol=1e-4, atol=1e-7)


@pytest.mark.timeout(60)
def test_in_process_stops_when_the_training_loss_stops_improving() -> None:
    config = {**CONFIG, "n": 5000, "n_test": 1000}
    runtime = in_process(config, 3)
    result = runtime.run()
    losses = [r["loss"] for r in runtime.reports]
    tol, patience = 1e-3, 3  # the defaults
    flat = [i > 0 and losses[i] > min(losses[:i]) - tol for i in range(len(losses))]
    assert flat[-patience:] == [True] * patience, losses  # stopped after `patience` flat epochs ...
    assert not any(all(flat[i:i + patience]) for i in range(len(flat) - patience)), losses  # ... not before
    assert result["epochs"] == len(losses) < 100
    per_epoch = runtime.driver.per_epoch  # iterations already dispatched when it stopped still ran
    assert len(losses) * per_epoch <= result["iterations"] <= len(losses) * per_epoch + 3  # staleness + 1
    fixed = in_process({**config, "tol": 0, "epochs": len(losses) + 2}, 3)
    assert fixed.run()["epochs"] == len(fixed.reports) == len(losses) + 2  # tol=0: exactly `epochs`


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_executors,staleness", [(1, 0), (3, 2), (8, 3)])
def test_in_process_matches_sklearn(num_executors: int, staleness: int) -> None:
    config = {**CONFIG, "staleness": staleness}
    result = in_process(config, num_executors).run()
    assert result["train_rows"] == 40_000 and result["test_rows"] == 10_000
    assert result["epochs"] < 100, result  # the stopping rule ended it, not the cap
    assert abs(result["test_accuracy"] - sklearn_accuracy(config)) <= 0.01, result


@pytest.mark.timeout(30)
def test_in_process_reports_every_epoch_in_order() -> None:
    config = {**CONFIG, "n": 5000, "n_test": 1000, "epochs": 4}
    runtime = in_process(config, 3, seed=1)
    result = runtime.run()
    assert [r["epoch"] for r in runtime.reports] == [1, 2, 3, 4]
    losses = [r["loss"] for r in runtime.reports]
    assert losses[-1] < losses[0] < np.log(10) + 0.01
    assert all(0 <= r["train_accuracy"] <= 1 for r in runtime.reports)
    assert set(result) >= {"train_loss", "train_accuracy", "test_accuracy", "epochs"}
    assert all(isinstance(result[k], (int, float)) for k in ("train_loss", "train_accuracy", "test_accuracy"))


@pytest.mark.timeout(30)
def test_in_process_zero_epochs_evaluates_zero_model() -> None:
    result = in_process({**CONFIG, "n": 1000, "n_test": 500, "epochs": 0}, 2).run()
    assert result["train_loss"] == pytest.approx(np.log(10), rel=1e-5)


@pytest.mark.timeout(30)
def test_in_process_libsvm_with_test_file(tmp_path) -> None:
    X, y = synthetic_rows(0, 6000, d=10, classes=3, seed=5)
    order = np.argsort(y, kind="stable")  # sorted by label: partitions must still be mixed
    X, y = X[order], y[order]
    for name, rows in (("train.svm", slice(0, 5000)), ("test.svm", slice(5000, 6000))):
        lines = [f"{label} " + " ".join(f"{j + 1}:{v:.6g}" for j, v in enumerate(x) if v > -0.5)
                 for x, label in zip(X[rows], y[rows], strict=True)]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    config = {"train": str(tmp_path / "train.svm"), "test": str(tmp_path / "test.svm")}
    result = in_process(config, 2).run()
    assert result["test_rows"] == 1000 and result["test_accuracy"] > 0.6, result


@pytest.mark.timeout(60)
@pytest.mark.parametrize("roundtrip", ["evict", "reload"])
def test_in_process_moved_executors_train_the_same(tmp_path, roundtrip: str) -> None:
    """The scaler is input data, re-fitted by load_input after a reload: the same run, the same model."""
    X, y = synthetic_rows(0, 3000, d=8, classes=3, seed=2)
    np.savez(tmp_path / "t.npz", X=X * np.arange(1, 9) ** 2 + 5, y=y)  # unscaled: the scaler matters
    config = {"train": str(tmp_path / "t.npz"), "epochs": 6}
    plain = in_process(config, 3).run()
    moved = in_process(config, 3, roundtrip=roundtrip).run()
    assert moved == plain


# ------------------------------------------------------------------------------------------ real runtime
@pytest.mark.timeout(60)
def test_litz_run_matches_sklearn() -> None:
    result = litz.run("apps.mlr", workers=2, servers=1, config=dict(CONFIG))
    assert result["epochs"] < 100 and result["train_rows"] == CONFIG["n"]
    assert abs(result["test_accuracy"] - sklearn_accuracy(CONFIG)) <= 0.01, result


@pytest.mark.timeout(60)
def test_litz_run_bsp_more_servers_writes_the_model(tmp_path) -> None:
    """output=PATH: the driver reads the final weights from both servers (Driver.ps_get_many) into an .npz whose
    directory it creates; scored here, they give exactly the test accuracy the executors measured."""
    from apps.mlr import model

    out = tmp_path / "models" / "mlr.npz"
    config = {**CONFIG, "staleness": 0, "blocks": 5, "output": str(out)}
    result = litz.run("apps.mlr", workers=2, servers=2, executors=3, config=config)
    assert abs(result["test_accuracy"] - sklearn_accuracy(config)) <= 0.01, result
    assert result["model"] == str(out)
    with np.load(out) as f:
        W, b, classes = f["weights"], f["bias"], f["classes"]
    assert W.shape == (50, 10) and b.shape == (10,) and list(classes) == list(range(10))
    Xt, yt = synthetic_rows(CONFIG["n"], CONFIG["n"] + CONFIG["n_test"], d=50, classes=10, seed=0)
    _, correct, rows = model.evaluate(Xt, yt, W, b)
    assert correct / rows == result["test_accuracy"]


@pytest.mark.timeout(60)
def test_litz_run_missing_file_is_one_clear_error(tmp_path) -> None:
    missing = str(tmp_path / "missing.npz")
    with pytest.raises(litz.LitzError, match=r"missing\.npz: no such file"):
        litz.run("apps.mlr", workers=1, servers=1, config={"train": missing})


@pytest.mark.timeout(60)
def test_litz_run_bad_config_is_one_clear_error() -> None:
    with pytest.raises(litz.LitzError, match="'staleness' must be an integer"):
        litz.run("apps.mlr", workers=1, servers=1, config={"synthetic": 1, "staleness": "lots"})
