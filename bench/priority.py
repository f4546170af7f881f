"""Priority scheduling (issue 3, thesis Fig. 4.6): a job on 4 workers lends 2 to a higher-priority job.

Two ``litz run apps.mlr`` jobs, driven from this script as a cluster scheduler would drive them:

 * **A** (low priority): 4 workers, 1 server, 16 executors, synthetic 200 000 x 500, 100 classes,
   30 epochs (quick: 100 000 rows, 10 epochs);
 * **B** (high priority): arrives when A's driver has run 60% of A's uninterrupted training time, and needs
   2 workers: 2 workers,
   1 server, 8 executors, 100 000 rows, 20 epochs (quick: 50 000 rows, 6 epochs).

Three scenarios, run one after another (the thesis' a, b, c):

 a. **uninterrupted**: A alone, no B (the reference completion time of A);
 b. **kill and restart** (the inelastic baseline): when B arrives, ``litzctl stop`` ends A; B starts once A
    has exited; when B is done A is started again from scratch;
 c. **elastic**: when B arrives, ``litzctl scale --workers 2`` on A (it waits until the two released
    workers have exited), then B starts; when B is done, ``litzctl scale --workers 4`` on A.

Completion times are wall-clock: A from its (first) submission to the exit of its (last) ``litz run``; B
from its arrival to the exit of its ``litz run``, so B's time includes the wait for A to release workers.

The machine has 2 cores, so "workers" are not machines: A's 4 workers share them, and in (c) A's 2 workers
and B's 2 workers share them, which gives A about half the CPU, as 2 of 4 machines would. In (b) B has the
machine to itself and so runs faster than it would on 2 of 4 machines; its time in (b) is a lower bound.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import _jobs
import _table

from apps.mlr.settings import THESIS_SGD

ARRIVAL_AT = 0.60


def a_job(tmp: str, name: str, config: dict, blas: str) -> _jobs.Job:
    return _jobs.Job(tmp, name, workers=4, servers=1, executors=16, config=config, blas_threads=blas)


def b_job(tmp: str, name: str, config: dict, blas: str) -> _jobs.Job:
    return _jobs.Job(tmp, name, workers=2, servers=1, executors=8, config=config, blas_threads=blas)


def sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def summary_of(doc: dict, job: _jobs.Job) -> dict:
    """The job's outcome, its elasticity events, and its live worker count over time (from --metrics)."""
    res = doc.get("result") or {}
    timeline, last = [], None
    for r in job.reports():
        if r.get("workers") != last:
            last = r.get("workers")
            timeline.append((r["t"], last))
    return {"state": doc["state"], "elapsed_s": doc["elapsed_s"], "tasks": doc["tasks_completed"],
            "test_accuracy": res.get("test_accuracy"), "workers_at_report": timeline,
            "events": [e for e in doc["events"] if e["kind"] in ("scale_in", "scale_out", "stop")]}


def uninterrupted(tmp: str, tag: str, a_cfg: dict, blas: str) -> dict:
    a = a_job(tmp, f"prio-a-alone-{tag}", a_cfg, blas).start()
    doc = a.wait(600)
    train = [r["t"] for r in a.reports() if "epoch" in r]
    return {"a_s": a.t_exit - a.t_submit, "a_train_s": train[-1] if train else doc["elapsed_s"],
            "a": summary_of(doc, a), "loadavg": a.load}


def kill_restart(tmp: str, tag: str, a_cfg: dict, b_cfg: dict, arrival_s: float, blas: str) -> dict:
    a1 = a_job(tmp, f"prio-a1-{tag}", a_cfg, blas).start()
    t_submit = a1.t_submit
    try:
        sleep_until(a1.driver_start_wall() + arrival_s)
        t_arrive = time.time()
        a1.ctl("stop")
    except BaseException:
        a1.kill()
        raise
    a1_doc = a1.wait(120)
    t_freed = a1.t_exit
    b = b_job(tmp, f"prio-b-kill-{tag}", b_cfg, blas).start()
    b_doc = b.wait(600)
    a2 = a_job(tmp, f"prio-a2-{tag}", a_cfg, blas).start()
    a2_doc = a2.wait(600)
    return {"a_s": a2.t_exit - t_submit, "b_s": b.t_exit - t_arrive, "b_wait_s": t_freed - t_arrive,
            "b_run_s": b.t_exit - b.t_submit, "a_first": summary_of(a1_doc, a1), "b": summary_of(b_doc, b),
            "a_restart": summary_of(a2_doc, a2), "arrival_s": t_arrive - t_submit,
            "loadavg": [a1.load, b.load, a2.load]}


def elastic(tmp: str, tag: str, a_cfg: dict, b_cfg: dict, arrival_s: float, blas: str) -> dict:
    a = a_job(tmp, f"prio-a-el-{tag}", a_cfg, blas).start()
    try:
        sleep_until(a.driver_start_wall() + arrival_s)
        t_arrive = time.time()
        cp_in = a.ctl("scale", "--workers", "2")  # returns once the released workers have exited
        t_freed = time.time()
        b = b_job(tmp, f"prio-b-el-{tag}", b_cfg, blas).start()
        b_doc = b.wait(600)
        cp_out = a.ctl("scale", "--workers", "4") if a.running() else None
    except BaseException:
        a.kill()
        raise
    a_doc = a.wait(600)
    return {"a_s": a.t_exit - a.t_submit, "b_s": b.t_exit - t_arrive, "b_wait_s": t_freed - t_arrive,
            "b_run_s": b.t_exit - b.t_submit, "a": summary_of(a_doc, a), "b": summary_of(b_doc, b),
            "arrival_s": t_arrive - a.t_submit, "scale_in_said": cp_in.stdout.strip(),
            "scale_out_said": cp_out.stdout.strip() if cp_out else "A had finished before B",
            "loadavg": [a.load, b.load]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/priority.quick.json)")
    ap.add_argument("--repeats", type=int, default=1, help="rounds of the three scenarios (default 1)")
    ap.add_argument("--blas-threads", default="1", help="BLAS threads per process ('default': the library's)")
    args = ap.parse_args()
    common = {**THESIS_SGD, "synthetic": 1, "n_test": 20_000, "d": 500, "classes": 100, "staleness": 2}
    a_cfg = {**common, "n": 100_000 if args.quick else 200_000, "epochs": 10 if args.quick else 30, "seed": 0}
    b_cfg = {**common, "n": 50_000 if args.quick else 100_000, "epochs": 6 if args.quick else 20, "seed": 1}

    rounds = []
    with tempfile.TemporaryDirectory(prefix="litz-bench-priority-") as tmp:
        for i in range(args.repeats):
            tag = f"{os.getpid()}-{i}"
            alone = uninterrupted(tmp, tag, a_cfg, args.blas_threads)
            arrival = ARRIVAL_AT * alone["a_train_s"]
            print(f"round {i + 1}: (a) A uninterrupted {alone['a_s']:.1f} s (training {alone['a_train_s']:.1f} s); "
                  f"B arrives when A has trained {arrival:.1f} s", flush=True)
            kill = kill_restart(tmp, tag, a_cfg, b_cfg, arrival, args.blas_threads)
            print(f"round {i + 1}: (b) kill+restart: A {kill['a_s']:.1f} s, B {kill['b_s']:.1f} s "
                  f"(waited {kill['b_wait_s']:.2f} s, ran {kill['b_run_s']:.1f} s)", flush=True)
            el = elastic(tmp, tag, a_cfg, b_cfg, arrival, args.blas_threads)
            print(f"round {i + 1}: (c) elastic: A {el['a_s']:.1f} s, B {el['b_s']:.1f} s "
                  f"(waited {el['b_wait_s']:.2f} s, ran {el['b_run_s']:.1f} s); {el['scale_in_said']!r}", flush=True)
            rounds.append({"uninterrupted": alone, "kill_restart": kill, "elastic": el})

    def med(scenario: str, key: str) -> float:
        xs = sorted(r[scenario][key] for r in rounds)
        return xs[len(xs) // 2]

    a_alone, a_kill, a_el = med("uninterrupted", "a_s"), med("kill_restart", "a_s"), med("elastic", "a_s")
    b_kill, b_el = med("kill_restart", "b_s"), med("elastic", "b_s")
    b_wait_kill, b_wait_el = med("kill_restart", "b_wait_s"), med("elastic", "b_wait_s")
    met = a_el < a_kill
    doc = {"target": "A completes sooner scaling in than killed and restarted (thesis: 120 vs 190 min; "
                     "B 31 vs 30 min)", "a_config": a_cfg, "b_config": b_cfg, "arrival_at": ARRIVAL_AT,
           "blas_threads": args.blas_threads, "met": met,
           "median": {"a_uninterrupted_s": a_alone, "a_kill_restart_s": a_kill, "a_elastic_s": a_el,
                      "b_kill_restart_s": b_kill, "b_elastic_s": b_el, "b_wait_kill_s": b_wait_kill,
                      "b_wait_elastic_s": b_wait_el, "a_elastic_vs_kill": a_el / a_kill,
                      "a_elastic_vs_uninterrupted": a_el / a_alone, "b_elastic_vs_kill": b_el / b_kill},
           "rounds": rounds}
    path = _table.write_result("priority", doc, quick=args.quick)
    print(f"A: uninterrupted {a_alone:.1f} s, kill+restart {a_kill:.1f} s, elastic {a_el:.1f} s "
          f"({a_el / a_kill:.2f}x kill+restart, {a_el / a_alone:.2f}x uninterrupted); "
          f"B: kill+restart {b_kill:.1f} s, elastic {b_el:.1f} s ({b_el / b_kill:.2f}x)")
    print(f"-> {path}")
    if not args.quick:
        _table.update_rows({"priority": [
            f"scale-in: A {a_el:.1f} s ({a_el / a_alone:.2f}x uninterrupted {a_alone:.1f} s), "
            f"B {b_el:.1f} s (waited {b_wait_el:.2f} s)",
            f"kill + restart: A {a_kill:.1f} s, B {b_kill:.1f} s (waited {b_wait_kill:.2f} s)",
            f"A {a_el / a_kill:.2f}x, B {b_el / b_kill:.2f}x", "A sooner than kill + restart",
            _table.yes_no(met), _table.today()]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
