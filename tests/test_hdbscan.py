"""apps.hdbscan: NN-Descent recall, the MST against scipy, clusters against the ``hdbscan`` library, edge cases.

``in_process`` drives the app's Driver and Executors in this process against a dict parameter server
(tests/support/inprocess.py), so tests can look at the executors' kNN lists after a phase. The ``litz_run``
tests run the real thing through ``litz.run`` with worker and server processes.

Before the first test, whichever it is, ``litz warmup`` compiles the numba kernels into their on-disk cache
(about 30 s on a cold checkout, more on a busy machine); every test, and every worker process, loads them from
it. The tests' timeouts count only their own bodies (``func_only``), not that compile.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import apps.hdbscan as hd
import litz
from apps.hdbscan import data, mailbox, tree
from tests.support import inprocess
from tests.support.errors import assert_one_line

LOCAL = {"workers": 2, "servers": 1}


def in_process(config: dict, num_executors: int, **kw) -> inprocess.InProcess:
    return inprocess.InProcess(hd.HDBSCANDriver, hd.HDBSCANExecutor, config, num_executors, **kw)


def after_phase(kind: str, look) -> object:
    """An ``after_task`` hook calling ``look(executors)`` once every executor ran its task of phase ``kind``
    (each phase is one task per executor, and the next starts only after all of them)."""
    ran = []

    def hook(args, executors) -> None:
        if args[0] == kind:
            ran.append(args)
            if len(ran) == len(executors):
                look(executors)

    return hook


def exact_knn(X: np.ndarray, k: int, metric: str = "euclidean") -> np.ndarray:
    """Distances to the k nearest other points, brute force in float64."""
    X = X.astype(np.float64)
    if metric == "euclidean":
        sq = (X * X).sum(1)
        D = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2 * X @ X.T, 0))
    elif metric == "cosine":
        U = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-300)
        D = 1 - U @ U.T
    else:
        D = (np.linalg.norm(X, axis=1) ** 2).max() - X @ X.T
    np.fill_diagonal(D, np.inf)
    return np.sort(D, axis=1)[:, :k]


def blobs(n_per: int, centres: np.ndarray, std: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = np.concatenate([c + rng.normal(0, std, (n_per, len(c))) for c in centres]).astype(np.float32)
    y = np.repeat(np.arange(len(centres)), n_per)
    order = rng.permutation(len(X))
    return X[order], y[order]


# ------------------------------------------------------------------------------------------ kernels
pytestmark = pytest.mark.timeout(120, func_only=True)  # for the tests without a timeout of their own


@pytest.fixture(scope="module", autouse=True)
def kernels_in_cache() -> None:
    """The kernels in numba's on-disk cache before any test runs, so no test depends on another having compiled
    them (they ran in file order before, and the first one compiled them). In a process of its own, under its
    own timeout; at once when the cache is warm."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", "litz.cli.litz", "warmup", "apps.hdbscan"], cwd=root,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.timeout(60, func_only=True)
def test_both_mst_paths_run_in_process() -> None:
    """Kruskal and Borůvka paths, both partitionings, in this process (its kernels loaded from the cache)."""
    for extra in ({"mst": "kruskal"}, {"mst": "boruvka", "partition": "block", "dmax_filter": 0}):
        config = {"synthetic": 1, "n": 2000, "d": 4, "clusters": 10, "noise": 0.1, "check_recall": 1, **extra}
        result = in_process(config, 3).run()
        assert result["knn_recall"] >= 0.95 and 8 <= result["clusters"] <= 14, result
        assert result["mst"] == extra["mst"]


@pytest.mark.timeout(60, func_only=True)
def test_extract_matches_hdbscan_on_its_own_tree() -> None:
    """Given the reference's exact MST, our condensed tree, EOM and labels are the reference's labels."""
    hdbscan = pytest.importorskip("hdbscan")
    from sklearn.metrics import fowlkes_mallows_score

    X, _ = data.synthetic(3000, 5, 30, 0.1, seed=1)
    for mcs, max_size in ((5, 0), (15, 0), (5, 60)):
        ref = hdbscan.HDBSCAN(min_cluster_size=mcs, max_cluster_size=max_size, gen_min_span_tree=True,
                              core_dist_n_jobs=1).fit(X)
        mst = ref.minimum_spanning_tree_._mst
        labels, k = tree.extract(len(X), mst[:, 0].astype(np.int32), mst[:, 1].astype(np.int32), mst[:, 2],
                                 mcs, max_size)
        assert k == ref.labels_.max() + 1
        assert np.array_equal(labels < 0, ref.labels_ < 0)
        assert fowlkes_mallows_score(ref.labels_, labels) == pytest.approx(1.0)



@pytest.mark.timeout(120, func_only=True)
@pytest.mark.parametrize("rho", [1.0, 0.6])
def test_candidates_built_only_for_joining_rows_equal_building_every_row(rho: float) -> None:
    """build_candidates builds only rows with a new candidate, and merge_reverse builds the rows a remote new
    candidate activates. Every row that joins must get exactly the lists (entries and priorities) it would
    get with every row built first, unbuilt rows must be exactly the ones without a new candidate, and the
    flags must end the same."""
    from apps.hdbscan import knn

    rng = np.random.default_rng(3)
    n, k, c, total, lo = 300, 8, 6, 900, 300  # this executor owns 300..599 of 900 points
    ind = np.empty((n, k), np.int32)
    for i in range(n):  # mostly local neighbours (as with the tree partition), some remote, some empty slots
        local = rng.choice(np.setdiff1d(np.arange(lo, lo + n), [lo + i]), k, replace=False)
        remote = rng.choice(np.r_[0:lo, lo + n:total], k, replace=False)
        ind[i] = np.where(rng.random(k) < 0.8, local, remote)
    ind[rng.random((n, k)) < 0.03] = -1
    flag = (rng.random((n, k)) < 0.04).astype(np.uint8)  # late in a run: few new entries, many idle rows
    # reverse candidates from the other executors: (local target, source * 2 + is_new, priority bits)
    rec = np.empty((150, 3), np.int32)
    rec[:, 0] = rng.integers(0, n, 150)
    rec[:, 1] = rng.choice(np.r_[0:lo, lo + n:total], 150) * 2 + (rng.random(150) < 0.3)
    rec[:, 2] = rng.random(150).astype(np.float32).view(np.int32)
    seed = 12345

    def lists(eager: bool):
        f = flag.copy()
        cand = [a for _ in range(2) for a in (np.full((n, c), -1, np.int32), np.zeros((n, c), np.float32),
                                               np.zeros(n, np.int32))]
        built, rcount = np.zeros(n, np.uint8), np.zeros(n + 1, np.int64)
        rrow, rslot = np.zeros(n * k, np.int32), np.zeros(n * k, np.int32)
        rev = np.empty((n * k, 3), np.int32)
        m = knn.build_candidates(ind, f, lo, n, total, np.float32(rho), seed, *cand, rev, built, rcount, rrow,
                                 rslot)
        lazily_built = built.copy()
        if eager:  # build every row, then merge: the reference
            stamp = np.full(total, -1, np.int32)
            for i in range(n):
                if not built[i]:
                    knn.build_row(i, ind, f, lo, np.float32(rho), seed, rcount, rrow, rslot, stamp, *cand)
            built[:] = 1
        knn.merge_reverse(rec, *cand, ind, f, lo, total, np.float32(rho), seed, built, rcount, rrow, rslot)
        return cand, f, rev[:m].copy(), lazily_built

    (lz, lz_flag, lz_rev, lz_built), (ref, ref_flag, ref_rev, _) = lists(False), lists(True)
    joining = ref[2] > 0
    assert 0 < lz_built.sum() < joining.sum() < n  # the case at hand: rows built late, rows never built
    assert np.array_equal(lz[2] > 0, joining)
    for ci, cp, cn in ((0, 1, 2), (3, 4, 5)):  # new lists, then old lists
        for i in np.flatnonzero(joining):
            got = sorted(zip(lz[ci][i, :lz[cn][i]].tolist(), lz[cp][i, :lz[cn][i]].tolist(), strict=True))
            want = sorted(zip(ref[ci][i, :ref[cn][i]].tolist(), ref[cp][i, :ref[cn][i]].tolist(), strict=True))
            assert got == want, (i, got, want)
    assert np.array_equal(lz_flag, ref_flag) and not np.array_equal(lz_flag, flag)
    assert np.array_equal(lz_rev, ref_rev)

@pytest.mark.timeout(60, func_only=True)
def test_mailbox_slots_are_exact_when_reused() -> None:
    """Messages overwrite reusable slots through additive updates and arrive bit for bit (float bits too)."""
    rng = np.random.default_rng(0)
    box, server = mailbox.Outbox("m", 0), {}
    for size in (5, 3000, 700, 0, 20000, 1):
        rec = rng.integers(-2**31, 2**31 - 1, (size, 3), dtype=np.int64).astype(np.int32)
        rec[:, 2] = rng.standard_normal(size).astype(np.float32).view(np.int32)
        for key, delta in box.post(1, rec):
            server[key] = delta.copy() if key not in server else server[key] + delta
        keys = mailbox.inbox_keys("m", 1, {0: size} if size else {})
        got = mailbox.assemble(keys, [server[k] for k, _, _ in keys], {0: size})
        assert np.array_equal(got, rec)
    assert max(j for (_, _, _, j) in server) == mailbox.slots_for(20000) - 1  # slots reused, not accumulated


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize("metric", ["euclidean", "cosine", "dot"])
def test_knn_recall_against_exact(metric: str) -> None:
    X, _ = data.synthetic(3000, 8, 20, 0.2, seed=2)
    config = {"synthetic": 1, "n": 3000, "d": 8, "clusters": 20, "noise": 0.2, "seed": 2, "metric": metric, "k": 10}
    lists = {}

    def grab(executors):
        lists["dist"] = np.concatenate([ex.dist for ex in executors])
        lists["perm"] = executors[0].perm

    in_process(config, 4, after_task=after_phase("F", grab)).run()
    exact = exact_knn(X, 10, metric)[lists["perm"]]  # executors hold points in their internal order
    approx = lists["dist"].astype(np.float64)
    tol = 1e-4 * np.abs(exact[:, -1:]) + 1e-4
    recall = np.mean(approx <= exact[:, -1:] + tol)
    assert recall >= 0.95, recall
    assert np.all(approx >= exact - tol)  # never closer than the true neighbours


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize("mst", ["kruskal", "boruvka"])
def test_mst_weight_equals_scipy_on_the_same_knn_graph(mst: str) -> None:
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import minimum_spanning_tree

    config = {"synthetic": 1, "n": 4000, "d": 6, "clusters": 40, "noise": 0.2, "seed": 3, "mst": mst,
              "min_samples": 7}
    graph = {}

    def grab(executors):
        ind = np.concatenate([ex.ind for ex in executors])
        dist = np.concatenate([ex.dist for ex in executors]).astype(np.float64)
        core = np.concatenate([ex.core for ex in executors]).astype(np.float64)
        src = np.repeat(np.arange(len(ind)), ind.shape[1])
        w = np.maximum(dist.reshape(-1), np.maximum(core[src], core[ind.reshape(-1)]))
        graph["m"] = coo_matrix((w, (src, ind.reshape(-1))), shape=(len(ind), len(ind))).tocsr()

    result = in_process(config, 5, after_task=after_phase("F", grab)).run()
    expected = minimum_spanning_tree(graph["m"])  # both directions of an edge carry the same weight
    assert result["mst_weight"] == pytest.approx(expected.sum(), rel=1e-5)
    assert result["mst"] == mst and result["mst_edges"] == expected.nnz


# ------------------------------------------------------------------------------------------ real runtime
@pytest.mark.timeout(60, func_only=True)
def test_litz_run_finds_every_well_separated_blob(tmp_path) -> None:
    centres = np.array([[i * 40.0, (i % 3) * 40.0, -i * 20.0] for i in range(12)])
    X, y = blobs(250, centres, 1.0)
    np.save(tmp_path / "blobs.npy", X)
    out = tmp_path / "model.npz"
    result = litz.run("apps.hdbscan", **LOCAL, config={"input": str(tmp_path / "blobs.npy"), "output": str(out),
                                                       "min_cluster_size": 20, "check_recall": 1})
    labels = np.load(out)["labels"]
    assert result["clusters"] == 12 and labels.shape == (len(X),)
    assert result["knn_recall"] >= 0.95
    for c in range(12):  # each blob is one cluster, and no two blobs share one
        assert len(set(labels[y == c]) - {-1}) == 1
    assert len(set(labels) - {-1}) == 12
    assert result["noise_fraction"] < 0.02
    assert set(result["timings_s"]) >= {"load", "init", "nndescent", "mst", "extract", "total"}
    assert result["executors"] == 4 * LOCAL["workers"]  # the runtime's default: room to move on scale-out


@pytest.mark.timeout(60, func_only=True)
def test_litz_run_matches_hdbscan_library_on_table_4_2_style_data(tmp_path) -> None:
    hdbscan = pytest.importorskip("hdbscan")
    from sklearn.metrics import fowlkes_mallows_score

    cfg = {"n": 20000, "d": 5, "clusters": 200, "noise": 0.2, "seed": 7}
    X, _ = data.synthetic(cfg["n"], cfg["d"], cfg["clusters"], cfg["noise"], seed=cfg["seed"])
    # exact: the library's default approximates its spanning tree (FM about 0.93 against its own exact one)
    ref = hdbscan.HDBSCAN(min_cluster_size=5, core_dist_n_jobs=1, approx_min_span_tree=False).fit_predict(X)
    out = tmp_path / "model.npz"
    result = litz.run("apps.hdbscan", **LOCAL, config={"synthetic": 1, **cfg, "output": str(out)})
    fm = fowlkes_mallows_score(ref, np.load(out)["labels"])
    assert fm >= 0.9, (fm, result["clusters"], ref.max() + 1)


BASE = {"synthetic": 1, "n": 6000, "d": 8, "clusters": 30, "noise": 0.1, "check_recall": 1}


@pytest.mark.timeout(60, func_only=True)
def test_litz_run_boruvka_equals_kruskal() -> None:
    base = BASE
    k = litz.run("apps.hdbscan", **LOCAL, executors=3, config={**base, "mst": "kruskal"})
    b = litz.run("apps.hdbscan", **LOCAL, executors=3, config={**base, "mst": "boruvka"})
    assert k["mst"] == "kruskal" and b["mst"] == "boruvka" and b["boruvka_rounds"] >= 2
    assert k["knn_recall"] >= 0.95 and b["updates_per_iteration"] == k["updates_per_iteration"]  # same kNN graph
    assert b["mst_weight"] == pytest.approx(k["mst_weight"], rel=1e-6) and b["clusters"] == k["clusters"]


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize("metric", ["cosine", "dot"])
def test_litz_run_other_metrics(metric: str) -> None:
    r = litz.run("apps.hdbscan", **LOCAL, config={**BASE, "metric": metric})
    assert r["knn_recall"] >= 0.95 and r["clusters"] >= 1 and r["metric"] == metric, r


@pytest.mark.timeout(60, func_only=True)
@pytest.mark.parametrize("mst", ["kruskal", "boruvka"])
def test_litz_run_disconnected_knn_graph_gives_a_forest(tmp_path, mst: str) -> None:
    centres = np.array([[0.0, 0.0], [1e4, 0.0], [0.0, 1e4], [1e4, 1e4]])
    X, y = blobs(40, centres, 1.0, seed=4)  # k=5 neighbours never leave a group: 4 components
    np.save(tmp_path / "x.npy", X)
    out = tmp_path / "model.npz"
    result = litz.run("apps.hdbscan", **LOCAL, config={"input": str(tmp_path / "x.npy"), "output": str(out),
                                                       "k": 5, "min_samples": 5, "min_cluster_size": 10,
                                                       "mst": mst})
    labels = np.load(out)["labels"]
    assert result["mst_components"] == 4 and result["mst_edges"] == len(X) - 4
    with np.load(out) as model:  # the forest in the model file: input-order point ids, no edge between groups
        u, v, w = model["mst_u"], model["mst_v"], model["mst_weight"]
    assert len(u) == len(v) == len(w) == len(X) - 4 and np.all(y[u] == y[v]) and np.all(w >= 0)
    assert w.sum() == pytest.approx(result["mst_weight"], rel=1e-5)
    assert result["clusters"] == 4 and len(set(labels) - {-1}) == 4
    for c in range(4):
        assert len(set(labels[y == c]) - {-1}) == 1


@pytest.mark.timeout(60, func_only=True)
def test_litz_run_duplicate_points(tmp_path) -> None:
    rng = np.random.default_rng(5)
    base = np.concatenate([rng.normal(0, 0.5, (30, 3)), rng.normal(20, 0.5, (30, 3))]).astype(np.float32)
    X = np.repeat(base, 25, axis=0)  # every point 25 times: more copies than k
    X = np.concatenate([X, rng.uniform(-10, 30, (50, 3)).astype(np.float32)])
    np.save(tmp_path / "dup.npy", X)
    out = tmp_path / "model.npz"
    result = litz.run("apps.hdbscan", **LOCAL, config={"input": str(tmp_path / "dup.npy"), "output": str(out),
                                                       "k": 10, "min_samples": 5, "min_cluster_size": 20})
    labels = np.load(out)["labels"]
    copies = labels[:1500].reshape(60, 25)
    assert np.all(copies == copies[:, :1])  # copies of one point share its label
    assert result["clusters"] >= 2 and np.isfinite(result["mst_weight"])
    assert len(set(labels[:750]) - {-1}) >= 1 and not set(labels[:750]) & set(labels[750:1500]) - {-1}


# ------------------------------------------------------------------------------------------ bad input
def fails(config: dict, match: str) -> None:
    with pytest.raises(litz.InputError, match=match):
        litz.run("apps.hdbscan", workers=1, servers=1, executors=2, config=config)


@pytest.mark.timeout(60, func_only=True)
def test_bad_input_files_are_one_line_errors(tmp_path) -> None:
    good = np.random.default_rng(0).normal(size=(100, 3)).astype(np.float32)
    fails({"input": str(tmp_path / "missing.npy")}, r"missing\.npy: no such file")
    np.save(tmp_path / "flat.npy", good[:, 0])
    fails({"input": str(tmp_path / "flat.npy")}, r"expected an N x D matrix .*shape \(100,\)")
    np.save(tmp_path / "complex.npy", good.astype(np.complex64))
    fails({"input": str(tmp_path / "complex.npy")}, "got dtype complex64")
    bad = good.copy()
    bad[7, 2], bad[9, 0], bad[50, 1] = np.nan, np.inf, np.nan
    np.save(tmp_path / "nan.npy", bad)
    fails({"input": str(tmp_path / "nan.npy")}, r"2 NaN and 1 infinite value\(s\).*row 7, column 2")
    np.savetxt(tmp_path / "nan.csv", bad, delimiter=",")
    fails({"input": str(tmp_path / "nan.csv")}, r"nan\.csv: 2 NaN and 1 infinite")
    (tmp_path / "text.csv").write_text("a,b\n1,2\n3,x\n")
    fails({"input": str(tmp_path / "text.csv")}, r"text\.csv: .*'x'")
    np.save(tmp_path / "few.npy", good[:4])
    fails({"input": str(tmp_path / "few.npy")}, "4 points, fewer than min_cluster_size=5")
    np.save(tmp_path / "small.npy", good[:12])
    fails({"input": str(tmp_path / "small.npy")}, "k=15 neighbours needs more than k points, the data has 12")


@pytest.mark.timeout(60, func_only=True)
def test_bad_config_values_are_one_line_errors(tmp_path) -> None:
    fails({"synthetic": 1, "k": 4}, r"'min_samples' \(5\) must be at most 'k' \(4\)")
    fails({"synthetic": 1, "metric": "manhattan"}, "'metric' must be one of euclidean, cosine, dot")
    fails({"synthetic": 1, "output": str(tmp_path)}, "config 'output': .* is a directory")
    fails({"synthetic": 1, "min_cluster_size": 1}, "'min_cluster_size' must be an integer >= 2")


@pytest.mark.timeout(60, func_only=True)
def test_bad_input_on_the_command_line_is_one_line(tmp_path) -> None:
    from tests.support.processes import run_cli

    bad = np.ones((20, 2), np.float32)
    bad[3, 1] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    res = run_cli(["litz", "run", "apps.hdbscan", "--no-progress", "--workers", "1", "--config",
                   f"input={tmp_path / 'nan.npy'}"], timeout=50)
    assert_one_line(res, "1 NaN value(s) in the data; the first at row 3, column 1", code=None)


def test_per_process_caches_never_serve_another_arrays_points() -> None:
    """The tree and order caches are keyed by id(X): an entry left by an array since freed must not be found
    for a new array at the same address (a job run after another in one process got the old points: recall 0)."""
    import apps.hdbscan as app

    rng = np.random.default_rng(0)
    X, old = (rng.random((300, 4), dtype=np.float32) for _ in range(2))
    for cache, build in ((app._ORDERS, app._spatial_order), (app._TREES, app._rp_tree)):
        key = (id(X), X.shape, 0, 16, 1)
        cache.clear()
        cache[key] = (old, build(old, 0, 16, 1))  # what an earlier array at X's address left behind
        got = build(X, 0, 16, 1)
        if build is app._spatial_order:
            ordered, perm = got
            assert np.array_equal(ordered, X[perm])
        assert cache[key][0] is X  # rebuilt for X, not served from the stale entry
        cache.clear()


@pytest.mark.timeout(120, func_only=True)
def test_numba_ready_skips_scipy_linalg_and_leaves_blas_working() -> None:
    """``knn.numba_ready`` loads numba's registries with stand-ins for ``scipy.linalg``: numba code that does
    use BLAS (``np.dot`` of matrices) must still compile afterwards against the real module. In a fresh
    process, since this one may have used numba already."""
    import subprocess
    import sys

    script = """
import sys
import numba, numpy as np
from apps.hdbscan import knn
knn.numba_ready()
assert "scipy.linalg" not in sys.modules, "the stand-ins were left behind or scipy.linalg was imported"
f = numba.njit(lambda a, b: np.dot(a, b))
a = np.arange(6.0).reshape(2, 3)
assert np.allclose(f(a, a.T), a @ a.T)
assert hasattr(sys.modules["scipy.linalg"], "svd"), "numba got a stand-in, not scipy.linalg"
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.timeout(300, func_only=True)
def test_preloaded_kernel_signatures_are_the_ones_the_executors_use() -> None:
    """Compiling the app's ``KERNELS`` (litz warmup) loads every kernel for the argument types listed in
    ``SIGNATURES`` (importing the app then loads them from the cache, and forked
    workers inherit them). If the executors passed other types, each worker would still load or compile its
    own specialization and the preload would be wasted: a whole job (both spanning-tree paths, both
    partitionings, every metric, the recall check) must add no signature. In a fresh process, since this
    one's kernels may have been called with other types by other tests."""
    import subprocess
    import sys

    script = """
import apps.hdbscan as hd
import litz.kernels
from apps.hdbscan import knn, tree
litz.kernels.compile_all(hd.KERNELS)  # what `litz warmup` does; a cold cache loads nothing at import
from tests.support.inprocess import InProcess
loaded = {(m.__name__, name): getattr(m, name).signatures for m in (knn, tree) for name in m.SIGNATURES}
assert all(len(s) == 1 for s in loaded.values()), loaded
for extra in ({"mst": "kruskal", "check_recall": 1}, {"mst": "boruvka", "partition": "block", "dmax_filter": 0},
              {"metric": "cosine"}, {"metric": "dot", "max_cluster_size": 50}):
    config = {"synthetic": 1, "n": 1500, "d": 4, "clusters": 8, "noise": 0.1, **extra}
    InProcess(hd.HDBSCANDriver, hd.HDBSCANExecutor, config, 3).run()
used = {(m.__name__, name) for m in (knn, tree) for name in vars(m) if getattr(getattr(m, name), "signatures", None)}
assert loaded.keys() <= used, "a listed kernel was never called: " + str(loaded.keys() - used)
added = {key: getattr(__import__(key[0], fromlist=["x"]), key[1]).signatures for key in loaded}
added = {key: sigs for key, sigs in added.items() if len(sigs) != 1}
assert not added, "the executors called kernels with types not in SIGNATURES: " + str(added)
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=290,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_hdbscan_refuses_partial_recovery() -> None:
    """Its mailboxes, core distances and forests cannot be recounted: the runtime must restore it whole."""
    assert hd.HDBSCANDriver.handle_partial_recovery(hd.HDBSCANDriver.__new__(hd.HDBSCANDriver), {}) is False
