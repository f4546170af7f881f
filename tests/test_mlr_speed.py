"""apps.mlr's ``size_by_speed``: each task's mini-batches in proportion to its executor's speed (LB-BSP).

The shares are checked against a model of what the master measures (tasks per second, which rise as a task
shrinks, smoothed over seconds); the app in process with the speeds such a model gives; and the real thing, with
one of two workers slowed by the test hook, as accurate as scikit-learn."""
from __future__ import annotations

import numpy as np
import pytest

import apps.mlr as mlr
import litz
from apps.mlr import sizing
from apps.mlr.sizing import SpeedSizing, batch_starts
from tests.support import inprocess
from tests.support.reference import MLR_CONFIG as CONFIG
from tests.support.reference import sklearn_accuracy

RATES = [4.0, 4.0, 1.0, 1.0]  # mini-batches per second each executor can run: two on a worker at a quarter


def measured(rates: list[float], per_iteration: int, share: list[float]) -> list[float]:
    """Tasks per second as the master sees them: a task of ``per_iteration x share`` mini-batches (plus a fixed
    cost of a tenth of a mini-batch) at ``rate`` mini-batches a second."""
    return [r / (per_iteration * s + 0.1) for r, s in zip(rates, share, strict=True)]


def test_shares_settle_in_proportion_to_the_rates_without_swinging() -> None:
    """With the master's smoothing (the speeds follow the truth about a third of the way a second) the shares
    approach the rates' proportions and stay there; a share never drops below a tenth of the even one."""
    s = SpeedSizing(4, 16)
    seen = measured(RATES, 16, s.share)
    history = []
    for second in range(40):
        truth = measured(RATES, 16, s.share)
        seen = [m + 0.36 * (t - m) for m, t in zip(seen, truth, strict=True)]
        assert s.resize(seen, float(second))
        assert not s.resize(seen, second + 0.5)  # at most once per RESIZE_S
        history.append(s.share[2])
        assert min(s.share) >= sizing.MIN_SHARE / 4 - 1e-12 and sum(s.share) == pytest.approx(1.0)
    assert s.share == pytest.approx([0.4, 0.4, 0.1, 0.1], abs=0.02)  # 4:4:1:1, less the fixed cost's pull
    assert max(history[15:]) - min(history[15:]) < 0.01, history  # settled, not oscillating
    assert min(history) > history[-1] - 0.01, history  # approached without overshooting


def test_no_resize_until_every_executor_is_measured_and_counts_average_the_share() -> None:
    s = SpeedSizing(4, 6)
    assert not s.resize([1.0, None, 1.0, 1.0], 0.0) and s.share == [0.25] * 4
    assert not s.resize([1.0, 0.0, 1.0, 1.0], 0.0)
    counts = [s.take(0)[1] for _ in range(100)]
    assert set(counts) == {1, 2} and sum(counts) == 150  # 6 x 0.25 a task on average, carried over
    first, count = s.take(0)
    assert first == 150 and s.taken[0] == 150 + count


def test_batch_starts_walk_shuffled_passes_carrying_on_across_tasks() -> None:
    def order(p: int) -> np.ndarray:
        return np.random.default_rng([7, p]).permutation(10)

    chunks, first = [], 0
    for count in (3, 0, 4, 7, 1, 5):  # 20 mini-batches: two whole passes of 10
        chunks += batch_starts(first, count, 10, order)
        first += count
    assert chunks[:10] == list(order(0)) and chunks[10:] == list(order(1))


@pytest.mark.timeout(60)
def test_in_process_slow_executors_run_fewer_steps_and_the_model_is_as_accurate(monkeypatch) -> None:
    monkeypatch.setattr(sizing, "RESIZE_S", 0.0)  # in process an iteration takes milliseconds: resize at each

    def speeds(e: int, runtime) -> float:
        s = runtime.driver.sizing
        return measured(RATES, s.per_iteration, s.share)[e]

    config = {**CONFIG, "staleness": 0, "size_by_speed": 1, "batches_per_task": 4}
    sized = inprocess.InProcess(mlr.MLRDriver, mlr.MLRExecutor, config, 4, speeds=speeds).run()
    ran = sized["batches_run"]
    assert sized["resizes"] > 20 and ran[2] < 0.4 * ran[0] and ran[3] < 0.4 * ran[1], sized
    assert sum(ran) == pytest.approx(16 * sized["iterations"], abs=4)  # the same steps an iteration, shared out
    assert sized["epochs"] < 100 and abs(sized["test_accuracy"] - sklearn_accuracy(config)) <= 0.01, sized
    unmeasured = inprocess.InProcess(mlr.MLRDriver, mlr.MLRExecutor, config, 4).run()  # speeds all None
    assert unmeasured["resizes"] == 0 and len(set(unmeasured["batches_run"])) == 1, unmeasured
    plain = inprocess.InProcess(mlr.MLRDriver, mlr.MLRExecutor, {**config, "size_by_speed": 0}, 4).run()
    assert "batches_run" not in plain  # off by default: the result (and the tasks) as before


@pytest.mark.timeout(120)
def test_litz_run_with_a_slow_worker_sizes_its_tasks_down(monkeypatch) -> None:
    """Two workers, w1 slowed to a quarter by the test hook, even placement (nothing moves): w1's executors (4..7,
    the first placement's second block) run fewer mini-batches, and the model is as accurate as scikit-learn's."""
    monkeypatch.setenv("LITZ_TEST_SLOW_WORKER", "w1:0.75")
    config = {**CONFIG, "staleness": 0, "size_by_speed": 1, "tol": 0, "epochs": 30}
    result = litz.run(
        "apps.mlr", workers=2, servers=1, executors=8, config=config, placement="even", steal=False
    )
    fast, slow = result["batches_run"][:4], result["batches_run"][4:]
    assert result["resizes"] >= 1 and max(slow) < 0.8 * min(fast), result
    assert abs(result["test_accuracy"] - sklearn_accuracy(config)) <= 0.01, result
