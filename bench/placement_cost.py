"""What ``--placement speed`` (with stealing) costs when there is no straggler, against ``even``, in one run.

Two workloads where any per-task cost of measuring speeds or counting tasks for stealing would show:
 * ``throughput``: ``bench/throughput.py``'s no-op job (200 000 tasks, 2 000 in flight, 2 workers, 1 server):
   driver-side tasks per second;
 * ``overpartition``: ``bench/overpartition.py``'s MLR job at its widest (16 executors per worker, 2 workers,
   SSP staleness 2, the app's default task size): mean epoch time over epochs 2..N.
The policies alternate in ``--repeats`` rounds, in the order even, speed then speed, even (ABBA), so load that
drifts over the run falls on both; the table takes the medians and the ratio speed / even (for throughput, of the
time per task). A throughput job lasts about a second, so its rate moves by a few percent from job to job: each
round runs ``--throughput-jobs`` of them per policy (default 3), enough samples for a median that resolves 2 %.
Rebalances and steals in the speed runs are counted: on equal workers there should be none.
Target: speed costs at most 2 % (ratio <= 1.02).
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
import overpartition
import throughput
from straggler import FREE_COST

from apps.mlr.settings import THESIS_SGD

POLICIES = ("even", "speed")


def run_throughput(tasks: int, policy: str) -> dict:
    """One no-op job, with the rebalances and steals of its job log."""
    with tempfile.TemporaryDirectory(prefix="litz-bench-") as tmp:
        out = os.path.join(tmp, "out.json")
        r = throughput.run_litz(tasks, 2000, placement=policy, output=out)
        with open(out) as f:
            doc = json.load(f)
    return {**r, "rebalances": len(_jobs.events(doc, "rebalance")), "steals": len(_jobs.events(doc, "steal"))}


def ordered(pair: int) -> tuple[str, ...]:
    """The policies of the ``pair``-th pair of jobs: even first, then speed first, and so on (ABBA)."""
    return POLICIES if pair % 2 == 0 else POLICIES[::-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/placement_cost.quick.json)")
    ap.add_argument("--repeats", type=int, help="rounds (default 5, quick 1)")
    ap.add_argument("--throughput-jobs", type=int, help="throughput jobs per policy in a round (default 3, quick 1)")
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 5)
    throughput_jobs = args.throughput_jobs or (1 if args.quick else 3)
    tasks = 20_000 if args.quick else 200_000
    mlr = {**THESIS_SGD, "synthetic": 1, "n": 50_000 if args.quick else 200_000, "n_test": 20_000,
           "epochs": 3 if args.quick else 10, "staleness": 2, "seed": 0}

    runs: dict[str, dict[str, list]] = {w: {p: [] for p in POLICIES} for w in ("throughput", "overpartition")}
    pairs = 0
    for i in range(repeats):
        for _ in range(throughput_jobs):
            for policy in ordered(pairs):
                r = run_throughput(tasks, policy)
                runs["throughput"][policy].append(r)
                print(f"round {i + 1}/{repeats} throughput    {policy:5s}: {r['rate']:,.0f} tasks/s, "
                      f"{r['rebalances']} rebalances, {r['steals']} steals", flush=True)
            pairs += 1
        for policy in ordered(i):
            r = overpartition.run_mlr(16 * overpartition.WORKERS, mlr, placement=policy)
            runs["overpartition"][policy].append(r)
            print(f"round {i + 1}/{repeats} overpartition {policy:5s}: epoch {r['epoch_s'] * 1e3:.1f} ms, "
                  f"{r['rebalances']} rebalances, {r['steals']} steals", flush=True)

    rate = {p: statistics.median(r["rate"] for r in runs["throughput"][p]) for p in POLICIES}
    epoch = {p: statistics.median(r["epoch_s"] for r in runs["overpartition"][p]) for p in POLICIES}
    moves = {w: {k: sum(r[k] for r in runs[w]["speed"]) for k in ("rebalances", "steals")} for w in runs}
    moved = {w: f" (median of {len(runs[w]['speed'])}), {moves[w]['rebalances']} rebalances, "
                f"{moves[w]['steals']} steals" for w in runs}
    ratios = {"throughput": rate["even"] / rate["speed"], "overpartition": epoch["speed"] / epoch["even"]}
    met = all(v <= FREE_COST for v in ratios.values())
    doc = {"target": f"speed / even <= {FREE_COST} with no straggler", "met": met, "ratios": ratios,
           "throughput_tasks_per_s": rate, "overpartition_epoch_s": epoch, "runs": runs, "mlr_config": mlr,
           "tasks": tasks, "throughput_jobs_per_round": throughput_jobs,
           "moves_in_speed_jobs": moves}
    path = _table.write_result("placement_cost", doc, quick=args.quick)
    print(f"speed / even: throughput {ratios['throughput']:.3f}x ({rate['speed']:,.0f} vs {rate['even']:,.0f} "
          f"tasks/s), overpartition {ratios['overpartition']:.3f}x ({epoch['speed'] * 1e3:.1f} vs "
          f"{epoch['even'] * 1e3:.1f} ms/epoch); target <= {FREE_COST}x: {'met' if met else 'MISSED'} -> {path}")
    if not args.quick:
        _table.update_rows({
            "placement_cost (throughput)": [f"speed: {rate['speed']:,.0f} tasks/s{moved['throughput']}",
                                            f"even: {rate['even']:,.0f} tasks/s", f"{ratios['throughput']:.3f}x",
                                            f"<= {FREE_COST}x", _table.yes_no(ratios["throughput"] <= FREE_COST),
                                            _table.today()],
            "placement_cost (overpartition)": [f"speed: {epoch['speed'] * 1e3:.1f} ms/epoch{moved['overpartition']}",
                                               f"even: {epoch['even'] * 1e3:.1f} ms/epoch",
                                               f"{ratios['overpartition']:.3f}x", f"<= {FREE_COST}x",
                                               _table.yes_no(ratios["overpartition"] <= FREE_COST), _table.today()]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
