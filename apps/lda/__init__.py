"""Latent Dirichlet allocation by block-scheduled collapsed Gibbs sampling (thesis §2.2.3 and §4.5, after
Strads' LDA, Kim et al. EuroSys'16).

Run: ``litz run apps.lda --config synthetic=1`` (see README.md in this directory for every key).

**Model scheduling with stateful executors.** Executor ``e`` owns a contiguous range of documents (balanced
by tokens): their topic assignments ``z`` and document-topic counts ``ndk`` live in the executor, as state
(not ``input_attrs``), so they move with it and are checkpointed. The word-topic counts live in the
parameter server, split by vocabulary into ``B`` blocks (key ``("wt", b)``: int32, words-of-the-block x K;
words are dealt to blocks by frequency so the blocks hold about equal numbers of tokens). In round ``r``
executor ``e`` samples the tokens of its documents whose word is in block ``(e + r) mod B``. ``B`` rounds
make an epoch, one sweep over every token.

**The schedule.** Each block has a fixed order of holders: (round, executor) in lexicographic order. The
driver dispatches executor ``e``'s round ``r`` only when (1) its round ``r - 1`` has completed and (2) the
previous holder of the block has completed. By the consistency rule the task then reads the block with
every earlier update, and no two executors ever hold a block at once. There is no barrier between rounds
or epochs: each executor moves on as soon as its next block is free (a pipeline, as in Strads' ring). With
``B < E`` executors sharing a block in a round take turns; with ``B > E`` some blocks rest each round.

**Dispatch ahead** (``ahead=1``). Each round above waits for: the predecessor completes, its result reaches
the master, the driver dispatches, the worker runs. With ``ahead=1`` the driver dispatches task T = (e, r) on
block b as soon as its two predecessors, P1 = (e, r - 1) and P2 = b's previous holder, have been *dispatched*
(not completed), with ``dispatch_task(e, args, after=[P1, P2])``: the runtime starts T once their updates have
been flushed, on their worker without the master when it can (docs/design.md, "Dependent dispatch"). The
lookahead is one deep: T also waits until every task before T in the schedule other than P1 and P2 has completed
(P1's and P2's own predecessors), so an executor has at most two rounds in flight.

**Topic totals** ``n_k`` (int64 [K]) are not a parameter-server key: the driver hands each task the totals of
exactly the tasks before it in the schedule (the initial totals plus their changes, ``LDADriver._totals``), a
function of the schedule alone, so the same seed gives the same topics. The task keeps its own changes locally
while sampling and returns its net change. So a task misses the changes of the tasks not before it in the
schedule: with ``B = E`` about ``(E - 1) / 2`` rounds of the other executors' changes.

With ``ahead=1`` T's totals are those of every task before it in the schedule except P1 and P2 (the union of
the tasks before P1 and before P2: complete at T's dispatch by the lookahead rule, and a function of the schedule
only, so the same seed still gives the same topics); the executor adds its own previous round's change itself (it
is stateful and knows it), so T misses only P2's change beyond what ``ahead=0`` misses: one more round of
staleness on the other executors' changes.

**Checks the driver makes.** Every task adds 1 to ``("hold", b)`` and returns the value it read; the
holders of a block must read 0, 1, 2, ... in completion order (an overlap or a lost update would show a
repeated or skipped value). The holders of a block must also complete in the schedule's order (a holder that
ran before its predecessor finished would show), and with ``ahead=0`` the driver also checks its own
dispatch/completion intervals per block (with ``ahead=1`` a hold starts when the runtime releases the task, which
the driver does not see: the completion order and the hold counts are the checks).
Executors check that rounds arrive in order (a task run twice or lost after a migration would show).
With ``check_counts=1`` each epoch ends with a barrier and two check rounds: every executor adds the
word-topic counts recomputed from its ``z`` into ``("zc", b)`` and checks its ``ndk`` against ``z``, then
the block's checker compares ``("wt", b)`` with ``("zc", b)``, resets ``("zc", b)`` and returns the sums;
the driver checks that the counts sum to the number of tokens and that the totals equal the blocks' column
sums.

**After a SCAR partial recovery** (``--partial-recovery``) the lost shards' counts are back at a checkpoint
while every ``z`` kept going, so the driver recounts (thesis §5.4.1: recount what can be recounted): it stops
dispatching rounds (ahead too), waits for the running ones (those dispatched ahead included), then every
executor adds its recomputed block counts into keys of that recount (``("rc", n, b)``), and the checkers set
``("wt", b)`` and ``("hold", b)`` to the recounted values and the check sums ``("zc", b)`` to zero (the topic
totals are the driver's, which no server loss touches) (a checkpoint taken during a check holds partial sums); then the
rotation goes on where it stopped. Hold counts read stale before the recount are listed as ``stale_holds``, not
as violations, and an epoch with a task that completed before the recount ended does not check its topic totals
against its blocks' column sums (``stale_epochs``): those sums may hold a restored shard's counts; the next
epoch's check covers them again.

**Log-likelihood** (the standard collapsed joint ``log p(w, z | α, β)``) is computed without a barrier:
an executor's last round of an epoch returns its documents' part, the last holder of a block in an epoch
returns the block's word part and column sums (= that block's share of the final topic totals), and the
driver adds them up once every task of the epoch has completed.

Protocol (task arguments -> result dicts, all with ``kind``):
 * ``("init",)`` -> random ``z``, counts pushed to the server, kernels compiled; sizes.
 * ``("sample", round, block, totals, ll_doc, ll_word[, counts[, own]])`` -> hold value read, tokens, seconds, the
   change of the topic totals, optional LL parts (``own``: add this executor's previous round's change to
   ``totals``, for ``ahead=1``)
   (and with ``counts`` the block's word-topic counts, for ``recovery_every``).
 * ``("check", epoch)``, ``("check2", epoch)`` -> the counts invariant (``check_counts=1``).
 * ``("recount", n)``, ``("recount2", n, {block: holds})`` -> the counts recomputed after a partial recovery.
 * ``("final",)`` -> top words per topic of the executor's blocks (and the full counts if needed).
"""
from __future__ import annotations

import functools
import math
import sys
import time
from collections import deque
from typing import Any

import numpy as np

import litz
import litz.kernels

from ..modelfile import model_path, save_model
from . import data, kernels
from .settings import Settings

# Every numba kernel of the app with the types it is called with (litz.kernels): `litz warmup` compiles them
# into numba's on-disk cache, and a local job's master does before it starts workers if the cache lacks some.
KERNELS = {kernels.__name__: kernels.SIGNATURES, data.__name__: data.SIGNATURES}
litz.kernels.preload(KERNELS)  # what the cache has, loaded in the launcher: its forked workers inherit it


def _sampler():  # noqa: ANN202 (a numba dispatcher)
    """``kernels.sample_task`` as imported from disk when this process can import the app, else the shipped copy
    (:func:`litz.kernels.from_disk`: the shipped one compiled in every worker process, about 1.3 s of CPU before
    its first task, against about 0.25 s to load it from the cache)."""
    return (litz.kernels.from_disk(kernels.__name__) or kernels).sample_task


# --------------------------------------------------------------------------------------------- executor
class LDAExecutor(litz.Executor):
    """Owns a range of documents: the token layout (input), ``z`` and ``ndk`` (state)."""

    input_attrs = ("settings", "layout", "blocks", "doc_lo", "num_docs", "num_words", "total_tokens")
    z: np.ndarray | None = None  # topic of each token, in layout order (int16): the executor's state
    ndk: np.ndarray | None = None  # doc-topic counts (docs x K, int16 or int32): rebuilt from z on arrival
    next_round: int = 0  # the round this executor expects next (a lost or repeated task shows)
    last_delta: np.ndarray | None = None  # the change of the topic totals of round next_round - 1 (ahead=1 adds it)
    min_blocks: int = 0  # the driver's floor on the blocks (the workers at the start), from "init": state

    def load_input(self) -> None:
        self.settings = Settings.from_config(self.config)
        part = data.partition(self.settings, self.executor_id, self.num_executors, self.min_blocks)
        self.layout, self.blocks = part.layout, part.blocks
        self.doc_lo, self.num_docs = part.doc_lo, part.num_docs
        self.num_words, self.total_tokens = part.num_words, part.total_tokens

    def __getstate__(self) -> dict:
        """Moves and checkpoints carry ``z`` and the round counter; ``ndk`` is rebuilt from ``z`` (O(tokens))
        at the destination, which keeps the state at 2 bytes a token whatever K is."""
        state = super().__getstate__()
        state.pop("ndk", None)
        return state

    def run_task(self, args: tuple) -> dict[str, Any]:
        kind = args[0]
        if kind == "sample":
            return self._sample(*args[1:])
        if kind == "init":
            return self._init(*args[1:])
        if kind == "check":
            return self._check(args[1])
        if kind == "check2":
            return self._check2(args[1])
        if kind == "recount":
            return self._recount(args[1])
        if kind == "recount2":
            return self._recount2(args[1], args[2])
        if kind == "final":
            return self._final()
        raise ValueError(f"unknown LDA task {args!r}")

    # -- helpers ---------------------------------------------------------------------------------------
    @property
    def K(self) -> int:
        return self.settings.topics

    def _runs(self, block: int) -> tuple[int, int]:
        return int(self.layout.blk_run_ptr[block]), int(self.layout.blk_run_ptr[block + 1])

    def _doc_topics(self) -> np.ndarray:
        if self.ndk is None:
            L = self.layout
            self.ndk = kernels.doc_topic_counts(self.z, L.run_doc, L.run_ptr, len(L.doc_len), self.K)
        return self.ndk

    def _block_counts(self, block: int) -> np.ndarray:
        r0, r1 = self._runs(block)
        ptr = self.layout.run_ptr
        return kernels.word_topic_counts(self.layout.word, self.z, int(ptr[r0]), int(ptr[r1]),
                                         int(self.blocks.sizes[block]), self.K)

    def _my_blocks(self) -> range:
        """Blocks this executor checks and reports at the end: b = e, e + E, e + 2E, ..."""
        return range(self.executor_id, self.blocks.num_blocks, self.num_executors)

    def _state_bytes(self) -> int:
        return int(self.z.nbytes) + 64

    # -- tasks -----------------------------------------------------------------------------------------
    def _init(self, min_blocks: int = 0) -> dict[str, Any]:
        if self.z is None and self.settings.blocks is None and min_blocks > self.blocks.num_blocks:
            # more workers at the start than blocks by default
            self.min_blocks = min_blocks
            self.load_input()  # the same documents, laid out by more blocks; kept in the state for reloads
        s, L = self.settings, self.layout
        if self.z is None:
            self.z = kernels.random_topics(L.tokens, self.K, kernels.task_seed(s.sampler_seed, self.executor_id, -1))
            self.ndk = None
            self.ps_update_many([(("wt", b), self._block_counts(b)) for b in range(self.blocks.num_blocks)])
        ndk = self._doc_topics()
        t0 = time.perf_counter()
        # compile the kernels now, with the real argument types, so sampling time is sampling time: the block
        # read-only, as ps_get hands it out (a writable one was a second compiled version, 1.5 s more at first)
        wt0 = np.zeros((1, self.K), np.int32)
        wt0.flags.writeable = False
        _sampler()(L.word, self.z, L.run_doc, L.run_ptr, 0, 0, ndk, wt0, np.zeros(self.K, np.int64), L.doc_len,
                   s.alpha, s.beta, s.beta * self.num_words, np.uint64(1), False, False)
        return {"kind": "init", "executor": self.executor_id, "tokens": L.tokens, "docs": len(L.doc_len),
                "doc_lo": self.doc_lo, "blocks": self.blocks.num_blocks, "num_docs": self.num_docs,
                "num_words": self.num_words, "total_tokens": self.total_tokens,
                "block_tokens": L.block_tokens().tolist(), "state_bytes": self._state_bytes(),
                "memory_bytes": int(self.z.nbytes + ndk.nbytes), "compile_s": time.perf_counter() - t0,
                "nk": np.bincount(self.z, minlength=self.K).astype(np.int64)}

    def _sample(self, rnd: int, block: int, totals: np.ndarray, ll_doc: bool, ll_word: bool,
                counts: bool = False, own: bool = False) -> dict[str, Any]:
        if rnd != self.next_round:
            raise RuntimeError(f"executor {self.executor_id} got round {rnd}, expected {self.next_round}: "
                               f"a task was lost or ran twice")
        s, L = self.settings, self.layout
        wt_ps, hold = self.ps_get_many([("wt", block), ("hold", block)])
        t0, c0 = time.perf_counter(), time.thread_time()
        if wt_ps is None:
            wt_ps = np.zeros((int(self.blocks.sizes[block]), self.K), np.int32)
        elif wt_ps.dtype != np.int32 or not wt_ps.flags.c_contiguous:  # as stored it always is: one compiled kernel
            wt_ps = np.ascontiguousarray(wt_ps, np.int32)
        wt_ps.flags.writeable = False  # as ps_get hands it out: one compiled kernel (numba types read-only apart)
        nk = np.array(totals, dtype=np.int64)  # the driver's, a function of the schedule (see LDADriver._totals)
        if own:  # ahead=1: the driver could not count my previous round, still running when it dispatched this one
            nk += self.last_delta
        ndk = self._doc_topics()
        r0, r1 = self._runs(block)
        seed = np.uint64(kernels.task_seed(s.sampler_seed, self.executor_id, rnd))
        wt, delta, nk_delta, changed, lo, hi, doc_ll, word_ll, cols = _sampler()(
            L.word, self.z, L.run_doc, L.run_ptr, r0, r1, ndk, wt_ps, nk, L.doc_len, s.alpha, s.beta,
            s.beta * self.num_words, seed, bool(ll_doc), bool(ll_word))
        self.ps_update_many([(("wt", block), kernels.block_delta(delta, lo, hi, wt, wt_ps)), (("hold", block), 1)])
        self.next_round, self.last_delta = rnd + 1, nk_delta
        out: dict[str, Any] = {"kind": "sample", "executor": self.executor_id, "round": rnd, "block": block,
                               "hold": int(hold or 0), "tokens": int(L.run_ptr[r1] - L.run_ptr[r0]),
                               "changed": int(changed), "nk_delta": nk_delta}
        if ll_doc:
            out["ll_doc"] = doc_ll
        if ll_word:
            out["ll_word"], out["cols"] = word_ll, cols
        if counts:  # the block as this epoch left it, for the driver's topic recovery (recovery_every)
            out["words"], out["wt"] = self.blocks.words_of(block), wt
        out["seconds"], out["cpu_s"] = time.perf_counter() - t0, time.thread_time() - c0
        return out

    def _check(self, epoch: int) -> dict[str, Any]:
        """Phase 1: add the counts recomputed from ``z`` into ("zc", b); check ``ndk`` against ``z``."""
        L = self.layout
        ndk = self._doc_topics()
        recomputed = kernels.doc_topic_counts(self.z, L.run_doc, L.run_ptr, len(L.doc_len), self.K)
        ndk_ok = bool(np.array_equal(recomputed, ndk)) and bool(np.array_equal(ndk.sum(axis=1), L.doc_len))
        self.ps_update_many([(("zc", b), self._block_counts(b)) for b in range(self.blocks.num_blocks)])
        return {"kind": "check", "executor": self.executor_id, "epoch": epoch, "ndk_ok": ndk_ok,
                "tokens": L.tokens}

    def _check2(self, epoch: int) -> dict[str, Any]:
        """Phase 2: for my blocks, the server's counts must equal the sum of every executor's recomputed ones."""
        mine = list(self._my_blocks())
        values = self.ps_get_many([k for b in mine for k in (("wt", b), ("zc", b))])
        mismatched, wt_sum, cols, resets = 0, 0, np.zeros(self.K, np.int64), []
        for i, b in enumerate(mine):
            wt, zc = values[2 * i], values[2 * i + 1]
            shape = (int(self.blocks.sizes[b]), self.K)
            wt = np.zeros(shape, np.int64) if wt is None else np.asarray(wt, np.int64)
            zc = np.zeros(shape, np.int64) if zc is None else np.asarray(zc, np.int64)
            mismatched += int(np.count_nonzero(wt != zc)) + int((wt < 0).sum())
            wt_sum += int(wt.sum())
            cols += wt.sum(axis=0)
            resets.append((("zc", b), (-zc).astype(np.int32)))
        self.ps_update_many(resets)
        return {"kind": "check2", "executor": self.executor_id, "epoch": epoch, "blocks": len(mine),
                "mismatched": mismatched, "wt_sum": wt_sum, "cols": cols}

    def _recount(self, n: int) -> dict[str, Any]:
        """Phase 1 of recount ``n``: this executor's share of every block's counts, into keys of this recount only
        (``("zc", b)`` may hold a check's partial sums, restored from a checkpoint). The topic totals are the
        driver's, which no server loss touches."""
        self.ps_update_many([(("rc", n, b), self._block_counts(b)) for b in range(self.blocks.num_blocks)])
        return {"kind": "recount", "executor": self.executor_id}

    def _recount2(self, n: int, holds: dict[int, int]) -> dict[str, Any]:
        """Phase 2: my blocks set to the recounted values, the check sums ``zc`` to zero, the hold counts to the
        driver's."""
        mine = sorted(holds)
        values = self.ps_get_many([k for b in mine for k in (("wt", b), ("rc", n, b), ("zc", b), ("hold", b))])
        updates, fixed = [], 0
        for i, b in enumerate(mine):
            shape = (int(self.blocks.sizes[b]), self.K)
            wt, rc, zc = (np.zeros(shape, np.int32) if v is None else np.asarray(v, np.int32)
                          for v in values[4 * i: 4 * i + 3])
            fixed += int(np.count_nonzero(wt != rc))
            updates += [(("wt", b), rc - wt), (("rc", n, b), -rc), (("zc", b), -zc),
                        (("hold", b), holds[b] - int(values[4 * i + 3] or 0))]
        self.ps_update_many(updates)
        return {"kind": "recount2", "executor": self.executor_id, "fixed": fixed}

    def _final(self) -> dict[str, Any]:
        s = self.settings
        mine = list(self._my_blocks())
        values = self.ps_get_many([("wt", b) for b in mine])
        full = s.output is not None or s.synthetic
        top: list[tuple[np.ndarray, np.ndarray]] = []  # per block: (counts n x K, global word ids n x K)
        blocks = []
        for b, wt in zip(mine, values, strict=True):
            rows = int(self.blocks.sizes[b])
            wt = np.zeros((rows, self.K), np.int32) if wt is None else np.asarray(wt)
            words = self.blocks.words_of(b)
            n = min(s.top_words, rows)
            if n:
                idx = np.argpartition(-wt, n - 1, axis=0)[:n] if n < rows else np.tile(np.arange(rows)[:, None],
                                                                                    (1, self.K))
                top.append((np.take_along_axis(wt, idx, axis=0), words[idx]))
            if full:
                blocks.append((words, np.array(wt)))
        out: dict[str, Any] = {"kind": "final", "executor": self.executor_id, "top": top, "blocks": blocks}
        if s.output is not None:
            out["doc_lo"], out["ndk"] = self.doc_lo, self._doc_topics()
        return out


# --------------------------------------------------------------------------------------------- driver
class LDADriver(litz.Driver):
    """Runs the block rotation, adds up the log-likelihood per epoch, checks the schedule and the counts."""

    # With B < E a round's turns on a block start at a rotated executor (_holder_after); a driver restored from a
    # checkpoint written before 2026-11-28 has no such attribute and goes on in the order it began in (by id):
    # switching order mid-round would skip an executor's turn and wait for it forever.
    turns_rotated = False

    def dispatch_initial_tasks(self) -> None:
        self.s = Settings.from_config(self.config)
        self.output = model_path(self.s.output)  # a bad path fails now, not after training
        self.infos: dict[int, dict] = {}
        workers = self.num_workers() or 0
        for e in range(self.num_executors):  # at least as many blocks as workers, so none waits for lack of one
            self.dispatch_task(e, ("init", min(workers, self.num_executors)))

    def handle_task_completion(self, result: dict) -> None:
        kind = result["kind"]
        if kind == "sample":
            self._sampled(result)
        elif kind == "init":
            self.infos[result["executor"]] = result
            if len(self.infos) == self.num_executors:
                self._start()
        elif kind == "check":
            self._checked(result)
        elif kind == "check2":
            self._checked2(result)
        elif kind in ("recount", "recount2"):
            self._recounted(result)
        elif kind == "final":
            self.finals.append(result)
            if len(self.finals) == self.num_executors:
                self._finish()
        else:
            raise ValueError(f"unexpected task result kind {kind!r}")

    # -- start -----------------------------------------------------------------------------------------
    def _start(self) -> None:
        s, E = self.s, self.num_executors
        info = self.infos[0]
        self.B, self.V, self.D = info["blocks"], info["num_words"], info["num_docs"]
        self.N = info["total_tokens"]
        if any(i["blocks"] != self.B for i in self.infos.values()):
            raise RuntimeError("executors laid their tokens out by different numbers of blocks")
        self.few_blocks_said = False  # the job has more workers than blocks: said once (_end_epoch)
        if sum(i["tokens"] for i in self.infos.values()) != self.N:
            raise RuntimeError("executors' token counts do not add up to the corpus's")
        self._vocabulary()  # a bad vocabulary file fails now, not after training
        self.total_rounds = s.epochs * self.B
        self.set_total(s.epochs, unit="epoch")  # the progress line: epoch 3/20 and an ETA
        self.round_limit = self.B if s.check_counts else self.total_rounds
        self.next_round = [0] * E
        self.busy = [False] * E
        self.held: list[int | None] = [None] * self.B
        self.turns_rotated = True
        self.block_next = [self._holder_after(b, 0, -1) for b in range(self.B)]
        self.holds_seen = [0] * self.B  # completed holds per block = the ("hold", b) value the next must read
        self.violations: list[str] = []
        # every hold of a block is an interval (dispatch, completion) on one event counter; they must not overlap
        self.events = 0
        self.open_holds: dict[tuple[int, int, int], int] = {}  # (block, round, executor) -> dispatch event
        self.last_start = [0] * self.B  # latest dispatch event per block
        self.last_end = [0] * self.B  # latest completion event per block
        self.overlaps = 0
        self.holders: list[deque] = [deque() for _ in range(self.B)]  # dispatched, not completed: (round, executor)
        self.checking = False  # a counts check (a barrier) is under way
        self.recount: dict | None = None  # after a partial recovery until the counts are recounted
        self.recounts: list[dict] = []
        self.recount_seq = 0  # names each recount's keys: a recount started again counts into fresh ones
        self.stale_holds = 0  # hold counts read from a restored shard before the recount
        self.stale_epochs = 0  # epochs whose block sums were read before a recount (their totals not checked)
        self.epoch_parts: dict[int, dict] = {}
        self.history: list[dict] = []
        self.checks: list[dict] = []
        self.check_results: list[dict] = []
        self.finals: list[dict] = []
        self.compute_s = self.compute_cpu_s = 0.0  # in-task wall and thread CPU seconds
        # the topic totals each task samples with: the initial ones plus every change of the tasks that precede it
        # in the schedule (see _totals); clock rows are, per executor e', the last round of e' that precedes
        nk0 = sum(i["nk"] for i in self.infos.values())
        self.clock_exec = np.full((E, E), -1, np.int64)  # ... executor e's next task
        self.clock_block = np.full((self.B, E), -1, np.int64)  # ... the next holder of block b
        self.cum: list[dict[int, np.ndarray]] = [{-1: nk0 if e == 0 else np.zeros(s.topics, np.int64)}
                                                 for e in range(E)]  # per executor: round -> its changes so far
        self.tot_exec = [nk0] * E  # the totals of each clock (never changed in place)
        self.tot_block = [nk0] * self.B
        # per executor, (round, block, (clock, totals)) of its task in flight: neither clock moves until it
        # completes (its executor runs one task at a time and holds the block), so its completion reuses them
        self.in_flight_clock: dict[int, tuple] = {}
        self.epoch_totals = np.array(nk0)  # after every task of the epochs done so far
        # by default ahead when executors take turns on a block (B < E): each turn is handed on by the worker,
        # without the master; with B = E a round has E tasks ready to run and nothing waits for that hop
        self.ahead = s.ahead if s.ahead is not None else self.B < E
        if self.ahead:  # the clocks of the tasks dispatched last (see _try_ahead); busy counts tasks in flight
            self.done = [-1] * E  # per executor, its last completed round
            # the predecessors (executor, round) of executor e's and of block b's last dispatched task
            self.preds_exec: list[list[tuple[int, int]]] = [[] for _ in range(E)]
            self.preds_block: list[list[tuple[int, int]]] = [[] for _ in range(self.B)]
            self.anc_exec = np.full((E, E), -1, np.int64)  # the tasks before executor e's last dispatched task
            self.anc_block = np.full((self.B, E), -1, np.int64)  # ... before block b's last dispatched holder
            self.last_holder: list[tuple[int, int] | None] = [None] * self.B  # (round, executor)
            self.tid_exec: list[int | None] = [None] * E  # task ids of the same
            self.tid_block: list[int | None] = [None] * self.B
            self.ref_clock = np.full((E, E), -1, np.int64)  # the totals clock of e's last dispatched task
            self.ref_totals = [nk0] * E  # and its totals
        self.dispatched_ahead = 0  # rounds dispatched before a predecessor completed
        state = [i["state_bytes"] for i in self.infos.values()]
        self.state_bytes = {"max": max(state), "total": sum(state),
                            "memory_max": max(i["memory_bytes"] for i in self.infos.values())}
        self.report(stage="init", tokens=self.N, docs=self.D, vocab=self.V, blocks=self.B,
                    state_bytes_per_executor=self.state_bytes["max"],
                    compile_s=round(max(i["compile_s"] for i in self.infos.values()), 3))
        self.t_start = self.t_mark = time.time()
        if self.total_rounds == 0:
            self._final_round()
            return
        for e in range(E):
            self._try(e)

    # -- the block schedule ------------------------------------------------------------------------------
    def _holder_after(self, block: int, rnd: int, executor: int) -> tuple[int, int] | None:
        """The first holder (round, executor) of ``block`` after ``(rnd, executor)`` (executor -1: from the start
        of round ``rnd``), or None."""
        E, B = self.num_executors, self.B
        while rnd < self.total_rounds:
            first = (block - rnd) % B
            n = (E - first + B - 1) // B  # the round's holders of the block: first, first + B, ... below E
            start = first * n // B if self.turns_rotated else 0
            if executor >= 0 and n > 1:
                i = ((executor - first) // B - start) % n + 1
                if i < n:
                    return rnd, first + (start + i) % n * B
            elif executor < 0 and n > 0:
                return rnd, first + start * B
            rnd, executor = rnd + 1, -1
        return None

    def _try(self, e: int) -> None:
        if self.ahead:
            self._pump([e])
            return
        r = self.next_round[e]
        if self.busy[e] or r >= self.round_limit or self.recount is not None:
            return
        b = (e + r) % self.B
        if self.held[b] is not None or self.block_next[b] != (r, e):
            return
        self.busy[e] = True
        self.held[b] = e
        self.events += 1
        self.open_holds[(b, r, e)] = self.last_start[b] = self.events
        nxt = self._holder_after(b, r, e)
        last_of_epoch = nxt is None or nxt[0] // self.B != r // self.B
        every = self.s.recovery_every
        counts = last_of_epoch and every > 0 and (r // self.B + 1) % every == 0
        self.holders[b].append((r, e))
        self.dispatch_task(e, ("sample", r, b, self._totals(e, b), r % self.B == self.B - 1, last_of_epoch, counts))

    def _pump(self, executors: list[int]) -> None:
        """``ahead=1``: dispatch what became ready among the next tasks of ``executors``, and after each dispatch
        the next tasks of its executor and of its block's next holder (their predecessors may all be dispatched
        now)."""
        todo = list(executors)
        while todo:
            e = todo.pop()
            b = self._try_ahead(e)
            if b is not None:
                todo.append(e)
                nxt = self.block_next[b]
                if nxt is not None:
                    todo.append(nxt[1])

    def _try_ahead(self, e: int) -> int | None:
        """Dispatch executor ``e``'s next task T = (e, r) on block b if its predecessors P1 = (e, r - 1) and P2 = b's
        previous holder are dispatched and every task before T in the schedule but P1 and P2 has completed (the
        lookahead is one deep); return b if it did.

        The tasks before T but P1 and P2 are the tasks before P1 and those before P2 (their clocks' join, kept per
        executor and block for the last dispatched task): T samples with their totals, a function of the schedule
        only, plus (``own``) its executor's change of round r - 1 where that is not among them."""
        r = self.next_round[e]
        if r >= self.round_limit or self.recount is not None:
            return None
        b = (e + r) % self.B
        if self.block_next[b] != (r, e):  # P2 is not dispatched yet
            return None
        done = self.done
        for x, q in self.preds_exec[e]:  # one deep: P1's and P2's own predecessors must have completed (the
            if done[x] < q:              # latest of the tasks before them; this is most calls: plain ints)
                return None
        for x, q in self.preds_block[b]:
            if done[x] < q:
                return None
        clock = np.maximum(self.anc_exec[e], self.anc_block[b])
        ref, totals = self.ref_clock[e], self.ref_totals[e]  # e's previous task's clock, contained in this one
        ahead = np.flatnonzero(clock != ref).tolist()
        if len(ahead) > 3:  # (a pipeline moves every entry along) one sum of E rows: 6 us at 32 executors, not 33
            totals = np.add.reduce(np.array([self.cum[x][c] for x, c in enumerate(clock.tolist())]))
        else:
            for x in ahead:
                cum = self.cum[x]
                totals = totals + cum[int(clock[x])] - cum[int(ref[x])]
        self.ref_clock[e], self.ref_totals[e] = clock, totals
        before = np.array(clock)  # the tasks before T: those before P1 and P2, and P1 and P2
        if r > 0:
            before[e] = max(before[e], r - 1)
        p2 = self.last_holder[b]
        if p2 is not None:
            before[p2[1]] = max(before[p2[1]], p2[0])
        self.anc_exec[e] = self.anc_block[b] = before
        self.preds_exec[e] = self.preds_block[b] = ([(e, r - 1)] if r > 0 else []) + ([(p2[1], p2[0])] if p2 else [])
        after = [t for t in (self.tid_exec[e], self.tid_block[b]) if t is not None]
        nxt = self._holder_after(b, r, e)
        last_of_epoch = nxt is None or nxt[0] // self.B != r // self.B
        every = self.s.recovery_every
        counts = last_of_epoch and every > 0 and (r // self.B + 1) % every == 0
        own = r > 0 and clock[e] < r - 1
        if done[e] < r - 1 or (p2 is not None and done[p2[1]] < p2[0]):
            self.dispatched_ahead += 1  # a predecessor still runs: without ahead=1 it would wait for the master
        tid = self.dispatch_task(e, ("sample", r, b, totals, r % self.B == self.B - 1, last_of_epoch, counts, own),
                                 after=after)
        self.tid_exec[e] = self.tid_block[b] = tid
        self.last_holder[b] = (r, e)
        self.next_round[e] = r + 1
        self.block_next[b] = nxt
        self.busy[e] += 1
        self.holders[b].append((r, e))
        return b

    def _clock(self, e: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Per executor, its last round that precedes executor ``e``'s next task on block ``b`` in the schedule
        (the task waits for e's previous round and for b's previous holder, and so for everything they waited
        for), and the totals after exactly those rounds.

        The clock is the two clocks' join, and its totals those of one clock corrected where the other is ahead,
        not a sum over every executor (42 us a task at 32 executors on a loaded machine: 4% of an epoch's master
        time at 1 024 tasks an epoch). With B = E the executor's clock is ahead in one entry, its own last round,
        so that side is tried first and the other compared only if it is ahead in more than two (in one process,
        32 executors, 3.6M tokens: the driver's time outside tasks 0.29 s against 0.34 s in 10 epochs)."""
        ce, cb = self.clock_exec[e], self.clock_block[b]
        base, lag, totals = cb, ce, self.tot_block[b]
        ahead = np.flatnonzero(ce > cb).tolist()
        if len(ahead) > 2:  # either side is right; the other may need fewer corrections (with B = E, 1 against
            ahead_b = np.flatnonzero(cb > ce).tolist()  # E - 1 the other way round: this test is most calls)
            if len(ahead_b) < len(ahead):
                base, lag, totals, ahead = ce, cb, self.tot_exec[e], ahead_b
        for x in ahead:
            cum = self.cum[x]
            totals = totals + cum[int(lag[x])] - cum[int(base[x])]
        return np.maximum(ce, cb), totals

    def _totals(self, e: int, b: int) -> np.ndarray:
        """The topic totals executor ``e``'s next task (on block ``b``) samples with: the initial totals plus the
        changes of exactly the tasks that precede it in the schedule, all complete at its dispatch.

        Why not the totals as they are at its start, as a parameter-server key would give: which concurrent tasks
        had completed by then depends on timing, so the chain, and the learned topics, differed from run to run
        with the same seed (4 per worker: topic recovery 0.934, 0.975, 0.964 in three runs of seed 0). This
        version depends only on the schedule: the same seed gives the same topics for the same executors and
        blocks. It is staler: with B = E it misses about (E - 1) / 2 rounds of the other executors' changes
        against about one (bench/README.md, lda_quality: at 8 executors recovery per sweep within 0.01 of
        tomotopy's). The clock and totals are kept for the task's completion (``in_flight_clock``)."""
        clock_totals = self._clock(e, b)
        self.in_flight_clock[e] = (self.next_round[e], b, clock_totals)
        return clock_totals[1]


    def _sampled(self, res: dict) -> None:
        e, r, b = res["executor"], res["round"], res["block"]
        holders = self.holders[b]
        if holders and holders[0] == (r, e):
            holders.popleft()
        else:  # it completed before an earlier holder of its block: it ran before that one's updates were in
            self.violations.append(f"block {b}: executor {e}'s round {r} completed before the earlier holder "
                                   f"{holders[0] if holders else None} (round, executor)")
            if (r, e) in holders:
                holders.remove((r, e))
        if res["hold"] != self.holds_seen[b]:
            if self.recount is not None:  # read from a restored shard: the recount resets it
                self.stale_holds += 1
            else:
                self.violations.append(f"block {b}, round {r}, executor {e} read hold count {res['hold']}, "
                                       f"expected {self.holds_seen[b]}")
        self.holds_seen[b] += 1
        if self.ahead:  # a hold began when the runtime released the task: the driver saw neither that nor its end
            self.busy[e] -= 1
            self._count_ahead(e, r, res["nk_delta"])
        else:
            if self.held[b] != e:
                self.violations.append(f"block {b} completed by executor {e} but held by {self.held[b]}")
            self.events += 1
            start = self.open_holds.pop((b, r, e))
            if start <= self.last_end[b] or self.last_start[b] != start:  # it began before the last one ended,
                self.overlaps += 1                                         # or another began while it was held
                self.violations.append(f"block {b}: the hold of executor {e} in round {r} overlaps another")
            self.last_end[b] = self.events
            self.held[b] = None
            self.busy[e] = False
            self.next_round[e] = r + 1
            self._count_totals(e, r, b, res["nk_delta"])
            self.block_next[b] = self._holder_after(b, r, e)
        self.compute_s += res["seconds"]
        self.compute_cpu_s += res["cpu_s"]
        epoch = r // self.B
        parts = self.epoch_parts.get(epoch)
        if parts is None:  # not setdefault: its default (an array) would be built for every task
            parts = self.epoch_parts[epoch] = {"tasks": 0, "ll": [],
                                               "cols": np.zeros(self.s.topics, np.int64), "changed": 0,
                                               "nk": np.zeros(self.s.topics, np.int64)}
        parts["tasks"] += 1
        if self.recount is not None:  # it may have read a restored shard's counts: its block sums are stale
            parts["stale"] = True
        parts["changed"] += res["changed"]
        parts["nk"] += res["nk_delta"]
        if "ll_doc" in res:
            parts["ll"].append(res["ll_doc"])
        if "ll_word" in res:
            parts["ll"].append(res["ll_word"])
            parts["cols"] += res["cols"]
        if "wt" in res:
            if "topic_word" not in parts:
                parts["topic_word"] = np.zeros((self.s.topics, self.V), np.int64)
            parts["topic_word"][:, res["words"]] = res["wt"].T
        if parts["tasks"] == self.num_executors * self.B:
            self._epoch_done(epoch, self.epoch_parts.pop(epoch))  # may start a check round (a barrier)
        if self.ahead:
            self._pump(list(dict.fromkeys(self._after_done(e, r, b))))
        else:
            self._try(e)
            if self.block_next[b] is not None:
                self._try(self.block_next[b][1])
        self._maybe_recount()

    def _after_done(self, e: int, r: int, b: int) -> list[int]:
        """``ahead=1``: the executors whose next task may have become ready when (e, r) on block b completed: those of
        its successors (e's next round, b's next holder) and of theirs. A task is dispatched once every task before
        it but its two predecessors has completed, so the last of them to complete is a predecessor's predecessor."""
        B = self.B

        def successors(x: int, q: int) -> list[tuple[int, int]]:  # (executor, round): x's next, the block's next
            nxt = self._holder_after((x + q) % B, q, x)
            return [(x, q + 1)] + ([(nxt[1], nxt[0])] if nxt is not None else [])

        out = []
        for x, q in successors(e, r):
            out.append(x)
            out += [y for y, _ in successors(x, q)]
        return out

    def _count_ahead(self, e: int, r: int, nk_delta: np.ndarray) -> None:
        """``ahead=1``: executor ``e``'s round ``r`` is done: its changes join the totals of the tasks dispatched
        after every predecessor of one of its successors has completed."""
        self.done[e] = r
        mine = self.cum[e]
        mine[r] = mine[r - 1] + nk_delta
        if len(mine) > 2 * self.B + 2:  # rounds no later task's clock can name: below every executor's last clock
            oldest = int(self.ref_clock[:, e].min())
            for old in [x for x in mine if x < oldest]:
                del mine[old]

    def _count_totals(self, e: int, r: int, b: int, nk_delta: np.ndarray) -> None:
        """Executor ``e``'s round ``r`` (on block ``b``) is done: its changes join the totals of the tasks after it."""
        at_dispatch = self.in_flight_clock.pop(e, None)
        clock, totals = at_dispatch[2] if at_dispatch is not None and at_dispatch[:2] == (r, b) else self._clock(e, b)
        clock[e] = r
        self.clock_exec[e] = self.clock_block[b] = clock
        self.tot_exec[e] = self.tot_block[b] = totals + nk_delta
        mine = self.cum[e]
        mine[r] = mine[r - 1] + nk_delta
        if len(mine) > 2 * self.B + 2:  # rounds no later task can be given: below every clock's entry for e
            oldest = min(int(self.clock_exec[:, e].min()), int(self.clock_block[:, e].min()))
            for old in [x for x in mine if x < oldest]:
                del mine[old]

    # -- after a partial recovery ------------------------------------------------------------------------
    def handle_partial_recovery(self, info: dict) -> None:
        if not hasattr(self, "busy"):  # still initialising: the init tasks push counts computed from z
            return
        if self.recount is None:
            self.recount = {"phase": "waiting", "results": [], "since": time.time(), "lost": info["lost"]}
        elif self.recount["phase"] != "waiting":  # lost during a recount: its sums may be wrong, count again
            self.recount["again"] = True
        self._maybe_recount()

    def _maybe_recount(self) -> None:
        """Start the recount once no sampling round or counts check is running (a barrier)."""
        rc = self.recount
        if rc is None or rc["phase"] != "waiting" or any(self.busy) or self.checking:
            return
        rc["phase"] = "recount"
        rc["n"], self.recount_seq = self.recount_seq, self.recount_seq + 1
        for e in range(self.num_executors):
            self.dispatch_task(e, ("recount", rc["n"]))

    def _recounted(self, res: dict) -> None:
        rc = self.recount
        rc["results"].append(res)
        if len(rc["results"]) < self.num_executors:
            return
        results, rc["results"] = rc["results"], []
        if rc["phase"] == "recount":
            rc["phase"] = "recount2"
            E = self.num_executors
            for e in range(E):
                self.dispatch_task(e, ("recount2", rc["n"], {b: self.holds_seen[b] for b in range(e, self.B, E)}))
            return
        self.recounts.append({"lost": rc["lost"], "entries_fixed": sum(r["fixed"] for r in results),
                              "seconds": round(time.time() - rc["since"], 4)})
        self.report(recounts=len(self.recounts), recount_fixed=self.recounts[-1]["entries_fixed"],
                    stale_holds=self.stale_holds)
        if rc.get("again"):
            rc.update(phase="waiting", again=False)
            self._maybe_recount()
            return
        then, self.recount = rc.get("then"), None
        if then is not None:  # the epoch ended while it waited: its check or the end comes now
            self._end_epoch(then)
        for e in range(self.num_executors):
            self._try(e)

    def _epoch_done(self, epoch: int, parts: dict) -> None:
        s = self.s
        now = time.time()
        seconds, self.t_mark = now - self.t_mark, now
        # math.fsum: exactly rounded, so the same whatever order the parts arrived in (a plain sum differed in its
        # last bits from run to run of the same chain)
        ll = math.fsum(parts["ll"]) + kernels.topic_log_likelihood(parts["cols"], self.V, s.beta)
        self.epoch_totals += parts["nk"]  # from the changes of z: right whatever a restored shard held
        if parts.get("stale"):  # block sums read before a recount fixed them: checked again from the next epoch
            self.stale_epochs += 1
        elif int(parts["cols"].sum()) != self.N:
            self.violations.append(f"epoch {epoch + 1}: topic totals sum to {int(parts['cols'].sum())}, "
                                   f"not {self.N} tokens")
        elif not np.array_equal(self.epoch_totals, parts["cols"]):  # the totals tasks get against the blocks' counts
            self.violations.append(f"epoch {epoch + 1}: the driver's topic totals differ from the blocks' column sums")
        entry = {"epoch": epoch + 1, "log_likelihood": ll, "ll_per_token": ll / self.N,
                 "tokens_per_s": self.N / max(seconds, 1e-9), "seconds": seconds,
                 "changed": parts["changed"] / self.N}
        if "topic_word" in parts:
            entry["topic_recovery"] = topic_recovery(parts["topic_word"], self._truth())
        self.history.append(entry)
        ahead = {"dispatched_ahead": self.dispatched_ahead} if self.ahead else {}
        self.report(**{k: (round(v, 6) if isinstance(v, float) else v) for k, v in entry.items()},
                    schedule_violations=len(self.violations), **ahead)
        if self.recount is not None:
            self.recount["then"] = epoch  # check or finish with the recounted counts
        else:
            self._end_epoch(epoch)

    def _end_epoch(self, epoch: int) -> None:
        workers = self.num_workers()
        useful = min(workers, self.num_executors, self.V) if workers is not None else 0  # blocks that could run
        if self.B < useful and not getattr(self, "few_blocks_said", True):
            self.few_blocks_said = True
            print(f"apps.lda: the job has {workers} workers but {self.B} vocabulary blocks, and at most one task per "
                  f"block runs at a time: set config blocks={useful} or more (and the executors to a multiple) to "
                  f"keep them all busy", file=sys.stderr, flush=True)
        if self.s.check_counts:
            self._check_round(epoch)
        elif epoch + 1 == self.s.epochs:
            self._final_round()

    # -- counts invariant ------------------------------------------------------------------------------
    def _check_round(self, epoch: int) -> None:
        self.checking = True
        self.check_results = []
        for e in range(self.num_executors):
            self.dispatch_task(e, ("check", epoch))

    def _checked(self, res: dict) -> None:
        self.check_results.append(res)
        if len(self.check_results) == self.num_executors:
            for e in range(self.num_executors):
                self.dispatch_task(e, ("check2", res["epoch"]))

    def _checked2(self, res: dict) -> None:
        self.check_results.append(res)
        if len(self.check_results) < 2 * self.num_executors:
            return
        epoch = res["epoch"]
        phase1 = [r for r in self.check_results if r["kind"] == "check"]
        phase2 = [r for r in self.check_results if r["kind"] == "check2"]
        cols = sum(r["cols"] for r in phase2)
        totals = self.epoch_totals  # the driver's after this epoch: at this barrier, after every task so far
        wt_sum = sum(r["wt_sum"] for r in phase2)
        entry = {"epoch": epoch + 1, "tokens": self.N, "wt_sum": wt_sum, "totals_sum": int(totals.sum()),
                 "z_tokens": sum(r["tokens"] for r in phase1),
                 "mismatched": sum(r["mismatched"] for r in phase2),
                 "ndk_ok": all(r["ndk_ok"] for r in phase1),
                 "totals_match": bool(np.array_equal(totals, cols))}
        entry["ok"] = bool(entry["wt_sum"] == entry["totals_sum"] == entry["z_tokens"] == self.N
                           and entry["mismatched"] == 0 and entry["ndk_ok"] and entry["totals_match"])
        self.check_results = []
        self.checking = False
        if self.recount is not None:  # a partial recovery during the check: recount, then check again
            self.recount.setdefault("then", epoch)
            self._maybe_recount()
            return
        self.checks.append(entry)
        self.report(counts_check_epoch=epoch + 1, counts_ok=entry["ok"], schedule_violations=len(self.violations))
        if epoch + 1 >= self.s.epochs:
            self._final_round()
            return
        self.round_limit = min(self.total_rounds, self.round_limit + self.B)
        self.t_mark = time.time()  # check rounds are not sampling time
        for e in range(self.num_executors):
            self._try(e)

    # -- the end ---------------------------------------------------------------------------------------
    def _final_round(self) -> None:
        self.t_end = time.time()
        for e in range(self.num_executors):
            self.dispatch_task(e, ("final",))

    def _schedule_summary(self) -> dict:
        for b, r, e in self.open_holds:
            self.violations.append(f"block {b} is still held by executor {e} (round {r}) at the end")
        if self.ahead:
            for b, holders in enumerate(self.holders):
                for r, e in holders:
                    self.violations.append(f"block {b} is still held by executor {e} (round {r}) at the end")
        return {"holds": sum(self.holds_seen), "expected_holds": self.num_executors * self.total_rounds,
                "overlaps": self.overlaps, "violations": list(self.violations), "stale_holds": self.stale_holds,
                "ahead": bool(self.ahead), "dispatched_ahead": self.dispatched_ahead,
                "stale_epochs": self.stale_epochs}

    def _finish(self) -> None:
        s, K = self.s, self.s.topics
        top_words = self._top_words()
        last = self.history[-1] if self.history else None
        sampled = self.N * len(self.history)
        result: dict[str, Any] = {
            "log_likelihood": last["log_likelihood"] if last else None,
            "ll_per_token": last["ll_per_token"] if last else None,
            "tokens_per_s": sampled / max(sum(h["seconds"] for h in self.history), 1e-9) if last else None,
            "epochs": len(self.history), "tokens": self.N, "docs": self.D, "vocab": self.V, "topics": K,
            "blocks": self.B, "executors": self.num_executors,
            "sampling_s": sum(h["seconds"] for h in self.history),
            "compute_s": self.compute_s, "compute_cpu_s": self.compute_cpu_s, "top_words": top_words,
            "history": self.history,
            "state_bytes": self.state_bytes, "schedule": self._schedule_summary(), "recounts": self.recounts,
        }
        if s.check_counts:
            result["counts_checks"] = self.checks
            result["counts_ok"] = bool(self.checks) and all(c["ok"] for c in self.checks)
        topic_word = self._topic_word() if (s.output is not None or s.synthetic) else None
        if s.synthetic:
            result["topic_recovery"] = topic_recovery(topic_word, self._truth())
        if self.output is not None:
            self._save_model(topic_word)
        result["model"] = self.output
        self.finish(result)

    def summary(self, result: dict) -> dict:
        """What the terminal shows: the final metrics and the first topics' top words; the history, every
        topic and the schedule's record stay in the whole result (``--output``)."""
        shown = 3
        out = {k: v for k, v in result.items() if not isinstance(v, (dict, list))}
        out["top_words"] = [words[:8] for words in result["top_words"][:shown]]
        if len(result["top_words"]) > shown:
            out["top_words"].append(f"... {len(result['top_words']) - shown} more topics in --output")
        out["schedule_violations"] = len(result["schedule"]["violations"])
        if "counts_ok" in result:
            out["counts_ok"] = result["counts_ok"]
        if isinstance(result.get("output"), dict):
            out["output"] = result["output"]
        return out

    def _truth(self) -> np.ndarray:
        """The synthetic corpus's true topics (cached per process, not a driver attribute: a checkpoint of the
        driver would carry them)."""
        s = self.s
        return _synthetic_topics(s.vocab, s.topics, s.gen_beta, s.seed)

    def _top_words(self) -> list[list]:
        s, K = self.s, self.s.topics
        counts = [t[0] for f in self.finals for t in f["top"]]
        if not counts or not s.top_words:
            return [[] for _ in range(K)]
        counts, words = np.concatenate(counts), np.concatenate([t[1] for f in self.finals for t in f["top"]])
        order = np.argsort(-counts, axis=0, kind="stable")[:s.top_words]
        vocab = self._vocabulary()
        out = []
        for k in range(K):
            ids = [int(words[i, k]) for i in order[:, k] if counts[i, k] > 0]
            out.append([vocab[w] if vocab is not None else w for w in ids])
        return out

    def _vocabulary(self) -> list[str] | None:
        s = self.s
        if s.synthetic:
            return None
        path = s.vocab_file or data.default_vocab_file(s.corpus)
        return data.read_vocab(path, self.V) if path else None

    def _topic_word(self) -> np.ndarray:
        tw = np.zeros((self.s.topics, self.V), np.int64)
        for f in self.finals:
            for words, wt in f["blocks"]:
                tw[:, words] = wt.T
        return tw

    def _save_model(self, topic_word: np.ndarray) -> None:
        """``topic_word`` (topics x vocabulary counts), ``doc_topic`` (documents x topics counts), ``alpha``,
        ``beta``, and ``vocabulary`` when the corpus has one (:mod:`apps.modelfile`)."""
        doc_topic = np.zeros((self.D, self.s.topics), np.int32)
        for f in self.finals:
            doc_topic[f["doc_lo"]:f["doc_lo"] + len(f["ndk"])] = f["ndk"]
        arrays = {"topic_word": topic_word, "doc_topic": doc_topic, "alpha": self.s.alpha, "beta": self.s.beta}
        vocab = self._vocabulary()
        if vocab is not None:
            arrays["vocabulary"] = np.array(vocab, dtype=str)
        save_model(self.output, arrays)


@functools.lru_cache(maxsize=2)
def _synthetic_topics(vocab: int, topics: int, gen_beta: float, seed: int) -> np.ndarray:
    return data.synthetic_topics(vocab, topics, gen_beta, seed)


def topic_recovery(learned: np.ndarray, truth: np.ndarray) -> float:
    """Mean over the true topics of the best cosine similarity with any learned topic (rows = topics)."""
    L = np.asarray(learned, np.float64)
    T = np.asarray(truth, np.float64)
    L = L / np.maximum(np.linalg.norm(L, axis=1, keepdims=True), 1e-300)
    T = T / np.maximum(np.linalg.norm(T, axis=1, keepdims=True), 1e-300)
    return float((T @ L.T).max(axis=1).mean())


__all__ = ["LDADriver", "LDAExecutor", "topic_recovery"]
