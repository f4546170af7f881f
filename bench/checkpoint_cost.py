"""Checkpoint cost and recovery time: MLR with a consistent checkpoint about once per epoch.

Each round runs three ``litz run apps.mlr`` jobs with the same config (synthetic 200 000 x 500, 100 classes,
10 epochs, 8 executors, 2 workers, 1 server; quick: 100 000 rows, 6 epochs):

 1. **no checkpoints** (the baseline): training time ``T0`` and the epoch time ``T0 / epochs``;
 2. **checkpoints**: ``--checkpoint-dir DIR --checkpoint-every E`` with ``E`` = the baseline's epoch time
    (so about one checkpoint per epoch): every ``checkpoint`` event's ``pause_s`` (dispatch held, from the
    request to the rename of the finished checkpoint) and ``bytes``; training time ``T1``;
 3. **checkpoints + a killed worker**: as 2, and at 50% of the run ``litzctl kill WORKER`` (SIGKILL). The
    runtime replaces the worker and restores the latest checkpoint: the ``recovery`` event's ``duration_s``
    (from the master noticing the loss to the job running again, including the replacement worker's start
    and input loading). The worker's exit is watched by pid, so the detection delay (exit -> recovery
    start) is measured too, and the whole cost of the failure, ``T2 - T1`` (detection, recovery, rework).

Training time = job time of the last epoch's ``report()`` (``--metrics``). Slowdown = ``T1 / T0``. Rounds are
interleaved ``--repeats`` times; the table shows medians. Issue 4 sets no numeric target for this one; the
thesis' own requirement is that a checkpoint pauses the job only as long as needed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import _jobs
import _table

from apps.mlr.settings import THESIS_SGD

WORKERS, EXECUTORS = 2, 8


def run(tmp: str, name: str, config: dict, blas: str, every: float | None = None,
        kill_at: float | None = None) -> dict:
    extra = []
    if every:
        ckdir = os.path.join(tmp, f"{name}-ckpt")
        extra = ["--checkpoint-dir", ckdir, "--checkpoint-every", f"{every:.3f}"]
    job = _jobs.Job(tmp, name, workers=WORKERS, executors=EXECUTORS, config=config, extra=extra,
                    blas_threads=blas).start()
    kill = None
    try:
        if kill_at is not None:
            start = job.driver_start_wall()
            st = job.wait_status(lambda s: s["state"] == "running" and len(s["workers"]) == WORKERS)
            victim = st["workers"][-1]
            time.sleep(max(0.0, start + kill_at - time.time()))
            watcher = _jobs.ExitWatcher([victim["pid"]], every=0.002)
            t_req = time.time()
            job.ctl("kill", victim["id"])
            watcher._thread.join(30)
            exits = watcher.stop()
            kill = {"id": victim["id"], "pid": victim["pid"], "t_request": round(t_req - start, 4),
                    "t_exit": round(exits[victim["pid"]] - start, 4) if victim["pid"] in exits else None}
    except BaseException:
        job.kill()
        raise
    doc = job.wait(600)
    reports = job.reports()
    cps = _jobs.events(doc, "checkpoint")
    recs = _jobs.events(doc, "recovery")
    out = {"train_s": _jobs.train_time(doc, reports), "elapsed_s": doc["elapsed_s"],
           "test_accuracy": doc["result"]["test_accuracy"], "checkpoints": len(cps),
           "pause_s": [c["pause_s"] for c in cps], "bytes": [c["bytes"] for c in cps], "recoveries": recs,
           "kill": kill, "failed_checkpoints": _jobs.events(doc, "checkpoint_failed")}
    if kill and recs and kill["t_exit"] is not None:
        rec = recs[0]
        start_t = rec["t"] - rec["duration_s"]
        before = [c for c in cps if c["t"] <= kill["t_exit"]]
        out["recovery"] = {"duration_s": rec["duration_s"], "detect_s": round(start_t - kill["t_exit"], 4),
                           "kill_to_running_s": round(rec["t"] - kill["t_exit"], 4),
                           "since_checkpoint_s": round(kill["t_exit"] - before[-1]["t"], 4) if before else None}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/checkpoint_cost.quick.json)")
    ap.add_argument("--repeats", type=int, help="rounds of the three runs (default 2, quick 1)")
    ap.add_argument("--epochs", type=int, help="epochs per run (default 10, quick 6)")
    ap.add_argument("--blas-threads", default="1", help="BLAS threads per process ('default': the library's)")
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 2)
    epochs = args.epochs or (6 if args.quick else 10)
    config = {"synthetic": 1, "n": 100_000 if args.quick else 200_000, "n_test": 20_000, "d": 500, "classes": 100,
              "epochs": epochs, "staleness": 2, "seed": 0, **THESIS_SGD}

    rounds = []
    with tempfile.TemporaryDirectory(prefix="litz-bench-ckpt-") as tmp:
        for i in range(repeats):
            tag = f"{os.getpid()}-{i}"
            base = run(tmp, f"ck-none-{tag}", config, args.blas_threads)
            every = base["train_s"] / epochs
            ck = run(tmp, f"ck-every-{tag}", config, args.blas_threads, every=every)
            kl = run(tmp, f"ck-kill-{tag}", config, args.blas_threads, every=every, kill_at=0.5 * base["train_s"])
            r = {"round": i + 1, "every_s": every, "none": base, "checkpoints": ck, "kill": kl,
                 "slowdown": ck["train_s"] / base["train_s"], "failure_cost_s": kl["train_s"] - ck["train_s"]}
            rounds.append(r)
            rec = kl.get("recovery", {})
            print(f"round {i + 1}/{repeats}: none {base['train_s']:.2f} s; every {every:.2f} s: {ck['train_s']:.2f} s "
                  f"({r['slowdown']:.3f}x), {ck['checkpoints']} checkpoints, pause median "
                  f"{statistics.median(ck['pause_s']) * 1e3:.0f} ms max {max(ck['pause_s']) * 1e3:.0f} ms, "
                  f"{statistics.median(ck['bytes']) / 1e3:.0f} kB; kill: {kl['train_s']:.2f} s, "
                  f"{len(kl['recoveries'])} recovery, duration {rec.get('duration_s')} s, "
                  f"detect {rec.get('detect_s')} s, "
                  f"test acc {base['test_accuracy']:.4f}/{ck['test_accuracy']:.4f}/{kl['test_accuracy']:.4f}",
                  flush=True)

    pauses = [p for r in rounds for p in r["checkpoints"]["pause_s"]]
    sizes = [b for r in rounds for b in r["checkpoints"]["bytes"]]
    recs = [r["kill"]["recovery"] for r in rounds if "recovery" in r["kill"]]
    med = {"none_s": statistics.median(r["none"]["train_s"] for r in rounds),
           "checkpoints_s": statistics.median(r["checkpoints"]["train_s"] for r in rounds),
           "kill_s": statistics.median(r["kill"]["train_s"] for r in rounds),
           "slowdown": statistics.median(r["slowdown"] for r in rounds),
           "failure_cost_s": statistics.median(r["failure_cost_s"] for r in rounds),
           "pause_s": statistics.median(pauses), "pause_p90_s": _jobs.quantile(pauses, 0.9), "pause_max_s": max(pauses),
           "bytes": statistics.median(sizes),
           "checkpoints_per_epoch": statistics.median(r["checkpoints"]["checkpoints"] / epochs for r in rounds),
           "pause_per_epoch_s": statistics.median(sum(r["checkpoints"]["pause_s"]) / epochs for r in rounds),
           "recovery_s": statistics.median(x["duration_s"] for x in recs) if recs else None,
           "detect_s": statistics.median(x["detect_s"] for x in recs) if recs else None,
           "kill_to_running_s": statistics.median(x["kill_to_running_s"] for x in recs) if recs else None}
    all_recovered = all(len(r["kill"]["recoveries"]) == 1 for r in rounds)
    doc = {"target": "no number set: measure pause, size, recovery time and slowdown", "config": config,
           "workers": WORKERS, "servers": 1, "executors": EXECUTORS, "blas_threads": args.blas_threads,
           "all_recovered": all_recovered, "median": med, "rounds": rounds}
    path = _table.write_result("checkpoint_cost", doc, quick=args.quick)
    print(f"median: slowdown {med['slowdown']:.3f}x ({med['checkpoints_s']:.2f} vs {med['none_s']:.2f} s), "
          f"{med['checkpoints_per_epoch']:.2f} checkpoints/epoch, pause {med['pause_s'] * 1e3:.0f} ms "
          f"(p90 {med['pause_p90_s'] * 1e3:.0f}, max {med['pause_max_s'] * 1e3:.0f}), "
          f"{med['bytes'] / 1e3:.0f} kB each; recovery {med['recovery_s']} s (+{med['detect_s']} s detection), "
          f"failure cost {med['failure_cost_s']:.2f} s")
    print(f"-> {path}")
    if not args.quick:
        _table.update_rows({
            "checkpoint_cost": [
                f"1 per epoch: pause {med['pause_s'] * 1e3:.0f} ms (p90 {med['pause_p90_s'] * 1e3:.0f} ms), "
                f"{med['bytes'] / 1e3:.0f} kB; training {med['checkpoints_s']:.1f} s",
                f"no checkpoints: {med['none_s']:.1f} s", f"{med['slowdown']:.3f}x", "none set", "-",
                _table.today()],
            "checkpoint_cost recovery": [
                f"killed worker: recovery {med['recovery_s']:.2f} s (+{med['detect_s']:.2f} s to notice), "
                f"failure costs {med['failure_cost_s']:.1f} s in all",
                f"same run without the kill: {med['checkpoints_s']:.1f} s",
                f"{med['kill_s'] / med['checkpoints_s']:.3f}x",
                "recovers", _table.yes_no(all_recovered), _table.today()]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
