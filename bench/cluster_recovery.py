"""How fast a cluster-mode job notices a killed worker and runs again: connection watch vs leases.

Cluster mode, for real: an etcd server, and ``litz master apps.mlr``, two ``litz worker`` and one ``litz
server`` started as separate processes (no launcher watches them, as on several machines). MLR on synthetic
200 000 x 500, 100 classes, 10 epochs (quick: 100 000 rows, 6 epochs), 8 executors, a checkpoint every
second. Once the job has taken its first checkpoint, one worker is SIGKILLed and the job recovers onto the
other one. Two ways to notice the loss, alternated in every round:

 * **connection** (Litz's default): the master's connection to the worker drops and is not back within
   0.3 s;
 * **lease** (the baseline, ``LITZ_CONNECTION_WATCH=0``): only the worker's etcd lease (TTL 3 s) lapsing.

Per run: ``detect_s`` = the recovery's start (its event's time minus its duration) minus the kill, on the
job's clock (``--metrics`` rows carry wall time and job time); ``recovery_s`` = the recovery's own duration;
``kill_to_running_s`` = both; and how the recovery event says the loss was noticed. The ratio in the table
is the median detection time with the connection watch over the lease's.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import _jobs
import _table

from apps.mlr.settings import THESIS_SGD

WORKERS, EXECUTORS = 2, 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_etcd(tmp: str) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("etcd")
    if not binary:
        raise SystemExit("cluster_recovery: etcd is not installed (apt-get install etcd-server)")
    client, peer = free_port(), free_port()
    proc = subprocess.Popen([binary, "--data-dir", os.path.join(tmp, "etcd"), "--name", "bench",
                             "--listen-client-urls", f"http://127.0.0.1:{client}",
                             "--advertise-client-urls", f"http://127.0.0.1:{client}",
                             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-cluster", f"bench=http://127.0.0.1:{peer}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    endpoint = f"127.0.0.1:{client}"
    from litz.membership.etcdkv import EtcdKV

    deadline = time.time() + 30
    while True:
        try:
            EtcdKV(endpoint, timeout=1.0).close()
            return proc, endpoint
        except Exception:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise
            time.sleep(0.2)


def end(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def status(etcd: str, name: str, env: dict) -> dict | None:
    cp = subprocess.run([sys.executable, "-m", "litz.cli.litzctl", "--etcd", etcd, "--name", name, "status",
                         "--json"], cwd=_jobs.REPO, env=env, capture_output=True, text=True, timeout=30)
    return json.loads(cp.stdout) if cp.returncode == 0 else None


def run(tmp: str, etcd: str, name: str, config: dict, watch: bool) -> dict:
    env = _jobs.job_env(os.path.join(tmp, "home"))
    env["LITZ_CONNECTION_WATCH"] = "1" if watch else "0"
    out, metrics, log = (os.path.join(tmp, f"{name}.{x}") for x in ("out.json", "metrics.jsonl", "log"))
    role = ["--etcd", etcd, "--name", name]
    cli = [sys.executable, "-m", "litz.cli.litz"]
    procs: list[subprocess.Popen] = []
    with open(log, "w") as logf:
        def start(args: list[str]) -> subprocess.Popen:
            procs.append(subprocess.Popen(cli + args, cwd=_jobs.REPO, env=env, stdin=subprocess.DEVNULL,
                                          stdout=logf, stderr=subprocess.STDOUT, start_new_session=True))
            return procs[-1]

        try:
            workers = [start(["worker", *role]) for _ in range(WORKERS)]
            start(["server", *role])
            master = start(["master", "apps.mlr", *role, "--min-workers", str(WORKERS), "--executors",
                            str(EXECUTORS), "--checkpoint-dir", os.path.join(tmp, f"{name}-ckpt"),
                            "--checkpoint-every", "1", "--output", out, "--metrics", metrics, "--no-progress",
                            "--config", *_jobs.config_args(config)])
            deadline = time.time() + 120
            while not ((st := status(etcd, name, env)) and st.get("checkpoints", 0) >= 1):
                if time.time() > deadline or master.poll() is not None:
                    raise RuntimeError(f"job {name}: no checkpoint (see {log})")
                time.sleep(0.1)
            victim = workers[-1]
            os.kill(victim.pid, signal.SIGKILL)
            t_kill = time.time()
            if master.wait(300) != 0:
                raise RuntimeError(f"job {name} failed (see {log})")
        finally:
            for proc in procs:
                end(proc)
    with open(out) as f:
        doc = json.load(f)
    with open(metrics) as f:
        row = json.loads(f.readline())
    start_wall = row["time"] - row["t"]
    recs = _jobs.events(doc, "recovery")
    ids = {p["pid"]: p["id"] for p in st["workers"]}
    res = {"watch": watch, "recoveries": recs, "test_accuracy": doc["result"]["test_accuracy"],
           "victim": ids.get(victim.pid), "elapsed_s": doc["elapsed_s"]}
    if len(recs) == 1:
        rec = recs[0]
        res["detect_s"] = round(rec["t"] - rec["duration_s"] + start_wall - t_kill, 4)
        res["recovery_s"] = rec["duration_s"]
        res["kill_to_running_s"] = round(rec["t"] + start_wall - t_kill, 4)
        res["noticed"] = rec.get("noticed", {}).get(res["victim"])
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/cluster_recovery.quick.json)")
    ap.add_argument("--repeats", type=int, help="rounds of the two runs (default 3, quick 1)")
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    config = {"synthetic": 1, "n": 100_000 if args.quick else 200_000, "n_test": 20_000, "d": 500, "classes": 100,
              "epochs": 6 if args.quick else 10, "staleness": 2, "seed": 0, **THESIS_SGD}
    runs: dict[str, list[dict]] = {"connection": [], "lease": []}
    with tempfile.TemporaryDirectory(prefix="litz-bench-cluster-") as tmp:
        etcd_proc, etcd = start_etcd(tmp)
        try:
            for i in range(repeats):
                for mode in ("lease", "connection") if i % 2 else ("connection", "lease"):
                    r = run(tmp, etcd, f"cr-{mode}-{os.getpid()}-{i}", config, watch=mode == "connection")
                    runs[mode].append(r)
                    print(f"round {i + 1}/{repeats} {mode:10s}: noticed {r.get('detect_s')} s after the kill "
                          f"({r.get('noticed')}), recovery {r.get('recovery_s')} s, running again "
                          f"{r.get('kill_to_running_s')} s after the kill, test acc {r['test_accuracy']:.4f}",
                          flush=True)
        finally:
            end(etcd_proc)

    def med(mode: str, key: str) -> float | None:
        xs = [r[key] for r in runs[mode] if r.get(key) is not None]
        return round(statistics.median(xs), 4) if xs else None

    summary = {mode: {k: med(mode, k) for k in ("detect_s", "recovery_s", "kill_to_running_s")} for mode in runs}
    ok = all(len(r["recoveries"]) == 1 for rs in runs.values() for r in rs) and all(
        r.get("noticed") == "connection dropped" for r in runs["connection"])
    ratio = summary["connection"]["detect_s"] / summary["lease"]["detect_s"]
    doc = {"target": "no number set: a lost process is noticed and the job recovers", "config": config,
           "workers": WORKERS, "servers": 1, "executors": EXECUTORS, "checkpoint_every_s": 1.0,
           "all_recovered_and_noticed_by_connection": ok, "median": summary, "detect_ratio": ratio, "runs": runs}
    path = _table.write_result("cluster_recovery", doc, quick=args.quick)
    c, le = summary["connection"], summary["lease"]
    print(f"median: connection noticed in {c['detect_s']} s, running {c['kill_to_running_s']} s after the kill; "
          f"lease {le['detect_s']} s, {le['kill_to_running_s']} s; detection {ratio:.3f}x\n-> {path}")
    if not args.quick:
        _table.update_rows({"cluster_recovery": [
            f"killed worker (cluster mode, etcd): noticed in {c['detect_s']:.2f} s by its connection, running "
            f"again {c['kill_to_running_s']:.2f} s after the kill",
            f"lease only: noticed in {le['detect_s']:.2f} s, running again {le['kill_to_running_s']:.2f} s",
            f"{ratio:.3f}x detection time", "recovers", _table.yes_no(ok), _table.today()]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
