"""Parameter-server bandwidth: ps_get / ps_update of 1 MiB float32 arrays through Litz vs raw ZeroMQ.

Litz (``bench/apps/psbw.py``, 1 server; 1 worker, and 2 workers as a second data point): every key is
written once (untimed), then the timed ``update`` phase runs tasks that each ps_update 8 distinct 1 MiB
keys, and the timed ``get`` phase runs tasks that each ps_get_many 8 distinct keys. Every get misses the
worker cache: each task is dispatched from ``handle_task_completion``, so its version is newer than any
value fetched before, and tasks in flight together use disjoint keys; and the jobs run with
``LITZ_LIVE_CACHE=0``, or a worker would serve again from memory the keys no other worker wrote since it
fetched them (that is what users get, but not a measure of the transport). MB/s = payload bytes (1 MB = 10^6 B)
/ driver-side phase time (first dispatch to last completion; updates count only once the server acked).

Raw ZeroMQ, two processes on loopback, pyzmq zero-copy (``copy=False``) 1 MiB messages, DEALER -> ROUTER:
``get`` = the DEALER sends a tiny request, the ROUTER replies with a 1 MiB array; ``update`` = the DEALER
pushes 1 MiB arrays, the ROUTER acks each one. Windows of 1, 4 and 16 outstanding messages are measured and
the best is the baseline, once without security ("plain", the target's baseline) and once with CURVE,
which Litz uses on every socket (README.md, "Running on several machines"), to separate the cost of encryption
from the cost of Litz.

Litz runs with its default transport for one machine, Unix sockets without CURVE, where large frames go
through shared-memory rings (``litz.shmring``; the messages that name them cross the sockets), and once
more with ``LITZ_SHM=0 LITZ_LOCAL_TCP=1`` (1 worker): every byte through TCP with CURVE, as between
processes on different hosts; that run is compared with raw ZeroMQ with CURVE.

Litz and raw runs alternate ``--repeats`` times; the table uses medians. Target: Litz >= 0.7x raw (plain).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import _table
import numpy as np
import zmq

import litz

HERE = os.path.dirname(os.path.abspath(__file__))
APP = os.path.join(HERE, "apps", "psbw.py")
MIB = 1 << 20
WINDOWS = (1, 4, 16)


# ------------------------------------------------------------------------------------------ raw ZeroMQ
def _secure(sock: zmq.Socket, keys: tuple[bytes, bytes] | None, server: bool) -> None:
    if keys is None:
        return
    public, secret = keys
    if server:
        sock.curve_server = True
    else:
        sock.curve_serverkey = public
    sock.curve_publickey, sock.curve_secretkey = public, secret


def _raw_server(port_queue: mp.Queue, mode: str, keys: tuple[bytes, bytes] | None) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.rcvhwm = sock.sndhwm = 0
    _secure(sock, keys, server=True)
    port_queue.put(sock.bind_to_random_port("tcp://127.0.0.1"))
    payload = np.ones(MIB // 4, np.float32)
    while True:
        peer, body = sock.recv_multipart(copy=False)
        if body.bytes == b"stop":
            break
        if mode == "get":
            sock.send_multipart([peer, payload], copy=False)
        else:
            sock.send_multipart([peer, b"ack"])
    sock.close(linger=0)
    ctx.term()


def raw_rate(mode: str, window: int, messages: int, keys: tuple[bytes, bytes] | None) -> float:
    """MB/s of 1 MiB payloads moved between this process and a fresh server process."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_raw_server, args=(q, mode, keys), daemon=True)
    proc.start()
    zctx = zmq.Context()
    sock = zctx.socket(zmq.DEALER)
    sock.rcvhwm = sock.sndhwm = 0
    try:
        _secure(sock, keys, server=False)
        sock.connect(f"tcp://127.0.0.1:{q.get(timeout=30)}")
        payload = np.ones(MIB // 4, np.float32)

        def request() -> None:
            if mode == "get":
                sock.send(b"g")
            else:
                sock.send(payload, copy=False)

        for _ in range(4):  # warm-up: connection, handshake, buffers
            request()
            sock.recv(copy=False)
        sent = got = 0
        t0 = time.perf_counter()
        while sent < min(window, messages):
            request()
            sent += 1
        while got < messages:
            frame = sock.recv(copy=False)
            got += 1
            if mode == "get" and len(frame) != MIB:
                raise RuntimeError(f"raw get: got {len(frame)} bytes")
            if sent < messages:
                request()
                sent += 1
        seconds = time.perf_counter() - t0
        sock.send(b"stop")
    finally:
        sock.close(linger=1000)
        zctx.term()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return messages * MIB / seconds / 1e6


def raw_block(messages: int) -> dict:
    keys = zmq.curve_keypair()
    out: dict = {}
    for security, k in (("plain", None), ("curve", keys)):
        for mode in ("get", "update"):
            per_window = {w: raw_rate(mode, w, messages, k) for w in WINDOWS}
            out[f"{security}_{mode}"] = {"best": max(per_window.values()), "by_window": per_window}
    return out


# ------------------------------------------------------------------------------------------ Litz
def litz_block(workers: int, tasks: int, rings: bool = True) -> dict:
    os.environ["LITZ_SHM"] = "1" if rings else "0"  # read by every process of the job
    # without rings: the path between hosts, TCP with CURVE (a local job would use Unix sockets, no cipher)
    os.environ["LITZ_LOCAL_TCP"] = "0" if rings else "1"
    # every get must travel: a worker's live cache entries would serve keys no other worker wrote since
    os.environ["LITZ_LIVE_CACHE"] = "0"
    try:
        result = litz.run(APP, workers=workers, servers=1, config={"tasks": tasks, "keys_per_task": 8},
                          name=f"bench-psbw-{os.getpid()}", progress=False)
    finally:
        os.environ.pop("LITZ_SHM")
        os.environ.pop("LITZ_LOCAL_TCP")
        os.environ.pop("LITZ_LIVE_CACHE")
    return {phase: result["phases"][phase]["MB_per_s"] for phase in ("update", "get")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/ps_bandwidth.quick.json)")
    ap.add_argument("--repeats", type=int, help="alternating Litz/raw rounds (default 3, quick 1)")
    ap.add_argument("--tasks", type=int, help="Litz tasks per timed phase, 8 MiB each (default 384, quick 48)")
    ap.add_argument("--messages", type=int, help="raw 1 MiB messages per measurement (default 1500, quick 200)")
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    tasks = args.tasks or (48 if args.quick else 384)
    messages = args.messages or (200 if args.quick else 1500)

    rounds = []
    for i in range(repeats):
        raw = raw_block(messages)
        l1 = litz_block(1, tasks)
        l2 = litz_block(2, tasks)
        lc = litz_block(1, tasks, rings=False)
        rounds.append({"raw": raw, "litz_1_worker": l1, "litz_2_workers": l2, "litz_curve_only": lc})
        print(f"round {i + 1}/{repeats}: litz 1 worker get {l1['get']:.0f} update {l1['update']:.0f} MB/s; "
              f"2 workers get {l2['get']:.0f} update {l2['update']:.0f} MB/s; CURVE only get {lc['get']:.0f} "
              f"update {lc['update']:.0f} MB/s; raw plain get "
              f"{raw['plain_get']['best']:.0f} update {raw['plain_update']['best']:.0f}; raw CURVE get "
              f"{raw['curve_get']['best']:.0f} update {raw['curve_update']['best']:.0f} MB/s", flush=True)

    def med(f) -> float:
        return statistics.median(f(r) for r in rounds)

    summary = {}
    for op in ("get", "update"):
        s = {"litz_1_worker": med(lambda r, op=op: r["litz_1_worker"][op]),
             "litz_2_workers": med(lambda r, op=op: r["litz_2_workers"][op]),
             "litz_curve_only": med(lambda r, op=op: r["litz_curve_only"][op]),
             "raw_plain": med(lambda r, op=op: r["raw"][f"plain_{op}"]["best"]),
             "raw_curve": med(lambda r, op=op: r["raw"][f"curve_{op}"]["best"])}
        s["litz"] = max(s["litz_1_worker"], s["litz_2_workers"])
        s["ratio_vs_plain"] = s["litz"] / s["raw_plain"]
        s["ratio_vs_curve"] = s["litz"] / s["raw_curve"]
        s["curve_only_ratio_vs_curve"] = s["litz_curve_only"] / s["raw_curve"]
        s["met"] = s["ratio_vs_plain"] >= 0.7
        summary[op] = s
    doc = {"unit": "MB/s (10^6 bytes/s) of 1 MiB float32 payloads", "target": "litz >= 0.7x raw ZeroMQ (plain)",
           "met": all(s["met"] for s in summary.values()), "summary": summary, "rounds": rounds,
           "litz_tasks_per_phase": tasks, "keys_per_task": 8, "raw_messages": messages, "raw_windows": WINDOWS}
    path = _table.write_result("ps_bandwidth", doc, quick=args.quick)
    rows = {}
    for op, s in summary.items():
        print(f"{op}: litz {s['litz']:.0f} MB/s (1 worker {s['litz_1_worker']:.0f}, 2 workers "
              f"{s['litz_2_workers']:.0f}), raw plain {s['raw_plain']:.0f}; ratio {s['ratio_vs_plain']:.2f}x plain "
              f"(target >= 0.7x plain: {'met' if s['met'] else 'MISSED'}); CURVE only (as across hosts) "
              f"{s['litz_curve_only']:.0f} MB/s = {s['curve_only_ratio_vs_curve']:.2f}x raw CURVE "
              f"{s['raw_curve']:.0f}")
        rows[f"ps_bandwidth {op}"] = [
            f"{s['litz']:,.0f} MB/s (one host: shared-memory rings); CURVE only, as across hosts: "
            f"{s['litz_curve_only']:,.0f} MB/s",
            f"raw ZeroMQ {s['raw_plain']:,.0f} MB/s (with CURVE {s['raw_curve']:,.0f})",
            f"{s['ratio_vs_plain']:.2f}x (CURVE only: {s['curve_only_ratio_vs_curve']:.2f}x of raw CURVE)",
            ">= 0.7x raw",
            _table.yes_no(s["met"]), _table.today()]
    print(f"-> {path}")
    if not args.quick:
        _table.update_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
