"""litz.ssp.SSP's refusals, one clear line each, and its promise to stay a few counters however long the job runs
(it is pickled with the driver in every checkpoint)."""
from __future__ import annotations

import pickle

import pytest

from litz.ssp import SSP
from tests.test_ssp import FakeDriver


@pytest.mark.parametrize("kwargs,message", [
    ({"staleness": -1, "iterations": 3}, "SSP staleness must be a non-negative integer, got -1"),
    ({"staleness": 1.5, "iterations": 3}, "SSP staleness must be a non-negative integer, got 1.5"),
    ({"staleness": 1, "iterations": -2}, "SSP iterations must be a non-negative integer, got -2"),
    ({"staleness": 1, "iterations": 2.5}, "SSP iterations must be a non-negative integer, got 2.5"),
    ({"staleness": 1, "iterations": 3, "executors": []}, "SSP needs at least one executor"),
])
def test_bad_arguments_are_one_clear_line(kwargs, message):
    with pytest.raises(ValueError) as exc:
        SSP(FakeDriver(2), **kwargs)
    assert str(exc.value) == message


def test_integral_floats_are_counts_and_no_executors_is_fine_for_no_iterations():
    ssp = SSP(FakeDriver(2), staleness=1.0, iterations=3.0)
    assert (ssp.staleness, ssp.iterations) == (1, 3) and type(ssp.iterations) is int
    SSP(FakeDriver(0), staleness=0, iterations=0).start()


def test_a_wrong_completion_says_what_was_dispatched_and_finished():
    ssp = SSP(FakeDriver(1), staleness=1, iterations=5)
    ssp.start()
    ssp.complete(0)
    with pytest.raises(ValueError) as exc:
        ssp.complete(0)
    assert str(exc.value) == "SSP: unexpected completion of iteration 0 (dispatched 0..2, finished 0..0)"
    with pytest.raises(RuntimeError) as exc:
        ssp.start()
    assert str(exc.value) == "SSP.start() called twice"


def test_it_stays_a_few_counters_however_many_iterations_finish():
    def size_after(iterations: int) -> int:
        driver = FakeDriver(4)
        ssp = SSP(driver, staleness=2, iterations=iterations)
        ssp.start()
        for it in range(iterations):
            for _ in range(4):
                ssp.complete(it)
        assert ssp.done
        driver.dispatched = []  # the fake's record, not the helper's
        return len(pickle.dumps(ssp))

    assert size_after(2000) - size_after(10) < 8  # a larger counter or two, nothing per iteration
