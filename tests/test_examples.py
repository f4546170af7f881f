"""The README's example app runs and learns (its weights reach the known ones, so the loss hits the noise floor)."""
import os

import pytest

import litz
from tests.helpers import ROOT


@pytest.mark.timeout(60)
def test_readme_linreg_example():
    result = litz.run(os.path.join(ROOT, "examples", "linreg.py"), workers=2, servers=1, config={"steps": 60})
    assert result["loss"] < 0.02  # noise variance is 0.01; the zero model's loss is about 285


@pytest.mark.timeout(60)
def test_readme_example_is_the_file():
    readme = open(os.path.join(ROOT, "README.md")).read()
    code = open(os.path.join(ROOT, "examples", "linreg.py")).read()
    assert code.strip() in readme
