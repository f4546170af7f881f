"""litz.ssp.SSP against a fake driver: the staleness bound holds whatever order completions arrive in."""
from __future__ import annotations

import pickle
import random

import pytest

from litz.ssp import SSP


class FakeDriver:
    """Records dispatches; stands in for litz.Driver (SSP must only call dispatch_task)."""

    def __init__(self, num_executors: int) -> None:
        self.num_executors = num_executors
        self.dispatched: list[tuple[int, object]] = []

    def dispatch_task(self, executor: int, args: object = None) -> None:
        self.dispatched.append((executor, args))


def simulate(num_executors: int, staleness: int, iterations: int, seed: int) -> FakeDriver:
    """Run SSP to the end, completing a random in-flight task each step, checking the bound throughout."""
    rng = random.Random(seed)
    driver = FakeDriver(num_executors)
    ssp = SSP(driver, staleness, iterations, task_args=lambda it, ex: (it, ex))
    ssp.start()
    in_flight: list[tuple[int, int]] = []
    seen = 0
    completed: dict[int, int] = {}
    finished_order: list[int] = []
    while True:
        for executor, (it, ex) in driver.dispatched[seen:]:
            assert executor == ex
            # the bound: every iteration <= it - s - 1 has fully completed before `it` is dispatched
            for earlier in range(it - staleness):
                assert completed.get(earlier, 0) == num_executors, (it, earlier)
            in_flight.append((it, ex))
        seen = len(driver.dispatched)
        if not in_flight:
            break
        # no more than s+1 iterations can be in flight: the dispatch frontier is bounded
        assert max(it for it, _ in in_flight) - min(it for it, _ in in_flight) <= staleness
        it, ex = in_flight.pop(rng.randrange(len(in_flight)))
        completed[it] = completed.get(it, 0) + 1
        newly = ssp.complete(it)
        finished_order.extend(newly)
        assert ssp.finished_iterations == len(finished_order)
    assert ssp.done
    assert finished_order == list(range(iterations))
    return driver


@pytest.mark.timeout(30)
@pytest.mark.parametrize("staleness", [0, 1, 2, 5])
@pytest.mark.parametrize("num_executors", [1, 3, 8])
def test_bound_and_exactly_once(staleness: int, num_executors: int) -> None:
    for seed in range(20):
        driver = simulate(num_executors, staleness, iterations=12, seed=seed)
        pairs = [args for _, args in driver.dispatched]
        assert sorted(pairs) == [(it, ex) for it in range(12) for ex in range(num_executors)]


@pytest.mark.timeout(10)
def test_start_dispatches_first_s_plus_one_iterations() -> None:
    driver = FakeDriver(2)
    ssp = SSP(driver, staleness=2, iterations=10)
    ssp.start()
    assert driver.dispatched == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert ssp.dispatched_iterations == 3 and ssp.finished_iterations == 0 and not ssp.done


@pytest.mark.timeout(10)
def test_zero_staleness_is_bsp() -> None:
    driver = FakeDriver(3)
    ssp = SSP(driver, staleness=0, iterations=3)
    ssp.start()
    assert [a for _, a in driver.dispatched] == [0, 0, 0]
    assert ssp.complete(0) == [] and ssp.complete(0) == []
    assert len(driver.dispatched) == 3  # iteration 1 waits for the whole of iteration 0
    assert ssp.complete(0) == [0]
    assert [a for _, a in driver.dispatched] == [0, 0, 0, 1, 1, 1]


@pytest.mark.timeout(10)
def test_out_of_order_iterations_finish_in_order() -> None:
    driver = FakeDriver(1)
    ssp = SSP(driver, staleness=2, iterations=5)
    ssp.start()
    assert ssp.complete(2) == [] and ssp.complete(1) == []
    assert ssp.dispatched_iterations == 3  # iteration 3 still waits for iteration 0
    assert ssp.complete(0) == [0, 1, 2]
    assert ssp.dispatched_iterations == 5
    assert ssp.complete(4) == [] and ssp.complete(3) == [3, 4] and ssp.done


@pytest.mark.timeout(10)
def test_stop_dispatches_nothing_more_and_is_done_once_the_dispatched_finish() -> None:
    driver = FakeDriver(2)
    ssp = SSP(driver, staleness=1, iterations=10)
    ssp.start()
    assert ssp.complete(0) == [] and ssp.complete(0) == [0]  # iteration 2 dispatched
    ssp.stop()
    assert ssp.dispatched_iterations == 3 and not ssp.done
    for it in (2, 1, 2):
        ssp.complete(it)
        assert ssp.dispatched_iterations == 3 and not ssp.done
    assert ssp.complete(1) == [1, 2] and ssp.done
    assert len(driver.dispatched) == 6  # iterations 0..2 only


@pytest.mark.timeout(10)
def test_explicit_executors_and_args() -> None:
    driver = FakeDriver(10)
    ssp = SSP(driver, staleness=0, iterations=2, executors=[4, 7],
              task_args=lambda it, ex: {"it": it, "ex": ex})
    ssp.start()
    assert driver.dispatched == [(4, {"it": 0, "ex": 4}), (7, {"it": 0, "ex": 7})]


@pytest.mark.timeout(10)
def test_errors_and_edge_cases() -> None:
    with pytest.raises(ValueError):
        SSP(FakeDriver(2), staleness=-1, iterations=3)
    with pytest.raises(ValueError):
        SSP(FakeDriver(0), staleness=1, iterations=3)
    empty = SSP(FakeDriver(2), staleness=1, iterations=0)
    empty.start()
    assert empty.done
    driver = FakeDriver(1)
    ssp = SSP(driver, staleness=0, iterations=2)
    ssp.start()
    with pytest.raises(ValueError):
        ssp.complete(1)  # not dispatched yet
    ssp.complete(0)
    with pytest.raises(ValueError):
        ssp.complete(0)  # completed more often than dispatched
    with pytest.raises(RuntimeError):
        ssp.start()


@pytest.mark.timeout(10)
def test_pickles_with_its_driver() -> None:
    driver = FakeDriver(2)
    driver.ssp = SSP(driver, staleness=1, iterations=4)
    driver.ssp.start()
    driver.ssp.complete(0)
    copy = pickle.loads(pickle.dumps(driver))
    assert copy.ssp.driver is copy
    copy.ssp.complete(0)
    assert copy.ssp.finished_iterations == 1 and copy.ssp.dispatched_iterations == 3
    assert len(copy.dispatched) == 6


@pytest.mark.timeout(90)
@pytest.mark.parametrize("staleness", [0, 2])
def test_ssp_bound_through_real_processes(staleness):
    """No task of iteration i runs before every task of iteration i-s-1 finished (and its updates are visible),
    and the run does go ahead by s iterations (a slow executor holds the others at the bound): SSP, not BSP."""
    import litz
    from tests.support.processes import app_path

    result = litz.run(app_path("ssp_check"), workers=2, servers=1, executors=6,
                      config={"staleness": staleness, "iterations": 25})
    assert result == {"bad": [], "max_spread": staleness}
