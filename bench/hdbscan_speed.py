"""HDBSCAN speed (thesis Fig. 4.10), growth exponent, and the d_max pruning's saving.

Data: ``apps.hdbscan.data.synthetic`` with 50 dimensions, 50 clusters and 10% noise (box [-100, 100], std 1),
written to a ``.npy`` file that every side reads. Everything uses ``min_cluster_size=5``.

* **Speed at 50 000 x 50**: Litz (``litz.run("apps.hdbscan")``, 2 workers, 1 server, ``--executors 2``: one
  executor per worker, for a job that keeps its size; Litz's default of 4 per worker leaves room to move on
  scale-out and costs the driver 0.74 against 0.68 s here, each barrier phase paying a task per executor)
  against the exact ``hdbscan`` library and ``fast_hdbscan``, which at more than 30 dimensions uses
  pynndescent's NN-Descent and Kruskal.
  * Litz is timed end to end: the ``litz.run`` wall time, which includes starting its processes and loading
    the file, with numba's on-disk cache built. The driver-side total is recorded too. ``--cold`` adds a
    run with an empty cache.
  * The libraries are timed by ``fit_predict`` on the loaded array, in one fresh process. fast_hdbscan's
    *cold* time is the first fit in that process: pynndescent compiles much of its code in every new
    process, whatever the cache holds. Its *warm* time is the later fits in the same process.
  * Quality: Fowlkes-Mallows of each side's labels against ``hdbscan``'s, and Litz's kNN recall (``check_recall``
    on 1 000 points, in the untimed run that builds the numba cache).
  * Targets: Litz at least 10x faster than hdbscan, no slower than fast_hdbscan warm, FM >= 0.95, recall >= 0.95.
* **Growth**: Litz and fast_hdbscan (warm) at 2^14 .. 2^20 points (``--max-log2`` sets the top), and the exact
  ``hdbscan`` from 2^14 up, one fit per size, until a fit takes more than ``--exact-limit`` seconds (45: at about
  n^2 the next size would take over 3 min). The exponent is the least-squares slope of log(time) on log(n). The
  thesis reports about n^1.14 for NN-Descent. ``--growth-repeats`` Litz and fast_hdbscan runs per size.
* **d_max pruning**: Litz at 50 000 x 50 with ``dmax_filter`` on and off, with points in random blocks
  (``partition=block``, the thesis's setting) and in tree cells (``partition=tree``, the default), with 8
  executors (4 per worker, Litz's default, as in the rows before 2026-11-24's second change, so they compare
  across dates; with one per worker half as many pairs cross executors). Recorded: the update bytes
  sent, the bytes of the d_max broadcast, and the time of the NN-Descent stage.

Litz runs ``--repeats`` times, interleaved, on this shared 2-core machine, and the table shows medians.
``--quick``: 10 000 points, growth 2^12 .. 2^13, one repeat.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _table
import numpy as np

import litz

BASELINE = r"""
import json, sys, time
import numpy as np
lib, out, reps, warmup, paths = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
if lib == "hdbscan":
    import hdbscan
    make = lambda: hdbscan.HDBSCAN(min_cluster_size=5)
else:
    import fast_hdbscan
    make = lambda: fast_hdbscan.HDBSCAN(min_cluster_size=5)
res = {"first_fit_s": None, "fits": []}
if warmup != "-":
    t = time.perf_counter()
    make().fit_predict(np.load(warmup))
    res["first_fit_s"] = time.perf_counter() - t
for k, path in enumerate(paths):
    X = np.load(path)
    times = []
    for r in range(reps):
        t = time.perf_counter()
        labels = make().fit_predict(X)
        times.append(time.perf_counter() - t)
    res["fits"].append(times)
    np.save(f"{out}.{k}.npy", labels)
print(json.dumps(res))
"""


def baseline(lib: str, paths: list[str], out: str, reps: int, warmup: str | None = None) -> dict:
    """One fresh process: fit ``warmup`` once (its time is the *cold* fit: the process compiles what numba
    did not cache), then every path ``reps`` times (*warm* fits). Each path's labels go to ``out.<k>.npy``."""
    proc = subprocess.run([sys.executable, "-c", BASELINE, lib, out, str(reps), warmup or "-", *paths],
                          capture_output=True, text=True, timeout=7200)
    if proc.returncode:
        raise RuntimeError(f"{lib} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


WORKERS = 2  # and one executor each (see the docstring)


def run_litz(path: str, out: str, cold_cache: str | None = None, executors: int = WORKERS, **extra) -> dict:
    saved = os.environ.get("NUMBA_CACHE_DIR")
    if cold_cache:
        os.environ["NUMBA_CACHE_DIR"] = cold_cache  # the worker processes inherit it
    try:
        t = time.perf_counter()
        res = litz.run("apps.hdbscan", workers=WORKERS, servers=1, executors=executors, progress=False,
                       config={"input": path, "output": out, **extra})
        res["wall_s"] = time.perf_counter() - t
    finally:
        if cold_cache:
            if saved is None:
                os.environ.pop("NUMBA_CACHE_DIR", None)
            else:
                os.environ["NUMBA_CACHE_DIR"] = saved
    return res


def make(tmp: str, n: int) -> str:
    from apps.hdbscan.data import synthetic

    path = os.path.join(tmp, f"x{n}.npy")
    if not os.path.exists(path):
        np.save(path, synthetic(n, 50, 50, 0.1, seed=0)[0])
    return path


def labels_of(path: str) -> np.ndarray:
    """Labels from a baseline's .npy, or from a Litz model file (.npz, apps/modelfile.py)."""
    loaded = np.load(path)
    return loaded["labels"] if hasattr(loaded, "files") else loaded


def fm(a: str, b: str) -> float:
    from sklearn.metrics import fowlkes_mallows_score

    return round(float(fowlkes_mallows_score(labels_of(a), labels_of(b))), 4)


def med(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/hdbscan_speed.quick.json)")
    ap.add_argument("--repeats", type=int, help="interleaved rounds (default 3, quick 1)")
    ap.add_argument("--cold", action="store_true", help="also time Litz with an empty numba cache (minutes)")
    ap.add_argument("--max-log2", type=int, help="largest growth size as a power of two (default 20)")
    ap.add_argument("--growth-repeats", type=int, help="Litz and fast_hdbscan runs per growth size (default --repeats)")
    ap.add_argument("--exact-limit", type=float, default=45.0,
                    help="stop the exact hdbscan growth after a fit slower than this (s; default 45)")
    args = ap.parse_args()
    reps = args.repeats or (1 if args.quick else 3)
    greps = args.growth_repeats or reps
    n = 10_000 if args.quick else 50_000
    sizes = [2 ** p for p in (range(12, 14) if args.quick else range(14, (args.max_log2 or 20) + 1))]
    doc: dict = {"n": n, "d": 50, "clusters": 50, "noise": 0.1, "repeats": reps, "growth_repeats": greps,
                 "loadavg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        path = make(tmp, n)
        grow_paths = [make(tmp, size) for size in sizes]
        print(f"hdbscan on {n} x 50 ...", flush=True)
        hd = baseline("hdbscan", [path], os.path.join(tmp, "hdbscan"), 1)
        ref = os.path.join(tmp, "hdbscan.0.npy")
        doc["hdbscan_s"] = hd["fits"][0][0]
        print(f"  {doc['hdbscan_s']:.1f} s", flush=True)
        print("fast_hdbscan (one process: a cold fit, then warm fits of every size) ...", flush=True)
        fast = baseline("fast_hdbscan", [path], os.path.join(tmp, "fast"), reps, warmup=path)
        doc["fast_hdbscan"] = fast
        fast_fm = fm(ref, os.path.join(tmp, "fast.0.npy"))
        warm = run_litz(path, os.path.join(tmp, "l.npy"), check_recall=1)  # numba cache built; recall checked
        doc["litz_knn_recall"] = warm["knn_recall"]
        print(f"  litz kNN recall {warm['knn_recall']:.4f}", flush=True)
        speed: dict = {"litz_wall_s": [], "litz_driver_s": [], "litz_fm": []}
        for r in range(reps):
            lo = os.path.join(tmp, "l.npy")
            res = run_litz(path, lo)
            speed["litz_wall_s"].append(res["wall_s"])
            speed["litz_driver_s"].append(res["timings_s"]["total"])
            speed["litz_fm"].append(fm(ref, lo))
            if r == 0:
                doc["litz_result"] = res
            print(f"round {r}: litz {res['wall_s']:.2f} s (driver {res['timings_s']['total']:.2f})", flush=True)
        doc["speed"] = speed
        if args.cold:
            with tempfile.TemporaryDirectory() as c1:
                doc["litz_cold_wall_s"] = run_litz(path, os.path.join(tmp, "l.npy"), cold_cache=c1)["wall_s"]
            print(f"cold: litz {doc['litz_cold_wall_s']:.1f} s", flush=True)

        print("fast_hdbscan growth (one process) ...", flush=True)
        fast_g = baseline("fast_hdbscan", grow_paths, os.path.join(tmp, "fastg"), greps, warmup=grow_paths[0])
        growth = {"sizes": sizes, "litz_wall_s": [], "litz_driver_s": [],
                  "fast_fit_s": [med(f) for f in fast_g["fits"]], "hdbscan_sizes": [], "hdbscan_fit_s": []}
        for size, p in zip(sizes, grow_paths, strict=True):
            fit = baseline("hdbscan", [p], os.path.join(tmp, "hg"), 1)["fits"][0][0]
            growth["hdbscan_sizes"].append(size)
            growth["hdbscan_fit_s"].append(round(fit, 3))
            print(f"growth n={size}: hdbscan {fit:.1f} s", flush=True)
            if fit > args.exact_limit:
                break
        growth["hdbscan_skipped_from"] = next((z for z in sizes if z not in growth["hdbscan_sizes"]), None)
        for size, p in zip(sizes, grow_paths, strict=True):
            lw, ld = [], []
            for _ in range(greps):
                res = run_litz(p, os.path.join(tmp, "g.npy"))
                lw.append(res["wall_s"])
                ld.append(res["timings_s"]["total"])
            growth["litz_wall_s"].append(med(lw))
            growth["litz_driver_s"].append(med(ld))
            print(f"growth n={size}: litz {med(lw):.2f} s (driver {med(ld):.2f})", flush=True)
        for key in ("litz_wall_s", "litz_driver_s", "fast_fit_s", "hdbscan_fit_s"):
            xs = growth["hdbscan_sizes"] if key == "hdbscan_fit_s" else sizes
            growth[key.replace("_s", "_exponent")] = (round(float(np.polyfit(np.log(xs), np.log(growth[key]), 1)[0]), 3)
                                                      if len(xs) > 1 else None)
        doc["growth"] = growth

        dmax: dict = {}
        for _ in range(reps):
            for part in ("block", "tree"):
                for filt in (1, 0):
                    res = run_litz(path, os.path.join(tmp, "d.npy"), executors=8, partition=part,
                                   dmax_filter=filt)
                    entry = dmax.setdefault(f"{part}_filter{filt}", {"nndescent_s": []})
                    entry["nndescent_s"].append(res["timings_s"]["nndescent"])
                    for key in ("update_bytes_sent", "update_records_sent", "update_records_generated",
                                "update_records_dropped_by_dmax", "reverse_bytes_sent", "dmax_bytes_published",
                                "nndescent_iterations"):
                        entry[key] = res[key]
        for part in ("block", "tree"):
            on, off = dmax[f"{part}_filter1"], dmax[f"{part}_filter0"]
            dmax[part] = {
                "update_bytes_on": on["update_bytes_sent"], "update_bytes_off": off["update_bytes_sent"],
                "dmax_bytes": on["dmax_bytes_published"],
                "bytes_saved_fraction": round(1 - (on["update_bytes_sent"] + on["dmax_bytes_published"])
                                              / max(off["update_bytes_sent"], 1), 3),
                "nndescent_s_on": med(on["nndescent_s"]), "nndescent_s_off": med(off["nndescent_s"]),
                "time_saved_fraction": round(1 - med(on["nndescent_s"]) / med(off["nndescent_s"]), 3)}
            print(f"d_max {part}: {dmax[part]}", flush=True)
        doc["dmax"] = dmax

    doc["loadavg_end"] = os.getloadavg()
    lw, fw, hs = med(speed["litz_wall_s"]), med(fast["fits"][0]), doc["hdbscan_s"]
    ldrv = med(speed["litz_driver_s"])
    litz_fm, recall = min(speed["litz_fm"]), doc["litz_knn_recall"]
    met = hs / lw >= 10 and lw <= fw and litz_fm >= 0.95 and recall >= 0.95
    doc["target_met"] = met
    out = _table.write_result("hdbscan_speed", doc, quick=args.quick)
    print(f"wrote {out}")
    if not args.quick:
        cold = f"; Litz cold {doc['litz_cold_wall_s']:.0f} s" if args.cold else ""
        g, b = doc["growth"], doc["dmax"]["block"]
        _table.update_rows({
            "hdbscan_speed": (
                f"{lw:.2f} s end to end (driver {ldrv:.2f} s), FM {litz_fm:.3f} vs hdbscan, kNN recall {recall:.3f}"
                f"{cold}; load average {doc['loadavg_start'][0]:.1f}",
                f"hdbscan {hs:.1f} s; fast_hdbscan warm {fw:.2f} s, cold {fast['first_fit_s']:.0f} s "
                f"(FM {fast_fm:.3f})",
                f"{hs / lw:.1f}x hdbscan, {fw / lw:.2f}x fast_hdbscan warm (driver alone {fw / ldrv:.2f}x)",
                ">= 10x hdbscan, <= fast_hdbscan warm, FM >= 0.95, recall >= 0.95", _table.yes_no(met),
                _table.today()),
            "hdbscan_growth": (
                f"n^{g['litz_wall_exponent']} end to end (driver n^{g['litz_driver_exponent']}), "
                f"{sizes[0]}..{sizes[-1]} x 50: " + ", ".join(f"{x:.1f}" for x in g["litz_wall_s"]) + " s",
                f"fast_hdbscan warm n^{g['fast_fit_exponent']}; hdbscan n^{g['hdbscan_fit_exponent']} "
                f"({g['hdbscan_sizes'][0]}..{g['hdbscan_sizes'][-1]}"
                + (f", skipped from {g['hdbscan_skipped_from']}: over 3 min" if g["hdbscan_skipped_from"] else "")
                + ")", "-", "thesis: about n^1.14", "-", _table.today()),
            "hdbscan_dmax": (
                f"random blocks: update bytes -{100 * b['bytes_saved_fraction']:.0f}% (d_max broadcast included), "
                f"NN-Descent time -{100 * b['time_saved_fraction']:.0f}%",
                "the same runs without the d_max filter", "-", "thesis: -42% NN-Descent time (GloVe, 4 machines)",
                "-", _table.today())})
    return 0


if __name__ == "__main__":
    sys.exit(main())
