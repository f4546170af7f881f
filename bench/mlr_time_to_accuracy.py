"""MLR time to accuracy: Litz vs a Ray parameter server vs single-process numpy, and Litz vs its old defaults.

All train softmax regression with ``apps.mlr``'s default settings (``apps.mlr.model.sgd_steps``: AdaGrad,
batch 256 at this size, until the training loss stops improving) on the same synthetic data (``apps.mlr``
built-in example: 200 000 x 100, 10 classes, 20 000 test rows; quick: 50 000 rows), and we record the test
accuracy at the end of every epoch and the training time at that point (start-up and data loading excluded).
Time to accuracy = time at the end of the first epoch whose test accuracy reaches ``--target``.

* **Litz**: ``bench/apps/mlr_tta.py`` = ``apps.mlr`` (SSP, staleness 2, 8 executors) plus one test-set
  evaluation task per finished epoch; 2 workers, 1 server.
* **Litz, old defaults**: the same with the settings ``apps.mlr`` had before its defaults adapted to the data
  (``OLD_DEFAULTS``: plain SGD, lr 0.5 / sqrt(1 + epoch), batch 256, 10 epochs, no stopping rule): the
  built-in example must not get slower (time to the target and total training time, same run).
* **scikit-learn**: ``LogisticRegression()`` on the same rows, once per run (tens of seconds): the accuracy
  to reach.
* **Ray**: the *same* app classes (the Driver, the Executor, ``litz.ssp.SSP``) on a runtime built from Ray
  actors in this file: 2 worker actors holding 4 executors each (same partitioning), 1 parameter-server
  actor (a dict of keys -> float32 arrays, ``get_many`` / ``update_many``), and the driver in this process
  dispatching one actor call per micro-task and taking completions with ``ray.wait``. Same consistency
  as Litz: each task carries the number of completions seen when it was dispatched (its version); a
  worker actor re-fetches parameters when a task's version is newer than its cached copy, and a task's
  update is applied (``ray.get`` on the PS call) before its result is returned. So the algorithm, the
  staleness, the task sizes and the number of processes are identical; only the runtime differs.
* **numpy**: one process, sequential mini-batch steps (same optimiser, step size, l2 and stopping rule) over
  all rows in a shuffled batch order each epoch.

Each side runs ``--repeats`` times (interleaved); the table uses medians. Target: Litz faster than Ray.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import _table
import numpy as np

import litz
from apps.mlr.settings import THESIS_SGD

HERE = os.path.dirname(os.path.abspath(__file__))
APP = os.path.join(HERE, "apps", "mlr_tta.py")
WORKERS, EXECUTORS = 2, 8
OLD_DEFAULTS = {**THESIS_SGD, "epochs": 10}


def time_to_target(curve: list[dict], target: float) -> float | None:
    for point in curve:
        if point["test_accuracy"] >= target:
            return point["t"]
    return None


# ------------------------------------------------------------------------------------------- Litz
def run_litz(config: dict) -> dict:
    result = litz.run(APP, workers=WORKERS, servers=1, executors=EXECUTORS, config=config,
                      name=f"bench-tta-{os.getpid()}", progress=False)
    return {"curve": result["curve"], "train_seconds": result["train_seconds"],
            "final_test_accuracy": result["test_accuracy"]}


# ------------------------------------------------------------------------------------------- numpy
def run_numpy(config: dict) -> dict:
    from apps.mlr import data, model
    from apps.mlr.settings import Settings

    s = Settings.from_config(config).for_rows(config["n"])
    X, y = data.synthetic_rows(0, s.n, d=s.d, classes=s.classes, seed=s.seed, signal=s.signal)
    Xt, yt = data.test_share(s, 0, 1, s.d, s.classes)
    W = np.zeros((s.d, s.classes), np.float32)
    b = np.zeros(s.classes, np.float32)
    adagrad = (np.zeros_like(W), np.zeros_like(b)) if s.optimizer == "adagrad" else None
    plateau = model.Plateau(s.tol, s.patience)
    starts = np.arange(0, s.n, s.batch_size)
    curve, clock = [], 0.0
    for epoch in range(s.epochs):
        t0 = time.perf_counter()
        order = np.random.default_rng([s.seed, 3, epoch]).permutation(starts)
        loss, _, rows = model.sgd_steps(X, y, W, b, order, batch_size=s.batch_size, lr=s.lr_at(epoch), l2=s.l2,
                                        adagrad=adagrad)
        clock += time.perf_counter() - t0  # evaluation below is off the clock
        _, correct, count = model.evaluate(Xt, yt, W, b)
        curve.append({"epoch": epoch + 1, "t": clock, "test_accuracy": correct / count})
        if plateau.stop(loss / rows):
            break
    return {"curve": curve, "train_seconds": clock, "final_test_accuracy": curve[-1]["test_accuracy"]}


def run_sklearn(config: dict) -> float:
    """scikit-learn's ``LogisticRegression()`` (default settings) test accuracy on the same rows."""
    import warnings

    from sklearn.linear_model import LogisticRegression

    from apps.mlr import data
    from apps.mlr.settings import Settings

    s = Settings.from_config(config)
    X, y = data.synthetic_rows(0, s.n, d=s.d, classes=s.classes, seed=s.seed, signal=s.signal)
    Xt, yt = data.test_share(s, 0, 1, s.d, s.classes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a ConvergenceWarning at the default max_iter is part of the default
        return float(LogisticRegression().fit(X, y).score(Xt, yt))


# ------------------------------------------------------------------------------------------- Ray
def make_ray_runtime():
    """Ray actor classes (defined lazily so that importing this file does not import ray)."""
    import ray

    @ray.remote(num_cpus=0.5)
    class ParamServer:
        """Additive key-value store: a missing key reads as None and starts at zero."""

        def __init__(self):
            self.table = {}

        def get_many(self, keys):
            return [self.table.get(k) for k in keys]

        def update_many(self, items):
            for key, delta in items:
                cur = self.table.get(key)
                self.table[key] = np.array(delta) if cur is None else cur + delta
            return len(items)

    @ray.remote(num_cpus=0.5)
    class Worker:
        """Hosts some executors of the app; runs one micro-task per call, like a Litz worker process."""

        def __init__(self, ps, app_path, eids, num_executors, config):
            from litz.appload import load_app

            self.ps = ps
            app = load_app(app_path)
            self.cache = {}  # key -> (version, value): serves tasks of version <= the fetching task's
            self.log = {}
            self.version = 0
            self.executors = {}
            for eid in eids:
                ex = app.executor_cls.__new__(app.executor_cls)
                ex.executor_id, ex.num_executors, ex.config, ex._litz = eid, num_executors, config, self
                ex.__init__()
                ex.load_input()
                self.executors[eid] = ex

        def ready(self):
            return sorted(self.executors)

        def run(self, eid, version, args):
            self.version = version
            result = self.executors[eid].run_task(args)
            if self.log:  # the task's updates are applied before its completion is reported
                items, self.log = list(self.log.items()), {}
                ray.get(self.ps.update_many.remote(items))
            return result

        # the executor context (what litz.Executor's ps_* methods call)
        def ps_get_many(self, keys):
            values, missing = [None] * len(keys), []
            for i, key in enumerate(keys):
                entry = self.cache.get(key)
                if entry is not None and self.version <= entry[0]:
                    values[i] = entry[1]
                else:
                    missing.append(i)
            if missing:
                fetched = ray.get(self.ps.get_many.remote([keys[i] for i in missing]))
                for i, value in zip(missing, fetched, strict=True):
                    self.cache[keys[i]] = (self.version, value)
                    values[i] = value
            return values

        def ps_get(self, key):
            return self.ps_get_many([key])[0]

        def ps_update_many(self, items):
            for key, delta in items:
                cur = self.log.get(key)
                self.log[key] = np.array(delta) if cur is None else cur + delta

        def ps_update(self, key, delta):
            self.ps_update_many([(key, delta)])

    return ParamServer, Worker


class RayDriverContext:
    """The driver's side of the Ray runtime: dispatch, version counter, completions via ray.wait."""

    def __init__(self, workers: list, num_executors: int):
        self.workers = workers
        self.owner = [workers[e * len(workers) // num_executors] for e in range(num_executors)]
        self.version = 0
        self.pending: list = []
        self.result = None
        self.finished = False

    def dispatch_task(self, executor, args):
        self.pending.append(self.owner[executor].run.remote(int(executor), self.version, args))

    def report(self, metrics, t):
        pass

    def finish(self, result):
        self.result, self.finished = result, True

    def run(self, driver) -> dict:
        import ray

        driver.dispatch_initial_tasks()
        while not self.finished:
            if not self.pending:
                raise RuntimeError("Ray MLR driver: no tasks in flight and no finish()")
            ready, self.pending = ray.wait(self.pending, num_returns=1)
            if self.pending:  # take every other completion that is already in, without blocking
                more, self.pending = ray.wait(self.pending, num_returns=len(self.pending), timeout=0)
                ready += more
            for result in ray.get(ready):
                if self.finished:
                    break
                self.version += 1
                driver.handle_task_completion(result)
        return self.result


def run_ray(config: dict, runtime) -> dict:
    import ray

    from litz.appload import load_app

    ParamServer, Worker = runtime
    ps = ParamServer.remote()
    eids = [[e for e in range(EXECUTORS) if e * WORKERS // EXECUTORS == w] for w in range(WORKERS)]
    workers = [Worker.remote(ps, APP, mine, EXECUTORS, config) for mine in eids]
    try:
        ray.get([w.ready.remote() for w in workers])  # data loaded: the clock starts with the driver
        app = load_app(APP)
        ctx = RayDriverContext(workers, EXECUTORS)
        driver = app.driver_cls.__new__(app.driver_cls)
        driver.config, driver.num_executors, driver._litz = config, EXECUTORS, ctx
        driver.__init__()
        result = ctx.run(driver)
        ray.get(ctx.pending)  # nothing left running in the actors
    finally:
        for actor in [*workers, ps]:
            ray.kill(actor)
    return {"curve": result["curve"], "train_seconds": result["train_seconds"],
            "final_test_accuracy": result["test_accuracy"]}


# ------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/mlr_time_to_accuracy.quick.json)")
    ap.add_argument("--repeats", type=int, help="runs per side (default 3, quick 1)")
    ap.add_argument("--epochs", type=int, help="cap on epochs per run (default: the app's)")
    ap.add_argument("--rows", type=int, help="synthetic training rows (default 200000, quick 50000)")
    ap.add_argument("--target", type=float, default=0.778, help="common target test accuracy (default 0.778)")
    ap.add_argument("--staleness", type=int, default=2, help="SSP staleness for Litz and Ray (default 2)")
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray side (a reduced run; no table update)")
    ap.add_argument("--no-sklearn", action="store_true", help="skip scikit-learn's reference accuracy")
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    rows = args.rows or (50_000 if args.quick else 200_000)
    config = {"synthetic": 1, "n": rows, "n_test": 20_000, "staleness": args.staleness, "seed": 0}
    if args.epochs:
        config["epochs"] = args.epochs
    old_config = {**config, **OLD_DEFAULTS}

    runs: dict[str, list] = {"litz": [], "litz_old": [], "ray": [], "numpy": []}

    def record(side: str, r: dict, i: int) -> None:
        r["time_to_target"] = time_to_target(r["curve"], args.target)
        runs[side].append(r)
        tt = r["time_to_target"]
        accs = " ".join(f"{p['test_accuracy']:.4f}" for p in r["curve"])
        print(f"{side:8s} run {i + 1}/{repeats}: time to {args.target} "
              f"{'not reached' if tt is None else f'{tt:.2f} s'}, {len(r['curve'])} epochs in "
              f"{r['train_seconds']:.2f} s; test accuracy per epoch {accs}", flush=True)

    sklearn = None if args.no_sklearn else run_sklearn(config)
    if sklearn is not None:
        print(f"scikit-learn LogisticRegression(): test accuracy {sklearn:.4f}", flush=True)
    for i in range(repeats):
        record("numpy", run_numpy(config), i)
        record("litz", run_litz(config), i)
        record("litz_old", run_litz(old_config), i)
        if args.no_ray:
            continue
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            record("ray", run_ray(config, make_ray_runtime()), i)
        finally:
            ray.shutdown()

    def med_time(side: str) -> float | None:
        times = [r["time_to_target"] for r in runs[side]]
        return None if any(t is None for t in times) else statistics.median(times)

    summary = {side: {"time_to_target_s": med_time(side),
                      "train_s": statistics.median(r["train_seconds"] for r in runs[side]),
                      "epochs": statistics.median(len(r["curve"]) for r in runs[side]),
                      "epoch_s": statistics.median(r["train_seconds"] / len(r["curve"]) for r in runs[side]),
                      "final_test_accuracy": statistics.median(r["final_test_accuracy"] for r in runs[side])}
               for side in runs if runs[side]}
    lt, ot, nt = (summary[s]["time_to_target_s"] for s in ("litz", "litz_old", "numpy"))
    rt = summary["ray"]["time_to_target_s"] if "ray" in summary else None
    ratio = rt / lt if lt and rt else None
    # paired per round: the new defaults over the old ones, time to target and total training time
    pairs = list(zip(runs["litz"], runs["litz_old"], strict=True))
    new_over_old = [a["time_to_target"] / b["time_to_target"] for a, b in pairs
                    if a["time_to_target"] and b["time_to_target"]]
    total_over_old = [a["train_seconds"] / b["train_seconds"] for a, b in pairs]
    tta_ratio = statistics.median(new_over_old) if len(new_over_old) == repeats else None
    total_ratio = statistics.median(total_over_old)
    met = lt is not None and (rt is None or lt < rt)
    doc = {"target_accuracy": args.target, "target": "Litz reaches the target accuracy faster than Ray",
           "met": met, "ray_over_litz": ratio, "sklearn_test_accuracy": sklearn,
           "new_over_old_defaults": {"time_to_target": tta_ratio, "train_seconds": total_ratio},
           "config": config, "old_defaults_config": old_config, "workers": WORKERS, "servers": 1,
           "executors": EXECUTORS, "summary": summary, "runs": runs}
    path = _table.write_result("mlr_time_to_accuracy", doc, quick=args.quick or args.no_ray)

    def fmt(t: float | None) -> str:
        return "not reached" if t is None else f"{t:.2f} s"

    def times(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}x"

    lit = summary["litz"]
    print(f"time to test accuracy {args.target}: litz {fmt(lt)}, litz old defaults {fmt(ot)}, ray {fmt(rt)}, "
          f"numpy {fmt(nt)}; new/old defaults: {times(tta_ratio)} time to target, {times(total_ratio)} total "
          f"({lit['epochs']:g} epochs in {lit['train_s']:.2f} s, accuracy {lit['final_test_accuracy']:.4f}; "
          f"old: {summary['litz_old']['epochs']:g} in {summary['litz_old']['train_s']:.2f} s, "
          f"{summary['litz_old']['final_test_accuracy']:.4f}; scikit-learn "
          f"{'n/a' if sklearn is None else f'{sklearn:.4f}'}); ray/litz {times(ratio)} "
          f"(target litz faster than ray: {'met' if met else 'MISSED'}) -> {path}")
    if not (args.quick or args.no_ray):
        sk = "" if sklearn is None else f", scikit-learn {sklearn:.4f}"
        _table.update_rows({"mlr_time_to_accuracy": [
            f"{fmt(lt)} to {args.target} ({lit['epoch_s']:.2f} s/epoch); default settings stop after "
            f"{lit['epochs']:g} epochs, {lit['train_s']:.2f} s, test accuracy {lit['final_test_accuracy']:.4f}"
            f"{sk}; old defaults (10 epochs of SGD): {times(tta_ratio)} the time to target, "
            f"{times(total_ratio)} the total",
            f"Ray PS {fmt(rt)} ({summary['ray']['epoch_s']:.2f} s/epoch); numpy 1 process {fmt(nt)} "
            f"({summary['numpy']['epoch_s']:.2f} s/epoch)",
            "n/a" if ratio is None else f"Ray {ratio:.1f}x slower", "Litz faster than Ray",
            _table.yes_no(met), _table.today()]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
