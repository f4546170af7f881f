"""The critical path of one dependent round, in parts, against the carrier's raw round trip.

A dependent round is what block-scheduled LDA waits for between two holders of a block: one executor's task
completes, and the next task, which must read its updates, starts and has them in hand. ``bench/apps/chain.py``
runs nothing but such rounds (a counter read, checked and incremented by executors taking turns, tasks that do
no other work), in two phases: both executors on one worker (``same``: 30 of LDA's 32 handoffs a round at 16
executors a worker) and on two workers (``cross``). 2 workers, 1 server, 4 executors, even placement, no stealing.

**Parts**, from timestamps (``time.perf_counter``, one monotonic clock for every process of the machine) taken in
the task and at the runtime's steps: the script wraps a few methods of the worker and the master in the
launcher before the job starts, and the workers, forks of it, inherit the wrappers; a worker's records ride
back on its next task's result. For a round from task A to task B:

* ``flush``: A returns -> its update log is sent to the server (the worker's loop finishing what it was doing);
* ``ack``: sent -> every server acknowledged it (A's completion may now be told);
* ``result``: the completion sent -> the master has it (``DONE``);
* ``dispatch``: the master has A's completion -> B's ``TASKS`` leave it (the driver's handler in between);
* ``deliver``: B's ``TASKS`` leave the master -> B's worker has them;
* ``release``: with ``after=`` (B sent ahead, held on its worker), on one worker: A's flush sent -> B may start.
  The worker hands B off as A's flush leaves (docs/design.md, A2), and B reads A's update from the worker's
  in-flight flush; it replaces ``ack``, which is then off the path (``handed_off``: the share of rounds in which B
  was released before A's acknowledgement). Across workers (A9) A's worker hands A off to B's worker once every
  server acknowledged A's flush, with no message through the master: ``ack`` as above, then ``handoff`` (A's
  acknowledgement -> B's worker has the hand-off) and ``release`` (-> B may start);
* ``start``: B may start -> its ``run_task`` begins;
* ``fetch``: ``run_task`` begins -> ``ps_get`` returned A's update (from the cache, or a round trip to the server).

The **round** is the sum: A's end to B holding A's update (its median, and ``round_p10``, the tenth percentile:
on 2 cores the job's master, server and worker take turns, and the quickest rounds are those no other process
took the CPU from). **Baseline, in the same run:** the carrier's raw round
trip, a ping-pong of 200-byte messages between two forked processes over the same kind of socket with nothing
else: a Unix stream socket (what ``litz run`` uses) and ZeroMQ over ``ipc://`` (``LITZ_TRANSPORT=zmq``).
Medians over rounds 50..N of each phase, over ``--repeats`` jobs (each twice: dispatch on completion, as before,
and with ``after=``). Target: a dependent round within 2x the carrier's raw round trip.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import types

import _table

import litz

HERE = os.path.dirname(os.path.abspath(__file__))
CHAIN = os.path.join(HERE, "apps", "chain.py")
TRACE_MODULE = "litz_round_trace"
PAIRS = {"same": [0, 1], "cross": [0, 2]}  # 4 executors on 2 workers, even placement: 0 and 1 share a worker
MESSAGE = b"x" * 200
SKIP = 50  # rounds at the start of a phase left out (connections, the first fetches)


# -- the trace: wrappers around the runtime's steps ------------------------------------------------------------
def install_trace() -> types.ModuleType:
    """Wrap the worker's and the master's steps so each appends (kind, task ids, time) to a per-process list.
    Done in the launcher before the job starts: the master runs here, and the workers are forks of it."""
    from litz import master as m
    from litz import protocol as P
    from litz import worker as w

    trace = types.ModuleType(TRACE_MODULE)
    trace.records = []
    trace.names = {}  # master: task id -> (key, n)

    def note(kind: str, tids: list) -> None:
        if tids:
            trace.records.append((kind, tids, time.perf_counter()))

    def take() -> list:
        out, trace.records = trace.records, []
        return out

    trace.note, trace.take = note, take
    sys.modules[TRACE_MODULE] = trace

    def wrap(cls: type, name: str, before) -> None:  # noqa: ANN001
        original = getattr(cls, name)

        def wrapped(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            before(self, *args, **kwargs)
            return original(self, *args, **kwargs)

        setattr(cls, name, wrapped)

    def on_handle(self, sender, msg):  # noqa: ANN001, ANN202
        if msg[0] == P.TASKS:
            note("deliver", [t[0] for t in msg[1]] + [t[0] for t in (msg[4] if len(msg) > 4 else ())])

    wrap(w.Worker, "handle", on_handle)
    if hasattr(w.Worker, "handed_off"):  # across workers: another worker's task reported done (A9)
        wrap(w.Worker, "handed_off", lambda self, items, relayed: note("relayed" if relayed else "handoff",
                                                                       [item[0] for item in items]))
    wrap(w.Worker, "flush", lambda self: note("flush", [tid for tid, _ in self.completed]))
    wrap(w.Worker, "send_done", lambda self, results, *a: note("ack", [tid for tid, _ in results]))
    if hasattr(w.Worker, "release"):  # a task sent ahead may start (its closure is done here)
        wrap(w.Worker, "release", lambda self, task: note("release", [task.tid]))

    def on_done(self, results, *rest):  # noqa: ANN001, ANN002, ANN202
        note("result", [tid for tid, _ in results])
        for tid, r in results:
            trace.names[tid] = (r["key"], r["n"])

    wrap(m.Master, "on_done", on_done)
    wrap(m.Master, "flush_outbox", lambda self: note("dispatch", [t[0] for ts in self.outbox.values() for t in ts]))
    return trace


# successors sent ahead: enough that the next one is always held on its worker before its predecessor ends (the
# driver hears of task n - k while n runs; with the hand-off a round on one worker is far shorter than the master's
# path, and with 2 ahead the chain ran out and waited for deliveries)
AHEAD = 16


def run_chain(rounds: int, ahead: bool, trace: types.ModuleType) -> dict:
    trace.records.clear()
    trace.names.clear()
    result = litz.run(CHAIN, workers=2, servers=1, executors=4, placement="even", steal=False, progress=False,
                      name=f"bench-round-latency-{os.getpid()}",
                      config={"rounds": rounds, "pairs": list(PAIRS.values()), "ahead": AHEAD if ahead else 0})
    return analyse(result, trace)


def analyse(result: dict, trace: types.ModuleType) -> dict:
    """Per phase, the median of each part of a round over rounds SKIP..N, in microseconds."""
    at: dict[tuple, dict] = {}  # (key, n) -> point -> time
    by_tid = {tid: name for tid, name in trace.names.items()}
    events = list(trace.records)
    for r in result["records"]:
        point = at.setdefault((r["key"], r["n"]), {})
        point.update(start=r["t_start"], fetched=r["t_fetched"], end=r["t_end"])
        events += r["trace"]
    for kind, tids, t in events:
        for tid in tids:
            name = by_tid.get(tid)
            if name is not None:
                at.setdefault(name, {}).setdefault(kind, t)  # the first time (a task is delivered once)
    phases = {}
    for phase, name in enumerate(PAIRS):
        key = f"count{phase}"
        parts: dict[str, list] = {}
        for n in range(SKIP, result["rounds"]):
            a, b = at.get((key, n - 1)), at.get((key, n))
            if not a or not b or "ack" not in a or "flush" not in a:
                continue
            step = {"flush": a["flush"] - a["end"], "ack": a["ack"] - a["flush"]}
            released = b.get("release")
            if result["ahead"] and released is not None and "handoff" in a and a["ack"] <= a["handoff"] <= released:
                step.update(handoff=a["handoff"] - a["ack"], release=released - a["handoff"])  # across workers
                ready = max(released, b.get("deliver", released))
            elif result["ahead"] and released is not None:
                del step["ack"]  # handed off at the flush, or released at the acknowledgement: in ``release``
                step["release"] = released - a["flush"]
                step["handed_off"] = float(released < a["ack"])
                ready = max(released, b.get("deliver", released))
            elif "result" in a and "dispatch" in b and "deliver" in b:
                step.update(result=a["result"] - a["ack"], dispatch=b["dispatch"] - a["result"],
                            deliver=b["deliver"] - b["dispatch"])
                ready = b["deliver"]
            else:
                continue
            step.update(start=b["start"] - ready, fetch=b["fetched"] - b["start"])
            step["round"] = b["fetched"] - a["end"]
            for part, dt in step.items():
                parts.setdefault(part, []).append(dt if part == "handed_off" else dt * 1e6)
        phases[name] = {part: (statistics.fmean if part == "handed_off" else statistics.median)(v)
                        for part, v in parts.items()}
        phases[name]["rounds_measured"] = len(parts.get("round", ()))
        if parts.get("round"):  # the quick tenth: rounds no other process of the job took the CPU from
            phases[name]["round_p10"] = statistics.quantiles(parts["round"], n=10)[0]
    return phases


# -- the carrier's raw round trip ------------------------------------------------------------------------------
def _pin(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def pingpong(kind: str, count: int, same_core: bool = False) -> float:
    """Median round trip in microseconds of ``count`` 200-byte ping-pongs between this process and a fork. Over a Unix
    socket each is on its own core (or both on one with ``same_core``): unpinned, the kernel sometimes kept the two
    on one core, where a wake-up costs no interrupt, and the median moved between 26 and 43 us from run to run (10
    us on one core, 44 on two). ZeroMQ's processes are not pinned (its I/O threads would share their core)."""
    cpus = sorted(os.sched_getaffinity(0))
    mine, theirs = (cpus[0], cpus[0] if same_core else cpus[1]) if len(cpus) >= 2 else (None, None)
    if kind == "unix":
        _pin(mine)
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            _pin(theirs)
            a.close()
            for _ in range(count):
                b.sendall(_recv_exactly(b, len(MESSAGE)))
            os._exit(0)
        b.close()
        rtts = []
        for _ in range(count):
            t0 = time.perf_counter()
            a.sendall(MESSAGE)
            _recv_exactly(a, len(MESSAGE))
            rtts.append(time.perf_counter() - t0)
        os.waitpid(pid, 0)
        os.sched_setaffinity(0, cpus)
        return statistics.median(rtts[count // 10:]) * 1e6
    import tempfile

    import zmq

    path = os.path.join(tempfile.mkdtemp(prefix="litz-pingpong-"), "s")
    pid = os.fork()  # not pinned: ZeroMQ's I/O threads would share their process's core
    if pid == 0:
        ctx = zmq.Context()
        s = ctx.socket(zmq.DEALER)
        s.connect(f"ipc://{path}")
        s.send(b"hello")  # a ROUTER learns a peer's identity from its first message
        for _ in range(count):
            s.send(s.recv())
        s.close(linger=1000)  # the last echo is still in the I/O thread's hands
        ctx.term()
        os._exit(0)
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.bind(f"ipc://{path}")
    ident = s.recv_multipart()[0]
    rtts = []
    for _ in range(count):
        t0 = time.perf_counter()
        s.send_multipart([ident, MESSAGE])
        s.recv_multipart()
        rtts.append(time.perf_counter() - t0)
    os.waitpid(pid, 0)
    s.close(linger=0)
    ctx.term()
    return statistics.median(rtts[count // 10:]) * 1e6


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        buf += sock.recv(n - len(buf))
    return buf


def raw_round_trips(count: int) -> dict:
    """Both ping-pongs in a fresh interpreter: a ZeroMQ context here would make the launcher's fork server a
    fresh interpreter too (litz.forkserver), and the jobs would start differently."""
    out = subprocess.run([sys.executable, __file__, "--pingpong", str(count)], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/round_latency.quick.json)")
    ap.add_argument("--repeats", type=int, help="jobs per mode (default 3, quick 1)")
    ap.add_argument("--rounds", type=int, help="rounds per phase (default 1000, quick 300)")
    ap.add_argument("--no-ahead", action="store_true", help="measure only dispatch on completion")
    ap.add_argument("--pingpong", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pingpong:
        print(json.dumps({**{kind: pingpong(kind, args.pingpong) for kind in ("unix", "zmq")},
                          "unix_one_core": pingpong("unix", args.pingpong, same_core=True)}))
        return 0
    repeats = args.repeats or (1 if args.quick else 3)
    rounds = args.rounds or (300 if args.quick else 1000)
    modes = ["completion"] + ([] if args.no_ahead else ["ahead"])
    trace = install_trace()
    raw: list[dict] = []
    runs: dict[str, list] = {m: [] for m in modes}
    for i in range(repeats):
        raw.append(raw_round_trips(5000))
        for mode in modes if i % 2 == 0 else modes[::-1]:
            r = run_chain(rounds, mode == "ahead", trace)
            runs[mode].append(r)
            print(f"run {i + 1}/{repeats} {mode:10s} " + "  ".join(
                f"{ph}: round {v['round']:.0f} us" for ph, v in r.items()), flush=True)
        print(f"run {i + 1}/{repeats} raw round trip: unix {raw[-1]['unix']:.1f} us, zmq {raw[-1]['zmq']:.1f} us")
    rtt = {k: statistics.median(r[k] for r in raw) for k in ("unix", "zmq")}
    summary: dict = {"raw_round_trip_us": rtt}
    for mode in modes:
        summary[mode] = {}
        for ph in PAIRS:
            parts = dict.fromkeys(p for r in runs[mode] for p in r[ph])  # a part some runs lack: over those with it
            summary[mode][ph] = {p: statistics.median(r[ph][p] for r in runs[mode] if p in r[ph]) for p in parts}
            summary[mode][ph]["vs_raw"] = summary[mode][ph]["round"] / rtt["unix"]
            summary[mode][ph]["vs_zmq"] = summary[mode][ph]["round"] / rtt["zmq"]
    best = summary[modes[-1]]
    worst = max(best[ph]["vs_raw"] for ph in PAIRS)
    met = worst <= 2.0
    load = os.getloadavg()[0]  # the machine is shared: other jobs' load shows in every part
    doc = {"target": "a dependent round within 2x the carrier's raw round trip", "rounds": rounds, "load_avg": load,
           "repeats": repeats, "met": met, "summary": summary, "runs": runs, "raw": raw}
    path = _table.write_result("round_latency", doc, quick=args.quick)
    for mode in modes:
        for ph in PAIRS:
            s = summary[mode][ph]
            detail = ", ".join(f"{p} {s[p]:.0f}" for p in ("flush", "ack", "handoff", "result", "dispatch",
                                                          "deliver", "release", "start", "fetch") if p in s)
            if "handed_off" in s:
                detail += f"; handed off early in {s['handed_off']:.0%} of rounds"
            print(f"{mode:10s} {ph:5s}: round {s['round']:.0f} us = {s['vs_raw']:.2f}x raw, quickest tenth "
                  f"{s.get('round_p10', float('nan')):.0f} us ({detail})")
    print(f"raw round trip: Unix socket {rtt['unix']:.1f} us, ZeroMQ ipc {rtt['zmq']:.1f} us; -> {path}")
    if not args.quick:
        c = summary["completion"]
        after = summary.get("ahead")
        litz_cell = (f"same worker {best['same']['round']:.0f} us (quickest tenth {best['same']['round_p10']:.0f}; "
                     f"handed off at the flush in {best['same'].get('handed_off', 0):.0%}), across workers "
                     f"{best['cross']['round']:.0f} us"
                     + (f" (after=); on completion {c['same']['round']:.0f} / {c['cross']['round']:.0f} us"
                        if after else " (dispatch on completion)"))
        _table.update_rows({"round_latency": [
            litz_cell, f"raw Unix socket round trip {rtt['unix']:.0f} us (ZeroMQ ipc {rtt['zmq']:.0f} us)",
            f"{best['same']['vs_raw']:.1f}x / {best['cross']['vs_raw']:.1f}x (of ZeroMQ's: "
            f"{best['same']['vs_zmq']:.1f}x / {best['cross']['vs_zmq']:.1f}x; load average {load:.1f})", "<= 2x raw",
            _table.yes_no(met),
            _table.today()]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
