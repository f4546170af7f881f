"""Micro-task throughput: no-op tasks through the whole Litz path vs the same pattern on Ray actors.

Litz: ``bench/apps/noop.py`` with 2 workers and 1 server; the driver keeps ``--inflight`` tasks in flight
and dispatches one new task per completion (round-robin over the executors) until ``--tasks`` have run.
Ray: 2 actors with a no-op method; the driver keeps the same number of calls in flight and, per
completion reported by ``ray.wait``, submits one new call (alternating actors).

Rates are driver-side: tasks / (time from first dispatch to last completion); process start-up is
excluded on both sides. Each side runs ``--repeats`` times; the table uses the medians.
Target: Litz >= 20,000 tasks/s and >= 3x Ray.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import _table

import litz

HERE = os.path.dirname(os.path.abspath(__file__))
APP = os.path.join(HERE, "apps", "noop.py")


def run_litz(tasks: int, inflight: int, **run: object) -> dict:
    """One no-op job (``run``: further ``litz.run`` arguments, such as ``placement``)."""
    result = litz.run(APP, workers=2, servers=1, config={"tasks": tasks, "inflight": inflight},
                      name=f"bench-throughput-{os.getpid()}", progress=False, **run)
    return result


def run_ray(actors: list, tasks: int, inflight: int) -> dict:
    import ray

    pending, nxt, dispatched, done = [], 0, 0, 0
    t0 = time.perf_counter()
    for _ in range(min(inflight, tasks)):
        pending.append(actors[nxt].noop.remote())
        nxt, dispatched = (nxt + 1) % len(actors), dispatched + 1
    while done < tasks:
        ready, pending = ray.wait(pending, num_returns=1)
        if pending:  # also take every other call that is already complete, without blocking
            more, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
            ready += more
        done += len(ready)
        for _ in ready:
            if dispatched < tasks:
                pending.append(actors[nxt].noop.remote())
                nxt, dispatched = (nxt + 1) % len(actors), dispatched + 1
    seconds = time.perf_counter() - t0
    return {"tasks": tasks, "seconds": seconds, "rate": tasks / seconds, "inflight": inflight}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/throughput.quick.json)")
    ap.add_argument("--tasks", type=int, help="Litz tasks per run (default 200000, quick 20000)")
    ap.add_argument("--ray-tasks", type=int, help="Ray tasks per run (default 50000, quick 5000)")
    ap.add_argument("--inflight", type=int, default=2000, help="tasks kept in flight (default 2000)")
    ap.add_argument("--repeats", type=int, help="runs per side (default 3, quick 1)")
    args = ap.parse_args()
    tasks = args.tasks or (20_000 if args.quick else 200_000)
    ray_tasks = args.ray_tasks or (5_000 if args.quick else 50_000)
    repeats = args.repeats or (1 if args.quick else 3)

    litz_runs = []
    for i in range(repeats):
        r = run_litz(tasks, args.inflight)
        litz_runs.append(r)
        print(f"litz run {i + 1}/{repeats}: {r['rate']:,.0f} tasks/s ({r['tasks']} tasks, {r['seconds']:.2f} s)",
              flush=True)

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote
        class Noop:
            def noop(self):
                return None

        actors = [Noop.remote() for _ in range(2)]
        ray.get([a.noop.remote() for a in actors])  # actors started
        run_ray(actors, min(ray_tasks, 2000), args.inflight)  # warm-up
        ray_runs = []
        for i in range(repeats):
            r = run_ray(actors, ray_tasks, args.inflight)
            ray_runs.append(r)
            print(f"ray run {i + 1}/{repeats}: {r['rate']:,.0f} tasks/s ({r['tasks']} tasks, {r['seconds']:.2f} s)",
                  flush=True)
        for a in actors:
            ray.kill(a)
    finally:
        ray.shutdown()

    litz_rate = statistics.median(r["rate"] for r in litz_runs)
    ray_rate = statistics.median(r["rate"] for r in ray_runs)
    ratio = litz_rate / ray_rate
    met = litz_rate >= 20_000 and ratio >= 3.0
    doc = {"litz_tasks_per_s": litz_rate, "ray_tasks_per_s": ray_rate, "ratio": ratio,
           "target": "litz >= 20000 tasks/s and >= 3x ray", "met": met, "inflight": args.inflight,
           "litz_runs": litz_runs, "ray_runs": ray_runs, "workers": 2, "servers": 1, "ray_actors": 2}
    path = _table.write_result("throughput", doc, quick=args.quick)
    print(f"litz {litz_rate:,.0f} tasks/s, ray {ray_rate:,.0f} tasks/s, ratio {ratio:.2f}x "
          f"(target >= 20,000/s and >= 3x: {'met' if met else 'MISSED'}) -> {path}")
    if not args.quick:
        _table.update_rows({"throughput": [
            f"{litz_rate:,.0f} tasks/s", f"Ray actors {ray_rate:,.0f} tasks/s", f"{ratio:.1f}x",
            ">= 20,000 tasks/s and >= 3x", _table.yes_no(met), _table.today()]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
