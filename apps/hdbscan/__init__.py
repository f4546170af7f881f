"""HDBSCAN by distributed NN-Descent and a minimum spanning tree of the kNN graph (thesis §4.7).

Run: ``litz run apps.hdbscan --config synthetic=1`` (see README.md in this directory for every key).

The approximation of §4.7.2: the K-nearest-neighbour graph comes from NN-Descent instead of an exact search,
and the minimum spanning tree is the one of that graph (K N edges) under mutual reachability
``max(core(x), core(y), d(x, y))``, instead of the one of the complete graph.

Partitioning: executor ``e`` of ``E`` owns the points ``starts[e] .. starts[e + 1] - 1`` (contiguous
blocks), their kNN lists (bounded max-heaps, :mod:`.knn`) and all work on them. The data matrix is read-only
input that every executor can read (:mod:`.data` explains why, and how it is shared).

Messages between executors travel through the parameter server, in reusable mailbox slots (:mod:`.mailbox`).
That is how the paper's implementation did it, and it keeps the messages out of the master: the master only
relays per-pair record counts. Routing arrays through the driver in task arguments would send every byte
twice through one process. The PS spreads the bytes over all server processes, the workers' caches
dedupe the broadcasts, and the messages are part of every consistent checkpoint.

Protocol (task arguments -> result dicts). The driver runs phases as barriers, and each phase is one task
per executor, dispatched when the previous phase completed. By the consistency rule, a phase then sees
everything the previous phases wrote.

* ``("info",)``: sizes and load time; each executor also builds its share of the random-projection trees and
  publishes them (keys ``("tree", t, "order" | "leaves")``).
* ``("A", t, update counts)``: in iteration 0, initialise the lists from the leaves of all the trees. Later,
  apply the updates that other executors sent in iteration ``t - 1``. Then publish every point's ``d_max``
  (key ``("dmax", e)``, exact bits), sample this iteration's candidates, and send the *reverse* candidates
  (``j`` has ``i`` in its list, so ``i`` is a candidate of ``j``) to the owners of ``j``.
* The driver stops after ``A`` when iteration ``t - 1`` accepted fewer than ``delta * N * K`` updates (or
  at ``max_iters``). Otherwise it dispatches ``("B", t, reverse counts)``: merge the reverse candidates,
  read everybody's ``d_max``, and run the local join. An update ``(x, y, d)`` for a local ``x`` goes straight
  into the heap. One for a remote ``x`` is *dropped before sending* when ``d >= d_max(x)`` (the paper's
  optimisation; ``dmax_filter=0`` turns it off). What is left is reduced to the best ``K`` per target and
  sent to the owner of ``x``.
* ``("F",)``: sorted lists, core distances (``min_samples``-th neighbour) published as ``("core", e)``, and
  the recall against exact kNN on a sample (``check_recall=1``).
* ``("edges", kruskal)``: read all core distances and weight the local kNN edges by mutual reachability.
  *Kruskal* (when ``N K`` edges fit ``mst_memory``): every executor runs Kruskal on its own edges and publishes
  that minimum spanning forest (an edge left out closes a cycle of edges at most as heavy, so it is not needed
  in the whole graph's forest either: the cycle property). Executor 0 gathers these forests, at most ``N - 1``
  edges each instead of ``n K``, builds the minimum spanning forest of their union and extracts the clusters
  (``("kruskal", counts)``). The sorting is spread over the executors; 50 000 x 50: 0.08 s -> 0.01 s of serial
  work on executor 0. *Borůvka* (otherwise, or
  ``mst=boruvka``): keep them, and return every touched component's lightest outgoing local edge. The
  driver picks the lightest per component, merges, and answers with the relabelling
  (``("boruvka", relabel)``) until no component has an outgoing edge (a forest if the kNN graph is
  disconnected). Executor 0 then extracts the clusters from the forest (``("extract", u, v, w)``).
* The driver writes the model (``output``: labels and the minimum spanning forest, an ``.npz`` of
  :mod:`apps.modelfile`) and finishes with the counts, timings and traffic figures.
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

import litz
import litz.kernels

from ..modelfile import model_path, save_model
from . import data, mailbox
from . import knn as _knn
from . import tree as _tree
from .settings import Settings

JOIN_BUFFER_ROWS = 1 << 20  # initial rows of the local join's outgoing buffer (grows when needed)

# The kernels and the argument types the executors call them with (litz.kernels): `litz warmup` compiles them
# into numba's on-disk cache, and a local job's master does before it starts workers if the cache lacks some.
KERNELS = {_knn.__name__: _knn.SIGNATURES, _tree.__name__: _tree.SIGNATURES}

# Numba's first use in a process (its registries: 0.09 s) and loading the kernels from the cache (0.05 s) happen
# at import, in the launcher that loads the app: the workers of a local job are forks of it and start with them
# done, instead of each paying them again. Nothing compiles here (see litz.kernels.preload).
_knn.numba_ready()
litz.kernels.preload(KERNELS)


def _kernels():
    """The kernel modules as imported from disk when this process can import them, else the shipped copies,
    which compile on first use (:func:`litz.kernels.from_disk`)."""
    return litz.kernels.from_disk(_knn.__name__) or _knn, litz.kernels.from_disk(_tree.__name__) or _tree


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)


_TREES: dict[tuple, tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]] = {}  # per process, like data._CACHE


def _rp_tree(X: np.ndarray, metric: int, leaf: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One random-projection tree over all points, built once per process (executors there share it).

    Each entry holds its X: keyed by ``id(X)`` alone, a tree built for an array since freed would be found
    again for a new array that happens to get the same address (a job run after another in one process)."""
    key = (id(X), X.shape, metric, leaf, seed)
    entry = _TREES.get(key)
    if entry is None or entry[0] is not X:
        if len(_TREES) > 64:
            _TREES.clear()
        entry = _TREES[key] = (X, _kernels()[0].rp_tree(X, metric, leaf, seed))
    return entry[1]


_ORDERS: dict[tuple, tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]] = {}  # per process


def _spatial_order(X: np.ndarray, metric: int, leaf: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(X[perm], perm)`` with ``perm`` the leaf order of a random-projection tree: nearby points get nearby
    internal ids, so contiguous blocks of ids are spatial cells (built once per process; the entry holds X
    for the same reason as :func:`_rp_tree`'s: a stale entry would hand out another array's points)."""
    key = (id(X), X.shape, metric, leaf, seed)
    entry = _ORDERS.get(key)
    if entry is None or entry[0] is not X:
        _ORDERS.clear()
        perm, _ = _kernels()[0].rp_tree(X, metric, leaf, seed)
        entry = _ORDERS[key] = (X, (np.ascontiguousarray(X[perm]), perm))
    return entry[1]


def _pairs(counts: np.ndarray, dst: int) -> dict[int, int]:
    """``{src: records}`` that ``dst`` must read, from the driver's count matrix."""
    return {int(src): int(c) for src, c in enumerate(counts[:, dst]) if c}


class HDBSCANDriver(litz.Driver):
    """Runs the phases as barriers, decides convergence, runs Borůvka's merges, writes the labels."""

    def dispatch_initial_tasks(self) -> None:
        self.settings = Settings.from_config(self.config)
        self.output = model_path(self.settings.output)  # a bad path fails now, not after the work
        self.t_start = time.time()
        self.marks: dict[str, float] = {}
        self.pending = 0
        self.results: list[dict] = []
        self.accepted: list[int] = []  # updates accepted per NN-Descent iteration
        self.local_accepted = 0
        self.traffic = {"update_records_generated": 0, "update_records_dropped_by_dmax": 0,
                        "update_records_sent": 0, "update_bytes_sent": 0, "reverse_bytes_sent": 0,
                        "dmax_bytes_published": 0, "distances_computed": 0}
        self.join_s = 0.0
        self._all(lambda e: ("info",))

    def handle_partial_recovery(self, info: dict) -> bool:
        """Refused: restored shards would hold mailbox slots, core distances and spanning forests from an
        older phase beside this one's, and none of them can be recounted from the executors' state. The
        runtime restores the whole job from a full checkpoint instead."""
        return False

    # -- plumbing ------------------------------------------------------------------------------------
    def _all(self, args) -> None:
        self.pending = self.num_executors
        for e in range(self.num_executors):
            self.dispatch_task(e, args(e))

    def _one(self, args: tuple) -> None:
        self.pending = 1
        self.dispatch_task(0, args)

    def _mark(self, name: str) -> None:
        self.marks[name] = time.time()

    def handle_task_completion(self, result: dict) -> None:
        self.results.append(result)
        self.pending -= 1
        if self.pending:
            return
        results, self.results = sorted(self.results, key=lambda r: r.get("e", 0)), []
        getattr(self, "_after_" + results[0]["kind"])(results)

    # -- phases --------------------------------------------------------------------------------------
    def _after_info(self, results: list[dict]) -> None:
        shapes = {(r["N"], r["D"]) for r in results}
        if len(shapes) != 1:
            raise RuntimeError(f"executors disagree on the data shape: {sorted(shapes)}")
        (self.N, self.D), = shapes
        self.load_s = max(r["load_s"] for r in results)
        self._mark("info")
        self.iteration = 0
        # the progress line: NN-Descent iteration 3/10 (an upper bound: it stops early once it converges)
        self.set_total(self.settings.max_iters, unit="iteration")
        self._all(lambda e: ("A", 0, {}))

    def _after_A(self, results: list[dict]) -> None:
        t = results[0]["t"]
        self.traffic["reverse_bytes_sent"] += sum(r["reverse_bytes"] for r in results)
        self.traffic["dmax_bytes_published"] += sum(r["dmax_bytes"] for r in results)
        if t == 0:
            self._mark("init")
            self.traffic["distances_computed"] += sum(r["computed"] for r in results)
            if self.settings.max_iters == 0:  # the random-projection-tree graph as it is
                self._mark("nndescent")
                self._all(lambda e: ("F",))
                return
        else:
            accepted = self.local_accepted + sum(r["accepted"] for r in results)
            self.accepted.append(accepted)
            self.report(iteration=t, updates=accepted)
            s = self.settings
            if accepted < s.delta * self.N * s.k or t >= s.max_iters:
                self._mark("nndescent")
                self._all(lambda e: ("F",))
                return
        counts = np.array([r["reverse_counts"] for r in results])
        self._all(lambda e: ("B", t, _pairs(counts, e)))

    def _after_B(self, results: list[dict]) -> None:
        t = results[0]["t"]
        self.local_accepted = sum(r["local_accepted"] for r in results)
        for key in ("update_records_generated", "update_records_dropped_by_dmax", "update_records_sent",
                    "update_bytes_sent", "distances_computed"):
            self.traffic[key] += sum(r[key] for r in results)
        self.join_s += max(r["join_s"] for r in results)
        counts = np.array([r["update_counts"] for r in results])
        self._all(lambda e: ("A", t + 1, _pairs(counts, e)))

    def _after_F(self, results: list[dict]) -> None:
        self._mark("core")
        samples = sum(r["recall_samples"] for r in results)
        self.recall = sum(r["recall_sum"] for r in results) / samples if samples else None
        self.kruskal = self.settings.use_kruskal(self.N)
        self._all(lambda e: ("edges", self.kruskal))

    def _after_edges(self, results: list[dict]) -> None:
        self.edges = sum(r["edges"] for r in results)
        if self.kruskal:
            self._one(("kruskal", {r["e"]: r["forest_edges"] for r in results if r["forest_edges"]}))
            return
        self.num_comps = self.N
        self.rounds = 0
        self.mst_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._after_boruvka(results)

    def _after_boruvka(self, results: list[dict]) -> None:
        cand = [np.concatenate([r[key] for r in results]) for key in ("comp", "w", "a", "b", "ca", "cb")]
        if not len(cand[0]):
            self._mark("mst")
            u, v, w = (np.concatenate([p[i] for p in self.mst_parts]) if self.mst_parts else
                       np.zeros(0, dt) for i, dt in enumerate((np.int32, np.int32, np.float32)))
            self._one(("extract", u, v, w))
            return
        relabel, count, a, b, w = _tree.boruvka_merge(self.num_comps, *cand)
        self.mst_parts.append((a, b, w))
        self.num_comps = int(count)
        self.rounds += 1
        self._all(lambda e: ("boruvka", relabel, self.num_comps))

    def _after_extract(self, results: list[dict]) -> None:
        r = results[0]
        labels = r["labels"]
        if self.output:
            u, v, w = r["mst"]
            save_model(self.output, {"labels": labels, "mst_u": u, "mst_v": v, "mst_weight": w})
        self._mark("end")
        m, s = self.marks, self.settings
        if self.kruskal:  # one task did both: split it by the executor's own clock
            m["mst"] = m["end"] - r["extract_s"]
        stages = {"load": self.load_s, "init": m["init"] - self.t_start, "nndescent": m["nndescent"] - m["init"],
                  "core_and_recall": m["core"] - m["nndescent"], "mst": m["mst"] - m["core"],
                  "extract": m["end"] - m["mst"], "total": m["end"] - self.t_start}
        traffic = dict(self.traffic)
        self.finish({
            "clusters": int(r["clusters"]), "noise_fraction": float(np.mean(labels < 0)),
            "knn_recall": self.recall, "n": self.N, "d": self.D, "k": s.k, "metric": s.metric,
            "min_cluster_size": s.min_cluster_size, "min_samples": s.min_samples,
            "max_cluster_size": s.max_cluster_size, "executors": self.num_executors,
            "nndescent_iterations": len(self.accepted), "updates_per_iteration": self.accepted,
            "dmax_filter": s.dmax_filter, **traffic, "join_s": round(self.join_s, 4),
            "mst": "kruskal" if self.kruskal else "boruvka", "boruvka_rounds": None if self.kruskal else self.rounds,
            "knn_edges": int(self.edges), "mst_edges": int(r["mst_edges"]), "mst_weight": float(r["mst_weight"]),
            "mst_components": int(self.N - r["mst_edges"]), "model": self.output,
            "timings_s": {k: round(v, 4) for k, v in stages.items()},
        })

    _after_kruskal = _after_extract


class HDBSCANExecutor(litz.Executor):
    """Owns a block of points: their kNN heaps, candidates, outgoing mailboxes, and later their edges."""

    input_attrs = ("X", "perm", "owner", "starts")

    def load_input(self) -> None:
        t0 = time.perf_counter()
        _kernels()[0].numba_ready()  # before the first kernel call: numba's first use, without scipy.linalg
        self.settings = s = Settings.from_config(self.config)
        X, self.shift = data.matrix(s)
        N = len(X)
        data.check_sizes(s, N, data.source_name(s))
        self.metric = _knn.SQEUCLID if s.metric == "euclidean" else _knn.SHIFTED_DOT
        if s.partition == "tree":  # internal ids in tree order: blocks are cells, most neighbours are local
            self.X, self.perm = _spatial_order(X, self.metric, s.leaf(), _seed(s.seed, 0))
        else:  # blocks of the input order
            self.X, self.perm = X, None
        E = self.num_executors
        self.starts = np.array([N * e // E for e in range(E + 1)], np.int64)
        self.owner = np.repeat(np.arange(E, dtype=np.int32), np.diff(self.starts))
        self.lo = int(self.starts[self.executor_id])
        self.n = int(self.starts[self.executor_id + 1]) - self.lo
        self.load_s = time.perf_counter() - t0

    def run_task(self, args: tuple) -> dict[str, Any]:
        kind = args[0]
        handler = getattr(self, "_task_" + kind, None)
        if handler is None:
            raise ValueError(f"unknown HDBSCAN task {args!r}")
        out = handler(*args[1:])
        out.setdefault("kind", kind)
        out["e"] = self.executor_id
        return out

    # -- helpers -------------------------------------------------------------------------------------
    def _receive(self, name: str, counts: dict[int, int]) -> np.ndarray:
        keys = mailbox.inbox_keys(name, self.executor_id, counts)
        values = self.ps_get_many([k for k, _, _ in keys]) if keys else []
        return mailbox.assemble(keys, values, counts)

    def _post(self, box: mailbox.Outbox, rec: np.ndarray, counts: np.ndarray) -> list:
        items, at = [], 0
        for dst, c in enumerate(counts):
            if c:
                items += box.post(dst, rec[at:at + c])
            at += c
        return items

    def _gather(self, name: str) -> np.ndarray:
        """All executors' float32 arrays ``(name, e)`` end to end (published as float32 or as its bits)."""
        return self._concat(self.ps_get_many([(name, e) for e in range(self.num_executors)]))

    def _concat(self, values: list) -> np.ndarray:
        """The values of ``(name, e)`` for every executor ``e``, as one float32 array (a missing one is zeros)."""
        return np.concatenate([np.zeros(self.starts[e + 1] - self.starts[e], np.float32) if v is None
                               else np.asarray(v).view(np.float32) for e, v in enumerate(values)])

    # -- NN-Descent ----------------------------------------------------------------------------------
    def _my_trees(self) -> list[int]:
        """The random-projection trees this executor builds: an even share of them, in executor order, so each
        worker process builds about its share (every process built every tree before: 0.08 s of the init's
        0.21 s at 50 000 x 50, duplicated in each worker)."""
        T, E = self.settings.trees(len(self.X)), self.num_executors
        return [t for t in range(T) if t * E // T == self.executor_id]

    def _task_info(self) -> dict:
        s = self.settings
        items = []
        for t in self._my_trees():  # published for everyone's init (phase A of iteration 0)
            order, leaves = _rp_tree(self.X, self.metric, s.leaf(), _seed(s.seed, 1, t))
            items += [(("tree", t, "order"), order), (("tree", t, "leaves"), leaves)]
        if items:
            self.ps_update_many(items)
        return {"N": len(self.X), "D": self.X.shape[1], "n": self.n, "load_s": self.load_s}

    def _candidate_seed(self, t: int) -> int:
        """Iteration ``t``'s sampling priorities (knn.pair_priority): phase A builds rows with it, phase B the
        rows that received candidates activate."""
        return _seed(self.settings.seed, 3, self.executor_id, t)

    def _task_A(self, t: int, counts: dict[int, int]) -> dict:
        knn = _kernels()[0]
        s, e = self.settings, self.executor_id
        computed = accepted = 0
        if t == 0:
            self.ind, self.dist, self.flag = knn.empty_heaps(self.n, s.k)
            self.out_u, self.out_r = mailbox.Outbox("u", e), mailbox.Outbox("r", e)
            self.dmax_last = np.zeros(self.n, np.int32)
            trees = range(s.trees(len(self.X)))
            values = self.ps_get_many([("tree", t, part) for t in trees for part in ("order", "leaves")])
            for tree_id in trees:  # writable copies: numba would compile again for read-only arrays
                order, leaves = (np.array(v) for v in values[2 * tree_id:2 * tree_id + 2])
                computed += knn.leaf_init(self.X, self.metric, self.shift, order, leaves, self.lo, self.n,
                                          self.ind, self.dist, self.flag)
            knn.random_fill(self.X, self.metric, self.shift, self.lo, self.n, self.ind, self.dist, self.flag,
                            _seed(s.seed, 2, e))
        else:
            accepted = knn.apply_updates(self._receive("u", counts), self.ind, self.dist, self.flag)
        items: list = []
        dmax_bytes = 0
        if s.dmax_filter:  # publish d_max exactly: the delta of its bits (see mailbox.py)
            bits = np.ascontiguousarray(self.dist[:, 0]).view(np.int32)
            items.append((("dmax", e), bits - self.dmax_last))
            self.dmax_last = bits.copy()
            dmax_bytes = bits.nbytes
        c = s.max_candidates
        self.new_ci, self.old_ci = np.empty((self.n, c), np.int32), np.empty((self.n, c), np.int32)
        self.new_cp, self.old_cp = np.empty((self.n, c), np.float32), np.empty((self.n, c), np.float32)
        self.new_n, self.old_n = np.empty(self.n, np.int32), np.empty(self.n, np.int32)
        # which rows are built, and the reverse index that builds more in phase B (see knn.build_candidates)
        self.built, self.rcount = np.empty(self.n, np.uint8), np.empty(self.n + 1, np.int64)
        self.rrow, self.rslot = np.empty(self.n * s.k, np.int32), np.empty(self.n * s.k, np.int32)
        rev = np.empty((self.n * s.k, 3), np.int32)
        m = knn.build_candidates(self.ind, self.flag, self.lo, self.n, len(self.X), np.float32(s.rho),
                                 self._candidate_seed(t), self.new_ci, self.new_cp, self.new_n, self.old_ci,
                                 self.old_cp, self.old_n, rev, self.built, self.rcount, self.rrow, self.rslot)
        rec, rcounts = knn.pack_reverse(rev, m, self.owner, self.starts, self.num_executors)
        before = self.out_r.wire_bytes
        items += self._post(self.out_r, rec, rcounts)
        self.ps_update_many(items)
        return {"t": t, "accepted": int(accepted), "computed": int(computed), "reverse_counts": rcounts.tolist(),
                "reverse_bytes": self.out_r.wire_bytes - before, "dmax_bytes": dmax_bytes}

    def _task_B(self, t: int, counts: dict[int, int]) -> dict:
        knn, _ = _kernels()
        s = self.settings
        t0 = time.perf_counter()
        use_filter = s.dmax_filter and self.num_executors > 1
        # the reverse candidates and everybody's d_max in one request (one round trip to the servers, not two)
        keys = mailbox.inbox_keys("r", self.executor_id, counts)
        dmax_keys = [("dmax", e) for e in range(self.num_executors)] if use_filter else []
        values = self.ps_get_many([k for k, _, _ in keys] + dmax_keys)
        knn.merge_reverse(mailbox.assemble(keys, values[:len(keys)], counts), self.new_ci, self.new_cp, self.new_n,
                          self.old_ci, self.old_cp, self.old_n, self.ind, self.flag, self.lo, len(self.X),
                          np.float32(s.rho), self._candidate_seed(t), self.built, self.rcount, self.rrow, self.rslot)
        thresholds = self._concat(values[len(keys):]) if use_filter else np.zeros(0, np.float32)
        stats = np.zeros(4, np.int64)
        buf = np.empty((JOIN_BUFFER_ROWS, 3), np.float64)
        m, start = 0, 0
        while True:
            start, wrote = knn.local_join(self.X, self.metric, self.shift, self.lo, self.n, self.ind, self.dist,
                                          self.flag, self.new_ci, self.new_n, self.old_ci, self.old_n, thresholds,
                                          use_filter, start, buf[m:], stats)
            m += wrote
            if start >= self.n:
                break
            bigger = np.empty((2 * len(buf), 3), np.float64)
            bigger[:m] = buf[:m]
            buf = bigger
        rec, ucounts = knn.pack_updates(buf, m, self.owner, self.starts, self.num_executors, s.k)
        before = self.out_u.wire_bytes
        self.ps_update_many(self._post(self.out_u, rec, ucounts))
        del self.new_ci, self.old_ci, self.new_cp, self.old_cp, self.new_n, self.old_n
        del self.built, self.rcount, self.rrow, self.rslot
        return {"t": t, "local_accepted": int(stats[0]), "distances_computed": int(stats[1]),
                "update_records_generated": int(stats[2]), "update_records_dropped_by_dmax": int(stats[3]),
                "update_records_sent": int(len(rec)), "update_bytes_sent": self.out_u.wire_bytes - before,
                "update_counts": ucounts.tolist(), "join_s": time.perf_counter() - t0}

    def _task_F(self) -> dict:
        knn = _kernels()[0]
        s, e = self.settings, self.executor_id
        self.ind, self.dist = knn.sorted_lists(self.ind, self.dist, self.metric == knn.SQEUCLID)
        del self.flag, self.out_u, self.out_r, self.dmax_last
        self.core = np.ascontiguousarray(self.dist[:, s.min_samples - 1])
        self.ps_update(("core", e), self.core)
        recall_sum, samples = 0.0, 0
        if s.check_recall and self.n:
            rng = np.random.default_rng([s.seed, 5, e])
            samples = min(self.n, max(1, math.ceil(s.recall_sample * self.n / len(self.X))))
            local = np.sort(rng.choice(self.n, samples, replace=False))
            kth = knn.exact_kth(self.X, self.metric, self.shift, (local + self.lo).astype(np.int64), s.k)
            if self.metric == knn.SQEUCLID:
                kth = np.sqrt(kth)
            tol = np.abs(kth) * 1e-5 + 1e-6
            recall_sum = float(np.sum(np.sum(self.dist[local] <= (kth + tol)[:, None], axis=1) / s.k))
        return {"recall_sum": recall_sum, "recall_samples": samples}

    # -- minimum spanning forest ---------------------------------------------------------------------
    def _task_edges(self, kruskal: bool) -> dict:
        knn = _kernels()[0]
        core_all = self._gather("core")
        u, v, w = knn.knn_edges(self.ind, self.dist, self.core, self.lo, core_all)
        del self.ind, self.dist
        if kruskal:  # only this executor's own minimum spanning forest can be in the whole graph's (below)
            fu, fv, fw = _kernels()[1].kruskal(len(self.X), u, v, w)
            rec = np.empty((len(fu), 3), np.int32)
            rec[:, 0], rec[:, 1], rec[:, 2] = fu, fv, fw.view(np.int32)
            if len(rec):
                self.ps_update(("edges", self.executor_id), rec)
            return {"edges": len(u), "forest_edges": len(fu)}
        self.eu, self.ev, self.ew = u, v, w
        self.comp = np.arange(len(self.X), dtype=np.int32)
        out = self._boruvka_step(len(self.X))
        out["edges"] = len(u)
        out["kind"] = "edges"
        return out

    def _boruvka_step(self, num_comps: int) -> dict:
        tree = _kernels()[1]
        keep, comp, w, a, b = tree.boruvka_candidates(self.eu, self.ev, self.ew, self.comp, num_comps)
        self.eu, self.ev, self.ew = self.eu[:keep].copy(), self.ev[:keep].copy(), self.ew[:keep].copy()
        return {"kind": "boruvka", "comp": comp, "w": w, "a": a, "b": b, "ca": self.comp[a], "cb": self.comp[b]}

    def _task_boruvka(self, relabel: np.ndarray, num_comps: int) -> dict:
        self.comp = relabel[self.comp]
        return self._boruvka_step(num_comps)

    def _task_kruskal(self, counts: dict[int, int]) -> dict:
        tree = _kernels()[1]
        t0 = time.perf_counter()
        values = self.ps_get_many([("edges", src) for src in sorted(counts)])
        rec = np.concatenate([np.asarray(v) for v in values]) if values else np.zeros((0, 3), np.int32)
        w = np.ascontiguousarray(rec[:, 2]).view(np.float32)
        u, v, w = tree.kruskal(len(self.X), np.ascontiguousarray(rec[:, 0]), np.ascontiguousarray(rec[:, 1]), w)
        out = self._task_extract(u, v, w)
        out["kruskal_s"] = time.perf_counter() - t0 - out["extract_s"]
        return out

    def _task_extract(self, u: np.ndarray, v: np.ndarray, w: np.ndarray) -> dict:
        tree = _kernels()[1]
        t0 = time.perf_counter()
        s = self.settings
        labels, clusters = tree.extract(len(self.X), u, v, w, s.min_cluster_size, s.max_cluster_size)
        if self.perm is not None:  # back to the input's order
            internal, labels = labels, np.empty_like(labels)
            labels[self.perm] = internal
        out = {"kind": "extract", "labels": labels, "clusters": int(clusters), "mst_edges": len(u),
               "mst_weight": float(np.sum(w, dtype=np.float64)), "extract_s": time.perf_counter() - t0}
        if s.output is not None:  # the forest's edges for the model file, between points in input order
            out["mst"] = (u, v, w) if self.perm is None else (self.perm[u], self.perm[v], w)
        return out
