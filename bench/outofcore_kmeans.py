"""Out-of-core k-means (issue 7, thesis §4.8.2): data 4x the per-worker budget against the unlimited run, and OS swap.

Every run is ``litz run apps.kmeans`` on synthetic data, 2 workers, 1 server, 32 executors (16 per worker; 16 in
all for the 400k case), BSP (the app's default), the same seed, the app's default settings otherwise: each
mini-batch comes from a quarter of the executors, picked by the runtime (``sampling=executors``,
``Driver.choose_executor``: executors in memory first, the next one prefetched). Runs:

 * **unlimited**: no ``--memory-limit``;
 * **limited**: ``--memory-limit B`` with ``B`` = a quarter of one worker's executor state (``X``, float32,
   plus the app's 4-byte batch index per row: ``n (4d + 4) / 2 / 4`` bytes), so each worker's data is 4x its
   budget and the budget holds 4 of its 16 executors. Spill files go to ``$LITZ_SPILL_DIR`` = a scratch
   directory under the system temp directory (local ext4 disk here).

Which executors a mini-batch comes from depends on what is in memory, so the limited run's objective may differ from
the unlimited run's: it must stay within 1% (``OBJ_RTOL``; with ``sampling=rows`` the app is deterministic and the
two agreed to 1e-7).

Configs (full run): ``n = 1 000 000, d = 64, k = 1024``, 2 epochs, with 1, 4 or 16 mini-batches per epoch
(``batch = n / b``; the headline is 4), the app's built-in example (``200 000 x 32, k = 16``, default batch
4096, i.e. 49 mini-batches per epoch; 2 epochs), and ``400 000 x 64, k = 50``, 5 epochs, default batch (98
mini-batches per epoch), 16 executors. Before the runtime chose executors, the app drew each mini-batch from
*every* row, so every iteration ran one task on every executor and, with data 4x the budget, reloaded about 3/4 of
the data: the I/O per epoch grew with the number of mini-batches (the 400k case: 26x the unlimited time, 6,917
evictions). Now an executor is loaded about once an epoch. ``--quick``: ``200 000 x 32, k = 256``, 1 epoch, 4
mini-batches, and the 400k case with 2 epochs.

Time = the job's ``elapsed_s`` (start to finish: input, initialisation, training, final evaluation). The
training time (job time of the last epoch's ``report()``) is recorded too. Ratio = limited / unlimited, per
round; the table shows medians over ``--repeats`` interleaved rounds. Target: <= 1.5x (issue 7).

Memory: every 0.5 s the script reads the job's status (the JSON ``litzctl status --json`` prints, read from
the job's registry in-process: a ``litzctl`` subprocess per poll would cost ~0.1 CPU-s, 20% of one of the
two cores) for each worker's ``memory`` (RSS, reported by the worker every second), ``state_bytes`` and
``evicted``; and ``/proc/PID/status`` of every process of the job for ``VmRSS``, ``VmHWM`` (the kernel's
peak-RSS mark, so short peaks between polls are not missed) and ``VmSwap``.

Swap comparison (headline config and the 400k case, once each, after the rounds): create a swap file
(``fallocate``, ``mkswap``, ``swapon``; the script says so plainly if that is not permitted) and make child
memory cgroups of this process's own cgroup (cgroup v1 ``memory.limit_in_bytes``, or v2 ``memory.max``). Three
runs, each in its own cgroup:

 * **unlimited, accounted**: the unlimited job in a cgroup without a limit, for its peak charge ``P``
   (``memory.max_usage_in_bytes``; shared libraries already in the page cache are charged elsewhere, which is
   why ``P`` and not the sum of the processes' RSS). The cap is ``C = P - 3/4 x`` the executor state: what the
   job needs, less the part of the data that does not fit in a budget of a quarter;
 * **swap**: the job *without* ``--memory-limit`` under the cap ``C``: the kernel must page out to swap;
 * **limited + cap**: the limited Litz job under the same cap. Without a cap Litz's spill files stay in the
   page cache (20 GB free here), so a load is a memory copy; under the cap the page cache counts against the
   limit, so spilled executors really go to the disk and come back, and any memory Litz holds beyond its
   budget must be swapped like anyone else's.

The cgroups are removed and the swap file is switched off (``swapoff``) and deleted afterwards, also on errors
and on SIGINT/SIGTERM. A run that does not finish within max(300 s, 10x the unlimited time) is killed and
reported as "> T".
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import _jobs
import _table

from litz.membership import Membership, connect_kv

WORKERS, SERVERS, EXECUTORS = 2, 1, 32
EXECUTORS_OF = {"k400": 16}  # the 400k case: 8 executors a worker
OBJ_RTOL = 0.01
BIG = {"synthetic": 1, "n": 1_000_000, "d": 64, "k": 1024, "epochs": 2, "seed": 0}
BUILTIN = {"synthetic": 1, "n": 200_000, "d": 32, "k": 16, "epochs": 2, "seed": 0}  # batch: app default (4096)
QUICK = {"synthetic": 1, "n": 200_000, "d": 32, "k": 256, "epochs": 1, "seed": 0}
K400 = {"synthetic": 1, "n": 400_000, "d": 64, "k": 50, "epochs": 5, "seed": 0}  # batch: app default (4096)
HEADLINE_BATCHES = 4
TARGETS = {"builtin": 2.0}  # limited / unlimited time; 1.5x for the others


def configs(quick: bool) -> dict[str, dict]:
    if quick:
        return {"b4": {**QUICK, "batch": math.ceil(QUICK["n"] / HEADLINE_BATCHES)}, "k400": {**K400, "epochs": 2}}
    out = {f"b{b}": {**BIG, "batch": math.ceil(BIG["n"] / b)} for b in (HEADLINE_BATCHES, 1, 16)}
    out["builtin"] = dict(BUILTIN)
    out["k400"] = dict(K400)
    return out


def state_per_worker(cfg: dict) -> int:
    """Executor state of one worker as the runtime accounts it: X (float32) + the int32 batch index per row."""
    return cfg["n"] * (4 * cfg["d"] + 4) // WORKERS


# -- memory monitor -------------------------------------------------------------------------------------------
def _proc_status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "VmSwap"):
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def _role(pid: int) -> str | None:
    """``worker`` or ``server`` for a local process of ``litz run`` (``litz worker --name ...``), else None."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return None
    for role in (b"worker", b"server"):
        if role in args[:6]:
            return role.decode()
    return None


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid:  # the job runs in its own session / process group
                    pids.append(int(name))
            except (OSError, IndexError, ValueError):
                continue
    return pids


class Monitor:
    """Polls the job's status (as ``litzctl status --json``) and ``/proc`` of its processes every ``every`` s."""

    def __init__(self, job: _jobs.Job, every: float = 0.5):
        self.job, self.every = job, every
        self.workers: dict[str, dict] = {}  # id -> peak memory (status), peak state_bytes, max evicted, pid
        self.procs: dict[int, dict] = {}  # pid -> peak VmRSS, VmHWM, VmSwap
        self.peak_total_rss = 0
        self.peak_total_swap = 0
        self.samples: list[dict] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Monitor:
        self._thread.start()
        return self

    def _status(self) -> dict | None:
        try:
            return Membership(connect_kv(home=self.job.home), self.job.name).get("status")
        except Exception:  # not published yet, or being rewritten
            return None

    def _run(self) -> None:
        pgid = self.job.proc.pid
        t0 = time.time()
        while not self._stop.is_set() and self.job.running():
            self.polls += 1
            st = self._status()
            if st:
                for w in st.get("workers", []):
                    rec = self.workers.setdefault(w["id"], {"pid": w.get("pid"), "memory": 0, "state_bytes": 0,
                                                            "evicted": 0, "budget": w.get("budget")})
                    rec["memory"] = max(rec["memory"], w.get("memory") or 0)
                    rec["state_bytes"] = max(rec["state_bytes"], w.get("state_bytes") or 0)
                    rec["evicted"] = max(rec["evicted"], len(w.get("evicted") or ()))
            total_rss = total_swap = 0
            for pid in _group_pids(pgid):
                s = _proc_status(pid)
                if not s:
                    continue
                rec = self.procs.setdefault(pid, {"VmRSS": 0, "VmHWM": 0, "VmSwap": 0, "role": _role(pid)})
                for key, value in s.items():
                    rec[key] = max(rec[key], value)
                if rec["role"] is None:
                    rec["role"] = _role(pid)
                total_rss += s.get("VmRSS", 0)
                total_swap += s.get("VmSwap", 0)
            self.peak_total_rss = max(self.peak_total_rss, total_rss)
            self.peak_total_swap = max(self.peak_total_swap, total_swap)
            self.samples.append({"t": round(time.time() - t0, 2), "rss": total_rss, "swap": total_swap,
                                 "workers": {w["id"]: [w.get("memory"), w.get("state_bytes"),
                                                       len(w.get("evicted") or ())]
                                             for w in (st or {}).get("workers", [])}})
            self._stop.wait(self.every)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(10)
        worker_pids = {w["pid"] for w in self.workers.values()} | {
            pid for pid, p in self.procs.items() if p["role"] == "worker"}  # also when no status was published
        hwm = {pid: p["VmHWM"] for pid, p in self.procs.items()}
        workers = {}
        for wid, w in sorted(self.workers.items()):
            p = self.procs.get(w["pid"], {})
            workers[wid] = {**w, "peak_rss_status": w["memory"], "peak_rss_hwm": p.get("VmHWM"),
                            "peak_swap": p.get("VmSwap")}
        return {"workers": workers,
                "peak_worker_rss_hwm": max((p for pid, p in hwm.items() if pid in worker_pids), default=None),
                "peak_worker_rss_status": max((w["memory"] for w in self.workers.values()), default=None),
                "peak_worker_state_bytes": max((w["state_bytes"] for w in self.workers.values()), default=None),
                "sum_process_hwm": sum(hwm.values()), "peak_total_rss": self.peak_total_rss,
                "peak_total_swap": self.peak_total_swap, "processes": {str(pid): p for pid, p in self.procs.items()},
                "polls": self.polls,
                "samples": self.samples}


# -- swap file and memory cgroup -------------------------------------------------------------------------------
def _sh(cmd: list[str]) -> dict:
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        return {"cmd": " ".join(cmd), "rc": cp.returncode, "out": (cp.stdout + cp.stderr).strip()}
    except (OSError, subprocess.SubprocessError) as exc:
        return {"cmd": " ".join(cmd), "rc": None, "out": str(exc)}


def active_swaps() -> list[str]:
    try:
        with open("/proc/swaps") as f:
            return [line.split()[0] for line in f.readlines()[1:] if line.strip()]
    except OSError:
        return []


@contextlib.contextmanager
def swap_file(path: str, size: str) -> Iterator[dict]:
    """Create and enable a swap file; yield what happened (``enabled``); always swapoff and delete it."""
    info: dict = {"path": path, "size": size, "swaps_before": active_swaps(), "steps": [], "enabled": False}
    created = False
    try:
        for cmd in (["fallocate", "-l", size, path], ["chmod", "600", path], ["mkswap", path], ["swapon", path]):
            step = _sh(cmd)
            info["steps"].append(step)
            created = created or os.path.exists(path)
            if step["rc"] != 0:
                info["error"] = f"`{step['cmd']}` failed (exit {step['rc']}): {step['out']}"
                break
        else:
            info["enabled"] = path in active_swaps()
            if not info["enabled"]:
                info["error"] = f"swapon exited 0 but {path} is not in /proc/swaps"
        yield info
    finally:
        if path in active_swaps():
            info["swapoff"] = _sh(["swapoff", path])
        if created or os.path.exists(path):
            with contextlib.suppress(OSError):
                os.unlink(path)
        info["removed"] = not os.path.exists(path) and path not in active_swaps()
        info["swaps_after"] = active_swaps()


def own_memory_cgroup() -> tuple[str, int] | None:
    """(directory, cgroup version) of this process's memory cgroup, or None."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [ln.strip().split(":", 2) for ln in f if ln.strip()]
    except OSError:
        return None
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):
            d = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
            if os.path.exists(os.path.join(d, "memory.limit_in_bytes")):
                return d, 1
    for hid, controllers, path in lines:
        if hid == "0" and controllers == "":
            d = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
            if os.path.exists(os.path.join(d, "memory.max")):
                return d, 2
    return None


def _write(path: str, value: object) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


@contextlib.contextmanager
def memory_cgroup(limit: int | None, name: str) -> Iterator[dict]:
    """A child memory cgroup of our own, with a hard limit (v1 ``memory.limit_in_bytes``, v2 ``memory.max``) or,
    with ``limit=None``, none (to measure a job's peak charge).

    Yields ``{"dir", "version", ...}`` (``error`` if it could not be made); removed afterwards."""
    info: dict = {"limit": limit}
    own = own_memory_cgroup()
    if own is None:
        info["error"] = "no writable memory cgroup found for this process"
        yield info
        return
    parent, version = own
    d = os.path.join(parent, name)
    info.update({"dir": d, "version": version})
    try:
        os.mkdir(d)
        if limit is not None:
            _write(os.path.join(d, "memory.limit_in_bytes" if version == 1 else "memory.max"), limit)
    except OSError as exc:
        info["error"] = f"cannot create memory cgroup {d}: {exc.strerror or exc}"
        with contextlib.suppress(OSError):
            os.rmdir(d)
        yield info
        return
    try:
        yield info
    finally:
        procs = (_read(os.path.join(d, "cgroup.procs")) or "").split()
        if procs:
            info["leftover_procs"] = procs  # only this script's job could be in it; the job was ended before
        for _ in range(50):
            try:
                os.rmdir(d)
                break
            except OSError:
                time.sleep(0.1)
        info["removed"] = not os.path.exists(d)


def cgroup_usage(info: dict) -> dict:
    d, v = info["dir"], info["version"]
    if v == 1:
        keys = ("memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes", "memory.failcnt")
        out = {k: _read(os.path.join(d, k)) for k in keys}
        stat = dict(ln.split() for ln in (_read(os.path.join(d, "memory.stat")) or "").splitlines() if ln.strip())
        out.update({k: stat.get(k) for k in ("total_pgmajfault", "total_swap", "pgpgin", "pgpgout")})
        out["oom_control"] = _read(os.path.join(d, "memory.oom_control"))
        return out
    stat = dict(ln.split() for ln in (_read(os.path.join(d, "memory.stat")) or "").splitlines() if ln.strip())
    return {"memory.peak": _read(os.path.join(d, "memory.peak")),
            "memory.events": _read(os.path.join(d, "memory.events")),
            **{k: stat.get(k) for k in ("pgmajfault", "pswpin", "pswpout")}}


def _in_cgroup(cmd: list[str], info: dict) -> list[str]:
    procs = os.path.join(info["dir"], "cgroup.procs")
    return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *cmd]


# -- one run ---------------------------------------------------------------------------------------------------
def run(tmp: str, name: str, cfg: dict, budget: int | None, timeout: float, cgroup: dict | None = None,
        allow_timeout: bool = False, executors: int = EXECUTORS) -> dict:
    """One job; with ``allow_timeout`` a job still running after ``timeout`` s is killed and reported unfinished."""
    extra = ["--memory-limit", str(budget)] if budget else []
    job = _jobs.Job(tmp, name, app="apps.kmeans", workers=WORKERS, servers=SERVERS, executors=executors,
                    config=cfg, extra=extra)
    spill = os.path.join(tmp, f"{name}-spill")
    os.makedirs(spill, exist_ok=True)
    job.env["LITZ_SPILL_DIR"] = spill
    if cgroup is not None:
        job.cmd = _in_cgroup(job.cmd, cgroup)
    job.start()
    mon = Monitor(job).start()
    try:
        doc = job.wait(timeout)
    except RuntimeError as exc:
        mem = mon.stop()
        if not allow_timeout or "still running" not in str(exc):
            raise
        return {"finished": False, "timeout_s": timeout, "elapsed_s": None, "memory": mem,
                "cgroup": cgroup_usage(cgroup) if cgroup else None, "load_avg": job.load}
    finally:
        job.kill()
    mem = mon.stop()
    reports = job.reports()
    epochs = [r["t"] for r in reports if "epoch" in r]
    out = {"finished": True, "elapsed_s": doc["elapsed_s"], "train_s": epochs[-1] if epochs else None,
           "first_epoch_s": epochs[0] if epochs else None, "objective": doc["result"]["objective"],
           "iterations": doc["result"]["iterations"], "batch": doc["result"]["batch"], "load_avg": job.load,
           "memory": mem, "spill_left": sorted(os.listdir(spill))}
    for kind in ("evict", "load", "prefetch"):
        evs = _jobs.events(doc, kind)
        out[kind] = {"count": len(evs), "bytes": sum(e["bytes"] for e in evs),
                     "seconds": round(sum(e["seconds"] for e in evs), 4),
                     "per_worker": {w: sum(1 for e in evs if e.get("worker") == w)
                                    for w in sorted({e.get("worker") for e in evs})}}
    out["other_memory_events"] = [e for e in doc.get("events", []) if e.get("kind") in ("evict_failed", "memory_limit")]
    if cgroup is not None:
        out["cgroup"] = cgroup_usage(cgroup)
    return out


def median(values) -> float | None:
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def mb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e6:,.0f} MB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/outofcore_kmeans.quick.json)")
    ap.add_argument("--repeats", type=int, help="interleaved rounds of every config (default 5, quick 1)")
    ap.add_argument("--no-swap", action="store_true", help="skip the swap comparison")
    ap.add_argument("--swap-size", default="4G", help="swap file size (default 4G)")
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 5)
    cfgs = configs(args.quick)
    head = f"b{HEADLINE_BATCHES}"
    budgets = {c: state_per_worker(cfg) // 4 for c, cfg in cfgs.items()}
    for c, cfg in cfgs.items():
            print(f"{c}: {cfg}; state per worker {mb(state_per_worker(cfg))}, budget {mb(budgets[c])} "
              f"({state_per_worker(cfg) / budgets[c]:.2f}x), executor "
              f"{mb(state_per_worker(cfg) * WORKERS / EXECUTORS_OF.get(c, EXECUTORS))}", flush=True)

    runs: dict[str, list[dict]] = {c: [] for c in cfgs}
    mismatches = []
    with tempfile.TemporaryDirectory(prefix="litz-bench-ooc-") as tmp:
        for i in range(repeats):
            for c, cfg in cfgs.items():
                tag = f"{os.getpid()}-{i}-{c}"
                ex = EXECUTORS_OF.get(c, EXECUTORS)
                if i % 2 == 0:  # alternate the order: the machine's load drifts
                    un = run(tmp, f"ooc-un-{tag}", cfg, None, 1800, executors=ex)
                    lim = run(tmp, f"ooc-lim-{tag}", cfg, budgets[c], 3600, executors=ex)
                else:
                    lim = run(tmp, f"ooc-lim-{tag}", cfg, budgets[c], 3600, executors=ex)
                    un = run(tmp, f"ooc-un-{tag}", cfg, None, 1800, executors=ex)
                rel = abs(lim["objective"] - un["objective"]) / abs(un["objective"])
                if rel > OBJ_RTOL:
                    mismatches.append(f"{c} round {i + 1}: limited {lim['objective']!r} vs unlimited "
                                      f"{un['objective']!r} (rel {rel:.2e})")
                r = {"round": i + 1, "unlimited": un, "limited": lim, "ratio": lim["elapsed_s"] / un["elapsed_s"],
                     "train_ratio": lim["train_s"] / un["train_s"], "objective_rel_diff": rel}
                runs[c].append(r)
                print(f"round {i + 1}/{repeats} {c}: unlimited {un['elapsed_s']:.1f} s (train {un['train_s']:.1f}), "
                      f"limited {lim['elapsed_s']:.1f} s (train {lim['train_s']:.1f}): {r['ratio']:.2f}x "
                      f"(train {r['train_ratio']:.2f}x); objective {un['objective']:.6f} / {lim['objective']:.6f} "
                      f"(rel {rel:.1e}); {lim['evict']['count']} evictions {mb(lim['evict']['bytes'])} "
                      f"{lim['evict']['seconds']:.1f} s, {lim['load']['count']} loads {mb(lim['load']['bytes'])} "
                      f"+ {lim['prefetch']['count']} prefetched "
                      f"{lim['load']['seconds']:.1f} s; peak worker RSS {mb(un['memory']['peak_worker_rss_hwm'])} "
                      f"-> {mb(lim['memory']['peak_worker_rss_hwm'])} (budget {mb(budgets[c])}), peak state "
                      f"{mb(lim['memory']['peak_worker_state_bytes'])}; load avg {un['load_avg']} {lim['load_avg']}",
                      flush=True)

        summary = {}
        for c in cfgs:
            rs = runs[c]
            summary[c] = {
                "batches_per_epoch": math.ceil(cfgs[c]["n"] / cfgs[c].get("batch", 4096)),
                "budget": budgets[c], "state_per_worker": state_per_worker(cfgs[c]),
                "unlimited_s": median(r["unlimited"]["elapsed_s"] for r in rs),
                "limited_s": median(r["limited"]["elapsed_s"] for r in rs),
                "ratio": median(r["ratio"] for r in rs),
                "train_ratio": median(r["train_ratio"] for r in rs),
                "ratios": [round(r["ratio"], 3) for r in rs],
                "unlimited_peak_worker_rss": median(r["unlimited"]["memory"]["peak_worker_rss_hwm"] for r in rs),
                "limited_peak_worker_rss": median(r["limited"]["memory"]["peak_worker_rss_hwm"] for r in rs),
                "limited_peak_worker_state": median(r["limited"]["memory"]["peak_worker_state_bytes"] for r in rs),
                "unlimited_peak_total_rss": median(r["unlimited"]["memory"]["sum_process_hwm"] for r in rs),
                "limited_peak_total_rss": median(r["limited"]["memory"]["sum_process_hwm"] for r in rs),
                "evictions": median(r["limited"]["evict"]["count"] for r in rs),
                "loads": median(r["limited"]["load"]["count"] + r["limited"]["prefetch"]["count"] for r in rs),
                "prefetches": median(r["limited"]["prefetch"]["count"] for r in rs),
                "loaded_bytes": median(r["limited"]["load"]["bytes"] for r in rs),
                "iterations": rs[0]["unlimited"]["iterations"],
                "target": TARGETS.get(c, 1.5),
                "met": statistics.median(r["ratio"] for r in rs) <= TARGETS.get(c, 1.5)}

        swap: dict = {"attempted": not args.no_swap}
        swap_k400: dict = {"attempted": not args.no_swap and "k400" in cfgs}
        if not args.no_swap:
            swap.update(swap_comparison(tmp, cfgs[head], budgets[head], runs[head], args.swap_size))
            if "k400" in cfgs:
                swap_k400.update(swap_comparison(tmp, cfgs["k400"], budgets["k400"], runs["k400"], args.swap_size,
                                                 executors=EXECUTORS_OF["k400"]))

    for m in mismatches:
        print(f"OBJECTIVE MISMATCH: {m}", file=sys.stderr)
    for c, sw in ((head, swap), ("k400", swap_k400)):
        if c not in runs:
            continue
        un_obj = runs[c][0]["unlimited"]["objective"]
        for key in ("unlimited_accounted", "swap", "limited_capped", "swap_tight", "limited_capped_tight"):
            got = sw.get(key)
            if got and got.get("finished"):
                rel = abs(got["objective"] - un_obj) / abs(un_obj)
                got["objective_rel_diff"] = rel
                if rel > OBJ_RTOL:
                    mismatches.append(f"{c} {key}: {got['objective']!r} vs unlimited {un_obj!r} (rel {rel:.2e})")

    doc = {"target": "limited (data 4x the per-worker budget) <= 1.5x the unlimited run's time (issue 7; the "
                     "built-in example <= 2x); objectives within 1%",
           "workers": WORKERS, "servers": SERVERS, "executors": EXECUTORS, "executors_of": EXECUTORS_OF,
           "configs": cfgs, "headline": head, "objectives_match": not mismatches, "mismatches": mismatches,
           "summary": summary, "swap": swap, "swap_k400": swap_k400,
           "runs": runs}
    path = _table.write_result("outofcore_kmeans", doc, quick=args.quick)
    h = summary[head]
    print(f"{head}: limited {h['limited_s']:.1f} s vs unlimited {h['unlimited_s']:.1f} s: {h['ratio']:.2f}x "
          f"(target <= 1.5x: {'met' if h['met'] else 'MISSED'})")
    print(f"-> {path}")
    if mismatches:
        print("objectives differ between the limited and unlimited runs: table not updated", file=sys.stderr)
        return 1
    if not args.quick:
        _table.update_rows(table_rows(cfgs, summary, swap, head, swap_k400))
    return 0


def _peak_charge(usage: dict) -> int | None:
    value = usage.get("memory.max_usage_in_bytes") or usage.get("memory.peak")
    return int(value) if value else None


def swap_comparison(tmp: str, cfg: dict, budget: int, head_runs: list[dict], size: str,
                    executors: int = EXECUTORS) -> dict:
    """The unlimited job in a cgroup without a limit (its peak charge P); then, under a cap of P minus 3/4 of the
    data (the part that does not fit in a budget of a quarter) and under a tighter cap of P minus all of the
    data, the job without ``--memory-limit`` (``swap``, ``swap_tight``) and the limited job (``limited_capped``,
    ``limited_capped_tight``)."""
    out: dict = {}
    un_s = statistics.median(r["unlimited"]["elapsed_s"] for r in head_runs)
    data = state_per_worker(cfg) * WORKERS
    timeout = max(300.0, 10 * un_s)
    out["timeout_s"] = timeout
    path = os.path.join(tempfile.gettempdir(), f"litz-bench-swapfile-{os.getpid()}")
    with swap_file(path, size) as info:
        out["swapfile"] = info
        if not info["enabled"]:
            out["skipped"] = f"no swap: {info.get('error')}"
            print(f"swap comparison skipped: {out['skipped']}", flush=True)
            return out
        caps: dict[str, int] = {}
        plan = (("unlimited_accounted", None, None), ("swap", None, "cap"), ("limited_capped", budget, "cap"),
                ("swap_tight", None, "cap_tight"), ("limited_capped_tight", budget, "cap_tight"))
        for key, budget_, cap_key in plan:
            limit = caps[cap_key] if cap_key else None
            with memory_cgroup(limit, f"litz-bench-{os.getpid()}-{key}") as cg:
                if "error" in cg:
                    out["skipped"] = f"swap file enabled, but {cg['error']}"
                    print(f"swap comparison skipped: {out['skipped']}", flush=True)
                    return out
                r = run(tmp, f"ooc-{key}-{os.getpid()}-{executors}", cfg, budget_, timeout, cgroup=cg,
                        allow_timeout=True, executors=executors)
                r["cgroup_dir"], r["cgroup_version"], r["cgroup_limit"] = cg["dir"], cg["version"], cg["limit"]
            r["cgroup_removed"] = cg.get("removed")
            out[key] = r
            if key == "unlimited_accounted":
                peak = _peak_charge(r.get("cgroup") or {})
                if not r["finished"] or peak is None:
                    out["skipped"] = "the accounting run did not give a peak memory charge"
                    return out
                caps = {"cap": (max(peak - 3 * data // 4, 1 << 20) >> 20) << 20,
                        "cap_tight": (max(peak - data, 1 << 20) >> 20) << 20}
                out.update({"unlimited_peak_charge": peak, "data_bytes": data, **caps,
                            "cap_rule": "peak cgroup charge P of the unlimited job minus 3/4 of the executor state "
                                        "(cap) or all of it (cap_tight), rounded down to MiB"})
                un_s = r["elapsed_s"]  # the same-phase unlimited time is the baseline of this comparison
            stat = r.get("cgroup")
            if r["finished"]:
                print(f"{key} (cgroup limit {mb(cg['limit'])}, swap on): {r['elapsed_s']:.1f} s = "
                      f"{r['elapsed_s'] / un_s:.2f}x unlimited; peak swap {mb(r['memory']['peak_total_swap'])}; "
                      f"cgroup {stat}", flush=True)
            else:
                print(f"{key} (cgroup limit {mb(cg['limit'])}, swap on): not finished within {timeout:.0f} s; "
                      f"cgroup {stat}", flush=True)
    print(f"swap file: swapoff {out['swapfile'].get('swapoff')}, removed {out['swapfile']['removed']}", flush=True)
    return out


def _time(r: dict | None) -> str:
    if not r:
        return "-"
    return f"{r['elapsed_s']:.0f} s" if r["finished"] else f"> {r['timeout_s']:.0f} s (killed)"


def table_rows(cfgs: dict, summary: dict, swap: dict, head: str, swap_k400: dict | None = None) -> dict:
    h = summary[head]
    others = ", ".join(f"{summary[c]['batches_per_epoch']} batches/epoch {summary[c]['ratio']:.2f}x"
                       for c in cfgs if c not in (head, "builtin", "k400"))
    cfg = cfgs[head]
    rows = {"outofcore_kmeans": [
        f"{cfg['n'] / 1e6:g}M x {cfg['d']}, k={cfg['k']}, {h['batches_per_epoch']} batches/epoch, budget "
        f"{mb(h['budget'])}/worker (data 4x): {h['limited_s']:.0f} s; peak worker RSS "
        f"{mb(h['limited_peak_worker_rss'])}, peak executor state {mb(h['limited_peak_worker_state'])} ({others})",
        f"unlimited: {h['unlimited_s']:.0f} s; peak worker RSS {mb(h['unlimited_peak_worker_rss'])}",
        f"{h['ratio']:.2f}x (rounds {min(h['ratios']):.2f}-{max(h['ratios']):.2f})", "<= 1.5x",
        _table.yes_no(h["met"]), _table.today()]}
    if "builtin" in summary:
        b = summary["builtin"]
        rows["outofcore_kmeans (built-in example)"] = [
            f"200k x 32, k=16, batch 4096 ({b['batches_per_epoch']} batches/epoch), budget {mb(b['budget'])}/worker: "
            f"{b['limited_s']:.1f} s, {b['loads']:,.0f} loads ({b['prefetches']:,.0f} prefetched)",
            f"unlimited: {b['unlimited_s']:.1f} s", f"{b['ratio']:.2f}x", "<= 2x", _table.yes_no(b["met"]),
            _table.today()]
    if "k400" in summary:
        k = summary["k400"]
        rows["outofcore_kmeans (400k x 64)"] = [
            f"400k x 64, k=50, 5 epochs, batch 4096 ({k['batches_per_epoch']} batches/epoch), 16 executors, budget "
            f"{mb(k['budget'])}/worker (data 4x): {k['limited_s']:.1f} s, {k['evictions']:,.0f} evictions, "
            f"{k['loads']:,.0f} loads ({k['prefetches']:,.0f} prefetched)",
            f"unlimited: {k['unlimited_s']:.1f} s", f"{k['ratio']:.2f}x (rounds {min(k['ratios']):.2f}-"
            f"{max(k['ratios']):.2f})", "<= 1.5x", _table.yes_no(k["met"]), _table.today()]
    rows.update(swap_rows("outofcore_kmeans vs swap", swap, h))
    if swap_k400 and "k400" in summary:
        rows.update(swap_rows("outofcore_kmeans (400k x 64) vs swap", swap_k400, summary["k400"]))
    return rows


def swap_rows(name: str, swap: dict, h: dict) -> dict:
    """The table rows of one swap comparison: Litz limited under the cap against OS swap under the same cap."""
    rows: dict = {}
    if not swap.get("attempted"):
        return rows
    if swap.get("swap") is None:
        rows[name] = [f"limited: {h['limited_s']:.0f} s", f"OS swap: not measured ({swap.get('skipped')})", "-",
                      "faster than OS swap (paper 6-8x)", "-", _table.today()]
        return rows
    un = swap["unlimited_accounted"]
    for suffix, cap_key, label in (("", "cap", "P - 3/4 data"), ("_tight", "cap_tight", "P - all data")):
        s, lc = swap.get("swap" + suffix), swap.get("limited_capped" + suffix)
        if s is None or lc is None:
            continue
        if s["finished"] and lc["finished"]:
            ratio = f"swap / Litz {s['elapsed_s'] / lc['elapsed_s']:.2f}x"
        elif lc["finished"]:
            ratio = f"swap / Litz > {s['timeout_s'] / lc['elapsed_s']:.1f}x"
        else:
            ratio = "-"
        faster = lc["finished"] and (not s["finished"] or lc["elapsed_s"] < s["elapsed_s"])
        rows[name + (" (tight cap)" if suffix else "")] = [
            f"limited (budget {mb(h['budget'])}/worker) under the cap: {_time(lc)}, swapped "
            f"{mb(lc['memory']['peak_total_swap'])}",
            f"no --memory-limit, swap on, cgroup cap {mb(swap[cap_key])} ({label}, P = "
            f"{mb(swap['unlimited_peak_charge'])}): {_time(s)}, swapped {mb(s['memory']['peak_total_swap'])}; "
            f"uncapped {_time(un)}",
            ratio, "faster than OS swap (paper 6-8x)", _table.yes_no(faster), _table.today()]
    return rows


if __name__ == "__main__":
    sys.exit(main())
