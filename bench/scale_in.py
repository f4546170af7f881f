"""Scale-in latency (issue 3, thesis §4.5.2): from ``litzctl scale`` to the exit of the last released process.

Each round runs one ``litz run apps.mlr`` job with 4 workers, 3 servers, 16 executors and 64 shards
(synthetic 65 536 x 1000, 250 classes: a 1 MB model in 64 row blocks, so every server holds about 330 kB;
quick: 100 classes). Once it has trained a few seconds the script runs, with the job still training,

 1. ``litzctl --name JOB scale --workers 2``: 8 executors move off the two newest workers (state and
    buffered tasks travel; input data is dropped and re-loaded by ``load_input`` at the destination);
 2. once those moves have finished (``status --json`` shows nothing moving) and one more second has
    passed, ``litzctl --name JOB scale --servers 1``: about 43 shards move off two servers, which forward
    requests until every worker has the new shard map;

then stops the job (``litzctl stop``). For each operation:

 * **latency (external)**: from the moment this script starts ``litzctl scale`` to the exit of the last
   released process (the ids litzctl names), watched by pid every 5 ms (``/proc``; a zombie counts as
   exited). This includes litzctl's own start-up and the master's polling of requests. litzctl
   reports "released" when the processes have left the registry, which is before they have exited;
 * ``litzctl``'s own figure (``released ... in X s``, from its request to the processes leaving the
   registry) and the time the ``litzctl`` command took;
 * the ``scale_in`` event of the ``--output`` document: move duration, bytes, executors and shards moved.

Target (issue 3): latency <= 0.5 s + bytes / 1 GB/s. Bytes = the event's bytes (executor state and shards
the runtime moved; should an event report 0 for executor moves, an in-process estimate is added: the
cloudpickle size of one executor's state without input, times the executors moved). Medians over
``--repeats`` rounds.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time

import _jobs
import _table

from apps.mlr.settings import THESIS_SGD

WORKERS, SERVERS, EXECUTORS = 4, 3, 16
OPS = (("workers", "4->2", ("--workers", "2")), ("servers", "3->1", ("--servers", "1")))


def executor_state_bytes(config: dict) -> tuple[int, float]:
    """What one MLR executor's moved state weighs on the wire (no input data), and how long its
    ``load_input`` takes (what a destination does for each executor it receives on scale-in), here."""
    import cloudpickle

    from litz.appload import load_app
    from litz.worker import executor_state

    cls = load_app("apps.mlr").executor_cls
    ex = cls.__new__(cls)
    ex.executor_id, ex.num_executors, ex.config = 0, EXECUTORS, dict(config)
    t0 = time.perf_counter()
    ex.load_input()
    load_s = time.perf_counter() - t0
    return len(cloudpickle.dumps(executor_state(ex, False), protocol=5)), load_s


def scale_in(job: _jobs.Job, flag: tuple, start_wall: float) -> dict:
    st = job.status()
    pids = {p["id"]: p["pid"] for p in st["workers"] + st["servers"]}
    watcher = _jobs.ExitWatcher(pids.values())
    t0 = time.time()
    cp = job.ctl("scale", *flag, "--timeout", "120")
    t_ret = time.time()
    m = re.search(r"draining ([\w, -]+)", cp.stdout)
    leaving = [i.strip() for i in m.group(1).split(",")] if m else []
    exited = watcher.wait([pids[i] for i in leaving if i in pids], timeout=60)
    exits = watcher.stop()
    released = {i: round(exits[pids[i]] - t0, 4) if pids.get(i) in exits else None for i in leaving}
    m = re.search(r"released .* in ([0-9.]+) s", cp.stdout)
    latency = max(released.values()) if released and exited else None
    return {"t_request_job": round(t0 - start_wall, 4), "latency_s": latency, "released": released,
            "litzctl_reported_s": float(m.group(1)) if m else None, "litzctl_wall_s": round(t_ret - t0, 4),
            "exit_after_litzctl_returned_s": round(latency - (t_ret - t0), 4) if latency else None,
            "litzctl_said": cp.stdout.strip(), "others_exited": sorted(i for i, p in pids.items()
                                                                       if p in exits and i not in leaving)}


def run_round(tmp: str, name: str, config: dict, blas: str, warmup_s: float) -> dict:
    job = _jobs.Job(tmp, name, workers=WORKERS, servers=SERVERS, executors=EXECUTORS, config=config,
                    blas_threads=blas).start()
    ops = {}
    try:
        start = job.driver_start_wall()
        time.sleep(max(0.0, start + warmup_s - time.time()))
        for what, _, flag in OPS:
            ops[what] = scale_in(job, flag, start)
            job.wait_status(lambda s: not s["moving"]["executors"] and not s["moving"]["shards"], timeout=120)
            time.sleep(1.0)
        job.ctl("stop")
    except BaseException:
        job.kill()
        raise
    doc = job.wait(300)
    ins = _jobs.events(doc, "scale_in")
    for what, _, _ in OPS:
        op = ops[what]
        ev = [e for e in ins if set(op["released"]) <= set(e["processes"])]
        op["event"] = ev[0] if ev else None
        op["event_shared"] = bool(ev) and set(ev[0]["processes"]) != set(op["released"])
        if ev:  # the master picks the request up at ev.t (it polls for requests)
            op["pickup_s"] = round(ev[0]["t"] - op["t_request_job"], 4)
            if op["latency_s"] is not None:
                op["from_pickup_s"] = round(op["latency_s"] - op["pickup_s"], 4)
    return {"ops": ops, "events": doc["events"], "state": doc["state"], "tasks": doc["tasks_completed"],
            "reports": len(job.reports())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/scale_in.quick.json)")
    ap.add_argument("--repeats", type=int, help="jobs, each scaling in workers then servers (default 3, quick 1)")
    ap.add_argument("--classes", type=int, help="MLR classes: model = 1000 x classes float32 (default 250, "
                    "quick 100)")
    ap.add_argument("--blas-threads", default="1", help="BLAS threads per process ('default': the library's)")
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    classes = args.classes or (100 if args.quick else 250)
    config = {**THESIS_SGD, "synthetic": 1, "n": 65_536, "n_test": 4096, "d": 1000, "classes": classes, "blocks": 64,
              "epochs": 1000, "staleness": 2, "seed": 0}
    state_bytes, load_input_s = executor_state_bytes(config)
    model_bytes = config["d"] * classes * 4 + classes * 4

    rounds = []
    with tempfile.TemporaryDirectory(prefix="litz-bench-scale-in-") as tmp:
        for i in range(repeats):
            r = run_round(tmp, f"si-{os.getpid()}-{i}", config, args.blas_threads, warmup_s=3.0)
            for what, label, _ in OPS:
                op = r["ops"][what]
                ev = op["event"] or {}
                op["bytes"] = ev.get("bytes", 0) + (state_bytes * ev.get("executors_moved", 0)
                                                   if ev.get("bytes", 0) == 0 else 0)
                op["target_s"] = 0.5 + op["bytes"] / 1e9
                op["met"] = op["latency_s"] is not None and op["latency_s"] <= op["target_s"]
                print(f"round {i + 1}/{repeats} {what} {label}: last exit {op['latency_s']} s after litzctl start "
                      f"(litzctl says {op['litzctl_reported_s']} s, command {op['litzctl_wall_s']} s); event: "
                      f"moves {ev.get('duration_s')} s, picked up after {op.get('pickup_s')} s, last exit "
                      f"{op.get('from_pickup_s')} s after pickup, "
                      f"{ev.get('executors_moved')} executors, {ev.get('shards_moved')} shards, "
                      f"{ev.get('bytes')} bytes reported, {op['bytes']} counted; target {op['target_s']:.3f} s",
                      flush=True)
            rounds.append(r)

    summary = {}
    for what, label, _ in OPS:
        ops = [r["ops"][what] for r in rounds]

        def med(key: str, ops=ops) -> float | None:
            xs = [o[key] for o in ops if o.get(key) is not None]
            return statistics.median(xs) if xs else None

        summary[what] = {"label": label, "latency_s": med("latency_s"), "litzctl_reported_s": med("litzctl_reported_s"),
                         "litzctl_wall_s": med("litzctl_wall_s"), "pickup_s": med("pickup_s"), "bytes": med("bytes"),
                         "from_pickup_s": med("from_pickup_s"),
                         "move_s": statistics.median([o["event"]["duration_s"] for o in ops if o["event"]] or [0.0]),
                         "exit_after_litzctl_returned_s": med("exit_after_litzctl_returned_s"),
                         "target_s": med("target_s")}
        s = summary[what]
        s["met"] = s["latency_s"] is not None and s["latency_s"] <= s["target_s"]
    met = all(s["met"] for s in summary.values())
    doc = {"target": "scale-in latency (litzctl scale -> last released process exits) <= 0.5 s + bytes / 1 GB/s",
           "config": config, "workers": WORKERS, "servers": SERVERS, "executors": EXECUTORS,
           "blas_threads": args.blas_threads, "model_bytes": model_bytes, "executor_state_bytes": state_bytes,
           "load_input_s_per_executor": load_input_s,
           "met": met, "summary": summary,
           "note": "bytes are the scale_in event's; only if an event reported 0 are executors_moved x "
                   "executor_state_bytes (cloudpickle size, no input data) added",
           "rounds": rounds}
    path = _table.write_result("scale_in", doc, quick=args.quick)
    rows = {}
    for what, s in summary.items():
        print(f"{what} {s['label']}: median latency {s['latency_s']:.3f} s (litzctl {s['litzctl_reported_s']:.3f} s; "
              f"request picked up after {s['pickup_s']:.3f} s, last exit {s['from_pickup_s']:.3f} s after that), "
              f"moves {s['move_s']:.3f} s, {s['bytes'] / 1e6:.2f} MB; target {s['target_s']:.3f} s: "
              f"{'met' if s['met'] else 'MISSED'}")
        rows[f"scale_in {what} {s['label']}"] = [
            f"{s['latency_s']:.2f} s to last exit ({s['from_pickup_s']:.2f} s after the master picked the request up; "
            f"litzctl says {s['litzctl_reported_s']:.2f} s; moves {s['move_s']:.2f} s)",
            f"{s['bytes'] / 1e6:.2f} MB moved (model {model_bytes / 1e6:.1f} MB)",
            f"{s['latency_s'] / s['target_s']:.2f}x target", f"<= 0.5 s + bytes / 1 GB/s = {s['target_s']:.2f} s",
            _table.yes_no(s["met"]), _table.today()]
    print(f"-> {path}")
    if not args.quick:
        _table.update_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
