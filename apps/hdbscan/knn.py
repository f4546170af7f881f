"""Numba kernels of distributed NN-Descent (Dong et al. 2011; thesis §4.7.2). No per-point Python.

An executor owns the points ``lo .. lo + n - 1`` (global ids) and keeps their K-nearest-neighbour lists as
three ``(n, K)`` arrays that form one bounded max-heap per row: ``ind`` (global id, -1 = empty slot),
``dist`` (distance, +inf = empty) and ``flag`` (1 = "new": not yet used in a local join). ``dist[i, 0]`` is
the row's largest distance, the paper's ``d_max``.

Distances are computed from the replicated, read-only data matrix ``X`` (float32), with one of two kernels:

* ``SQEUCLID``: squared euclidean distance (the square root is taken once, for the final lists);
* ``SHIFTED_DOT``: ``shift - <x, y>``, clamped at 0. ``metric=dot`` uses ``shift = max ||x||^2`` over the
  data, so every distance is >= 0 and the ranking is the inner product's; ``metric=cosine`` runs on
  row-normalised data with ``shift = 1``, which is exactly the cosine distance ``1 - cos``.

Records that travel between executors are ``(m, 3)`` int32 arrays; float32 values travel as their bits
(``view``), so a record array is one homogeneous buffer and additive parameter-server arithmetic on it is
exact (see :mod:`apps.hdbscan.mailbox`).
"""
from __future__ import annotations

import sys
import types

import numba
import numpy as np


def numba_ready() -> None:
    """Load numba's typing and lowering registries (its first use in a process) without ``scipy.linalg``.

    Loading them imports ``numba.np.arraymath``, which imports ``scipy.linalg.cython_blas`` only to learn
    whether BLAS is there. With scipy 1.17 that import takes 0.13-0.2 s (``scipy.linalg`` pulls in
    ``numpy.f2py``, ``numpy.testing`` and more), about 0.2 s of every worker's 0.33 s first use, and no
    kernel here uses BLAS. While the registries load, empty stand-ins answer for the three modules; they are
    removed right after, so a later ``np.dot`` in numba code imports the real ones (numba checks again at
    compile time). Only when scipy is installed (``import numba`` has imported it), so the answer "BLAS
    is there" stays true."""
    from numba.core.registry import cpu_target

    if "numba.np.arraymath" in sys.modules or "scipy.linalg" in sys.modules or "scipy" not in sys.modules:
        return  # loaded already, or nothing to save: numba loads them on first use as usual
    names = ("scipy.linalg", "scipy.linalg.cython_blas", "scipy.linalg.cython_lapack")
    stubs = {name: types.ModuleType(name) for name in names}
    sys.modules.update(stubs)
    try:
        cpu_target.target_context.refresh()
    finally:
        for name, stub in stubs.items():
            if sys.modules.get(name) is stub:
                del sys.modules[name]
        scipy = sys.modules.get("scipy")
        if scipy is not None and vars(scipy).get("linalg") is stubs["scipy.linalg"]:
            del scipy.linalg

SQEUCLID, SHIFTED_DOT = 0, 1
# nogil: the process's lease keep-alive thread must keep running. fastmath: only the flags that let sums be
# vectorised (reassociation, contraction, no signed zeros), not "no infinities": +inf marks an empty slot.
NOGIL = dict(nogil=True, cache=True, fastmath={"reassoc", "contract", "nsz"})


@numba.njit(inline="always")
def distance(X, a, b, metric, shift):
    xa, xb = X[a], X[b]
    s = np.float32(0.0)
    if metric == SQEUCLID:
        for t in range(xa.shape[0]):
            diff = xa[t] - xb[t]
            s += diff * diff
        return s
    for t in range(xa.shape[0]):
        s += xa[t] * xb[t]
    s = shift - s
    return s if s > 0 else np.float32(0.0)


@numba.njit(inline="always")
def heap_push(ind, dist, flag, i, d, j, f):
    """Insert ``(d, j)`` into row ``i`` if it beats the row's maximum and ``j`` is not there yet: 1 if inserted."""
    if d >= dist[i, 0]:
        return 0
    k = ind.shape[1]
    for s in range(k):
        if ind[i, s] == j:
            return 0
    pos = 0
    while True:
        left = 2 * pos + 1
        if left >= k:
            break
        right = left + 1
        c = left if (right >= k or dist[i, left] >= dist[i, right]) else right
        if dist[i, c] > d:
            ind[i, pos], dist[i, pos], flag[i, pos] = ind[i, c], dist[i, c], flag[i, c]
            pos = c
        else:
            break
    ind[i, pos], dist[i, pos], flag[i, pos] = j, d, f
    return 1


def empty_heaps(n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.full((n, k), -1, np.int32), np.full((n, k), np.inf, np.float32), np.zeros((n, k), np.uint8)


# ------------------------------------------------------------------------------------------ RP-tree init
@numba.njit(**NOGIL)
def rp_tree(X, metric, leaf_size, seed):
    """One random-projection tree over all rows of ``X``: ``(order, leaf_starts)``; leaf ``l`` holds
    ``order[leaf_starts[l]:leaf_starts[l + 1]]``. Each split is the hyperplane halfway between two random
    points of the node (angular version for the dot kernels); ties and degenerate splits are broken at
    random, so duplicate points cannot stall it."""
    np.random.seed(seed)
    n, dim = X.shape
    order = np.arange(n).astype(np.int32)
    side = np.empty(n, np.uint8)
    stack = np.empty((2 * (n // max(leaf_size, 1)) + 64, 2), np.int64)
    leaves = np.empty(n + 1, np.int64)
    nleaves = 0
    top = 0
    stack[0, 0], stack[0, 1] = 0, n
    top = 1
    normal = np.empty(dim, np.float32)
    while top > 0:
        top -= 1
        lo, hi = stack[top, 0], stack[top, 1]
        size = hi - lo
        if size <= leaf_size:
            leaves[nleaves] = lo
            nleaves += 1
            continue
        a = order[lo + np.random.randint(size)]
        b = order[lo + np.random.randint(size)]
        offset = np.float32(0.0)
        if metric == SQEUCLID:
            for t in range(dim):
                normal[t] = X[a, t] - X[b, t]
                offset -= normal[t] * (X[a, t] + X[b, t]) * np.float32(0.5)
        else:
            na = np.float32(0.0)
            nb = np.float32(0.0)
            for t in range(dim):
                na += X[a, t] * X[a, t]
                nb += X[b, t] * X[b, t]
            na = np.float32(1.0) / np.sqrt(na) if na > 0 else np.float32(0.0)
            nb = np.float32(1.0) / np.sqrt(nb) if nb > 0 else np.float32(0.0)
            for t in range(dim):
                normal[t] = X[a, t] * na - X[b, t] * nb
        nleft = 0
        for s in range(lo, hi):
            p = order[s]
            m = offset
            for t in range(dim):
                m += normal[t] * X[p, t]
            if m > 0:
                side[s - lo] = 0
            elif m < 0:
                side[s - lo] = 1
            else:
                side[s - lo] = np.random.randint(2)
            nleft += 1 - side[s - lo]
        if nleft == 0 or nleft == size:  # degenerate (e.g. duplicates): random halves
            nleft = 0
            for s in range(size):
                side[s] = np.random.randint(2)
                nleft += 1 - side[s]
            if nleft == 0 or nleft == size:
                nleft = size // 2
                for s in range(size):
                    side[s] = 0 if s < nleft else 1
        # stable partition of order[lo:hi] by side
        tmp = order[lo:hi].copy()
        w0, w1 = lo, lo + nleft
        for s in range(size):
            if side[s] == 0:
                order[w0] = tmp[s]
                w0 += 1
            else:
                order[w1] = tmp[s]
                w1 += 1
        if top + 2 > stack.shape[0]:
            bigger = np.empty((2 * stack.shape[0], 2), np.int64)
            bigger[:top] = stack[:top]
            stack = bigger
        stack[top, 0], stack[top, 1] = lo, lo + nleft
        stack[top + 1, 0], stack[top + 1, 1] = lo + nleft, hi
        top += 2
    starts = np.sort(leaves[:nleaves])
    out = np.empty(nleaves + 1, np.int64)
    out[:nleaves] = starts
    out[nleaves] = n
    return order, out


@numba.njit(**NOGIL)
def leaf_init(X, metric, shift, order, leaf_starts, lo, n, ind, dist, flag):
    """Offer every local point its leaf-mates in one tree (local heaps only: no message). Each pair of a leaf
    is compared once and offered to both ends (to each local one), not once from each side."""
    hi = lo + n
    computed = 0
    for leaf in range(leaf_starts.shape[0] - 1):
        a0, a1 = leaf_starts[leaf], leaf_starts[leaf + 1]
        mine = False
        for s in range(a0, a1):
            if lo <= order[s] < hi:
                mine = True
                break
        if not mine:
            continue
        for s in range(a0, a1):
            p = order[s]
            p_local = lo <= p < hi
            for t in range(s + 1, a1):
                q = order[t]
                q_local = lo <= q < hi
                if not (p_local or q_local):
                    continue
                d = distance(X, p, q, metric, shift)
                computed += 1
                # the heap's first test, before the call (faster; see local_join)
                if p_local and d < dist[p - lo, 0]:
                    heap_push(ind, dist, flag, p - lo, d, q, 1)
                if q_local and d < dist[q - lo, 0]:
                    heap_push(ind, dist, flag, q - lo, d, p, 1)
    return computed


@numba.njit(**NOGIL)
def random_fill(X, metric, shift, lo, n, ind, dist, flag, seed):
    """Fill empty slots with random points (only rows whose leaves were smaller than K + 1)."""
    np.random.seed(seed)
    total = X.shape[0]
    k = ind.shape[1]
    for i in range(n):
        tries = 0
        while ind[i, 0] < 0 and tries < 4 * k + 16:  # an empty slot sits at the root (dist = +inf)
            j = np.random.randint(total)
            tries += 1
            if j != lo + i:
                heap_push(ind, dist, flag, i, distance(X, lo + i, j, metric, shift), j, 1)


# ------------------------------------------------------------------------------------------ iterations
@numba.njit(**NOGIL)
def cand_sift_down(cind, cpri, i, pos, p, j):
    """In row ``i`` (a max-heap on priority below ``pos``), put ``(p, j)`` at ``pos`` and sift it down. Called
    directly per entry, never through another helper: numba adds reference counting to every call of a
    helper that takes arrays (about 15 ns, inlined or not)."""
    c = cind.shape[1]
    while True:
        left = 2 * pos + 1
        if left >= c:
            break
        right = left + 1
        ch = left if (right >= c or cpri[i, left] >= cpri[i, right]) else right
        if cpri[i, ch] > p:
            cind[i, pos], cpri[i, pos] = cind[i, ch], cpri[i, ch]
            pos = ch
        else:
            break
    cind[i, pos], cpri[i, pos] = j, p


@numba.njit(**NOGIL)
def cand_heapify(cind, cpri, i):
    """Make the full row ``i`` a max-heap on priority (Floyd); once per full row."""
    for top in range(cind.shape[1] // 2 - 1, -1, -1):
        cand_sift_down(cind, cpri, i, top, cpri[i, top], cind[i, top])


@numba.njit(inline="always")
def pair_priority(seed, g, s):
    """The sampling priority in [0, 1) of neighbour slot ``s`` of global row ``g`` in one iteration: a hash
    (splitmix64's finaliser), not a draw from a stream. Any row's candidates can then be built on demand, in
    any order, with the same priority for a pair in both of its lists (forward and reverse)."""
    x = np.uint64(seed) + np.uint64(g) * np.uint64(0x9E3779B97F4A7C15)
    x += np.uint64(s + 1) * np.uint64(0xD1B54A32D192ED03)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return np.float32(x >> np.uint64(40)) * np.float32(1.0 / 16777216.0)


@numba.njit(**NOGIL)
def build_row(i, ind, flag, lo, rho, seed, rcount, rrow, rslot, stamp, new_ci, new_cp, new_n, old_ci, old_cp,
              old_n):
    """Row ``i``'s candidates: its own neighbours (forward) and the local points that have ``i`` as a
    neighbour (reverse, from the index :func:`build_candidates` made), as "new" or "old" after the slot's flag;
    each list keeps the ``C`` lowest priorities. A point that is both (a mutual pair) enters once, found by a
    stamp instead of a scan of the row.

    A row holds ``new_n[i]`` (``old_n[i]``) entries: while fewer than ``C``, unordered at the front; a full
    row is a max-heap on priority, and a later entry replaces the maximum if its priority is lower."""
    k = ind.shape[1]
    c = new_ci.shape[1]
    g = lo + i
    nn = no = 0
    for r in range(-k, rcount[i + 1] - rcount[i]):  # forward entries (r < 0), then reverse ones
        if r < 0:
            s = r + k
            j = ind[i, s]
            if j < 0:
                continue
            p = pair_priority(seed, g, s)
            if p >= rho:
                continue
            isnew = flag[i, s]
        else:
            a, s = rrow[rcount[i] + r], rslot[rcount[i] + r]
            j = lo + a
            if stamp[j] == i:  # a mutual pair: the row has it already
                continue
            p = pair_priority(seed, j, s)  # the reverse index holds only pairs that passed rho
            isnew = flag[a, s]
        stamp[j] = i
        if isnew:
            if nn < c:
                new_ci[i, nn], new_cp[i, nn] = j, p
                nn += 1
                if nn == c:
                    cand_heapify(new_ci, new_cp, i)
            elif p < new_cp[i, 0]:
                cand_sift_down(new_ci, new_cp, i, 0, p, j)
        else:
            if no < c:
                old_ci[i, no], old_cp[i, no] = j, p
                no += 1
                if no == c:
                    cand_heapify(old_ci, old_cp, i)
            elif p < old_cp[i, 0]:
                cand_sift_down(old_ci, old_cp, i, 0, p, j)
    new_n[i], old_n[i] = nn, no


@numba.njit(**NOGIL)
def build_candidates(ind, flag, lo, n, total, rho, seed, new_ci, new_cp, new_n, old_ci, old_cp, old_n, rev,
                     built, rcount, rrow, rslot):
    """Sample this iteration's candidates (Dong et al.; priorities as pynndescent: one random priority per
    pair, the ``C`` lowest kept per list). A pair enters only with probability ``rho``. Reverse entries for a
    remote ``j`` become records ``(j, i * 2 + is_new, priority bits)`` in ``rev``: returns how many.

    Only rows that can take part in the local join are built: those with a new candidate. A row without one
    joins nothing, so its old candidates are never used; late in a run that is most rows (at 50 000 x 50,
    three quarters from the fourth iteration, 99% at the end), and building every row cost about 11 ms per
    25 000 points and iteration whatever the row's state. Rows are marked in ``built``. A row that only a
    remote executor's reverse entry makes "new" is built when that entry arrives (:func:`merge_reverse`),
    from the reverse index kept here (``rcount``: CSR offsets over local targets, ``rrow``/``rslot``: the
    local row and slot that hold the target), so every joining row gets exactly the candidates it would
    get if all rows were built."""
    k = ind.shape[1]
    hi = lo + n
    built[:] = 0
    new_n[:] = 0
    old_n[:] = 0
    rcount[:] = 0
    pri_bits = np.empty(1, np.float32)
    m = 0
    for i in range(n):
        g = lo + i
        for s in range(k):
            j = ind[i, s]
            if j < 0:
                continue
            if rho < 1 and pair_priority(seed, g, s) >= rho:
                continue
            f = flag[i, s]
            if f:
                built[i] = 1
            if lo <= j < hi:
                rcount[j - lo + 1] += 1
                if f:
                    built[j - lo] = 1
            else:
                pri_bits[0] = pair_priority(seed, g, s)
                rev[m, 0] = j
                rev[m, 1] = g * 2 + f
                rev[m, 2] = pri_bits.view(np.int32)[0]
                m += 1
    for i in range(n):
        rcount[i + 1] += rcount[i]
    fill = rcount[:n].copy()
    for i in range(n):
        for s in range(k):
            j = ind[i, s]
            if lo <= j < hi and (rho >= 1 or pair_priority(seed, lo + i, s) < rho):
                rrow[fill[j - lo]] = i
                rslot[fill[j - lo]] = s
                fill[j - lo] += 1
    stamp = np.full(total, -1, np.int32)
    for i in range(n):
        if built[i]:
            build_row(i, ind, flag, lo, rho, seed, rcount, rrow, rslot, stamp, new_ci, new_cp, new_n, old_ci,
                      old_cp, old_n)
    return m


@numba.njit(**NOGIL)
def merge_reverse(rec, new_ci, new_cp, new_n, old_ci, old_cp, old_n, ind, flag, lo, total, rho, seed, built,
                  rcount, rrow, rslot):
    """Add the reverse candidates received (``(local i, j * 2 + is_new, priority bits)``) to the rows
    :func:`build_candidates` built; first build the rows that a received new candidate makes joining. Records
    for rows that stay unbuilt (only old candidates) are dropped: such a row joins nothing. Then mark as old
    every neighbour slot whose point made it into the new-candidate sample (it is joined now)."""
    stamp = np.full(total, -1, np.int32)
    for r in range(rec.shape[0]):
        i = rec[r, 0]
        if rec[r, 1] & 1 and not built[i]:
            build_row(i, ind, flag, lo, rho, seed, rcount, rrow, rslot, stamp, new_ci, new_cp, new_n, old_ci,
                      old_cp, old_n)
            built[i] = 1
    bits = np.empty(1, np.int32)
    c = new_ci.shape[1]
    for r in range(rec.shape[0]):
        i = rec[r, 0]
        if not built[i]:
            continue
        j = rec[r, 1] >> 1
        bits[0] = rec[r, 2]
        p = bits.view(np.float32)[0]
        isnew = rec[r, 1] & 1
        size = new_n[i] if isnew else old_n[i]
        cind = new_ci if isnew else old_ci
        cpri = new_cp if isnew else old_cp
        dup = False
        for t in range(size):
            if cind[i, t] == j:
                dup = True
                break
        if dup:
            continue
        if size < c:
            cind[i, size], cpri[i, size] = j, p
            size += 1
            if size == c:
                cand_heapify(cind, cpri, i)
            if isnew:
                new_n[i] = size
            else:
                old_n[i] = size
        elif p < cpri[i, 0]:
            cand_sift_down(cind, cpri, i, 0, p, j)
    n, k = ind.shape
    for i in range(n):
        if new_n[i] == 0:
            continue
        for t in range(new_n[i]):
            stamp[new_ci[i, t]] = -2 - i  # below every row id: stamps from the builds above never match
        for s in range(k):
            if flag[i, s] and ind[i, s] >= 0 and stamp[ind[i, s]] == -2 - i:
                flag[i, s] = 0


@numba.njit(**NOGIL)
def local_join(X, metric, shift, lo, n, ind, dist, flag, new_ci, new_n, old_ci, old_n, thresholds, use_filter,
               start, out, stats):
    """NN-Descent's local join for local points ``start ..``: every new-new and new-old candidate pair
    ``(u, v)`` is compared and offered to both ends. An offer to a local point goes straight into its heap.
    An offer ``(x, y, d)`` to a remote ``x`` is written to ``out`` (float64 rows), unless ``use_filter`` and
    ``d >= thresholds[x]`` (``d_max(x)`` as published at the start of the iteration): then it is dropped
    before sending. Stops before ``out`` could overflow; returns ``(next point, rows written)``. ``stats``
    accumulates: local updates accepted, distances computed, remote offers generated, remote offers dropped."""
    c = new_ci.shape[1]
    per_point = 2 * (c * c + c * c)
    hi = lo + n
    m = 0
    accepted = computed = generated = dropped = 0
    i = start
    while i < n:
        nn, no = new_n[i], old_n[i]
        if nn == 0:  # no new candidate: nothing to join (its row may not even be built)
            i += 1
            continue
        if m + per_point > out.shape[0]:
            break
        for a in range(nn):
            u = new_ci[i, a]
            u_local = lo <= u < hi
            for b in range(a + 1, nn + no):
                v = new_ci[i, b] if b < nn else old_ci[i, b - nn]
                if v == u:
                    continue
                d = distance(X, u, v, metric, shift)
                computed += 1
                # Both ends written out (no loop over a swapped tuple), and the heap's own first test done
                # here, before the call: together 3x faster at 50 dims, with the same result.
                if u_local:
                    if d < dist[u - lo, 0]:
                        accepted += heap_push(ind, dist, flag, u - lo, d, v, 1)
                else:
                    generated += 1
                    if use_filter and d >= thresholds[u]:
                        dropped += 1
                    else:
                        out[m, 0], out[m, 1], out[m, 2] = u, v, d
                        m += 1
                if lo <= v < hi:
                    if d < dist[v - lo, 0]:
                        accepted += heap_push(ind, dist, flag, v - lo, d, u, 1)
                else:
                    generated += 1
                    if use_filter and d >= thresholds[v]:
                        dropped += 1
                    else:
                        out[m, 0], out[m, 1], out[m, 2] = v, u, d
                        m += 1
        i += 1
    stats[0] += accepted
    stats[1] += computed
    stats[2] += generated
    stats[3] += dropped
    return i, m


@numba.njit(**NOGIL)
def pack_updates(buf, m, owner, starts, num_owners, keep):
    """Group offers ``buf[:m]`` (``(x, y, d)``) by target ``x`` (a counting sort: targets of one owner are one
    block of ids, so this also groups them by owner) into one int32 record array ``(x - start[owner], y,
    d bits)``. Per target, keep only the ``keep`` smallest distances (the target cannot accept more than
    that from one batch) and no repeated ``y``. Returns ``(records, counts per owner)``."""
    total = owner.shape[0]
    first = np.zeros(total + 1, np.int64)
    for r in range(m):
        first[np.int64(buf[r, 0]) + 1] += 1
    for x in range(total):
        first[x + 1] += first[x]
    fill = first[:total].copy()
    by_target = np.empty(m, np.int64)
    for r in range(m):
        x = np.int64(buf[r, 0])
        by_target[fill[x]] = r
        fill[x] += 1
    rec = np.empty((min(m, total * keep), 3), np.int32)
    counts = np.zeros(num_owners, np.int64)
    dbits = np.empty(1, np.float32)
    w = 0
    for x in range(total):
        lo, hi = first[x], first[x + 1]
        if lo == hi:
            continue
        for a in range(lo + 1, hi):  # insertion sort of the group by distance (groups are small)
            q = by_target[a]
            b = a - 1
            while b >= lo and buf[by_target[b], 2] > buf[q, 2]:
                by_target[b + 1] = by_target[b]
                b -= 1
            by_target[b + 1] = q
        o = owner[x]
        start = w
        for a in range(lo, hi):
            if w - start >= keep:
                break
            q = by_target[a]
            y = np.int32(buf[q, 1])
            dup = False
            for t in range(start, w):
                if rec[t, 1] == y:
                    dup = True
                    break
            if dup:
                continue
            rec[w, 0] = x - starts[o]
            rec[w, 1] = y
            dbits[0] = np.float32(buf[q, 2])
            rec[w, 2] = dbits.view(np.int32)[0]
            w += 1
        counts[o] += w - start
    return rec[:w], counts


@numba.njit(**NOGIL)
def pack_reverse(rev, m, owner, starts, num_owners):
    """Group reverse records ``rev[:m]`` by the owner of their target; targets become local indices."""
    counts = np.zeros(num_owners, np.int64)
    for r in range(m):
        counts[owner[rev[r, 0]]] += 1
    offsets = np.zeros(num_owners + 1, np.int64)
    for o in range(num_owners):
        offsets[o + 1] = offsets[o] + counts[o]
    rec = np.empty((offsets[num_owners], 3), np.int32)
    fill = offsets[:num_owners].copy()
    for r in range(m):
        o = owner[rev[r, 0]]
        w = fill[o]
        rec[w, 0] = rev[r, 0] - starts[o]
        rec[w, 1] = rev[r, 1]
        rec[w, 2] = rev[r, 2]
        fill[o] += 1
    return rec, counts


@numba.njit(**NOGIL)
def apply_updates(rec, ind, dist, flag):
    """Apply received ``(local x, y, d bits)`` records to the heaps; returns how many were accepted."""
    bits = np.empty(1, np.int32)
    accepted = 0
    for r in range(rec.shape[0]):
        bits[0] = rec[r, 2]
        accepted += heap_push(ind, dist, flag, rec[r, 0], bits.view(np.float32)[0], rec[r, 1], 1)
    return accepted


# ------------------------------------------------------------------------------------------ results
@numba.njit(**NOGIL)
def sorted_lists(ind, dist, sqrt):
    """Rows sorted by distance (ascending), as float32 real distances (square root for euclidean)."""
    n, k = ind.shape
    oi = ind.copy()
    od = dist.copy()
    for i in range(n):
        for a in range(1, k):  # insertion sort: K is small
            dv, iv = od[i, a], oi[i, a]
            b = a - 1
            while b >= 0 and od[i, b] > dv:
                od[i, b + 1], oi[i, b + 1] = od[i, b], oi[i, b]
                b -= 1
            od[i, b + 1], oi[i, b + 1] = dv, iv
        if sqrt:
            for a in range(k):
                od[i, a] = np.sqrt(od[i, a])
    return oi, od


@numba.njit(**NOGIL)
def exact_kth(X, metric, shift, queries, k):
    """Exact distance of each query point (global id) to its k-th nearest other point (brute force)."""
    n = X.shape[0]
    out = np.empty(queries.shape[0], np.float32)
    heap = np.empty(k, np.float32)
    for qi in range(queries.shape[0]):
        q = queries[qi]
        heap[:] = np.inf
        for j in range(n):
            if j == q:
                continue
            d = distance(X, q, j, metric, shift)
            if d < heap[0]:  # max-heap of the k smallest
                pos = 0
                while True:
                    left = 2 * pos + 1
                    if left >= k:
                        break
                    right = left + 1
                    c = left if (right >= k or heap[left] >= heap[right]) else right
                    if heap[c] > d:
                        heap[pos] = heap[c]
                        pos = c
                    else:
                        break
                heap[pos] = d
        out[qi] = heap[0]
    return out


def knn_edges(ind: np.ndarray, dist: np.ndarray, core: np.ndarray, lo: int, core_all: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The local rows of the kNN graph with mutual-reachability weights ``max(core_x, core_y, d(x, y))``."""
    n, k = ind.shape
    src = np.repeat(np.arange(lo, lo + n, dtype=np.int32), k)
    dst = ind.reshape(-1)
    w = dist.reshape(-1)
    ok = dst >= 0
    src, dst, w = src[ok], dst[ok], w[ok]
    w = np.maximum(w, np.maximum(core_all[src], core_all[dst]))
    return src, dst.astype(np.int32), w.astype(np.float32)


# The argument types the executors pass (numba's signature syntax; all arrays C-contiguous): see litz.kernels.
SIGNATURES = {
    "rp_tree": "(f4[:, ::1], i8, i8, i8)",
    "leaf_init": "(f4[:, ::1], i8, f8, i4[::1], i8[::1], i8, i8, i4[:, ::1], f4[:, ::1], u1[:, ::1])",
    "random_fill": "(f4[:, ::1], i8, f8, i8, i8, i4[:, ::1], f4[:, ::1], u1[:, ::1], i8)",
    "build_candidates": "(i4[:, ::1], u1[:, ::1], i8, i8, i8, f4, i8, i4[:, ::1], f4[:, ::1], i4[::1], i4[:, ::1], "
                        "f4[:, ::1], i4[::1], i4[:, ::1], u1[::1], i8[::1], i4[::1], i4[::1])",
    "merge_reverse": "(i4[:, ::1], i4[:, ::1], f4[:, ::1], i4[::1], i4[:, ::1], f4[:, ::1], i4[::1], i4[:, ::1], "
                     "u1[:, ::1], i8, i8, f4, i8, u1[::1], i8[::1], i4[::1], i4[::1])",
    "local_join": "(f4[:, ::1], i8, f8, i8, i8, i4[:, ::1], f4[:, ::1], u1[:, ::1], i4[:, ::1], i4[::1], i4[:, ::1], "
                  "i4[::1], f4[::1], b1, i8, f8[:, ::1], i8[::1])",
    "pack_updates": "(f8[:, ::1], i8, i4[::1], i8[::1], i8, i8)",
    "pack_reverse": "(i4[:, ::1], i8, i4[::1], i8[::1], i8)",
    "apply_updates": "(i4[:, ::1], i4[:, ::1], f4[:, ::1], u1[:, ::1])",
    "sorted_lists": "(i4[:, ::1], f4[:, ::1], b1)",
    "exact_kth": "(f4[:, ::1], i8, f8, i8[::1], i8)",
}
