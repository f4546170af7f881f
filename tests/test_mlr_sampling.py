"""apps.mlr's ``sampling=executors``: each SSP iteration's mini-batches come as chunks of executors the runtime picks
(apps/chunkplan.py), every mini-batch is still visited once an epoch, the staleness bound holds as with
``sampling=rows``, the accuracy stays, and under ``--memory-limit`` executors are loaded far less often."""
from __future__ import annotations

import json
import math

import pytest

import apps.mlr as mlr
from apps.mlr.settings import Settings
from litz.appconfig import ConfigError
from tests.support import inprocess
from tests.support.processes import run_cli
from tests.support.reference import MLR_CONFIG as CONFIG
from tests.support.reference import sklearn_accuracy


class Recording(inprocess.InProcess):
    """Records every chunk task's iteration at its dispatch, with the iterations not yet complete then."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.open: dict[int, int] = {}  # iteration -> its tasks dispatched and not yet completed
        self.dispatches: list[tuple[int, int]] = []  # (iteration, the oldest iteration not complete)

    def dispatch_task(self, executor: int, args: object) -> None:
        if args[0] == "chunk":
            oldest = min((i for i, n in self.open.items() if n), default=args[1])
            self.dispatches.append((args[1], oldest))
            self.open[args[1]] = self.open.get(args[1], 0) + 1
        super().dispatch_task(executor, args)


class Steps(mlr.MLRExecutor):
    """Records the mini-batches (their first rows) each training task stepped on, by epoch and executor."""

    seen: dict[tuple[int, int], list[int]] = {}

    def _steps(self, iteration, epoch, mine, batch_size, l2):
        Steps.seen.setdefault((epoch, self.executor_id), []).extend(int(r) for r in mine)
        return super()._steps(iteration, epoch, mine, batch_size, l2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_executors,staleness", [(8, 3), (5, 1)])
def test_in_process_every_minibatch_once_an_epoch_within_the_staleness_bound(num_executors: int,
                                                                             staleness: int) -> None:
    """Tasks complete in random order and read the weights as of their dispatch (the stalest view the consistency
    rule allows), executors are evicted between tasks: each epoch still steps on each executor's every mini-batch
    exactly once, no iteration is dispatched before those ``staleness + 1`` back completed (and some are dispatched
    right at the bound), and the test accuracy is within a point of scikit-learn's."""
    epochs = 4
    config = {**CONFIG, "sampling": "executors", "staleness": staleness, "epochs": epochs, "tol": 0}
    Steps.seen = {}
    runtime = Recording(mlr.MLRDriver, Steps, config, num_executors, seed=num_executors, roundtrip="evict")
    completed = runtime.driver.handle_task_completion

    def complete(result: dict) -> None:
        if result["kind"] == "train":
            runtime.open[result["iteration"]] -= 1
        completed(result)

    runtime.driver.handle_task_completion = complete
    result = runtime.run()
    assert result["sampling"] == "executors" and result["epochs"] == epochs
    batch = result["batch_size"]
    rows = {e: len(runtime.executors[e].y) for e in range(num_executors)}
    for epoch in range(epochs):
        for e in range(num_executors):
            assert sorted(Steps.seen[(epoch, e)]) == list(range(0, rows[e], batch)), (epoch, e)
    assert all(it - oldest <= staleness for it, oldest in runtime.dispatches)
    assert max(it - oldest for it, oldest in runtime.dispatches) == staleness  # the bound is used, not BSP
    tasks = Settings.from_config(config).tasks_per_iteration(num_executors)
    assert tasks == math.ceil(num_executors / 4)
    assert abs(result["test_accuracy"] - sklearn_accuracy(CONFIG)) <= 0.01, result


def test_sampling_setting_is_checked() -> None:
    assert Settings.from_config({"synthetic": 1}).sampling == "rows"  # the default: as before the setting
    with pytest.raises(ConfigError, match="'sampling' must be one of rows, executors"):
        Settings.from_config({"synthetic": 1, "sampling": "chunks"})
    with pytest.raises(ConfigError, match="size_by_speed=1 works with sampling=rows only"):
        Settings.from_config({"synthetic": 1, "sampling": "executors", "size_by_speed": 1})


def litz_run(tmp_path, name: str, config: dict, *extra: str, executors: int = 8) -> tuple[dict, list[dict]]:
    """``litz run apps.mlr`` on 2 workers and 1 server: the result and the job's events."""
    out = tmp_path / f"{name}.json"
    args = ["litz", "run", "apps.mlr", "--workers", "2", "--servers", "1", "--executors", str(executors),
            "--output", str(out), "--name", name, "--config", *[f"{k}={v}" for k, v in config.items()], *extra]
    proc = run_cli(args, timeout=100)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    return doc["result"], doc["events"]


@pytest.mark.timeout(120)
def test_litz_run_executor_sampling_as_accurate_as_rows(tmp_path) -> None:
    """The same seed and epochs through ``litz run``: drawing each iteration's mini-batches from the executors the
    runtime picks ends within a point of drawing them from every executor, itself within a point of scikit-learn."""
    config = {**CONFIG, "tol": 0, "epochs": 6}
    rows, _ = litz_run(tmp_path, "rows", {**config, "sampling": "rows"})
    chosen, _ = litz_run(tmp_path, "executors", {**config, "sampling": "executors"})
    assert rows["sampling"] == "rows" and chosen["sampling"] == "executors"
    assert rows["epochs"] == chosen["epochs"] == 6 and rows["train_rows"] == chosen["train_rows"] == CONFIG["n"]
    assert abs(chosen["test_accuracy"] - rows["test_accuracy"]) <= 0.01, (chosen, rows)
    assert abs(rows["test_accuracy"] - sklearn_accuracy(CONFIG)) <= 0.01, rows


@pytest.mark.timeout(180)
def test_litz_run_executor_sampling_loads_executors_less_under_a_memory_limit(tmp_path, monkeypatch) -> None:
    """With a quarter of each worker's data in memory, ``sampling=rows`` gives every executor a task every
    iteration, so each is loaded about once per ``staleness + 1`` iterations (the tasks queued meanwhile run in
    one stay); ``sampling=executors`` loads each about once an epoch, plus the info and evaluation rounds."""
    monkeypatch.setenv("LITZ_SPILL_DIR", str(tmp_path))
    executors, epochs, staleness = 16, 6, 2
    config = {**CONFIG, "tol": 0, "epochs": epochs, "staleness": staleness}
    per_executor = CONFIG["n"] // executors * (4 * CONFIG["d"] + 8)  # float32 X and int64 y
    budget = 2 * per_executor + (64 << 10)  # 2 of each worker's 8 executors: data 4x the budget
    counts = {}
    for sampling in ("rows", "executors"):
        result, events = litz_run(tmp_path, sampling, {**config, "sampling": sampling}, "--memory-limit",
                                  str(budget), executors=executors)
        kinds = [e["kind"] for e in events]
        assert result["epochs"] == epochs and kinds.count("evict") >= executors  # the budget did bite
        counts[sampling] = (kinds.count("load") + kinds.count("prefetch"), result["iterations"], result)
    (row_loads, row_iterations, rows), (loads, _, chosen) = counts["rows"], counts["executors"]
    assert row_loads >= executors * row_iterations / (staleness + 1) / 2, counts
    assert loads <= executors * (epochs + 3), counts  # once an epoch, the two rounds and an epoch to spare
    assert row_loads > 2 * loads, counts
    assert abs(chosen["test_accuracy"] - rows["test_accuracy"]) <= 0.01, counts


@pytest.mark.timeout(60)
def test_in_process_executor_sampling_stops_when_the_training_loss_stops_improving() -> None:
    """The stopping rule ends an executor-sampled run as a row-sampled one: no iteration is dispatched after the stop
    beyond the ``staleness + 1`` already under way, and they still complete before the evaluation."""
    config = {**CONFIG, "n": 5000, "n_test": 1000, "sampling": "executors"}
    runtime = inprocess.InProcess(mlr.MLRDriver, mlr.MLRExecutor, config, 8)
    result = runtime.run()
    epochs, per_epoch = result["epochs"], runtime.driver.per_epoch
    assert epochs == len(runtime.reports) < 100
    assert epochs * per_epoch <= result["iterations"] <= epochs * per_epoch + 3  # staleness 2, the default
    assert runtime.driver.plan.done and runtime.driver.plan.finished == result["iterations"]
