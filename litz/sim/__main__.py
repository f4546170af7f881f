"""python -m litz.sim: run seeded schedules of a simulated job and check every one."""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections import Counter

from .schedule import EVENTS, OUTCOMES, Outcome, run_schedule


def _run_range(args: tuple[int, int, tuple[str, ...]]) -> list[Outcome]:
    start, count, events, placement = args
    return [run_schedule(seed, events, placement=placement) for seed in range(start, start + count)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m litz.sim",
        description="Run N seeded schedules of a simulated Litz job (real master, worker and server code on "
                    "simulated time and network) and check the consistency rule, exact totals, executor state "
                    "and input, and that every job ends. Prints one line per violation with the seed that "
                    "replays it (--seed S --seeds 1), then a summary; exits 1 on any violation.")
    ap.add_argument("--seeds", type=int, default=100, help="how many schedules (default 100)")
    ap.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--events", default=",".join(EVENTS),
                    help=f"comma-separated event kinds to draw from (default: {','.join(EVENTS)})")
    ap.add_argument("--jobs", type=int, default=1, help="processes to run schedules in (default 1)")
    ap.add_argument("--placement", choices=("even", "speed"), help="the executor placement policy of every "
                    "schedule (default: each seed draws one; under speed the master is fed random speeds)")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per schedule")
    ap.add_argument("--digest", action="store_true", help="one line per schedule: a digest of every message "
                    "delivered (its time, sender, receiver and size, in order) and what the schedule ended with; "
                    "a seed prints the same line in every run and every interpreter")
    args = ap.parse_args(argv)
    events = tuple(e for e in args.events.split(",") if e)
    bad = [e for e in events if e not in EVENTS]
    if bad or not events or args.seeds < 1 or args.jobs < 1:
        ap.error(f"unknown event kind(s) {bad}; known: {', '.join(EVENTS)}" if bad or not events
                 else "--seeds and --jobs must be >= 1")
    t0 = time.perf_counter()
    chunk = max(1, min(50, args.seeds // (args.jobs * 4) or 1))
    ranges = [(s, min(chunk, args.seed + args.seeds - s), events, args.placement)
              for s in range(args.seed, args.seed + args.seeds, chunk)]
    totals: Counter = Counter()
    failed = runs = tasks = 0
    if args.jobs > 1:
        pool = multiprocessing.get_context("fork").Pool(args.jobs)
        results = pool.imap(_run_range, ranges)
    else:
        pool, results = None, map(_run_range, ranges)
    try:
        for outcomes in results:
            for o in outcomes:
                runs += 1
                tasks += o.tasks
                totals.update(o.events)
                if args.verbose:
                    print(f"seed {o.seed}: {o.sim_s:.2f} simulated s, {o.tasks} tasks, {o.messages} messages, "
                          f"events {dict(o.events)}, {len(o.violations)} violation(s)", flush=True)
                if args.digest:
                    print(f"seed {o.seed}: digest {o.digest}, {o.sim_s!r} simulated s, {o.tasks} tasks, "
                          f"{o.messages} messages, events {sorted(o.events.items())}, {len(o.violations)} "
                          "violation(s)", flush=True)
                if args.verbose and o.log:
                    print("  " + o.log.strip().replace("\n", "\n  "), flush=True)
                for v in o.violations:
                    print(f"seed {o.seed}: {v}", flush=True)
                failed += bool(o.violations)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    kinds = ", ".join(f"{k} {totals[k]}" for k in EVENTS if k in events)
    led = ", ".join(f"{k} {totals[k]}" for k in OUTCOMES)
    print(f"litz.sim: {runs} schedules, {tasks} tasks, events: {kinds} (led to {led}); {failed} with violations "
          f"({time.perf_counter() - t0:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
