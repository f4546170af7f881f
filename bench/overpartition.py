"""Over-partitioning overhead: MLR epoch time with 1, 2, 4, 8 and 16 executors per worker (2 workers).

Every run trains ``apps.mlr`` on the same synthetic data (200 000 x 100, 10 classes; quick: 50 000) for the
same number of epochs with 2 workers and 1 server; only ``executors`` changes (2, 4, 8, 16, 32). The
epoch time is the mean gap between consecutive per-epoch ``report()`` timestamps in the ``--metrics``
stream over epochs 2..N (epoch 1 also carries start-up effects); the ``--output`` document's ``elapsed_s``
(driver start to finish, including the info and evaluation rounds) is recorded too.

Two sweeps:
 * ``default``: the app's own task size, ``batches_per_task = max(1, 8 // executors)`` (an SSP iteration
   covers about 8 mini-batches), so 32 executors run about 4x as many, smaller tasks per epoch as 2 do;
 * ``fixed``: ``batches_per_task = 1`` for every count, so every run does the same tasks per epoch and only
   the number of executors (and so the width of an SSP iteration) changes.
Runs are interleaved over the counts ``--repeats`` times; the table uses medians.
Target: 16 executors/worker <= 1.05x the epoch time of 1 executor/worker.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import _jobs
import _table

import litz
from apps.mlr.settings import THESIS_SGD

PER_WORKER = (1, 2, 4, 8, 16)
WORKERS = 2


def run_mlr(executors: int, config: dict, **run: object) -> dict:
    """One MLR job (``run``: further ``litz.run`` arguments, such as ``placement``)."""
    with tempfile.TemporaryDirectory(prefix="litz-bench-") as tmp:
        out, metrics = os.path.join(tmp, "out.json"), os.path.join(tmp, "metrics.jsonl")
        litz.run("apps.mlr", workers=WORKERS, servers=1, executors=executors, config=config,
                 name=f"bench-overpartition-{os.getpid()}", output=out, metrics=metrics, progress=False, **run)
        with open(out) as f:
            doc = json.load(f)
        with open(metrics) as f:
            reports = [json.loads(line) for line in f if line.strip()]
    ts = [r["t"] for r in reports if "epoch" in r]
    epoch_s = (ts[-1] - ts[0]) / (len(ts) - 1) if len(ts) > 1 else ts[0]
    return {"executors": executors, "epoch_s": epoch_s, "elapsed_s": doc["elapsed_s"],
            "tasks": doc["tasks_completed"], "test_accuracy": doc["result"]["test_accuracy"],
            "rebalances": len(_jobs.events(doc, "rebalance")), "steals": len(_jobs.events(doc, "steal")),
            "epoch_times": [round(b - a, 4) for a, b in zip([0.0] + ts[:-1], ts, strict=True)]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/overpartition.quick.json)")
    ap.add_argument("--repeats", type=int, help="rounds over all counts (default 5, quick 1)")
    ap.add_argument("--epochs", type=int, help="epochs per run (default 10, quick 3)")
    ap.add_argument("--rows", type=int, help="synthetic training rows (default 200000, quick 50000)")
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 5)
    epochs = args.epochs or (3 if args.quick else 10)
    rows = args.rows or (50_000 if args.quick else 200_000)
    base = {**THESIS_SGD, "synthetic": 1, "n": rows, "n_test": 20_000, "epochs": epochs, "staleness": 2, "seed": 0}
    sweeps = {"default": base, "fixed": {**base, "batches_per_task": 1}}

    runs: dict[str, dict[int, list]] = {s: {k: [] for k in PER_WORKER} for s in sweeps}
    for i in range(repeats):
        for sweep, config in sweeps.items():
            for k in PER_WORKER:
                r = run_mlr(k * WORKERS, config)
                runs[sweep][k].append(r)
                print(f"round {i + 1}/{repeats} {sweep:7s} {k:2d}/worker: epoch {r['epoch_s'] * 1e3:6.1f} ms, "
                      f"elapsed {r['elapsed_s']:.2f} s, {r['tasks']} tasks, test acc {r['test_accuracy']:.4f}",
                      flush=True)

    summary: dict = {}
    for sweep in sweeps:
        med = {k: statistics.median(r["epoch_s"] for r in runs[sweep][k]) for k in PER_WORKER}
        rel = {k: med[k] / med[1] for k in PER_WORKER}
        summary[sweep] = {"epoch_s": med, "relative_to_1": rel, "met": rel[16] <= 1.05,
                          "elapsed_s": {k: statistics.median(r["elapsed_s"] for r in runs[sweep][k])
                                        for k in PER_WORKER},
                          "tasks": {k: runs[sweep][k][0]["tasks"] for k in PER_WORKER},
                          "test_accuracy": {k: statistics.median(r["test_accuracy"] for r in runs[sweep][k])
                                            for k in PER_WORKER}}
    doc = {"target": "epoch time with 16 executors/worker <= 1.05x that with 1/worker", "workers": WORKERS,
           "servers": 1, "config": base, "met": summary["default"]["met"], "summary": summary, "runs": runs}
    path = _table.write_result("overpartition", doc, quick=args.quick)
    rows = {}
    for sweep, s in summary.items():
        line = ", ".join(f"{k}: {s['epoch_s'][k] * 1e3:.0f}" for k in PER_WORKER)
        print(f"{sweep}: epoch ms per executors/worker {line}; 16 vs 1: {s['relative_to_1'][16]:.2f}x "
              f"(target <= 1.05x: {'met' if s['met'] else 'MISSED'})")
        name = "overpartition" if sweep == "default" else "overpartition (1 batch/task)"
        others = ", ".join(f"{k}/w {s['relative_to_1'][k]:.2f}x" for k in (2, 4, 8))
        rows[name] = [
            f"16/worker: {s['epoch_s'][16] * 1e3:.0f} ms/epoch ({others})",
            f"1/worker: {s['epoch_s'][1] * 1e3:.0f} ms/epoch", f"{s['relative_to_1'][16]:.2f}x",
            "<= 1.05x", _table.yes_no(s["met"]), _table.today()]
    print(f"-> {path}")
    if not args.quick:
        _table.update_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
