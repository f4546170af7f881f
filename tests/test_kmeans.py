"""apps.kmeans: mini-batch k-means against scikit-learn, determinism, output file, bad input.

``test_in_process_*`` drive the app's Driver and Executors in this process against a dict parameter server,
completing tasks in random order. A task reads either the parameter server as of its dispatch (the stalest
view the consistency rule allows) or as it is when the task runs (the freshest: it may include updates of
tasks of the same iteration). Executors can be serialised and restored between tasks, as eviction,
migration and recovery do. ``test_litz_run_*`` run the real thing through ``litz.run`` with real processes.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import apps.kmeans as km
import litz
from apps.kmeans import data, model
from tests.support import inprocess
from tests.support.processes import metric_rows
from tests.support.reference import full_kmeans_data as full_data
from tests.support.reference import rel, sklearn_objective

# overlapping blobs and more centres than blobs: the optimum is not simply the true centres
CONFIG = {"synthetic": 1, "n": 40_000, "d": 8, "k": 20, "blobs": 10, "spread": 5.0, "epochs": 5, "batch": 1000}


def in_process(config: dict, num_executors: int, **kw) -> inprocess.InProcess:
    return inprocess.InProcess(km.KMeansDriver, km.KMeansExecutor, config, num_executors, **kw)


# ------------------------------------------------------------------------------------------ kernels
@pytest.mark.timeout(30)
def test_batch_update_is_sculleys_per_centre_learning_rate() -> None:
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(4, 3)) * 3
    state = model.initial_model(centers)
    state[:, -1] += [5, 0, 2, 9]  # counts so far (the initial centre counts as one point)
    state[:, :-1] = centers * state[:, -1:]
    X = rng.normal(size=(50, 3)).astype(np.float32) * 3
    delta, sse = model.batch_delta(X, model.centers_of(state))
    # Sculley (2010), Algorithm 1: assign the whole batch first, then per point v[c] += 1; c += (x - c) / v[c]
    c, v = centers.copy(), state[:, -1].copy()
    labels = np.argmin(((X[:, None, :] - centers[None]) ** 2).sum(-1), axis=1)
    for x, j in zip(X.astype(np.float64), labels, strict=True):
        v[j] += 1
        c[j] += (x - c[j]) / v[j]
    np.testing.assert_allclose(model.centers_of(state + delta), c, rtol=1e-12)
    np.testing.assert_array_equal(delta[:, -1], np.bincount(labels, minlength=4))
    assert sse == pytest.approx(((X - centers[labels]) ** 2).sum(), rel=1e-6)


@pytest.mark.timeout(30)
def test_rows_and_batches_do_not_depend_on_the_partitioning() -> None:
    kw = dict(d=5, blobs=3, seed=4, spread=1.0)
    whole = data.synthetic_rows(0, 10_000, **kw)
    parts = [data.synthetic_rows(*data.block(10_000, 7, e), **kw) for e in range(7)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    slots = data.batch_of_rows(0, 10_000, 4, 2, 10)
    np.testing.assert_array_equal(np.concatenate([data.batch_of_rows(*data.block(10_000, 7, e), 4, 2, 10)
                                                  for e in range(7)]), slots)
    sizes = np.bincount(slots, minlength=10)
    assert sizes.sum() == 10_000 and sizes.min() > 850 and sizes.max() < 1150  # ~1000 +- 3 sigma
    assert not np.array_equal(slots, data.batch_of_rows(0, 10_000, 4, 3, 10))  # a new shuffle per epoch


@pytest.mark.timeout(30)
def test_kmeans_plus_plus_is_deterministic_and_spreads_out() -> None:
    X = data.synthetic_rows(0, 5000, d=4, blobs=6, seed=1, spread=0.5)
    a = model.kmeans_plus_plus(X, 6, np.random.default_rng(3))
    b = model.kmeans_plus_plus(X, 6, np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)
    truth = data.blob_centers(4, 6, 1)
    nearest_true = np.argmin(((a[:, None] - truth[None]) ** 2).sum(-1), axis=1)
    assert len(set(nearest_true.tolist())) == 6  # one initial centre per blob on well-separated blobs


# ------------------------------------------------------------------------------------------ in process
@pytest.mark.timeout(60)
def test_in_process_same_objective_for_any_partitioning_view_and_roundtrip() -> None:
    config = {**CONFIG, "n": 12_000, "epochs": 3, "batch": 500, "sampling": "rows"}
    runs = [in_process(config, 1).run(),
            in_process(config, 3, seed=1, view="run").run(),  # would differ without double-buffering
            in_process(config, 8, seed=2, view="run", roundtrip="evict").run(),
            in_process(config, 5, seed=3, roundtrip="reload").run()]
    objectives = [r["objective"] for r in runs]
    assert max(objectives) - min(objectives) <= 1e-7 * objectives[0], objectives
    assert all(r["iterations"] == 3 * 24 and r["n"] == 12_000 for r in runs)


@pytest.mark.timeout(60)
def test_in_process_reports_epochs_and_improves_on_the_initial_centres() -> None:
    config = {**CONFIG, "n": 12_000, "epochs": 4, "batch": 500}
    runtime = in_process(config, 3)
    trained = runtime.run()
    assert [r["epoch"] for r in runtime.reports] == [1, 2, 3, 4]
    untrained = in_process({**config, "epochs": 0}, 3).run()
    assert untrained["epochs"] == 0 and untrained["iterations"] == 0
    assert trained["objective"] < untrained["objective"]
    random_init = in_process({**config, "init": "random"}, 2).run()
    assert random_init["objective"] < 1.1 * trained["objective"]


@pytest.mark.timeout(60)
def test_in_process_stale_reads_stay_close() -> None:
    config = {**CONFIG, "n": 12_000, "epochs": 3, "batch": 500}
    bsp = in_process(config, 4).run()["objective"]
    for staleness in (1, 3):
        ssp = in_process({**config, "staleness": staleness}, 4, seed=staleness).run()["objective"]
        assert rel(ssp, bsp) < 0.01, (staleness, ssp, bsp)


# ------------------------------------------------------------------------------------------ real runtime
@pytest.mark.timeout(60)
@pytest.mark.parametrize("config", [CONFIG, {**CONFIG, "d": 16, "k": 12, "blobs": 12, "spread": 4.0, "seed": 1}],
                         ids=["20-centres-10-blobs", "12-blobs"])
def test_litz_run_close_to_sklearn(config: dict) -> None:
    result = litz.run("apps.kmeans", workers=2, servers=1, config=dict(config))
    assert result["epochs"] == 5 and result["n"] == 40_000 and result["k"] == config["k"]
    reference = sklearn_objective(config)
    assert result["objective"] <= 1.02 * reference, (result, reference)
    assert result["objective"] >= 0.98 * reference, (result, reference)


@pytest.mark.timeout(60)
def test_litz_run_same_seed_same_objective_for_any_worker_count() -> None:
    config = {**CONFIG, "n": 12_000, "epochs": 3, "batch": 500, "sampling": "rows"}  # rows: any partitioning
    runs = [litz.run("apps.kmeans", workers=1, servers=1, config=config),  # 4 executors
            litz.run("apps.kmeans", workers=2, servers=1, config=config),  # 8 executors
            litz.run("apps.kmeans", workers=2, servers=2, executors=3, config=config)]
    objectives = [r["objective"] for r in runs]
    assert max(objectives) - min(objectives) <= 1e-7 * objectives[0], objectives
    again = litz.run("apps.kmeans", workers=2, servers=1, config=config)["objective"]
    assert rel(again, objectives[0]) <= 1e-7
    other_seed = litz.run("apps.kmeans", workers=2, servers=1, config={**config, "seed": 5})["objective"]
    assert other_seed != objectives[0]


class PeakWorkerRSS:
    """Polls the kernel's peak-RSS mark (VmHWM, so no peak between polls is missed) of this process's
    ``litz worker`` children while a job runs; keeps the last value read for each worker pid."""

    def __init__(self) -> None:
        import threading

        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        import psutil

        while not self._stop.is_set():
            for p in psutil.Process().children(recursive=True):
                try:
                    if "worker" in " ".join(p.cmdline()).split():  # fresh interpreter or fork (one title)
                        with open(f"/proc/{p.pid}/status") as f:
                            hwm = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM"))
                        self.peaks[p.pid] = max(self.peaks.get(p.pid, 0), hwm)
                except (psutil.Error, OSError, StopIteration):
                    pass
            self._stop.wait(0.01)

    def __enter__(self) -> PeakWorkerRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.timeout(120)
def test_litz_run_with_a_quarter_of_the_data_in_memory(tmp_path, monkeypatch) -> None:
    """Out of core: a per-worker budget of a quarter of its executors' data. Same objective as the unlimited run
    (same seed), evictions happened, every worker's executor state stayed within the budget, and its peak
    resident memory stayed under the budget plus the overhead the unlimited run had beside its data."""
    monkeypatch.setenv("LITZ_SPILL_DIR", str(tmp_path))
    config = {"synthetic": 1, "n": 800_000, "d": 32, "k": 16, "epochs": 2, "batch": 200_000, "seed": 3,
              "sampling": "rows"}  # every executor in every mini-batch: deterministic, so the same objective
    executors, workers = 16, 2
    state = config["n"] * (4 * config["d"] + 4) // workers  # X (float32) and the batch index, per worker
    budget = state // 4
    with PeakWorkerRSS() as unlimited_rss:
        unlimited = litz.run("apps.kmeans", workers=workers, servers=1, executors=executors, config=config)
    out = tmp_path / "out.json"
    with PeakWorkerRSS() as limited_rss:
        # no steals: a stolen spilled executor is loaded to be sent (a load event) and leaves without an eviction,
        # which the replay below cannot tell from a fourth resident executor
        limited = litz.run("apps.kmeans", workers=workers, servers=1, executors=executors, config=config,
                           memory_limit=budget, output=str(out), steal=False)
    assert rel(limited["objective"], unlimited["objective"]) <= 1e-7, (limited, unlimited)
    events = [e for e in json.loads(out.read_text())["events"] if e["kind"] in ("evict", "load")]
    assert sum(e["kind"] == "evict" for e in events) >= executors // 2
    per_executor = state // (executors // workers)
    for worker in {e["worker"] for e in events}:  # replay: resident executors after each eviction or load
        resident, peak = executors // workers, 0
        for e in (e for e in events if e["worker"] == worker):
            resident += 1 if e["kind"] == "load" else -1
            peak = max(peak, resident) if e["kind"] == "load" else peak
        assert peak * per_executor <= budget + per_executor // 8, (worker, peak)
    assert len(unlimited_rss.peaks) == len(limited_rss.peaks) == workers
    overhead = min(unlimited_rss.peaks.values()) - state  # what a worker holds beside its executors' data
    # 16 MiB for a task's temporaries and a load's buffer; without the budget the peak is 3/4 of 53 MB higher
    assert max(limited_rss.peaks.values()) <= overhead + budget + (16 << 20), (
        limited_rss.peaks, unlimited_rss.peaks, budget)


@pytest.mark.timeout(60)
def test_litz_run_writes_centroids_and_reports(tmp_path) -> None:
    """The model file (.npz, apps.modelfile) holds the centres and cluster sizes; its directory is created."""
    out, metrics = tmp_path / "models" / "kmeans.npz", tmp_path / "metrics.jsonl"
    config = {**CONFIG, "n": 20_000, "epochs": 3, "output": str(out), "blocks": 3}
    result = litz.run("apps.kmeans", workers=2, servers=2, config=config, metrics=str(metrics))
    assert result["model"] == str(out) and result["epochs"] == 3 and result["empty_clusters"] == 0
    with np.load(out) as f:
        centers, sizes = f["centers"], f["sizes"]
    assert centers.shape == (20, 8) and sizes.shape == (20,) and sizes.sum() == 20_000
    X = full_data(config)
    score, counts = model.score(X, centers)
    assert rel(score / len(X), result["objective"]) < 1e-5
    np.testing.assert_array_equal(counts, sizes)
    epochs = [r.get("epoch") for r in metric_rows(metrics)]
    assert [e for e in epochs if e is not None] == [1, 2, 3]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".kmeans-")]  # no temporary file left


class Recording(inprocess.InProcess):
    """Keeps every task's arguments."""

    def dispatch_task(self, executor: int, args: object) -> None:
        self.__dict__.setdefault("dispatched", []).append(args)
        super().dispatch_task(executor, args)


def test_in_process_executor_sampling_visits_every_row_once_an_epoch_and_stays_close() -> None:
    """``sampling=executors`` (the default): a mini-batch is ``batch_tasks`` chunks of executors the runtime picks,
    yet every epoch still visits every row once, and the objective is within 1% of drawing every batch from all
    rows, which is within 1% of scikit-learn."""
    config = {**CONFIG, "n": 12_000, "epochs": 3, "batch": 500}
    rows = in_process({**config, "sampling": "rows"}, 8).run()["objective"]
    for tasks, seed in ((None, 0), (1, 1), (3, 2)):
        runtime = Recording(km.KMeansDriver, km.KMeansExecutor, {**config, "batch_tasks": tasks}, 8, seed=seed,
                            view="run", roundtrip="evict")
        result = runtime.run()
        assert result["sampling"] == "executors" and result["batch_tasks"] == (tasks or 2)
        counts: dict[int, int] = {}
        for args in runtime.dispatched:
            if args[0] == "chunk":
                counts[args[2]] = counts.get(args[2], 0) + 1
        assert rel(result["objective"], rows) < 0.01, (tasks, result["objective"], rows)
        assert sorted(counts) == [0, 1, 2] and len(set(counts.values())) == 1  # as many chunks every epoch
    reference = sklearn_objective(config)
    assert rel(rows, reference) < 0.01, (rows, reference)


def test_chunk_plan_takes_every_chunk_once_an_epoch() -> None:
    """Every executor's chunks are each taken once an epoch, whichever executor the runtime picks."""
    import random

    class Picker:
        def __init__(self) -> None:
            self.rng, self.tasks = random.Random(3), []

        def choose_executor(self, executors: list) -> int:
            return self.rng.choice(executors)

        def dispatch_task(self, executor: int, args: tuple) -> None:
            self.tasks.append((executor, args))

    picker = Picker()
    plan = km.ChunkPlan({0: 1000, 1: 999, 2: 10, 3: 0}, batch=300, tasks=2, epochs=2, staleness=0)
    assert plan.chunk == 150 and plan.chunks == {0: 7, 1: 7, 2: 1} and plan.per_epoch == 8
    while not plan.done:
        plan.advance(picker)
        its = {args[1] for _, args in picker.tasks if args[1] == plan.finished}
        for it in its:
            for _ in range(sum(1 for _, a in picker.tasks if a[1] == it)):
                plan.complete(it)
    assert plan.iterations == 16 and len(picker.tasks) == 30
    for epoch in (0, 1):
        taken = sorted((e, a[3]) for e, a in picker.tasks if a[2] == epoch)
        assert taken == sorted((e, j) for e, n in plan.chunks.items() for j in range(n))
    assert [a[1] for _, a in picker.tasks] == sorted(a[1] for _, a in picker.tasks)  # BSP: iteration by iteration


@pytest.mark.timeout(60)
def test_litz_run_stale_synchronous_close_to_bsp() -> None:
    config = {**CONFIG, "n": 20_000}
    bsp = litz.run("apps.kmeans", workers=2, servers=1, config=config)["objective"]
    ssp = litz.run("apps.kmeans", workers=2, servers=1, config={**config, "staleness": 2})["objective"]
    assert rel(ssp, bsp) < 0.01, (ssp, bsp)


@pytest.mark.timeout(60)
def test_litz_run_npy_input_matches_synthetic(tmp_path) -> None:
    config = {**CONFIG, "n": 20_000, "epochs": 2, "sampling": "rows"}  # 1 and 2 workers: the same rows per batch
    path = tmp_path / "points.npy"
    np.save(path, full_data(config))
    synthetic = litz.run("apps.kmeans", workers=2, servers=1, config=config)
    file_config = {k: v for k, v in config.items() if k not in ("synthetic", "n", "d", "blobs", "spread")}
    from_file = litz.run("apps.kmeans", workers=1, servers=1, config={**file_config, "input": str(path)})
    assert from_file["n"] == 20_000 and from_file["d"] == 8
    assert rel(from_file["objective"], synthetic["objective"]) <= 1e-7


@pytest.mark.timeout(60)
def test_litz_run_builtin_example() -> None:
    result = litz.run("apps.kmeans", workers=2, servers=1, config={"synthetic": 1})
    # 16 well-separated blobs with unit variance in 32 dimensions: the optimum is close to d * spread^2 = 32
    assert result["epochs"] == 5 and result["n"] == 200_000
    assert 31.8 < result["objective"] < 32.2, result


# ------------------------------------------------------------------------------------------ bad input
def _bad_files(tmp_path) -> dict[str, str]:
    files = {"int": np.arange(30).reshape(10, 3), "vec": np.zeros(10, np.float32)}
    with_nan = np.zeros((10, 3), np.float32)
    with_nan[7, 1] = np.nan
    files["nan"] = with_nan
    paths = {}
    for name, array in files.items():
        paths[name] = str(tmp_path / f"{name}.npy")
        np.save(paths[name], array)
    paths["text"] = str(tmp_path / "text.npy")
    (tmp_path / "text.npy").write_text("1 2 3\n")
    paths["ok"] = str(tmp_path / "ok.npy")
    np.save(paths["ok"], np.ones((100, 3), np.float32))
    return paths


@pytest.mark.timeout(60)
@pytest.mark.parametrize("config,message", [
    ({"input": "{missing}"}, r"missing\.npy: no such file"),
    ({"input": "{int}"}, r"int\.npy: expected float32 data, got int64"),
    ({"input": "{vec}"}, r"vec\.npy: expected an N x D array, got shape \(10,\)"),
    ({"input": "{nan}"}, r"nan\.npy: row 7 has a NaN or infinite value"),
    ({"input": "{text}"}, r"text\.npy: not a \.npy file"),
    ({"input": "{ok}", "k": 101}, r"k=101 is larger than the number of points in .*ok\.npy \(n=100\)"),
    ({"synthetic": 1, "n": 10, "k": 11}, r"k=11 is larger than the number of points n=10"),
    ({"synthetic": 1, "epoch": 3}, r"unknown config key\(s\) 'epoch'"),
    ({"synthetic": 1, "batch": 0}, r"'batch' must be an integer >= 1"),
    ({"synthetic": 1, "output": "{missing_dir}"}, r"config 'output': .* is a directory"),
    ({}, r"needs exactly one of config 'input'"),
], ids=["missing", "int", "vec", "nan", "text", "k>n-file", "k>n-synthetic", "unknown-key", "batch", "output",
        "no-data"])
def test_litz_run_bad_input_is_one_clear_error(tmp_path, config: dict, message: str) -> None:
    paths = {**_bad_files(tmp_path), "missing": str(tmp_path / "missing.npy"),
             "missing_dir": str(tmp_path)}
    config = {k: v.format(**paths) if isinstance(v, str) else v for k, v in config.items()}
    with pytest.raises(litz.InputError, match=message) as info:
        litz.run("apps.kmeans", workers=1, servers=1, config=config)
    assert "\n" not in str(info.value)
