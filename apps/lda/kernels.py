"""Numba kernels of the LDA app: the collapsed Gibbs sampler, count rebuilding and log-likelihood parts.

**Sampler: SparseLDA's bucket decomposition** (Yao, Mimno and McCallum, KDD 2009), exact collapsed Gibbs.
The conditional of token ``i`` (document ``d``, word ``w``) splits into three buckets::

    p(z=k) ∝ (n_dk + α)(n_wk + β) / (n_k + Vβ)
           = αβ/(n_k+Vβ)            s: smoothing, same for every token, kept as a running sum
           + β n_dk/(n_k+Vβ)        r: document bucket, non-zero only for the document's topics
           + (n_dk+α) n_wk/(n_k+Vβ) q: word bucket, non-zero only for the word's topics

``s`` is a running sum, updated in O(1) when a token changes topic; ``q`` is summed over the word's
non-zero topics only, held in a per-word topic list (built the first time the word occurs in the task,
kept up to date as counts reach or leave zero). Most of the mass falls in ``q`` once topics have formed,
so a token costs about the number of topics its word actually uses, not K: about 5 at K = 50 on the
issue's corpus after 40 sweeps. In the first sweeps, when a word has more than K/2 non-zero topics, its
word bucket is one dense pass over K instead, which LLVM vectorises (``fastmath``).

**The document bucket is computed only when a draw needs it.** A task visits each of its documents once, for
the document's tokens in the task's vocabulary block: with B blocks, ``N_d / B`` tokens a visit (about 6 at 32
blocks and 180-token documents). Summing ``r`` over K at every visit then added about 4% to every token's
cost, about half of what 32 blocks cost more per token than 2 (over-partitioning; measured in one process,
bench/README.md). So each draw first uses a bound, ``r <= β (N_d - 1) / min_k (n_k + Vβ)`` (the document's
other tokens, each in some topic); the task keeps a lower bound on ``min_k n_k`` (its value at the start, less
one per token removed). A uniform draw over ``q + bound + s`` that lands in ``q`` or ``s`` stands as it is.
One that lands in the bound's range gets ``r`` summed exactly: below ``r`` it stands (it is uniform there),
above it is rejected and drawn again over ``q + r + s``. Every accepted draw has probability proportional to
its topic's weight and a rejection redraws from the exact conditional, so the sampler stays exact Gibbs. ``r``
is then kept up to date for the rest of the visit. Once topics have formed, ``r`` is a small part of the mass
(about β/n_wk of ``q``), so few draws land in the bound's range: on the 14.4M-token corpus of
``bench/lda_overpartition.py`` after 10 sweeps, 0.3% of the visits sum ``r`` at 32 blocks (6 tokens a visit);
at 2 blocks 97% do, once per 90 tokens. Tests: ``test_sampler_draws_from_the_exact_conditional``.

Why this and not an alias/Metropolis-Hastings sampler (LightLDA): block scheduling already gives the
sampler exclusive, fresh word-topic counts for its block (Strads' point), so an exact sampler is cheap to
keep exact; MH proposals built from stale alias tables need several steps per token to mix as well as
one exact Gibbs step, and their per-token win only pays for K in the thousands. The issue's reference is
K = 50, where SparseLDA's word bucket costs a handful of non-zero topics per token and every sweep moves
the chain as far as a standard collapsed Gibbs sweep (tomotopy's, and the ``lda`` package's), so the
log-likelihood per sweep is comparable one to one.

**Documents in a random order.** A task visits its documents (runs) in an order drawn anew from its own
random stream, not in the layout's fixed order. Any order keeps the chain exact Gibbs; the same order sweep after
sweep mixes more slowly in the first sweeps, where the topics separate: on the 3.6M-token corpus of
``bench/lda_quality.py`` (2 executors, chain seeds 1-8) the fixed order was up to 0.014 behind tomotopy's 2 threads
(whose scheme draws a new document order every sweep) in sweeps 5-10, the random order at most 0.009. The order
is random by chunks of consecutive documents holding at least ``VISIT_CHUNK_TOKENS`` = 1 024 tokens: one
document at a time cost 9% of the sampler's time on 57.6M tokens (160 000 documents an executor: each visit
missed the caches for its document-topic row and tokens), chunks of 16 documents (about 1 400 tokens there) cost
nothing measurable and recovered as well (at most 0.009 behind in sweeps 1-14, against 0.009 one document at a
time). A chunk is counted in tokens, not documents, because a task's runs shrink as executors multiply: at 32
executors on 57.6M tokens a run is about 6 tokens, chunks of 16 runs (about 90 tokens) made every task 4.5%
dearer than the layout's order (task CPU, 2 runs each), chunks of 1 024 tokens 1.4% dearer.

One task = one numba call (:func:`sample_task`, around :func:`sample_block`): no per-token Python. The
random numbers come from an xorshift64* generator seeded per (chain seed, executor, round), so a task is a
deterministic function of its inputs. The log-likelihood parts are computed in the same call when the task
asks for them; the other helpers (initial topics, counts recomputed from ``z``) are vectorised numpy, so only
the sampler is compiled (about 1.3 s of CPU, once per machine: it is in numba's on-disk cache, see
``apps.lda._sampler`` and :data:`SIGNATURES`). Everything here is
a module-level function, never an executor attribute, so executors pickle as plain numpy arrays.
"""
from __future__ import annotations

import math

import numba
import numpy as np

_U12, _U25, _U27 = np.uint64(12), np.uint64(25), np.uint64(27)
_MUL = np.uint64(2685821657736338717)
_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53
_U11 = np.uint64(11)
VISIT_CHUNK_TOKENS = 1024


def task_seed(seed: int, executor: int, rnd: int) -> int:
    """A well-mixed non-zero 64-bit seed for one task (splitmix64 over the three numbers)."""
    x = 0
    for part in (seed, executor, rnd, 0x5EED):
        x = (x + (part & 0xFFFFFFFFFFFFFFFF) + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return x or 1


@numba.njit(nogil=True, cache=True, fastmath=True, inline="always")
def _doc_bucket(ndk, d, inv, beta):  # pragma: no cover
    """Document ``d``'s bucket mass, β Σ_k n_dk / (n_k + Vβ), summed exactly."""
    r = 0.0
    for k in range(inv.shape[0]):
        r += ndk[d, k] * inv[k]
    return r * beta


@numba.njit(nogil=True, cache=True, inline="always")
def _draw(x):  # pragma: no cover
    """One step of the xorshift64* stream: the next state and a uniform double in [0, 1) from it."""
    x ^= x >> _U12
    x ^= x << _U25
    x ^= x >> _U27
    return x, ((x * _MUL) >> _U11) * _TO_UNIT


@numba.njit(nogil=True, cache=True)
def visit_order(run_ptr, r0, r1, x):  # pragma: no cover
    """Runs ``r0..r1-1`` (a task's document visits) in a random order drawn from the xorshift64* state ``x``,
    and the state after it: chunks of consecutive runs, each closed once it holds ``VISIT_CHUNK_TOKENS`` tokens,
    in a random order (Fisher-Yates), each chunk's runs in layout order. See the module doc, "Documents in a
    random order"."""
    n = r1 - r0
    start = np.empty(n + 1, np.int64)  # chunk c is runs start[c]..start[c + 1]-1
    chunks = 0
    held = VISIT_CHUNK_TOKENS
    for run in range(r0, r1):
        if held >= VISIT_CHUNK_TOKENS:
            start[chunks] = run
            chunks += 1
            held = 0
        held += run_ptr[run + 1] - run_ptr[run]
    start[chunks] = r1
    perm = np.arange(chunks)
    for i in range(chunks - 1, 0, -1):
        x, u = _draw(x)
        j = int(u * (i + 1))
        perm[i], perm[j] = perm[j], perm[i]
    order = np.empty(n, np.int64)
    k = 0
    for c in perm:
        for run in range(start[c], start[c + 1]):
            order[k] = run
            k += 1
    return order, x


@numba.njit(nogil=True, cache=True, fastmath=True)
def sample_block(word, z, run_doc, run_ptr, r0, r1, ndk, wt, nk, doc_len, alpha, beta, vbeta, seed):  # pragma: no cover
    """Resample every token of runs ``r0..r1-1`` in place (``z``, ``ndk``, ``wt``, ``nk``).

    ``ndk`` is int16 or int32 (:func:`doc_topic_counts`); numba compiles one version for each.

    ``wt`` is the block's word-topic matrix (rows = words of the block), ``nk`` the topic totals as this
    task sees them (its own changes included), ``doc_len`` the tokens of each document (all blocks).
    Returns the number of tokens that changed topic.
    """
    K = nk.shape[0]
    V = wt.shape[0]
    ab = alpha * beta
    nzt = np.empty((V, K), np.int16)  # non-zero topics of each word, any order (built on first use)
    nzc = np.full(V, -1, np.int32)  # their number; -1: not built yet
    inv = np.empty(K, np.float64)
    nk_min = nk[0]
    for k in range(K):
        inv[k] = 1.0 / (nk[k] + vbeta)
        if nk[k] < nk_min:
            nk_min = nk[k]
    floor = nk_min + vbeta  # a lower bound on every n_k + V beta for the rest of the task (see the module doc)
    qbuf = np.empty(K, np.float64)
    dense_at = K // 2  # a word with more non-zero topics: its word bucket in one dense, vectorised pass
    order, x = visit_order(run_ptr, r0, r1, np.uint64(seed))
    changed = 0
    s = 0.0
    for k in range(K):
        s += inv[k]
    s *= ab
    for run in order:
        d = run_doc[run]
        r = 0.0
        known = False  # r summed exactly: once a draw lands in its bound, then kept up to date
        nd1 = doc_len[d] - 1  # the document's other tokens, each in some topic: r <= beta * nd1 / floor
        for i in range(run_ptr[run], run_ptr[run + 1]):
            w = word[i]
            t = z[i]
            c = nzc[w]
            if c < 0:  # the list holds exactly the positive counts: a count read from a shard restored by a
                c = 0    # partial recovery can be negative until the recount, and must not enter it twice
                for k in range(K):  # branch-free: which topics are non-zero is unpredictable
                    nzt[w, c] = k
                    c += wt[w, k] > 0
            ndt = ndk[d, t]
            it = inv[t]
            s -= ab * it
            if known:
                r -= beta * ndt * it
            ndt -= 1
            ndk[d, t] = ndt
            nk[t] -= 1
            floor -= 1.0
            cnt = wt[w, t] - 1
            wt[w, t] = cnt
            it = 1.0 / (nk[t] + vbeta)
            inv[t] = it
            s += ab * it
            if known:
                r += beta * ndt * it
            if cnt == 0:
                for j in range(c):
                    if nzt[w, j] == t:
                        nzt[w, j] = nzt[w, c - 1]
                        break
                c -= 1
            q = 0.0
            dense = c > dense_at
            if dense:
                for k in range(K):
                    qbuf[k] = (ndk[d, k] + alpha) * inv[k] * wt[w, k]
                for k in range(K):
                    q += qbuf[k]
            else:
                for j in range(c):
                    k = nzt[w, j]
                    v = (ndk[d, k] + alpha) * inv[k] * wt[w, k]
                    qbuf[j] = v
                    q += v
            if not known and floor <= 0.0:  # no bound (tiny or negative totals): the exact sum at once
                r = _doc_bucket(ndk, d, inv, beta)
                known = True
            new = -1
            while new < 0:  # once, or twice after a rejection
                x, u = _draw(x)
                rb = r if known else beta * nd1 / floor  # the document bucket's mass, or a bound on it
                u *= q + rb + s
                if u < q:
                    if dense:
                        # No branch on which topics are zero: that pattern is the word's, and with thousands of
                        # words in a block it cannot be predicted (a mispredicted branch per zero topic made
                        # a token cost 30% more as topics formed). u stays >= 0, so a zero never wins.
                        for k in range(K):
                            v = qbuf[k]
                            if u < v:
                                new = k
                                break
                            u -= v
                        if new < 0:  # rounding: the last topic with weight
                            for k in range(K - 1, -1, -1):
                                if qbuf[k] > 0.0:
                                    new = k
                                    break
                    else:
                        for j in range(c):
                            u -= qbuf[j]
                            if u <= 0.0:
                                new = nzt[w, j]
                                break
                        if new < 0:
                            new = nzt[w, c - 1]
                    continue
                u -= q
                if u >= rb:
                    u -= rb
                    for k in range(K):
                        u -= ab * inv[k]
                        if u <= 0.0:
                            new = k
                            break
                    if new < 0:
                        new = K - 1
                    continue
                if not known:  # in the bound's range: below the exact r the draw stands (uniform there)
                    r = _doc_bucket(ndk, d, inv, beta)
                    known = True
                    if u >= r:  # above it: rejected, drawn again from the exact conditional
                        continue
                last = t
                for k in range(K):
                    n = ndk[d, k]
                    if n > 0:
                        last = k
                        u -= beta * n * inv[k]
                        if u <= 0.0:
                            new = k
                            break
                if new < 0:
                    new = last
            ndn = ndk[d, new]
            inn = inv[new]
            s -= ab * inn
            if known:
                r -= beta * ndn * inn
            ndn += 1
            ndk[d, new] = ndn
            nk[new] += 1
            cnt = wt[w, new] + 1
            wt[w, new] = cnt
            inn = 1.0 / (nk[new] + vbeta)
            inv[new] = inn
            s += ab * inn
            if known:
                r += beta * ndn * inn
            if cnt == 1:
                nzt[w, c] = new
                c += 1
            nzc[w] = c
            if new != t:
                changed += 1
                z[i] = new
    return changed


@numba.njit(nogil=True, cache=True)
def sample_task(word, z, run_doc, run_ptr, r0, r1, ndk, wt_ps, nk, doc_len, alpha, beta, vbeta,
                seed, ll_doc, ll_word):  # pragma: no cover
    """A sampling task's arithmetic in one call: copy the block as read (``wt_ps``, int32), sample (``z``,
    ``ndk`` and ``nk`` in place, as :func:`sample_block`), take the block's delta with its range, and, when
    asked, the log-likelihood parts (``ll_doc``: :func:`doc_log_likelihood` of ``ndk``; ``ll_word``:
    :func:`word_log_likelihood` of the block after sampling).

    Why one call: between two tasks the sampler has filled the core's caches with its own data, so each
    numpy call around it runs cold (in a worker at 16 executors a worker, a 31 KB block subtraction took 7 us
    right after the kernel and 2 us right after itself). Doing the copy, the subtraction and the range here
    saved about 9 us of CPU a task (32 executors, 3.6M tokens, 3 alternating pairs: 398, 393, 398 against
    407, 399, 412 us of CPU a task from its values in hand to its end), about 2% of an epoch there.
    Returns ``(wt, delta8, nk_delta, changed, lo, hi, doc_ll, word_ll, cols)``: the block after sampling,
    ``wt - wt_ps`` as int8 (wrapped where an entry is outside -128..127), the change of ``nk``, the tokens that
    changed topic, the smallest and largest entry of the exact delta (:func:`block_delta` takes the int8 one when
    they fit, the usual case), and the log-likelihood parts with the block's column sums (0.0, 0.0 and zeros
    when not asked). The delta loop keeps its range with min and max, not branches: it then vectorises (20 us
    against 88 for a 2 500-word block of K = 50), and writing int8 spares an int32 delta and a pass to narrow it."""
    wt = wt_ps.copy()
    nk0 = nk.copy()
    changed = sample_block(word, z, run_doc, run_ptr, r0, r1, ndk, wt, nk, doc_len, alpha, beta, vbeta, seed)
    delta = np.empty(wt.shape, np.int8)
    after, before, out = wt.ravel(), wt_ps.ravel(), delta.ravel()
    lo = 0
    hi = 0
    for i in range(after.size):
        x = after[i] - before[i]
        out[i] = np.int8(x)
        lo = min(lo, x)
        hi = max(hi, x)
    doc_ll = doc_log_likelihood(ndk, doc_len, alpha) if ll_doc else 0.0
    word_ll, cols = word_log_likelihood(wt, beta) if ll_word else (0.0, np.zeros(nk.shape[0], np.int64))
    return wt, delta, nk - nk0, changed, lo, hi, doc_ll, word_ll, cols


def _sampler_signature(ndk: type) -> tuple:
    """``sample_task``'s argument types as the executors pass them: the block ``wt_ps`` read-only (as
    ``ps_get`` hands it out, and as ``_init`` passes its stand-in), ``ndk`` int16 or int32
    (:func:`doc_topic_counts`), every array C-contiguous. numba compiles one version per distinct set."""
    a1 = numba.types.Array
    i4, i8 = numba.int32, numba.int64
    return (a1(i4, 1, "C"), a1(numba.int16, 1, "C"), a1(i4, 1, "C"), a1(i8, 1, "C"), i8, i8, a1(ndk, 2, "C"),
            a1(i4, 2, "C", readonly=True), a1(i8, 1, "C"), a1(i4, 1, "C"), numba.float64, numba.float64,
            numba.float64, numba.uint64, numba.boolean, numba.boolean)


# The kernels and the types they are called with (litz.kernels; declared as apps.lda.KERNELS): `litz warmup`
# compiles them into numba's cache ahead of the first run
SIGNATURES = {"sample_task": [_sampler_signature(numba.int16), _sampler_signature(numba.int32)]}


def random_topics(tokens: int, K: int, seed: int) -> np.ndarray:
    """Uniform initial topics (int16)."""
    return np.random.default_rng(seed).integers(0, K, size=tokens, dtype=np.int16)


def doc_topic_counts(z: np.ndarray, run_doc: np.ndarray, run_ptr: np.ndarray, num_docs: int, K: int) -> np.ndarray:
    """``ndk`` (num_docs x K) recomputed from the topic assignments: int16 unless a document is longer than
    32 767 tokens (a count never exceeds its document's length), else int32.

    ``ndk`` is dense, the largest array an executor holds at large K (K = 1 000: 4 KB a document in int32,
    against 360 bytes of ``z`` for 180 tokens), and the sampler reads one row at every document visit, from
    memory when many small blocks make short visits: int16 halves both. The speed is level within this
    machine's noise (57.6M tokens, 7 pairs alternating with int32 in the job: 16 executors a worker 1.2%
    faster, 1 a worker 2.8% faster, single runs spreading by 5%)."""
    doc = np.repeat(run_doc.astype(np.int64), np.diff(run_ptr))
    counts = np.bincount(doc * K + z, minlength=num_docs * K).reshape(num_docs, K)
    longest = int(counts.sum(axis=1).max()) if num_docs else 0
    return counts.astype(np.int16 if longest <= np.iinfo(np.int16).max else np.int32)


def word_topic_counts(word: np.ndarray, z: np.ndarray, lo: int, hi: int, rows: int, K: int) -> np.ndarray:
    """One block's word-topic counts (rows x K, int32) from the tokens ``lo..hi-1`` (the block's runs)."""
    key = word[lo:hi].astype(np.int64) * K + z[lo:hi]
    return np.bincount(key, minlength=rows * K).reshape(rows, K).astype(np.int32)


LGAMMA_TABLE = 1 << 16  # counts up to this take lgamma from a table built per call, larger ones call it


@numba.njit(nogil=True, cache=True)
def _lgamma_table(top, shift):  # pragma: no cover
    """lgamma(n + shift) - lgamma(shift) for n = 0..min(top, LGAMMA_TABLE)."""
    size = min(max(top, 0), LGAMMA_TABLE) + 1
    table = np.empty(size, np.float64)
    base = math.lgamma(shift)
    for n in range(size):
        table[n] = math.lgamma(n + shift) - base
    return table


@numba.njit(nogil=True, cache=True)
def doc_log_likelihood(ndk, doc_len, alpha):  # pragma: no cover
    """Σ_d [lgamma(Kα) - lgamma(N_d + Kα) + Σ_k (lgamma(n_dk + α) - lgamma(α))] over these documents.

    Counts are small integers: lgamma comes from a table over 0..max (a count never exceeds its document's
    length). In numba, called from :func:`sample_task`: scipy's ``gammaln`` over numpy arrays took 0.3-0.4 ms
    a block of 138 000 entries, 3.5% of them non-zero (the 270 000-token corpus of bench/lda_quality.py), a
    sixth of the block's sampling, and importing scipy.special 0.15 s of CPU at every start."""
    D, K = ndk.shape
    top = 0
    for d in range(D):
        top = max(top, doc_len[d])
    table = _lgamma_table(top, alpha)
    ka = K * alpha
    acc = D * math.lgamma(ka)
    for d in range(D):
        acc -= math.lgamma(doc_len[d] + ka)
        for k in range(K):
            n = ndk[d, k]
            if n > 0:
                acc += table[n] if n < table.shape[0] else math.lgamma(n + alpha) - math.lgamma(alpha)
    return acc


@numba.njit(nogil=True, cache=True)
def word_log_likelihood(wt, beta):  # pragma: no cover
    """Σ_{w,k} (lgamma(n_wk + β) - lgamma(β)) over one block, and the block's column sums (int64). Counts
    below zero (a shard restored by a partial recovery, until the recount) add nothing."""
    V, K = wt.shape
    cols = np.zeros(K, np.int64)
    top = 0
    for v in range(V):
        for k in range(K):
            n = wt[v, k]
            cols[k] += n
            top = max(top, n)
    table = _lgamma_table(top, beta)
    acc = 0.0
    for v in range(V):
        for k in range(K):
            n = wt[v, k]
            if n > 0:
                acc += table[n] if n < table.shape[0] else math.lgamma(n + beta) - math.lgamma(beta)
    return acc, cols


def block_delta(delta8: np.ndarray, lo: int, hi: int, wt: np.ndarray, wt_ps: np.ndarray) -> np.ndarray:
    """A task's change of its block as it goes to the server: :func:`sample_task`'s int8 delta when its range
    ``lo..hi`` fits, else ``wt - wt_ps`` narrowed (:func:`compact_delta`; early sweeps of big tasks, where one
    word's count in one topic moves by more than 127)."""
    if -128 <= lo and hi <= 127:
        return delta8
    return compact_delta(wt - wt_ps, lo, hi)


def compact_delta(delta: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """``delta`` (whose entries lie in ``lo..hi``) in the narrowest integer type that holds it (int8, int16
    or int32).

    The server adds it into the block's int32 counts (``same_kind`` casting widens it). Safe because a
    block has one holder at a time: a worker's update log never sums two deltas of one block, which could
    otherwise add an int16 delta into an int8 one."""
    if delta.size == 0:
        return delta
    for dtype, low, high in _NARROW:
        if low <= lo and hi <= high:
            return delta.astype(dtype)
    return delta


# the narrower types compact_delta tries, with their ranges (np.iinfo is 2 us a call, once a task at 1 024 an epoch)
_NARROW = [(t, int(np.iinfo(t).min), int(np.iinfo(t).max)) for t in (np.int8, np.int16)]


def topic_log_likelihood(nk: np.ndarray, num_words: int, beta: float) -> float:
    """Σ_k [lgamma(Vβ) - lgamma(n_k + Vβ)]: the topic-total part of the word likelihood."""
    vb = num_words * beta
    return float(sum(math.lgamma(vb) - math.lgamma(float(n) + vb) for n in nk))
