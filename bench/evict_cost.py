"""The cost of one eviction and one load per MB, against raw file I/O of the same bytes.

**Litz:** ``bench/apps/spill.py``, 1 worker, 1 server, 8 executors of ``S`` MB each (pseudo-random bytes,
incompressible), ``S`` = 1, 8, 64. The budget is ``2.5 S`` (two executors fit), and the driver runs one task at a
time in cyclic order, so every task needs the least recently used executor: the worker evicts one (on its main
thread: ``pickle`` protocol 5 with the numpy buffers out of band, CRC-32, ``write`` of the header and the
buffers as they are; no fsync) and loads the other (prefetch thread: ``readinto`` one buffer, CRC-32,
``pickle.loads`` onto views of that buffer). Each ``evict`` and ``load`` event of the ``--output`` JSON carries its
``bytes`` (the pickled size) and ``seconds``; the result is the median of ``seconds / bytes`` over the events,
in ms per MB (MB = 10^6 bytes). The same job without ``--memory-limit`` gives the driver-side time per task
without I/O, so ``(limited - unlimited) / tasks`` is what one miss (an eviction plus a load, and the task
waiting for them) costs the job end to end. Spill files go to ``$LITZ_SPILL_DIR`` = a scratch directory in
the system temp directory.

**Baseline**, in this process, in the same directory, in the same run (alternating with the Litz jobs), on a
buffer of the same bytes, a fresh file each time (as a spill file is):

 * ``write``: ``open(wb).write`` (into the page cache, which is what an eviction does) and ``write + fsync``
   (the bytes on disk, the baseline the issue asks for);
 * ``read``: right after the write (from the page cache, which is where a load finds a spill file written
   seconds before, with memory free) and, after ``fsync`` and ``posix_fadvise(DONTNEED)``, from the disk.

The script also times Litz's own spill functions outside the runtime on the same bytes
(``litz.outofcore``'s write and checked load, and CRC-32 alone) to show where the time of an eviction or a
load goes. Rounds alternate ``--repeats`` times; the table shows
medians. Issue 7 sets no number for this one.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import zlib

import _jobs
import _table
import numpy as np

from litz import outofcore

APP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "apps", "spill.py")
SIZES = (1, 8, 64)
EXECUTORS = 8
ROUNDS = {1: 16, 8: 8, 64: 4}  # passes over the executors per job: 128, 64, 32 tasks
SAMPLES = {1: 32, 8: 16, 64: 6}  # raw I/O samples per size and round
QUICK_ROUNDS = {1: 4, 8: 2, 64: 1}
QUICK_SAMPLES = {1: 8, 8: 4, 64: 2}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def raw_io(folder: str, data: np.ndarray, samples: int) -> dict[str, list[float]]:
    """Seconds of each operation on ``data``'s bytes, ``samples`` times, each on a fresh file."""
    out: dict[str, list[float]] = {k: [] for k in ("write", "write_fsync", "read_cache", "read_disk",
                                                   "spill_write", "crc32", "spill_load")}
    buf = memoryview(data).cast("B")
    state = {"data": data, "check": 0}
    for i in range(samples):
        path = os.path.join(folder, f"raw-{i}.bin")

        def write(path=path) -> None:
            with open(path, "wb") as f:
                f.write(buf)

        def write_fsync(path=path) -> None:
            with open(path, "wb") as f:
                f.write(buf)
                f.flush()
                os.fsync(f.fileno())

        def read(path=path) -> None:
            with open(path, "rb") as f:
                got = f.read()
            assert len(got) == data.nbytes

        out["write"].append(_timed(write))
        out["read_cache"].append(_timed(read))
        os.unlink(path)
        out["write_fsync"].append(_timed(write_fsync))
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean pages (fsync'ed) leave the page cache
        os.close(fd)
        out["read_disk"].append(_timed(read))
        os.unlink(path)
        t0 = time.perf_counter()
        rec = outofcore._write(path, state)
        out["spill_write"].append(time.perf_counter() - t0)
        out["crc32"].append(_timed(lambda: zlib.crc32(buf)))
        out["spill_load"].append(_timed(lambda rec=rec: outofcore._checked_load(rec)))
        os.unlink(path)
    return out


def litz_run(tmp: str, name: str, mb: int, rounds: int, limited: bool) -> dict:
    extra = ["--memory-limit", str(int(2.5 * mb * 1e6))] if limited else []
    job = _jobs.Job(tmp, name, app=APP, workers=1, servers=1, executors=EXECUTORS,
                    config={"mb": mb, "rounds": rounds}, extra=extra)
    spill = os.path.join(tmp, f"{name}-spill")
    os.makedirs(spill, exist_ok=True)
    job.env["LITZ_SPILL_DIR"] = spill
    job.start()
    doc = job.wait(1800)
    out = {"tasks": doc["result"]["tasks"], "driver_s": doc["result"]["seconds"], "elapsed_s": doc["elapsed_s"],
           "load_avg": job.load, "spill_left": sorted(os.listdir(spill))}
    for kind in ("evict", "load"):
        evs = _jobs.events(doc, kind)
        out[kind] = [{"bytes": e["bytes"], "seconds": e["seconds"], "t": e["t"]} for e in evs]
    return out


def ms_per_mb(seconds: list[float], nbytes: int) -> float:
    return statistics.median(seconds) / (nbytes / 1e6) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/evict_cost.quick.json)")
    ap.add_argument("--repeats", type=int, help="rounds over all sizes (default 3, quick 1)")
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    rounds = QUICK_ROUNDS if args.quick else ROUNDS
    samples = QUICK_SAMPLES if args.quick else SAMPLES

    runs: dict[int, list[dict]] = {s: [] for s in SIZES}
    with tempfile.TemporaryDirectory(prefix="litz-bench-evict-") as tmp:
        for i in range(repeats):
            for mb in SIZES:
                data = np.random.default_rng([mb, i]).integers(0, 256, int(mb * 1e6), dtype=np.uint8)
                raw = raw_io(tmp, data, samples[mb])
                tag = f"{os.getpid()}-{i}-{mb}"
                lim = litz_run(tmp, f"evict-lim-{tag}", mb, rounds[mb], True)
                un = litz_run(tmp, f"evict-un-{tag}", mb, rounds[mb], False)
                if not lim["evict"] or not lim["load"]:
                    raise RuntimeError(f"{mb} MB: the limited job evicted {len(lim['evict'])} and loaded "
                                       f"{len(lim['load'])} executors; expected both")
                nbytes = data.nbytes
                r = {"round": i + 1, "mb": mb, "raw": raw, "limited": lim, "unlimited": un,
                     "evict_ms_per_mb": statistics.median(e["seconds"] / e["bytes"] * 1e9 for e in lim["evict"]),
                     "load_ms_per_mb": statistics.median(e["seconds"] / e["bytes"] * 1e9 for e in lim["load"]),
                     "miss_s": (lim["driver_s"] - un["driver_s"]) / lim["tasks"],
                     "evict_s": statistics.median(e["seconds"] for e in lim["evict"]),
                     "load_s": statistics.median(e["seconds"] for e in lim["load"]),
                     "raw_ms_per_mb": {k: ms_per_mb(v, nbytes) for k, v in raw.items()}}
                runs[mb].append(r)
                rm = r["raw_ms_per_mb"]
                print(f"round {i + 1}/{repeats} {mb:2d} MB: evict {r['evict_ms_per_mb']:.2f} ms/MB "
                      f"({len(lim['evict'])} events), load {r['load_ms_per_mb']:.2f} ms/MB ({len(lim['load'])}); "
                      f"raw write {rm['write']:.2f}, write+fsync {rm['write_fsync']:.2f}, read (cache) "
                      f"{rm['read_cache']:.2f}, read (disk) {rm['read_disk']:.2f}; spill write "
                      f"{rm['spill_write']:.2f}, crc32 {rm['crc32']:.2f}, spill load {rm['spill_load']:.2f} "
                      f"ms/MB; miss {r['miss_s'] * 1e3:.0f} ms/task; spill files left {len(lim['spill_left'])}; "
                      f"load avg {lim['load_avg']}", flush=True)

    med: dict[int, dict] = {}
    for mb in SIZES:
        rs = runs[mb]
        med[mb] = {"evict_ms_per_mb": statistics.median(r["evict_ms_per_mb"] for r in rs),
                   "load_ms_per_mb": statistics.median(r["load_ms_per_mb"] for r in rs),
                   "miss_ms_per_task": statistics.median(r["miss_s"] for r in rs) * 1e3,
                   "evict_ms": statistics.median(r["evict_s"] for r in rs) * 1e3,
                   "load_ms": statistics.median(r["load_s"] for r in rs) * 1e3,
                   **{f"raw_{k}_ms_per_mb": statistics.median(r["raw_ms_per_mb"][k] for r in rs)
                      for k in rs[0]["raw_ms_per_mb"]}}
        m = med[mb]
        m["evict_vs_write_fsync"] = m["evict_ms_per_mb"] / m["raw_write_fsync_ms_per_mb"]
        m["evict_vs_write"] = m["evict_ms_per_mb"] / m["raw_write_ms_per_mb"]
        m["load_vs_read_cache"] = m["load_ms_per_mb"] / m["raw_read_cache_ms_per_mb"]
        m["load_vs_read_disk"] = m["load_ms_per_mb"] / m["raw_read_disk_ms_per_mb"]
        m["miss_beyond_io_ms"] = m["miss_ms_per_task"] - m["evict_ms"] - m["load_ms"]
        m["evict_mb_per_s"] = 1e3 / m["evict_ms_per_mb"]
        m["load_mb_per_s"] = 1e3 / m["load_ms_per_mb"]
    left = sum(len(r["limited"]["spill_left"]) for rs in runs.values() for r in rs)
    doc = {"target": "no number set: the cost of one eviction and one load per MB",
           "executors": EXECUTORS, "budget": "2.5 executors", "sizes_mb": list(SIZES), "spill_files_left": left,
           "spill_fs": os.statvfs(tempfile.gettempdir()).f_fsid, "median": med, "runs": runs}
    path = _table.write_result("evict_cost", doc, quick=args.quick)
    for mb in SIZES:
        m = med[mb]
        print(f"{mb:2d} MB: evict {m['evict_ms_per_mb']:.2f} ms/MB ({m['evict_mb_per_s']:.0f} MB/s; "
              f"{m['evict_vs_write_fsync']:.2f}x write+fsync, {m['evict_vs_write']:.2f}x write), load "
              f"{m['load_ms_per_mb']:.2f} ms/MB ({m['load_mb_per_s']:.0f} MB/s; {m['load_vs_read_cache']:.2f}x read "
              f"from cache, {m['load_vs_read_disk']:.2f}x from disk); a miss costs the job "
              f"{m['miss_ms_per_task']:.0f} ms, {m['miss_beyond_io_ms']:.0f} ms more than its eviction and load "
              f"({m['evict_ms']:.1f} + {m['load_ms']:.1f} ms)")
    print(f"-> {path}")
    if not args.quick:
        def cells(key: str, fmt: str = "{:.2f}") -> str:
            return " / ".join(fmt.format(med[mb][key]) for mb in SIZES)

        sizes = "/".join(str(s) for s in SIZES)
        _table.update_rows({
            "evict_cost evict": [
                f"{cells('evict_ms_per_mb')} ms/MB at {sizes} MB executors ({cells('evict_mb_per_s', '{:.0f}')} MB/s)",
                f"write+fsync {cells('raw_write_fsync_ms_per_mb')} ms/MB (write to page cache "
                f"{cells('raw_write_ms_per_mb')})",
                f"{cells('evict_vs_write_fsync')}x (vs write alone {cells('evict_vs_write', '{:.1f}')}x)",
                "none set", "-", _table.today()],
            "evict_cost load": [
                f"{cells('load_ms_per_mb')} ms/MB at {sizes} MB executors ({cells('load_mb_per_s', '{:.0f}')} MB/s); "
                f"a miss costs a task {cells('miss_ms_per_task', '{:.0f}')} ms "
                f"({cells('miss_beyond_io_ms', '{:.0f}')} ms beyond the eviction + load)",
                f"read from page cache {cells('raw_read_cache_ms_per_mb')} ms/MB (from disk "
                f"{cells('raw_read_disk_ms_per_mb')})",
                f"{cells('load_vs_read_cache')}x (vs disk {cells('load_vs_read_disk')}x)",
                "none set", "-", _table.today()]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
