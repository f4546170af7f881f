"""Start-up cost of a local job: children forked from a fork server against fresh interpreters.

``litz run`` starts its workers and servers as forks of a fork server, a copy of the launcher made before
the job starts (``litz/forkserver.py``); ``LITZ_SPAWN=exec`` starts each as a fresh interpreter
(``python -m litz.cli.litz worker ...``), which imports litz, numpy, ZeroMQ and the app on its own. That
is the baseline, measured in the same run.

Two jobs, each with 2 workers and 1 server:

* ``noop``: ``tests/apps/noop.py`` with one task: nothing but start-up and shutdown;
* ``hdbscan``: ``apps.hdbscan`` on 5 000 synthetic points in 10 dimensions (numba kernels, from the
  on-disk cache, which an untimed run builds first): start-up with a heavy app.

Each is timed two ways:

* **in a warm launcher**: ``litz.run`` called from this process, which has imported litz and the app (a
  notebook, a script that runs several jobs, a test suite);
* **from the command line**: ``litz run ...`` as a new process, its own interpreter start included (what
  a user at a shell waits for).

and a third way:

* **in a threaded launcher**: ``litz.run`` from this process while it runs a thread of its own (a notebook's, or
  an etcd client's gRPC threads). Forking it is unsafe, so its fork server is a fresh interpreter, kept for its
  next jobs (``shared``); the baseline ``per-job`` ends it before each job, which is what every job paid before
  it was kept (a fresh fork server per job), and ``exec`` starts fresh interpreters.

Modes alternate within each repeat; the table shows medians and the ratio fork / exec (shared / per-job).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

import _table

import litz
from litz import forkserver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = {
    "noop": (os.path.join(ROOT, "tests", "apps", "noop.py"), {"tasks": 1}),
    "hdbscan": ("apps.hdbscan", {"synthetic": 1, "n": 5000, "d": 10, "clusters": 10, "noise": 0.1}),
}
MODES = ("fork", "exec")
THREADED_MODES = ("shared", "per-job", "exec")


def in_launcher(app: str, config: dict, mode: str) -> float:
    saved = os.environ.get("LITZ_SPAWN")
    os.environ["LITZ_SPAWN"] = mode
    try:
        t = time.perf_counter()
        litz.run(app, workers=2, servers=1, config=config, progress=False)
        return time.perf_counter() - t
    finally:
        if saved is None:
            os.environ.pop("LITZ_SPAWN")
        else:
            os.environ["LITZ_SPAWN"] = saved


def in_threaded_launcher(app: str, config: dict, mode: str) -> float:
    """``litz.run`` while this process runs a thread: ``shared`` fork server, a fresh one ``per-job``, or ``exec``."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        if mode == "per-job":
            forkserver.close_shared()
        return in_launcher(app, config, "exec" if mode == "exec" else "fork")
    finally:
        stop.set()
        thread.join()


def from_cli(app: str, config: dict, mode: str) -> float:
    args = [f"{k}={v}" for k, v in config.items()]
    cmd = [sys.executable, "-m", "litz.cli.litz", "run", app, "--no-progress", "--config", *args]
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "LITZ_SPAWN": mode}, capture_output=True, text=True,
                          timeout=300)
    took = time.perf_counter() - t
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/startup.quick.json)")
    ap.add_argument("--repeats", type=int, help="runs of each job, way and mode (default 7, quick 2)")
    args = ap.parse_args()
    repeats = args.repeats or (2 if args.quick else 7)
    loadavg_start = os.getloadavg()
    for app, config in JOBS.values():  # builds numba's cache; the launcher imports the apps
        litz.run(app, workers=2, servers=1, config=config, progress=False)
    times: dict[str, dict[str, dict[str, list[float]]]] = {
        job: {"launcher": {m: [] for m in MODES}, "cli": {m: [] for m in MODES},
              "threaded": {m: [] for m in THREADED_MODES}} for job in JOBS}
    for i in range(repeats):
        for job, (app, config) in JOBS.items():
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                times[job]["launcher"][mode].append(in_launcher(app, config, mode))
                times[job]["cli"][mode].append(from_cli(app, config, mode))
            for mode in (THREADED_MODES if i % 2 == 0 else THREADED_MODES[::-1]):
                times[job]["threaded"][mode].append(in_threaded_launcher(app, config, mode))
        print(f"repeat {i + 1}/{repeats}: " + ", ".join(
            f"{job} {way} {mode} {v[-1]:.2f} s" for job in JOBS for way, modes in times[job].items()
            for mode, v in modes.items()), flush=True)
    forkserver.close_shared()
    medians = {job: {way: {mode: round(statistics.median(v), 4) for mode, v in ways.items()}
                     for way, ways in per.items()} for job, per in times.items()}
    doc = {"benchmark": "startup", "quick": args.quick, **_table.machine(), **_table.litz_tree(),
           "repeats": repeats, "loadavg_start": loadavg_start, "jobs": {k: v[1] for k, v in JOBS.items()},
           "times_s": times, "median_s": medians}
    path = _table.write_result("startup", doc, quick=args.quick)
    print(f"wrote {path}")
    for job in JOBS:
        m = medians[job]
        print(f"{job}: launcher fork {m['launcher']['fork']:.2f} s vs exec {m['launcher']['exec']:.2f} s; "
              f"command line fork {m['cli']['fork']:.2f} s vs exec {m['cli']['exec']:.2f} s; threaded launcher "
              f"shared {m['threaded']['shared']:.2f} s vs per-job {m['threaded']['per-job']:.2f} s vs exec "
              f"{m['threaded']['exec']:.2f} s")
    if not args.quick:
        rows = {}
        for job in JOBS:
            m = medians[job]
            ratio, shell_ratio = m["launcher"]["fork"] / m["launcher"]["exec"], m["cli"]["fork"] / m["cli"]["exec"]
            rows[f"startup {job}"] = [
                f"in a warm launcher: {m['launcher']['fork']:.2f} s; `litz run` from a shell: {m['cli']['fork']:.2f} s"
                " (children forked from the fork server)",
                f"LITZ_SPAWN=exec (fresh interpreters): {m['launcher']['exec']:.2f} s; from a shell "
                f"{m['cli']['exec']:.2f} s",
                f"{ratio:.2f}x (shell: {shell_ratio:.2f}x)",
                "none set", "-", _table.today()]
            t = m["threaded"]
            rows[f"startup {job}, threaded launcher"] = [
                f"fork server kept for the launcher's jobs: {t['shared']:.2f} s",
                f"a fresh fork server per job (before): {t['per-job']:.2f} s; LITZ_SPAWN=exec: {t['exec']:.2f} s",
                f"{t['shared'] / t['per-job']:.2f}x", "none set", "-", _table.today()]
        _table.update_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
