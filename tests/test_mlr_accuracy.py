"""apps.mlr with its default settings, end to end through ``litz run``, reaches scikit-learn's accuracy on
real data sets bundled with scikit-learn: within one point of ``LogisticRegression()`` (default settings,
the same 70/30 split). This is what a user who does not tune gets; the settings that make it so (batch
size from the row count, feature scaling, AdaGrad, l2 = 1/rows, the stopping rule) are in apps/mlr/README.md.
"""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from tests.support.processes import run_cli


def split(name: str, tmp_path) -> tuple[str, str, float]:
    """``train.npz``, ``test.npz`` of a fixed 70/30 split, and scikit-learn's test accuracy on it."""
    from sklearn import datasets
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split

    X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # lbfgs stops at its default max_iter on raw pixels
        reference = LogisticRegression().fit(X_train, y_train).score(X_test, y_test)
    train, test = str(tmp_path / "train.npz"), str(tmp_path / "test.npz")
    np.savez(train, X=X_train, y=y_train)
    np.savez(test, X=X_test, y=y_test)
    return train, test, reference


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", ["digits", "breast_cancer"])
def test_default_settings_reach_sklearn_accuracy(name: str, tmp_path) -> None:
    train, test, reference = split(name, tmp_path)
    model = tmp_path / "model.npz"
    proc = run_cli(["litz", "run", "apps.mlr", "--no-progress", "--config", f"train={train}",
                    "--config", f"test={test}", f"output={model}"], timeout=80)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["test_accuracy"] >= reference - 0.01, (result, reference)
    assert result["epochs"] < 100, result  # the stopping rule ended training, not the cap
    # the model file applies to the raw features: the app's feature scaling is folded into it
    with np.load(model) as f, np.load(test) as t:
        predicted = (t["X"] @ f["weights"] + f["bias"]).argmax(axis=1)
        assert abs(np.mean(predicted == t["y"]) - result["test_accuracy"]) <= 1 / len(t["y"])
