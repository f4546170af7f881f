"""One-machine transport: Unix sockets written by each process's own thread vs ZeroMQ's ``ipc://``.

A one-machine job (``litz run``) carries its messages over :mod:`litz.localtransport` unless
``LITZ_TRANSPORT=zmq``, which keeps ZeroMQ (an I/O thread on each side of every message). This compares the
two in the same run, on what a job of short tasks pays per message:

* **no-op tasks/s**: ``bench/apps/noop.py`` (as ``bench/throughput.py``), 2 workers, 1 server;
* **LDA at 16 executors a worker**: the epoch time of ``apps.lda`` on ``bench/lda_overpartition.py``'s
  14.4M-token corpus with 32 executors (1 024 tasks an epoch), epochs 3..N averaged.

Each round runs both transports back to back, the order reversed every second round (drift cancels); the
ratios are medians of the per-round ratios. No target: it records why the carrier was chosen.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import _table

import litz

HERE = os.path.dirname(os.path.abspath(__file__))
NOOP = os.path.join(HERE, "apps", "noop.py")
LDA = {"synthetic": 1, "docs": 80_000, "vocab": 5_000, "topics": 50, "doc_length": 180, "alpha": 0.1,
       "beta": 0.01, "seed": 0}
QUICK_LDA = {**LDA, "docs": 8_000}
TRANSPORTS = ("unix", "zmq")


def _with_transport(transport: str) -> None:
    os.environ["LITZ_TRANSPORT"] = transport  # read by each process as it opens its endpoint


def run_noop(transport: str, tasks: int) -> float:
    _with_transport(transport)
    result = litz.run(NOOP, workers=2, servers=1, config={"tasks": tasks, "inflight": 64},
                      name=f"bench-transport-{os.getpid()}", progress=False)
    return result["rate"]


def run_lda(transport: str, config: dict) -> float:
    _with_transport(transport)
    result = litz.run("apps.lda", workers=2, servers=1, executors=32, config=config,
                      name=f"bench-transport-lda-{os.getpid()}", progress=False)
    seconds = [h["seconds"] for h in result["history"]][2:]
    return sum(seconds) / len(seconds)


def _paired(runs: dict[str, list[float]]) -> list[float]:
    """Per round: Unix sockets' value over ZeroMQ's."""
    return [u / z for u, z in zip(runs["unix"], runs["zmq"], strict=True)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/local_transport.quick.json)")
    ap.add_argument("--repeats", type=int, help="rounds (default 3, quick 1)")
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    tasks = 20_000 if args.quick else 200_000
    lda = {**(QUICK_LDA if args.quick else LDA), "epochs": 5 if args.quick else 8}
    noop: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    epoch: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    previous = os.environ.get("LITZ_TRANSPORT")
    try:
        for i in range(repeats):
            for t in TRANSPORTS if i % 2 == 0 else TRANSPORTS[::-1]:
                noop[t].append(run_noop(t, tasks))
                epoch[t].append(run_lda(t, lda))
                print(f"round {i + 1}/{repeats} {t}: {noop[t][-1]:,.0f} no-op tasks/s, LDA 16/worker "
                      f"{epoch[t][-1] * 1e3:.0f} ms an epoch", flush=True)
    finally:
        if previous is None:
            os.environ.pop("LITZ_TRANSPORT", None)
        else:
            os.environ["LITZ_TRANSPORT"] = previous
    rate = {t: statistics.median(noop[t]) for t in TRANSPORTS}
    ms = {t: 1e3 * statistics.median(epoch[t]) for t in TRANSPORTS}
    rate_ratio, epoch_ratio = statistics.median(_paired(noop)), statistics.median(_paired(epoch))
    doc = {"noop_tasks_per_s": rate, "lda_epoch_ms": ms, "noop_ratio": rate_ratio, "lda_epoch_ratio": epoch_ratio,
           "noop_round_ratios": _paired(noop), "lda_round_ratios": _paired(epoch), "noop_runs": noop,
           "lda_epoch_runs": epoch, "noop_tasks": tasks, "lda_config": lda, "workers": 2, "servers": 1,
           "lda_executors": 32}
    path = _table.write_result("local_transport", doc, quick=args.quick)
    print(f"no-op: {rate['unix']:,.0f} vs {rate['zmq']:,.0f} tasks/s ({rate_ratio:.2f}x); LDA 16/worker: "
          f"{ms['unix']:.0f} vs {ms['zmq']:.0f} ms an epoch ({epoch_ratio:.2f}x) -> {path}")
    if not args.quick:
        tokens = f"{lda['docs'] * lda['doc_length'] / 1e6:.1f}M"
        _table.update_rows({"local_transport": [
            f"Unix sockets: {rate['unix']:,.0f} no-op tasks/s; LDA ({tokens} tokens, 16/worker) "
            f"{ms['unix']:.0f} ms/epoch",
            f"ZeroMQ ipc://: {rate['zmq']:,.0f} tasks/s; {ms['zmq']:.0f} ms/epoch",
            f"{rate_ratio:.2f}x tasks/s, {epoch_ratio:.2f}x epoch time", "none set (design choice)", "-",
            _table.today()]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
