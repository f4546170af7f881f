"""Data for the LDA app: the UCI bag-of-words format, a synthetic corpus with known topics, and the
per-executor token layout the sampler runs on.

**UCI bag-of-words** (``docword.txt``): three header lines ``D``, ``W``, ``NNZ``, then ``NNZ`` lines
``doc word count`` (1-based ids). A numba parser reads the bytes in one pass (about 100 MB/s) and reports
the first bad line as ``FILE:LINE: what``. Every executor needs the whole file (word frequencies decide
the vocabulary blocks, document lengths decide the partition), so the parsed arrays are memoised per
process: executors on one worker parse the file once.

**Synthetic corpus**: the LDA generative model with known topics. ``phi_k ~ Dirichlet(gen_beta)`` over
``vocab`` words, ``theta_d ~ Dirichlet(gen_alpha)``, ``N_d ~ 1 + Poisson(doc_length - 1)``, and for each
token ``z ~ theta_d``, ``w ~ phi_z``. It is an indexed stream: document ``d`` depends only on
``(seed, d)`` (chunks of 1024 documents with their own seeds), so an executor generates only its own
documents, and the tests and benchmarks regenerate exactly the same corpus.

**Layout** (:func:`build_layout`): an executor's tokens sorted by (vocabulary block, document, word). For
block ``b`` the tokens are runs of one document each (``run_doc``, ``run_ptr``, ``blk_run_ptr``), so the
sampler visits each document once per block, with the document's topic counts at hand. Word ids in the
layout are local to their block (``word_local``), which is the row of the block's word-topic matrix.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numba
import numpy as np

import litz
import litz.kernels

from .settings import Settings

CHUNK = 1024  # documents per independently seeded synthetic chunk; part of the stream's definition


class DataError(litz.InputError, ValueError):
    """Bad or missing input data; the message names the file (and line); shown as one line, no traceback."""


# --------------------------------------------------------------------------------------------- synthetic
def synthetic_topics(vocab: int, topics: int, gen_beta: float, seed: int) -> np.ndarray:
    """The true topics, ``topics x vocab`` rows on the simplex (float64)."""
    rng = np.random.default_rng([seed, 0])
    phi = rng.gamma(gen_beta, size=(topics, vocab))
    empty = phi.sum(axis=1) == 0
    phi[empty] = 1.0  # a degenerate draw (tiny gen_beta): uniform instead of 0/0
    return phi / phi.sum(axis=1, keepdims=True)


def synthetic_lengths(docs: int, doc_length: float, seed: int) -> np.ndarray:
    """Document lengths ``1 + Poisson(doc_length - 1)`` (int64, every document non-empty)."""
    return 1 + np.random.default_rng([seed, 1]).poisson(doc_length - 1.0, size=docs)


def synthetic_docs(lo: int, hi: int, s: Settings) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of documents ``lo..hi-1`` as ``(doc, word)`` int32 arrays (doc ids relative to ``lo``)."""
    phi_cdf = np.cumsum(synthetic_topics(s.vocab, s.topics, s.gen_beta, s.seed), axis=1)
    phi_cdf[:, -1] = 1.0
    lengths = synthetic_lengths(s.docs, s.doc_length, s.seed)
    docs, words = [], []
    for chunk in range(lo // CHUNK, (hi + CHUNK - 1) // CHUNK):
        c0, c1 = chunk * CHUNK, min((chunk + 1) * CHUNK, s.docs)
        rng = np.random.default_rng([s.seed, 2, chunk])
        theta = rng.gamma(s.gen_alpha, size=(c1 - c0, s.topics))
        theta[theta.sum(axis=1) == 0] = 1.0
        theta_cdf = np.cumsum(theta / theta.sum(axis=1, keepdims=True), axis=1)
        theta_cdf[:, -1] = 1.0
        n = lengths[c0:c1]
        doc = np.repeat(np.arange(c0, c1, dtype=np.int64), n)
        u = rng.random(len(doc))
        z = (theta_cdf[doc - c0] < u[:, None]).sum(axis=1)
        u = rng.random(len(doc))
        word = np.empty(len(doc), np.int64)
        for k in range(s.topics):
            mine = z == k
            word[mine] = np.searchsorted(phi_cdf[k], u[mine], side="right")
        keep = (doc >= lo) & (doc < hi)
        docs.append((doc[keep] - lo).astype(np.int32))
        words.append(np.minimum(word[keep], s.vocab - 1).astype(np.int32))
    if not docs:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    return np.concatenate(docs), np.concatenate(words)


def synthetic_corpus(s: Settings) -> tuple[np.ndarray, np.ndarray]:
    """The whole synthetic corpus as ``(doc, word)`` token arrays (for tests and benchmarks)."""
    return synthetic_docs(0, s.docs, s)


# --------------------------------------------------------------------------------------------- UCI files
_MALFORMED, _DOC_RANGE, _WORD_RANGE, _COUNT, _TOO_MANY = 1, 2, 3, 4, 5


@numba.njit(cache=True, nogil=True)
def _parse_entries(buf, pos, first_line, nnz, num_docs, num_words, doc, word, count):  # pragma: no cover
    """Parse ``doc word count`` lines from ``buf[pos:]``; returns (entries, error, line, line start)."""
    n = 0
    line = first_line
    fields = 0
    vals = np.zeros(3, np.int64)
    cur = np.int64(0)
    digits = 0
    line_start = pos
    last = first_line - 1  # the last line that held an entry
    i = pos
    end = len(buf)
    while i <= end:
        c = buf[i] if i < end else 10  # a missing final newline ends the last line
        if 48 <= c <= 57:
            if digits == 18:
                return n, _MALFORMED, line, line_start
            cur = cur * 10 + (c - 48)
            digits += 1
        elif c == 32 or c == 9 or c == 13 or c == 10:
            if digits:
                if fields == 3:
                    return n, _MALFORMED, line, line_start
                vals[fields] = cur
                fields += 1
                cur = 0
                digits = 0
            if c == 10:
                if fields == 3:
                    if n == nnz:
                        return n, _TOO_MANY, line, line_start
                    if vals[0] < 1 or vals[0] > num_docs:
                        return n, _DOC_RANGE, line, line_start
                    if vals[1] < 1 or vals[1] > num_words:
                        return n, _WORD_RANGE, line, line_start
                    if vals[2] < 1 or vals[2] > 2147483647:
                        return n, _COUNT, line, line_start
                    doc[n] = vals[0] - 1
                    word[n] = vals[1] - 1
                    count[n] = vals[2]
                    n += 1
                    last = line
                elif fields != 0:
                    return n, _MALFORMED, line, line_start
                fields = 0
                line += 1
                line_start = i + 1
        else:
            return n, _MALFORMED, line, line_start
        i += 1
    return n, 0, last, line_start


@numba.njit(cache=True, nogil=True)
def _line_of_entry(buf, pos, first_line, entry):  # pragma: no cover
    """The line number of the ``entry``-th (0-based) non-blank line from ``buf[pos:]``."""
    line = first_line
    seen = 0
    blank = True
    for i in range(pos, len(buf)):
        c = buf[i]
        if c == 10:
            if not blank:
                if seen == entry:
                    return line
                seen += 1
            blank = True
            line += 1
        elif c != 32 and c != 9 and c != 13:
            blank = False
    return line


@dataclass
class Corpus:
    """A parsed UCI corpus: 0-based ``doc``, ``word`` and ``count`` per entry, as in the file."""

    path: str
    num_docs: int
    num_words: int
    doc: np.ndarray
    word: np.ndarray
    count: np.ndarray

    @property
    def tokens(self) -> int:
        return int(self.count.sum())


_MEMO: dict = {}  # per process: (path, size, mtime) -> Corpus; executors on one worker share one parse


def read_docword(path: str) -> Corpus:
    """Parse a UCI ``docword.txt``; :class:`DataError` (``FILE:LINE: what``) for anything wrong with it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if key in _MEMO:
        return _MEMO[key]
    try:
        buf = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    corpus = _parse(path, buf)
    _MEMO.clear()
    _MEMO[key] = corpus
    return corpus


# The parsers and the types _parse calls them with (litz.kernels; declared as apps.lda.KERNELS)
SIGNATURES = {"_parse_entries": "(u1[::1], i8, i8, i8, i8, i8, i4[::1], i4[::1], i4[::1])",
              "_line_of_entry": "(u1[::1], i8, i8, i8)"}


def _text_line(buf: np.ndarray, start: int) -> str:
    stop = start
    while stop < len(buf) and buf[stop] != 10 and stop - start < 80:
        stop += 1
    return bytes(buf[start:stop]).decode("utf-8", "replace").strip()


def _parse(path: str, buf: np.ndarray) -> Corpus:
    header: list[int] = []
    pos, line = 0, 1
    names = ("D (number of documents)", "W (vocabulary size)", "NNZ (number of doc-word entries)")
    while len(header) < 3:
        if pos >= len(buf):
            what = "empty file" if not header else f"truncated header: missing {names[len(header)]}"
            raise DataError(f"{path}:{line}: {what}; a UCI docword file starts with lines D, W and NNZ")
        ahead = np.flatnonzero(buf[pos:pos + 256] == 10)
        stop = pos + int(ahead[0]) if len(ahead) else min(len(buf), pos + 256)
        text = bytes(buf[pos:stop]).decode("utf-8", "replace").strip()
        if text:
            try:
                value = int(text)
            except ValueError:
                raise DataError(f"{path}:{line}: expected {names[len(header)]} as one integer, got {text[:60]!r}; "
                                f"a UCI docword file starts with lines D, W and NNZ") from None
            if value < (0 if len(header) == 2 else 1):
                raise DataError(f"{path}:{line}: {names[len(header)]} must be positive, got {value}")
            header.append(value)
        pos, line = stop + 1, line + 1
    num_docs, num_words, nnz = header
    doc = np.empty(nnz, np.int32)
    word = np.empty(nnz, np.int32)
    count = np.empty(nnz, np.int32)
    # the parsers as imported from this file where the process can (their numba cache serves them), else these
    imported = litz.kernels.from_disk(__name__)
    parse_entries, line_of_entry = ((imported._parse_entries, imported._line_of_entry) if imported is not None
                                    else (_parse_entries, _line_of_entry))
    n, err, bad_line, start = parse_entries(buf, min(pos, len(buf)), line, nnz, num_docs, num_words,
                                            doc, word, count)
    if err:
        text = _text_line(buf, start)
        what = {
            _MALFORMED: f"malformed entry, expected 'doc word count' (three positive integers), got {text!r}",
            _DOC_RANGE: f"document id out of range 1..{num_docs} (D in the header): {text!r}",
            _WORD_RANGE: f"word id out of range 1..{num_words} (W in the header): {text!r}",
            _COUNT: f"count must be a positive integer: {text!r}",
            _TOO_MANY: f"more entries than NNZ={nnz} in the header: {text!r}",
        }[err]
        raise DataError(f"{path}:{bad_line}: {what}")
    if n < nnz:
        raise DataError(f"{path}:{bad_line}: truncated: the header promises NNZ={nnz} entries, the file has {n}")
    per_doc = np.bincount(doc, minlength=num_docs)
    empty = np.flatnonzero(per_doc == 0)
    if len(empty):
        d = int(empty[0])
        after = np.flatnonzero(doc > d)
        if d > int(doc.max(initial=-1)):
            where = "1"  # the header's D promises documents the file does not have
        elif np.all(np.diff(doc) >= 0) and len(after):
            where = str(line_of_entry(buf, pos, line, int(after[0])))
        else:
            where = None
        more = f" ({len(empty)} empty documents in all)" if len(empty) > 1 else ""
        prefix = f"{path}:{where}:" if where else f"{path}:"
        raise DataError(f"{prefix} document {d + 1} has no words{more}; LDA needs every document to have "
                        f"at least one token")
    return Corpus(path, num_docs, num_words, doc, word, count)


def read_vocab(path: str, num_words: int) -> list[str]:
    """One word a line; at least ``num_words`` lines (W in the docword header)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            words = [line.strip() for line in f]
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    while words and not words[-1]:
        words.pop()
    if len(words) < num_words:
        raise DataError(f"{path}:{len(words) + 1}: the vocabulary has {len(words)} words, the corpus uses "
                        f"W={num_words}")
    return words[:num_words]


def default_vocab_file(corpus: str) -> str | None:
    """The UCI naming convention: ``docword.NAME.txt`` comes with ``vocab.NAME.txt`` (``vocab.txt`` for
    ``docword.txt``) in the same directory."""
    folder, name = os.path.split(corpus)
    if name.startswith("docword"):
        candidate = os.path.join(folder, "vocab" + name[len("docword"):])
        if os.path.isfile(candidate):
            return candidate
    return None


# --------------------------------------------------------------------------------------------- partitioning
def doc_ranges(lengths: np.ndarray, parts: int) -> np.ndarray:
    """Boundaries (``parts + 1`` ints) of contiguous document ranges with about equal numbers of tokens."""
    cum = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    targets = cum[-1] * np.arange(parts + 1) / parts
    bounds = np.searchsorted(cum, targets, side="left")
    bounds[0], bounds[-1] = 0, len(lengths)
    return np.maximum.accumulate(bounds)


@dataclass
class Blocks:
    """The vocabulary split into blocks of about equal token frequency."""

    word_block: np.ndarray  # int32 [V]: block of each word (-1: a word that does not occur, no row)
    word_local: np.ndarray  # int32 [V]: row of each word in its block's word-topic matrix (-1: none)
    sizes: np.ndarray  # int64 [B]: words per block

    @property
    def num_blocks(self) -> int:
        return len(self.sizes)

    def words_of(self, block: int) -> np.ndarray:
        """Global word ids of a block's rows, in row order."""
        mine = np.flatnonzero(self.word_block == block)
        out = np.empty(len(mine), np.int64)
        out[self.word_local[mine]] = mine
        return out


LPT_HEAD = 20_000  # words placed one by one (LPT); the rest are dealt in serpentine order


def vocab_blocks(freq: np.ndarray, num_blocks: int) -> Blocks:
    """Split the vocabulary into blocks of about equal token frequency.

    Word frequencies are Zipf-like, so contiguous id ranges would be very uneven. The ``LPT_HEAD`` most
    frequent words go, largest first, to the currently lightest block (LPT, a heap); the rest, each smaller
    than any of those, are dealt in serpentine order (0..B-1, B-1..0, ...) starting with the lightest block.
    The blocks then differ by about one small word unless a single word outweighs a block. Rows of a block
    are its words in order of decreasing frequency. A word that never occurs (frequency 0: in the vocabulary,
    not in the corpus) has no row, block -1: its counts stay 0 whatever the chain does, and its row would only
    be moved, copied and summed with every read of its block (38% of the rows of ``bench/lda_quality.py``'s
    small corpus). Its prior mass stays in the sampler's ``V beta``: ``V`` is the vocabulary's size."""
    import heapq

    freq = np.asarray(freq, dtype=np.float64)
    B = num_blocks
    order = np.argsort(-freq, kind="stable")
    order = order[freq[order] > 0]  # the words that occur, most frequent first
    V = len(order)
    word_block = np.full(len(freq), -1, np.int32)
    heap = [(0.0, b) for b in range(B)]
    head = order[:LPT_HEAD]
    for w, f in zip(head.tolist(), freq[head].tolist(), strict=True):
        load, b = heapq.heappop(heap)
        word_block[w] = b
        heapq.heappush(heap, (load + f, b))
    lightest_first = np.array([b for _, b in sorted(heap)], np.int32)
    rnd, off = np.divmod(np.arange(V - len(head)), B)
    word_block[order[len(head):]] = lightest_first[np.where(rnd % 2 == 0, off, B - 1 - off)]
    blk = word_block[order]  # block of each word, in order of decreasing frequency
    by_block = np.argsort(blk, kind="stable")
    sizes = np.bincount(blk, minlength=B).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    local = np.empty(V, np.int64)
    local[by_block] = np.arange(V) - starts[blk[by_block]]
    word_local = np.full(len(freq), -1, np.int32)
    word_local[order] = local
    return Blocks(word_block, word_local, sizes)


@dataclass
class Layout:
    """One executor's tokens, sorted by (block, document, word): the sampler's input arrays."""

    word: np.ndarray  # int32 [N]: word's row in its block
    run_doc: np.ndarray  # int32 [R]: local document of each run
    run_ptr: np.ndarray  # int64 [R+1]: token range of each run
    blk_run_ptr: np.ndarray  # int64 [B+1]: run range of each block
    doc_len: np.ndarray  # int32 [D_e]: tokens per local document

    @property
    def tokens(self) -> int:
        return len(self.word)

    def block_tokens(self) -> np.ndarray:
        return self.run_ptr[self.blk_run_ptr[1:]] - self.run_ptr[self.blk_run_ptr[:-1]]


def build_layout(doc: np.ndarray, word: np.ndarray, count: np.ndarray | None, num_docs: int,
                 blocks: Blocks) -> Layout:
    """Tokens from ``(doc, word[, count])`` entries (local doc ids ``0..num_docs-1``, global word ids)."""
    doc = np.asarray(doc, np.int64)
    blk = blocks.word_block[word].astype(np.int64)
    loc = blocks.word_local[word].astype(np.int64)
    rows = int(blocks.sizes.max()) if len(blocks.sizes) else 1
    key = (blk * max(num_docs, 1) + doc) * rows + loc
    order = np.argsort(key, kind="stable")
    key, doc, blk, loc = key[order], doc[order], blk[order], loc[order]
    reps = np.ones(len(key), np.int64) if count is None else np.asarray(count, np.int64)[order]
    tok_word = np.repeat(loc.astype(np.int32), reps)
    run_key = blk * max(num_docs, 1) + doc
    starts = np.flatnonzero(np.concatenate([[True], run_key[1:] != run_key[:-1]])) if len(key) else \
        np.zeros(0, np.int64)
    entry_ptr = np.concatenate([[0], np.cumsum(reps)])
    run_ptr = np.concatenate([entry_ptr[starts], [entry_ptr[-1]]]).astype(np.int64)
    run_doc = doc[starts].astype(np.int32)
    run_blk = blk[starts]
    blk_run_ptr = np.searchsorted(run_blk, np.arange(blocks.num_blocks + 1), side="left").astype(np.int64)
    doc_len = np.bincount(doc, weights=reps, minlength=num_docs).astype(np.int32)
    return Layout(tok_word, run_doc, run_ptr, blk_run_ptr, doc_len)


# --------------------------------------------------------------------------------------------- partitions
@dataclass
class Partition:
    """What an executor loads: its documents' layout, the block map, and global sizes."""

    layout: Layout
    blocks: Blocks
    doc_lo: int  # first global document id of this executor
    num_docs: int  # documents in the corpus
    num_words: int  # vocabulary size V
    total_tokens: int  # tokens in the corpus


def partition(s: Settings, executor: int, num_executors: int, min_blocks: int = 0) -> Partition:
    """Executor ``executor``'s documents (a contiguous range balanced by tokens) and the vocabulary blocks.

    Everything here is a deterministic function of the config, the executor count and ``min_blocks`` (kept in
    the executor's state), so re-loading after a move or a recovery yields the same token order and the
    executor's topic assignments ``z`` still fit.
    """
    if s.synthetic:
        lengths = synthetic_lengths(s.docs, s.doc_length, s.seed)
        V = s.vocab
        expected = synthetic_topics(s.vocab, s.topics, s.gen_beta, s.seed).mean(axis=0) * lengths.sum()
        blocks = vocab_blocks(expected, s.num_blocks(num_executors, V, int(lengths.sum()), min_blocks))
        bounds = doc_ranges(lengths, num_executors)
        lo, hi = int(bounds[executor]), int(bounds[executor + 1])
        doc, word = synthetic_docs(lo, hi, s)
        layout = build_layout(doc, word, None, hi - lo, blocks)
        return Partition(layout, blocks, lo, s.docs, V, int(lengths.sum()))
    corpus = read_docword(s.corpus)
    V = corpus.num_words
    freq = np.bincount(corpus.word, weights=corpus.count, minlength=V)
    blocks = vocab_blocks(freq, s.num_blocks(num_executors, int(np.count_nonzero(freq)), int(freq.sum()), min_blocks))
    lengths = np.bincount(corpus.doc, weights=corpus.count, minlength=corpus.num_docs).astype(np.int64)
    bounds = doc_ranges(lengths, num_executors)
    lo, hi = int(bounds[executor]), int(bounds[executor + 1])
    mine = (corpus.doc >= lo) & (corpus.doc < hi)
    layout = build_layout(corpus.doc[mine] - lo, corpus.word[mine], corpus.count[mine], hi - lo, blocks)
    return Partition(layout, blocks, lo, corpus.num_docs, V, int(lengths.sum()))


def vocabulary_size(s: Settings) -> int:
    return s.vocab if s.synthetic else read_docword(s.corpus).num_words
