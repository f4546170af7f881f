"""The README's example app runs and learns (its weights reach the known ones, so the loss hits the noise floor)."""
import os

import pytest

import litz
from tests.support.processes import ROOT, metric_rows


@pytest.mark.timeout(60)
def test_readme_linreg_example():
    result = litz.run(os.path.join(ROOT, "examples", "linreg.py"), workers=2, servers=1, config={"steps": 60})
    assert result["loss"] < 0.02  # noise variance is 0.01; the zero model's loss is about 285


@pytest.mark.timeout(60)
def test_readme_example_is_the_file():
    readme = open(os.path.join(ROOT, "README.md")).read()
    code = open(os.path.join(ROOT, "examples", "linreg.py")).read()
    assert code.strip() in readme


@pytest.mark.timeout(60)
def test_readme_ssp_example(tmp_path):
    """examples/ssp.py under staleness 2: every iteration is reported once, in order, and the model learns."""
    metrics = tmp_path / "metrics.jsonl"
    result = litz.run(os.path.join(ROOT, "examples", "ssp.py"), workers=2, servers=1,
                      config={"staleness": 2, "iterations": 40}, metrics=str(metrics))
    assert result["iterations"] == 40
    assert result["loss"] < 0.02  # noise variance is 0.01; the zero model's loss is about 285
    reports = metric_rows(metrics)
    iterations = [r["iteration"] for r in reports if "iteration" in r]
    assert iterations == list(range(40))
    assert reports[0]["loss"] > 100 * result["loss"]  # the first iteration read the zero model


@pytest.mark.timeout(60)
def test_readme_ssp_example_is_the_file():
    readme = open(os.path.join(ROOT, "README.md")).read()
    code = open(os.path.join(ROOT, "examples", "ssp.py")).read()
    assert code.strip() in readme
