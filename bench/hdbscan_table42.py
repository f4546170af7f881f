"""HDBSCAN, thesis Table 4.2: Litz's approximate HDBSCAN against the exact ``hdbscan`` library.

Data as Table 4.2 describes (``apps.hdbscan.data.synthetic``): 100 000 points, 1 000 clusters, 20% noise uniform
in the box, the rest normally distributed about random centres (box [-10, 10]^d, std 1: scikit-learn
``make_blobs``' defaults; the thesis does not give them), dimensions 1 to 10. Both sides run with
``min_cluster_size=5`` (so ``min_samples=5``); Litz with its defaults (k=15) on 2 workers, 1 server and 2
executors, one per worker as in ``hdbscan_speed`` (8, Litz's default, before 2026-11-24: the same FM to three
decimals). The reference is the library with ``approx_min_span_tree=False``, which makes it exact. Its default,
``True``, approximates the spanning tree: at
d=2 the default and the exact settings agree only at FM 0.925 with each other. The FM against the default is
recorded too. For each dimension: the Fowlkes-Mallows index of Litz's labels against the exact reference, and
both cluster counts, next to the thesis's figures. Target: FM at or above the thesis's in every dimension.

``--k K`` runs Litz with ``k=K`` neighbours in every dimension (default: the app's, 15). The gap below the thesis
is the kNN-graph spanning tree, not the kNN recall (0.99-1.0 here): at k=15 the MST of the 15-NN graph misses
mutual-reachability edges that the exact tree uses. One k for all dimensions, recorded in the JSON and the row.

``--quick``: 20 000 points, 200 clusters, dimensions 2 and 5.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import _table
import numpy as np

import litz

PAPER = {1: (0.896, 6267, 6285), 2: (0.959, 840, 842), 3: (0.934, 1129, 1135), 4: (0.941, 1117, 1115),
         5: (0.942, 1104, 1100), 6: (0.948, 1075, 1079), 7: (0.956, 1044, 1050), 8: (0.957, 1028, 1029),
         9: (0.958, 1027, 1023), 10: (0.961, 1020, 1018)}  # dim: (FM, clusters exact, clusters theirs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/hdbscan_table42.quick.json)")
    ap.add_argument("--repeats", type=int, default=1, help="seeds per dimension (default 1)")
    ap.add_argument("--dims", type=str, help="comma-separated dimensions (default 1..10, quick 2,5)")
    ap.add_argument("--k", type=int, help="Litz's k (neighbours) in every dimension (default: the app's, 15)")
    args = ap.parse_args()
    import hdbscan
    from sklearn.metrics import fowlkes_mallows_score

    from apps.hdbscan.data import synthetic

    n, clusters = (20_000, 200) if args.quick else (100_000, 1000)
    dims = [int(x) for x in args.dims.split(",")] if args.dims else ([2, 5] if args.quick else list(range(1, 11)))
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "model.npz")  # apps/modelfile.py
        for d in dims:
            for seed in range(args.repeats):
                X, _ = synthetic(n, d, clusters, 0.2, seed=seed)
                t = time.perf_counter()
                ref = hdbscan.HDBSCAN(min_cluster_size=5, core_dist_n_jobs=1,
                                      approx_min_span_tree=False).fit_predict(X)
                ref_s = time.perf_counter() - t
                approx = hdbscan.HDBSCAN(min_cluster_size=5, core_dist_n_jobs=1).fit_predict(X)
                config = {"synthetic": 1, "n": n, "d": d, "clusters": clusters, "noise": 0.2, "seed": seed,
                          "output": out, **({"k": args.k} if args.k else {})}
                t = time.perf_counter()
                res = litz.run("apps.hdbscan", workers=2, servers=1, executors=2, config=config, progress=False)
                litz_s = time.perf_counter() - t
                labels = np.load(out)["labels"]
                fm = fowlkes_mallows_score(ref, labels)
                run = {"d": d, "seed": seed, "fm": round(fm, 4),
                       "fm_vs_default_hdbscan": round(fowlkes_mallows_score(approx, labels), 4),
                       "fm_default_vs_exact_hdbscan": round(fowlkes_mallows_score(approx, ref), 4),
                       "clusters_litz": res["clusters"],
                       "clusters_hdbscan": int(ref.max() + 1), "noise_litz": res["noise_fraction"],
                       "noise_hdbscan": round(float(np.mean(ref < 0)), 4), "hdbscan_s": round(ref_s, 2),
                       "litz_s": round(litz_s, 2), "litz_result": res,
                       "paper_fm": PAPER[d][0], "paper_clusters_exact": PAPER[d][1], "paper_clusters_ours": PAPER[d][2]}
                runs.append(run)
                print(f"d={d} seed={seed}: FM {fm:.4f} (paper {PAPER[d][0]}; vs default hdbscan "
                      f"{run['fm_vs_default_hdbscan']}), clusters {res['clusters']} vs "
                      f"{ref.max() + 1} (paper {PAPER[d][2]} vs {PAPER[d][1]}), litz {litz_s:.1f} s, "
                      f"hdbscan {ref_s:.1f} s", flush=True)
    by_dim = {d: min(r["fm"] for r in runs if r["d"] == d) for d in dims}
    met = all(by_dim[d] >= PAPER[d][0] for d in dims)
    doc = {"n": n, "clusters": clusters, "noise": 0.2, "min_cluster_size": 5, "k": runs[0]["litz_result"]["k"],
           "runs": runs,
           "fm_by_dim": by_dim, "target_met": met}
    path = _table.write_result("hdbscan_table42", doc, quick=args.quick)
    print(f"wrote {path}")
    if not args.quick:
        worst = min(dims, key=lambda d: by_dim[d] - PAPER[d][0])
        fms = ", ".join(f"{by_dim[d]:.3f}" for d in dims)
        counts = ", ".join(f"{r['clusters_litz']}/{r['clusters_hdbscan']}" for r in runs if r["seed"] == 0)
        _table.update_rows({"hdbscan_table42": (
            f"k={doc['k']}: FM vs exact hdbscan (approx_min_span_tree=False), d=1..10: {fms}; "
            f"clusters ours/exact: {counts}",
            "thesis FM 0.896 ... 0.961",
            f"worst margin d={worst}: {by_dim[worst] - PAPER[worst][0]:+.3f}",
            ">= thesis FM in every dimension", _table.yes_no(met), _table.today())})
    return 0


if __name__ == "__main__":
    sys.exit(main())
