"""apps.lda data: the UCI docword parser (errors name file:line), settings, the synthetic corpus, the
vocabulary blocks and token layout, and bad input end to end (one line on stderr, no traceback)."""
from __future__ import annotations

import numpy as np
import pytest

from apps.lda import data, kernels
from apps.lda.settings import ConfigError, Settings
from tests.support.errors import assert_one_line
from tests.support.processes import run_cli

pytestmark = pytest.mark.timeout(30)

GOOD = "3\n5\n6\n1 1 2\n1 3 1\n2 2 4\n2 5 1\n3 1 1\n3 4 3\n"


def write(tmp_path, text: str, name: str = "docword.txt") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_docword_parses(tmp_path) -> None:
    c = data.read_docword(write(tmp_path, GOOD))
    assert (c.num_docs, c.num_words, c.tokens) == (3, 5, 12)
    np.testing.assert_array_equal(c.doc, [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(c.word, [0, 2, 1, 4, 0, 3])
    np.testing.assert_array_equal(c.count, [2, 1, 4, 1, 1, 3])


def test_docword_tolerates_blank_lines_crlf_and_no_final_newline(tmp_path) -> None:
    c = data.read_docword(write(tmp_path, "2\r\n3\r\n2\r\n\r\n1 1 1\r\n  \n2 3 5"))
    assert c.tokens == 6 and list(c.word) == [0, 2]


@pytest.mark.parametrize("text, where, what", [
    ("", ":1:", "empty file"),
    ("3\n5\n", ":3:", "truncated header: missing NNZ"),
    ("3\nfive\n6\n", ":2:", "expected W (vocabulary size) as one integer, got 'five'"),
    ("0\n5\n6\n", ":1:", "D (number of documents) must be positive"),
    (GOOD.replace("2 2 4", "2 2"), ":6:", "malformed entry, expected 'doc word count'"),
    (GOOD.replace("2 2 4", "2 2 4 7"), ":6:", "malformed entry"),
    (GOOD.replace("2 2 4", "2 x 4"), ":6:", "malformed entry"),
    (GOOD.replace("2 2 4", "2 -2 4"), ":6:", "malformed entry"),
    (GOOD.replace("2 5 1", "2 6 1"), ":7:", "word id out of range 1..5 (W in the header): '2 6 1'"),
    (GOOD.replace("2 5 1", "2 0 1"), ":7:", "word id out of range"),
    (GOOD.replace("3 4 3", "4 4 3"), ":9:", "document id out of range 1..3"),
    (GOOD.replace("3 4 3", "3 4 0"), ":9:", "count must be a positive integer"),
    (GOOD + "3 5 1\n", ":10:", "more entries than NNZ=6"),
    (GOOD.rsplit("\n", 2)[0] + "\n", ":8:", "truncated: the header promises NNZ=6 entries, the file has 5"),
    ("4\n5\n2\n1 1 1\n3 2 2\n", ":5:", "document 2 has no words"),
    ("4\n5\n2\n1 1 1\n2 2 2\n", ":1:", "document 3 has no words (2 empty documents in all)"),
])
def test_docword_errors_name_file_and_line(tmp_path, text, where, what) -> None:
    path = write(tmp_path, text)
    with pytest.raises(data.DataError) as err:
        data.read_docword(path)
    message = str(err.value)
    assert message.startswith(path + where), message
    assert what in message and "\n" not in message


def test_missing_corpus_and_bad_settings(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"nope.txt: no such file \(config 'corpus'\)"):
        Settings.from_config({"corpus": str(tmp_path / "nope.txt")})
    with pytest.raises(data.DataError, match="nope.txt: no such file"):
        data.read_docword(str(tmp_path / "nope.txt"))
    for config, message in [
        ({"synthetic": 1, "topics": 1}, "config 'topics' must be an integer >= 2, got 1"),
        ({"synthetic": 1, "alpha": 0}, "config 'alpha' must be a number > 0"),
        ({"synthetic": 1, "blocks": 0}, "config 'blocks' must be an integer >= 1"),
        ({"synthetic": 1, "epochs": "x"}, "config 'epochs' must be an integer >= 0"),
        ({"synthetic": 1, "topic": 5}, "unknown config key(s) 'topic'"),
        ({}, "exactly one of config 'corpus'"),
        ({"synthetic": 1, "corpus": write(tmp_path, GOOD)}, "exactly one of config 'corpus'"),
    ]:
        with pytest.raises(ConfigError) as err:
            Settings.from_config(config)
        assert message in str(err.value), (config, str(err.value))


def test_vocab_file(tmp_path) -> None:
    corpus = write(tmp_path, GOOD, "docword.kos.txt")
    vocab = write(tmp_path, "a\nb\nc\nd\ne\nf\n", "vocab.kos.txt")
    assert data.default_vocab_file(corpus) == vocab
    assert data.read_vocab(vocab, 5) == ["a", "b", "c", "d", "e"]
    short = write(tmp_path, "a\nb\n", "short.txt")
    with pytest.raises(data.DataError, match=r"short.txt:3: the vocabulary has 2 words, the corpus uses W=5"):
        data.read_vocab(short, 5)


def test_synthetic_corpus_is_an_indexed_stream() -> None:
    s = Settings.from_config({"synthetic": 1, "docs": 2500, "vocab": 300, "topics": 5, "doc_length": 20})
    doc, word = data.synthetic_corpus(s)
    lengths = data.synthetic_lengths(s.docs, s.doc_length, s.seed)
    np.testing.assert_array_equal(np.bincount(doc, minlength=s.docs), lengths)
    assert lengths.min() >= 1 and 0 <= word.min() and word.max() < s.vocab
    d2, w2 = data.synthetic_docs(1000, 2100, s)  # straddles chunk boundaries
    mine = (doc >= 1000) & (doc < 2100)
    np.testing.assert_array_equal(d2, doc[mine] - 1000)
    np.testing.assert_array_equal(w2, word[mine])


def test_blocks_balance_and_layout() -> None:
    freq = 1000.0 / np.arange(1, 2001)  # Zipf
    blocks = data.vocab_blocks(freq, 7)
    load = np.bincount(blocks.word_block, weights=freq, minlength=7)
    assert load.max() / load.min() < 1.02  # the top word alone is 12% of the tokens
    for b in range(7):
        words = blocks.words_of(b)
        assert len(words) == blocks.sizes[b]
        np.testing.assert_array_equal(blocks.word_local[words], np.arange(len(words)))
    rng = np.random.default_rng(0)
    doc, word, count = rng.integers(0, 50, 3000), rng.integers(0, 2000, 3000), rng.integers(1, 4, 3000)
    L = data.build_layout(doc, word, count, 50, blocks)
    assert L.tokens == count.sum() and L.doc_len.sum() == count.sum()
    assert L.blk_run_ptr[0] == 0 and L.blk_run_ptr[-1] == len(L.run_doc)
    for b in range(7):  # every run is one document of one block, tokens of that block's words
        for run in range(L.blk_run_ptr[b], L.blk_run_ptr[b + 1]):
            lo, hi = L.run_ptr[run], L.run_ptr[run + 1]
            assert hi > lo and np.all(L.word[lo:hi] < blocks.sizes[b])
    want = np.zeros((50, 7), int)
    np.add.at(want, (doc, blocks.word_block[word]), count)
    got = np.zeros((50, 7), int)
    for b in range(7):
        for run in range(L.blk_run_ptr[b], L.blk_run_ptr[b + 1]):
            got[L.run_doc[run], b] += L.run_ptr[run + 1] - L.run_ptr[run]
    np.testing.assert_array_equal(got, want)


def test_words_that_do_not_occur_have_no_rows() -> None:
    """A vocabulary word absent from the corpus gets no block row (its counts could only stay 0); the others are
    placed as if it were not there."""
    freq = np.array([5.0, 0.0, 3.0, 0.0, 1.0, 2.0])
    blocks = data.vocab_blocks(freq, 2)
    assert blocks.word_block[1] == blocks.word_block[3] == -1 and blocks.word_local[[1, 3]].tolist() == [-1, -1]
    assert blocks.sizes.sum() == 4
    assert sorted(np.concatenate([blocks.words_of(b) for b in range(2)]).tolist()) == [0, 2, 4, 5]
    dense = data.vocab_blocks(freq[[0, 2, 4, 5]], 2)  # the same words with the absent ones left out
    np.testing.assert_array_equal(blocks.word_block[[0, 2, 4, 5]], dense.word_block)
    np.testing.assert_array_equal(blocks.word_local[[0, 2, 4, 5]], dense.word_local)


def test_documents_are_visited_in_a_seeded_random_order() -> None:
    """A task's visit order is a permutation of its runs, drawn from its seed, by chunks of consecutive runs that
    close once they hold VISIT_CHUNK_TOKENS tokens: the same seed gives the same order, the first chunk is uniform
    over the seeds, and the random stream moves on."""
    T = kernels.VISIT_CHUNK_TOKENS
    lengths = np.array([T // 4] * 8 + [T] + [T + 7] + [3] * 5 + [T // 2, T // 2] + [5])  # the last chunk short
    run_ptr = np.concatenate([[0, 0, 0], np.cumsum(lengths)]).astype(np.int64)  # runs before r0 are not the task's
    r0, r1 = 2, 2 + len(lengths)
    chunks = [[2, 3, 4, 5], [6, 7, 8, 9], [10], [11], [12, 13, 14, 15, 16, 17, 18], [19]]
    first = {c[0]: 0 for c in chunks}
    for seed in range(1, 2001):
        order, x = kernels.visit_order(run_ptr, r0, r1, np.uint64(kernels.task_seed(0, 0, seed)))
        assert sorted(order.tolist()) == list(range(r0, r1))
        seen = order.tolist()
        assert sorted(seen[seen.index(c[0]):seen.index(c[0]) + len(c)] for c in chunks) == chunks
        first[seen[0]] += 1
    assert min(first.values()) > 275 and max(first.values()) < 392  # 333 each; 3.5 standard deviations
    many = np.arange(0, 50 * T + 1, T // 2, dtype=np.int64)  # 100 runs of T/2 tokens: 50 chunks
    a, xa = kernels.visit_order(many, 0, 100, np.uint64(7))
    b, xb = kernels.visit_order(many, 0, 100, np.uint64(7))
    c, _ = kernels.visit_order(many, 0, 100, np.uint64(8))
    assert a.tolist() == b.tolist() != c.tolist() and xa == xb != np.uint64(7)


def test_doc_ranges_balance_tokens() -> None:
    lengths = np.random.default_rng(1).integers(1, 500, 1000)
    bounds = data.doc_ranges(lengths, 8)
    assert bounds[0] == 0 and bounds[-1] == 1000 and np.all(np.diff(bounds) > 0)
    per = np.add.reduceat(lengths, bounds[:-1])
    assert per.max() - per.min() <= 2 * lengths.max()


K_SMALL, V_SMALL, D_SMALL = 8, 40, 30


def _random_state(seed: int) -> tuple:
    """A small random corpus in one block (every document has a token) and uniform random topics."""
    rng = np.random.default_rng(seed)
    blocks = data.vocab_blocks(np.ones(V_SMALL), 1)
    doc, word = rng.integers(0, D_SMALL, 2000), rng.integers(0, V_SMALL, 2000)
    doc[:D_SMALL] = np.arange(D_SMALL)
    L = data.build_layout(doc, word, None, D_SMALL, blocks)
    return L, kernels.random_topics(L.tokens, K_SMALL, 5)


@pytest.mark.parametrize("ndk_dtype", [np.int16, np.int32])
def test_sampler_keeps_counts_consistent(ndk_dtype) -> None:
    """One kernel call on a random state: counts stay equal to those recomputed from z, totals too (with the
    document counts in either width the app uses)."""
    K, V, D = K_SMALL, V_SMALL, D_SMALL
    L, z = _random_state(3)
    ndk = kernels.doc_topic_counts(z, L.run_doc, L.run_ptr, D, K).astype(ndk_dtype)
    wt = kernels.word_topic_counts(L.word, z, 0, L.tokens, V, K)
    nk = wt.sum(axis=0).astype(np.int64)
    for seed in range(1, 4):
        kernels.sample_block(L.word, z, L.run_doc, L.run_ptr, 0, len(L.run_doc), ndk, wt, nk, L.doc_len, 0.1, 0.01,
                             0.01 * V, np.uint64(seed))
        np.testing.assert_array_equal(ndk, kernels.doc_topic_counts(z, L.run_doc, L.run_ptr, D, K))
        np.testing.assert_array_equal(wt, kernels.word_topic_counts(L.word, z, 0, L.tokens, V, K))
        np.testing.assert_array_equal(nk, wt.sum(axis=0))
    assert z.min() >= 0 and z.max() < K


def test_sample_task_is_sample_block_with_its_delta() -> None:
    """The task's one-call kernel leaves the block as read untouched and returns what sample_block does to a
    copy, the block's exact delta with its range, the change of the totals (same seed, same draws), and the
    log-likelihood parts of the state after sampling when asked."""
    K, V, D = K_SMALL, V_SMALL, D_SMALL
    L, z = _random_state(4)
    z2 = z.copy()
    ndk = kernels.doc_topic_counts(z, L.run_doc, L.run_ptr, D, K)
    ndk2 = ndk.copy()
    wt_read = kernels.word_topic_counts(L.word, z, 0, L.tokens, V, K)
    nk_read = wt_read.sum(axis=0).astype(np.int64)
    wt_read_before = wt_read.copy()
    args = (L.run_doc, L.run_ptr, 0, len(L.run_doc))
    wt, delta, nk_delta, changed, lo, hi, doc_ll, word_ll, cols = kernels.sample_task(
        L.word, z, *args, ndk, wt_read, nk_read.copy(), L.doc_len, 0.1, 0.01, 0.01 * V, np.uint64(7), True, True)
    wt2, nk2 = wt_read.copy(), nk_read.copy()
    changed2 = kernels.sample_block(L.word, z2, *args, ndk2, wt2, nk2, L.doc_len, 0.1, 0.01, 0.01 * V, np.uint64(7))
    assert changed == changed2 > 0
    np.testing.assert_array_equal(z, z2)
    np.testing.assert_array_equal(wt, wt2)
    np.testing.assert_array_equal(ndk, ndk2)
    np.testing.assert_array_equal(wt_read, wt_read_before)  # the block as read is left as it was
    exact = wt2 - wt_read
    assert delta.dtype == np.int8 and np.array_equal(delta, exact)  # within int8 here
    np.testing.assert_array_equal(nk_delta, nk2 - nk_read)
    assert (lo, hi) == (min(0, int(exact.min())), max(0, int(exact.max()))) and lo < 0 < hi
    assert kernels.block_delta(delta, lo, hi, wt, wt_read) is delta
    big = wt_read.copy()  # a count that moved by 200 (and one by -3): the int8 delta wraps, the exact one is sent
    big[0, 0] += 200
    big[1, 1] -= 3
    wrapped = (big - wt_read).astype(np.int8)
    sent = kernels.block_delta(wrapped, -3, 200, big, wt_read)
    assert sent.dtype == np.int16 and np.array_equal(sent, big - wt_read)
    assert doc_ll == kernels.doc_log_likelihood(ndk2, L.doc_len, 0.1)
    assert (word_ll, cols.tolist()) == (kernels.word_log_likelihood(wt2, 0.01)[0], wt2.sum(axis=0).tolist())
    *_, no_doc, no_word, no_cols = kernels.sample_task(L.word, z, *args, ndk, wt_read, nk_read.copy(), L.doc_len,
                                                       0.1, 0.01, 0.01 * V, np.uint64(8), False, False)
    assert (no_doc, no_word, no_cols.tolist()) == (0.0, 0.0, [0] * K)


def test_doc_topic_counts_widen_for_long_documents() -> None:
    """int16 holds any count of a document up to 32 767 tokens; one token more and the counts are int32."""
    for length, dtype in ((32_767, np.int16), (32_768, np.int32)):
        z = np.zeros(length + 3, np.int16)  # one long document, all in topic 0, and a short one
        run_doc, run_ptr = np.array([0, 1], np.int32), np.array([0, length, length + 3], np.int64)
        ndk = kernels.doc_topic_counts(z, run_doc, run_ptr, 2, 4)
        assert ndk.dtype == dtype and ndk[0, 0] == length and ndk[1, 0] == 3


def _gibbs_joint(words, topics, ndk0, wt0, nk0, alpha, beta, V) -> np.ndarray:
    """The exact distribution of the new topics of one document's run of tokens, resampled in order by
    collapsed Gibbs: P(k1, k2, ...) = p1(k1) p2(k2 | k1) ..., each p_i ∝ (n_dk + a)(n_wk + b)/(n_k + Vb)
    with token i removed."""
    K = len(nk0)
    joint = {(): (1.0, ndk0.astype(float), wt0.astype(float), nk0.astype(float))}
    for w, t in zip(words, topics, strict=True):
        nxt = {}
        for path, (pr, nd, wt, nk) in joint.items():
            nd, wt, nk = nd.copy(), wt.copy(), nk.copy()
            nd[t] -= 1
            wt[w, t] -= 1
            nk[t] -= 1
            p = (nd + alpha) * (wt[w] + beta) / (nk + V * beta)
            p /= p.sum()
            for k in range(K):
                nd2, wt2, nk2 = nd.copy(), wt.copy(), nk.copy()
                nd2[k] += 1
                wt2[w, k] += 1
                nk2[k] += 1
                nxt[path + (k,)] = (pr * p[k], nd2, wt2, nk2)
        joint = nxt
    out = np.zeros((K,) * len(words))
    for path, (pr, *_) in joint.items():
        out[path] = pr
    return out


# Cases of one document: its counts include the run's tokens (words 1 and 2, topics 0 and 4).
_WT = np.array([[0, 0, 0, 0, 0, 0], [2, 1, 0, 0, 5, 0], [1, 0, 2, 0, 3, 0], [0] * 6, [0] * 6], np.int32)
_WT_DENSE = np.array([[0] * 6, [2, 1, 3, 0, 5, 1], [1, 2, 2, 1, 3, 1], [0] * 6, [0] * 6], np.int32)
_WT_ONE_WORD = _WT + np.array([[0] * 6, [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, -1, 0], [0] * 6, [0] * 6], np.int32)
_ND = np.array([4, 0, 1, 0, 3, 0], np.int32)
_NK = np.array([20, 15, 9, 30, 12, 7], np.int64)
# (words, their topics, the document's topic counts, word-topic counts, topic totals, beta, the bound on the
# first draw's document bucket: "loose" rejects some draws, "tight" fails if it were 20% smaller)
_CASES = {
    "one token, sparse word": ([1], [0], _ND, _WT, _NK, 0.3, "loose"),
    "one token, dense word": ([1], [0], _ND, _WT_DENSE, _NK, 0.3, "loose"),
    # the document's other tokens all in the smallest topic
    "one token, tight bound": ([1], [0], np.array([1, 0, 0, 0, 0, 6], np.int32), _WT, _NK, 0.3, "tight"),
    # a topic with no tokens and V beta < 1: no bound, the document bucket is summed at once
    "one token, no bound": ([1], [0], _ND, _WT, np.array([20, 15, 9, 0, 12, 7], np.int64), 0.1, "none"),
    # the second token sees the first one's move, with the document bucket known or still bounded
    "two tokens": ([1, 2], [0, 4], _ND, _WT, _NK, 0.3, "loose"),
    "two tokens, one word": ([1, 1], [0, 4], _ND, _WT_ONE_WORD, _NK, 0.3, "loose"),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_sampler_draws_from_the_exact_conditional(case) -> None:
    """A run resampled from the same state 20 000 times: the frequencies of its new topics match the exact
    collapsed Gibbs distribution (chi-square, fixed seeds, p < 1e-5 to fail by chance). Covers all three
    buckets (alpha and beta large enough to matter), both word-bucket paths, and the document bucket's
    bound: draws that stand in it, draws rejected and drawn again, and no bound at all."""
    from scipy.stats import chi2 as chi2_dist

    words, topics, nd, wt0, nk0, beta, bound_kind = _CASES[case]
    K, V, alpha = 6, 5, 0.5
    ndk0 = nd[None, :].astype(np.int16)  # the app's counts for documents of fewer than 32 768 tokens
    doc_len = np.array([int(ndk0.sum())], np.int32)
    # the first draw's document bucket and the sampler's bound on it: the case covers what it says
    removed = np.eye(K, dtype=np.int64)[topics[0]]
    r = beta * float(((ndk0[0] - removed) / (nk0 - removed + V * beta)).sum())
    floor = nk0.min() + V * beta - 1
    bound = beta * (doc_len[0] - 1) / floor
    assert {"loose": floor > 0 and bound - r > 0.05, "tight": floor > 0 and r < bound < 1.2 * r,
            "none": floor <= 0}[bound_kind], (bound, r)
    p = _gibbs_joint(words, topics, ndk0[0], wt0, nk0, alpha, beta, V).ravel()
    word, run_doc = np.array(words, np.int32), np.array([0], np.int32)
    run_ptr = np.array([0, len(words)], np.int64)
    draws = 20_000
    counts = np.zeros(len(p), np.int64)
    for seed in range(1, draws + 1):
        z, ndk, wt, nk = np.array(topics, np.int16), ndk0.copy(), wt0.copy(), nk0.copy()
        kernels.sample_block(word, z, run_doc, run_ptr, 0, 1, ndk, wt, nk, doc_len, alpha, beta, V * beta,
                             np.uint64(kernels.task_seed(7, 0, seed)))
        counts[np.ravel_multi_index(tuple(int(k) for k in z), (K,) * len(words))] += 1
        np.testing.assert_array_equal(ndk[0], nd + np.bincount(z, minlength=K) - np.bincount(topics, minlength=K))
        moved = np.zeros((V, K), np.int32)
        np.add.at(moved, (word, z), 1)
        np.add.at(moved, (word, np.array(topics)), -1)
        np.testing.assert_array_equal(wt, wt0 + moved)
    expected = p * draws
    rare = expected < 5  # cells too rare for chi-square are pooled into one
    obs = np.append(counts[~rare], counts[rare].sum())
    exp = np.append(expected[~rare], expected[rare].sum())
    keep = exp > 0
    chi2 = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    limit = float(chi2_dist.ppf(1 - 1e-5, int(keep.sum()) - 1))
    assert chi2 < limit, (chi2, limit, counts.tolist(), expected.round(1).tolist())


def test_log_likelihood_matches_direct_formula() -> None:
    import math

    rng = np.random.default_rng(4)
    ndk = rng.integers(0, 5, (6, 4)).astype(np.int32)
    ndk[:, 0] += 1
    got = kernels.doc_log_likelihood(ndk, ndk.sum(axis=1).astype(np.int32), 0.3)
    want = sum(math.lgamma(4 * 0.3) - math.lgamma(row.sum() + 4 * 0.3)
               + sum(math.lgamma(n + 0.3) - math.lgamma(0.3) for n in row) for row in ndk)
    assert got == pytest.approx(want, rel=1e-12)
    ll, cols = kernels.word_log_likelihood(ndk, 0.05)
    assert ll == pytest.approx(sum(math.lgamma(n + 0.05) - math.lgamma(0.05) for n in ndk.ravel()), rel=1e-12)
    np.testing.assert_array_equal(cols, ndk.sum(axis=0))
    big = ndk.copy()  # counts beyond the lgamma table take lgamma itself; negative ones (until a recount) add 0
    big[0, 1], big[1, 2] = kernels.LGAMMA_TABLE + 7, -3
    ll, cols = kernels.word_log_likelihood(big, 0.05)
    assert ll == pytest.approx(sum(math.lgamma(n + 0.05) - math.lgamma(0.05) for n in big.ravel() if n > 0),
                               rel=1e-12)
    np.testing.assert_array_equal(cols, big.sum(axis=0))
    lengths = big.clip(0).sum(axis=1).astype(np.int32)
    assert kernels.doc_log_likelihood(big.clip(0), lengths, 0.3) == pytest.approx(
        sum(math.lgamma(4 * 0.3) - math.lgamma(row.sum() + 4 * 0.3)
            + sum(math.lgamma(n + 0.3) - math.lgamma(0.3) for n in row) for row in big.clip(0)), abs=1e-6)  # terms ~1e6


# ------------------------------------------------------------------------------------- end to end, CLI
def lda_cli(*config: str, timeout: float = 60):
    return run_cli(["litz", "run", "apps.lda", "--no-progress", "--config", *config], timeout=timeout)


def test_cli_bad_corpus_is_one_line(tmp_path) -> None:
    bad = write(tmp_path, GOOD.replace("2 5 1", "2 9 1"))
    assert_one_line(lda_cli(f"corpus={bad}"), f"{bad}:7: word id out of range 1..5")


def test_cli_missing_corpus_and_bad_topics_are_one_line(tmp_path) -> None:
    missing = str(tmp_path / "missing.txt")
    assert_one_line(lda_cli(f"corpus={missing}"), f"{missing}: no such file")
    assert_one_line(lda_cli("synthetic=1", "topics=1"), "config 'topics' must be an integer >= 2, got 1")


def test_cli_short_vocabulary_fails_before_training(tmp_path) -> None:
    corpus = write(tmp_path, GOOD)
    vocab = write(tmp_path, "a\nb\n", "vocab.txt")  # the corpus has W=5 words
    assert_one_line(lda_cli(f"corpus={corpus}", f"vocab_file={vocab}", "epochs=1000000"),
                    f"{vocab}:3: the vocabulary has 2 words, the corpus uses W=5")


def test_shipped_executor_uses_the_cached_sampler(tmp_path) -> None:
    """Workers get the app by value (cloudpickle), whose numba copy cannot use the on-disk cache; the executor
    must take the sampler from the module imported from disk, so a new worker loads instead of compiling."""
    import os
    import subprocess
    import sys

    import cloudpickle

    import apps.lda

    blob = tmp_path / "executor.pkl"
    cloudpickle.register_pickle_by_value(apps.lda)
    try:
        blob.write_bytes(cloudpickle.dumps(apps.lda.LDAExecutor))
    finally:
        cloudpickle.unregister_pickle_by_value(apps.lda)
    code = ("import pickle, sys; cls = pickle.loads(open(sys.argv[1], 'rb').read()); g = cls.run_task.__globals__; "
            "print(type(g['kernels'].sample_task._cache).__name__, type(g['_sampler']()._cache).__name__)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code, str(blob)], cwd=root, capture_output=True, text=True,
                         timeout=25, env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 0, out.stderr
    shipped, used = out.stdout.split()
    assert shipped == "NullCache"  # the by-value copy: why the executor must not call it directly
    assert used == "FunctionCache"


def test_default_blocks_one_per_executor_for_big_tasks_else_one_per_worker() -> None:
    """Unset, ``blocks`` is one per executor when a task then samples at least TASK_TOKENS tokens, else one per
    worker at the start (at least 2); never more than executors or words."""
    from apps.lda.settings import TASK_TOKENS

    auto = Settings.from_config({"synthetic": 1})
    assert auto.blocks is None and auto.ahead is None
    big = 32 * 32 * TASK_TOKENS  # tokens / E**2 = TASK_TOKENS at 32 executors
    assert auto.num_blocks(32, 5000, big) == 32 and auto.num_blocks(32, 5000, 57_600_000) == 32
    assert auto.num_blocks(32, 5000, big - 1) == 2  # smaller tasks: one per worker (none said: 2)
    assert auto.num_blocks(32, 5000, 3_600_000, min_blocks=2) == 2  # 16 executors a worker
    assert auto.num_blocks(32, 5000, 14_400_000, min_blocks=3) == 3
    assert auto.num_blocks(8, 5000, 3_600_000, min_blocks=2) == 8  # 4 a worker: 56k-token tasks
    assert auto.num_blocks(4, 5000, 1000, min_blocks=9) == 4  # never more than executors...
    assert auto.num_blocks(32, 3, big) == 3  # ... or words
    assert auto.num_blocks(1, 5000, 1000) == 1
    fixed = Settings.from_config({"synthetic": 1, "blocks": 7})
    assert fixed.num_blocks(32, 5000, big, min_blocks=12) == 7 and fixed.num_blocks(32, 5, big) == 5
