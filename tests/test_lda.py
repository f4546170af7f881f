"""apps.lda end to end through real processes (``litz.run`` and the CLI).

* a synthetic corpus with known topics: the learned topics match the true ones, the log-likelihood
  improves, ``output=PATH`` writes the count matrices (.npz);
* the counts invariant after every epoch (``check_counts=1``: the server's word-topic counts equal those
  recomputed from every executor's ``z`` and sum to the number of tokens) and the block schedule (no block
  held by two executors at once; every holder sees every earlier holder's updates), for B = E, B > E and
  B < E, and on a UCI corpus file;
* the same invariant after scale-out and scale-in during a run, and after a worker is killed and the job
  recovers from a checkpoint.
"""
from __future__ import annotations

import json
import time
import zlib

import numpy as np
import pytest

import litz
from apps.lda import data, topic_recovery
from apps.lda.settings import Settings
from litz.cache import add_into, check_delta
from tests.support import inprocess
from tests.support.processes import Processes, ctl, metric_rows, run_cli, wait_for

CORPUS = {"synthetic": 1, "docs": 3000, "vocab": 1000, "topics": 20, "doc_length": 100, "seed": 0}
SMALL = {"synthetic": 1, "docs": 1200, "vocab": 600, "topics": 8, "doc_length": 60, "seed": 1}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One 40-epoch run on the known-topics corpus, with output=PATH; shared by the tests that read it."""
    out = tmp_path_factory.mktemp("lda-output") / "model" / "lda.npz"  # its directory is created
    home = tmp_path_factory.mktemp("litz-home")
    result = litz.run("apps.lda", workers=2, servers=1, executors=4, home=str(home), progress=False,
                      config={**CORPUS, "epochs": 40, "output": str(out)})
    return result, out


@pytest.mark.timeout(180)  # the first of these also trains the shared 40-epoch model
def test_learned_topics_match_the_true_ones(trained) -> None:
    result, out = trained
    s = Settings.from_config(CORPUS)
    truth = data.synthetic_topics(s.vocab, s.topics, s.gen_beta, s.seed)
    learned = np.load(out)["topic_word"]
    assert learned.shape == (s.topics, s.vocab)
    T = truth / np.linalg.norm(truth, axis=1, keepdims=True)
    L = learned / np.linalg.norm(learned, axis=1, keepdims=True)
    recovery = float((T @ L.T).max(axis=1).mean())  # mean best-match cosine, computed here independently
    assert recovery >= 0.9, recovery
    assert result["topic_recovery"] == pytest.approx(recovery)
    assert len(result["top_words"]) == s.topics and all(len(t) == 10 for t in result["top_words"])
    for k, words in enumerate(result["top_words"]):  # the most frequent words of the learned topic
        assert len(set(words)) == 10 and learned[k][words].min() >= np.sort(learned[k])[-10]
        assert list(learned[k][words]) == sorted(learned[k][words], reverse=True)


@pytest.mark.timeout(180)  # the first of these also trains the shared 40-epoch model
def test_log_likelihood_improves(trained) -> None:
    result, _ = trained
    ll = [h["log_likelihood"] for h in result["history"]]
    assert result["epochs"] == len(ll) == 40
    assert all(b > a for a, b in zip(ll[:5], ll[1:6], strict=True)), ll[:6]  # every one of the first epochs
    assert ll[-1] > ll[5] > ll[0]
    assert result["log_likelihood"] == ll[-1]
    assert result["ll_per_token"] == pytest.approx(ll[-1] / result["tokens"])
    assert -9 < result["ll_per_token"] < -4
    assert result["tokens_per_s"] > 0 and all(h["tokens_per_s"] > 0 for h in result["history"])
    assert result["schedule"]["violations"] == [] and result["schedule"]["overlaps"] == 0


@pytest.mark.timeout(180)  # the first of these also trains the shared 40-epoch model
def test_output_files(trained) -> None:
    result, out = trained
    s = Settings.from_config(CORPUS)
    lengths = data.synthetic_lengths(s.docs, s.doc_length, s.seed)
    with np.load(out) as f:
        topic_word, doc_topic, alpha, beta = f["topic_word"], f["doc_topic"], f["alpha"], f["beta"]
        assert "vocabulary" not in f.files  # synthetic: no vocabulary
    assert (alpha, beta) == (s.alpha, s.beta)
    assert doc_topic.shape == (s.docs, s.topics)
    np.testing.assert_array_equal(doc_topic.sum(axis=1), lengths)
    assert topic_word.sum() == doc_topic.sum() == result["tokens"] == lengths.sum()
    np.testing.assert_array_equal(topic_word.sum(axis=0), np.bincount(data.synthetic_corpus(s)[1],
                                                                      minlength=s.vocab))
    np.testing.assert_array_equal(topic_word.sum(axis=1), doc_topic.sum(axis=0))
    assert result["model"] == str(out)


def check_invariant(result: dict, epochs: int, executors: int) -> None:
    assert result["counts_ok"] is True, result["counts_checks"]
    assert [c["epoch"] for c in result["counts_checks"]] == list(range(1, epochs + 1))
    for c in result["counts_checks"]:
        assert c["wt_sum"] == c["totals_sum"] == c["z_tokens"] == result["tokens"] and c["mismatched"] == 0
    sched = result["schedule"]
    assert sched["violations"] == [] and sched["overlaps"] == 0
    assert sched["holds"] == sched["expected_holds"] == executors * epochs * result["blocks"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("executors, blocks", [(6, None), (3, 5), (6, 4)])
def test_counts_invariant_and_block_schedule(executors, blocks) -> None:
    config = {**SMALL, "epochs": 3, "check_counts": 1, "blocks": blocks or executors}
    result = litz.run("apps.lda", workers=2, servers=2, executors=executors, config=config, progress=False)
    assert result["blocks"] == (blocks or executors)
    check_invariant(result, 3, executors)


@pytest.mark.timeout(120)
def test_uci_corpus_file(tmp_path) -> None:
    s = Settings.from_config(SMALL)
    doc, word = data.synthetic_corpus(s)
    pairs, count = np.unique(doc.astype(np.int64) * s.vocab + word, return_counts=True)
    lines = [f"{p // s.vocab + 1} {p % s.vocab + 1} {c}" for p, c in zip(pairs.tolist(), count.tolist(), strict=True)]
    corpus = tmp_path / "docword.toy.txt"
    corpus.write_text(f"{s.docs}\n{s.vocab}\n{len(lines)}\n" + "\n".join(lines) + "\n")
    (tmp_path / "vocab.toy.txt").write_text("".join(f"word{i}\n" for i in range(s.vocab)))
    result = litz.run("apps.lda", workers=2, servers=1, executors=3, progress=False,
                      config={"corpus": str(corpus), "topics": 8, "epochs": 3, "check_counts": 1})
    assert (result["tokens"], result["docs"], result["vocab"]) == (len(doc), s.docs, s.vocab)
    check_invariant(result, 3, 3)
    assert all(isinstance(w, str) and w.startswith("word") for t in result["top_words"] for w in t)
    assert "topic_recovery" not in result


@pytest.mark.timeout(90)
def test_the_same_seed_gives_the_same_topics(tmp_path) -> None:
    """The chain is a function of the seed and the executors, not of timing: every task samples with the topic
    totals of exactly the tasks before it in the schedule. Two runs with the default 4 executors a worker (tasks
    of 8 executors in flight on 2 workers, in whatever order they complete), and one with the same 8 executors on
    1 worker, learn the same counts; another chain seed does not."""
    config = {**SMALL, "epochs": 6, "recovery_every": 2}

    def run(workers: int, executors: int | None, name: str, **extra) -> tuple[dict, np.ndarray]:
        out = tmp_path / f"{name}.npz"
        result = litz.run("apps.lda", workers=workers, servers=2, executors=executors, progress=False,
                          config={**config, **extra, "output": str(out)})
        assert result["executors"] == 8 and result["schedule"]["violations"] == []
        return result, np.load(out)["topic_word"]

    first, tw = run(2, None, "a")
    again, tw_again = run(2, None, "b")
    one_worker, tw_one = run(1, 8, "c")
    other, tw_other = run(2, None, "d", chain_seed=5)
    lls = [[h["log_likelihood"] for h in r["history"]] for r in (first, again, one_worker, other)]
    assert lls[0] == lls[1] == lls[2] != lls[3]
    np.testing.assert_array_equal(tw, tw_again)
    np.testing.assert_array_equal(tw, tw_one)
    assert not np.array_equal(tw, tw_other)
    recovery = [h.get("topic_recovery") for h in first["history"]]  # recovery_every=2: after sweeps 2, 4, 6
    assert recovery[1::2] == [h["topic_recovery"] for h in again["history"][1::2]] and None not in recovery[1::2]
    assert recovery[0::2] == [None] * 3 and recovery[-1] == first["topic_recovery"]


def in_process(config: dict, num_executors: int, seed: int) -> inprocess.InProcess:
    """The schedule logic itself, with no runtime underneath: tasks complete in a random order, each reading
    the server as it was when the task was dispatched (the stalest view the consistency rule allows). Without
    after= (``ahead_in_process`` has it): ahead=0 unless the config says otherwise."""
    import apps.lda as lda

    return inprocess.InProcess(lda.LDADriver, lda.LDAExecutor, {"ahead": 0, **config}, num_executors, seed=seed)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("executors, blocks", [(5, None), (3, 7), (7, 3), (4, 1)])
def test_schedule_in_process_with_random_completion_order(executors, blocks) -> None:
    config = {**SMALL, "docs": 300, "epochs": 3, "check_counts": 1, "blocks": blocks or executors}
    for seed in range(3):
        check_invariant(in_process(config, executors, seed).run(), 3, executors)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("executors, blocks", [(5, None), (3, 7), (7, 3), (4, 1)])
def test_totals_are_those_of_the_tasks_before_in_the_schedule(monkeypatch, executors, blocks) -> None:
    """Each task gets the initial totals plus the changes of every round, of every executor, that its clock says
    precedes it: the driver's shortcut (one clock corrected where the other is ahead) equals that sum, and every
    round in the clock had completed when the task was dispatched."""
    import apps.lda as lda

    original, seen = lda.LDADriver._totals, []

    def checked(self, e: int, b: int) -> np.ndarray:
        got = original(self, e, b)
        clock = np.maximum(self.clock_exec[e], self.clock_block[b])
        assert all(0 <= self.next_round[x] - 1 - r or r == -1 for x, r in enumerate(clock.tolist()))
        want = sum(self.cum[x][r] for x, r in enumerate(clock.tolist()))
        np.testing.assert_array_equal(got, want)
        seen.append(int(got.sum()))
        return got

    monkeypatch.setattr(lda.LDADriver, "_totals", checked)
    config = {**SMALL, "docs": 300, "epochs": 3, "check_counts": 1, "blocks": blocks or executors}
    for seed in range(2):
        check_invariant(in_process(config, executors, seed).run(), 3, executors)
    assert seen and all(n == seen[0] for n in seen)  # totals always count every token once


@pytest.mark.parametrize("executors, blocks", [(32, 4), (32, 8), (32, 16), (16, 4), (8, 2)])
def test_with_fewer_blocks_than_executors_the_holders_of_a_moment_are_spread(executors, blocks) -> None:
    """With B < E the executors take turns on each block within a round. Walked in step (every block at its
    i-th turn), the holders must be half in each half of the executor ids and half even: the default placement
    puts neighbouring ids on one worker (and round-robin placements alternate), so holders moving in step over
    neighbouring ids left the other worker idle (32 executors, 4 blocks: 395 ms an epoch against 218 spread)."""
    import apps.lda as lda

    driver = lda.LDADriver()
    driver.num_executors, driver.B, driver.total_rounds = executors, blocks, 2 * blocks
    assert [driver._holder_after(0, 0, e) for e in range(0, executors, blocks)] == [
        (0, e) for e in range(blocks, executors, blocks)] + [(1, blocks - 1)]  # a driver from an older
    driver.turns_rotated = True  # checkpoint (no turns_rotated) goes on by id, as it began; _start sets it
    for r in range(2 * blocks):
        turns = []
        for b in range(blocks):
            seq, h = [], driver._holder_after(b, r, -1)
            while h is not None and h[0] == r:
                seq.append(h[1])
                h = driver._holder_after(b, r, h[1])
            assert sorted(seq) == list(range((b - r) % blocks, executors, blocks))  # each of them once
            turns.append(seq)
        for at in zip(*turns, strict=True):
            assert sum(e < executors // 2 for e in at) == sum(e % 2 == 0 for e in at) == blocks // 2, (r, at)


@pytest.mark.timeout(60)
def test_a_completion_reuses_its_dispatchs_clock_and_learns_the_same(monkeypatch) -> None:
    """The clock and totals kept from a task's dispatch (``in_flight_clock``) are those its completion would
    compute: the same seed and completion order learn the same counts with them as with recomputing."""
    import apps.lda as lda

    config = {**SMALL, "docs": 300, "epochs": 3, "check_counts": 1, "blocks": 4}
    kept = in_process(config, 4, 3).run()
    reuse = lda.LDADriver._count_totals

    def recomputed(self, e: int, r: int, b: int, nk_delta: np.ndarray) -> None:
        self.in_flight_clock.clear()
        reuse(self, e, r, b, nk_delta)

    monkeypatch.setattr(lda.LDADriver, "_count_totals", recomputed)
    again = in_process(config, 4, 3).run()
    assert [h["ll_per_token"] for h in kept["history"]] == [h["ll_per_token"] for h in again["history"]]
    assert kept["history"][-1]["changed"] == again["history"][-1]["changed"]


@pytest.mark.timeout(60)
def test_schedule_checks_catch_a_broken_schedule(monkeypatch) -> None:
    """A driver that ignores block ownership (every executor runs its rounds as fast as it can) is caught."""
    import apps.lda as lda

    def greedy(self, e: int) -> None:
        r = self.next_round[e]
        if self.busy[e] or r >= self.round_limit:
            return
        b = (e + r) % self.B
        self.busy[e] = True
        self.held[b] = e
        self.events += 1
        self.open_holds[(b, r, e)] = self.last_start[b] = self.events
        self.dispatch_task(e, ("sample", r, b, self._totals(e, b), r % self.B == self.B - 1, False))

    def completed(self, res: dict) -> None:
        original(self, res)
        for e in range(self.num_executors):
            greedy(self, e)

    original = lda.LDADriver._sampled
    monkeypatch.setattr(lda.LDADriver, "_try", greedy)
    monkeypatch.setattr(lda.LDADriver, "_sampled", completed)
    result = in_process({**SMALL, "docs": 300, "epochs": 2, "check_counts": 1, "blocks": 4}, 4, seed=0).run()
    sched = result["schedule"]
    assert sched["overlaps"] > 0 and any("read hold count" in v for v in sched["violations"]), sched


@pytest.mark.timeout(60)
@pytest.mark.parametrize("roundtrip", [None, "reload"])
def test_more_workers_than_the_corpus_gives_blocks_lay_the_tokens_out_again(roundtrip, capsys) -> None:
    """A small corpus gets 2 blocks by default; with 5 workers at the start the driver asks the executors for 5,
    and each lays its tokens out again before its first topics. An executor reloaded from its state (as after
    a move or a restore) keeps that layout, and the counts invariant holds. Only blocks set below the workers
    (and the executors) draw the message that more would keep them busy."""
    import apps.lda as lda

    config = {**SMALL, "docs": 300, "epochs": 2, "check_counts": 1, "ahead": 0}
    for workers, blocks, extra in ((None, 2, {}), (1, 2, {}), (5, 5, {}), (9, 6, {}), (5, 3, {"blocks": 3})):
        run = inprocess.InProcess(lda.LDADriver, lda.LDAExecutor, {**config, **extra}, 6, seed=1,
                                  roundtrip=roundtrip, workers=workers)
        result = run.run()
        assert result["blocks"] == blocks, (workers, result["blocks"])  # never more than the 6 executors
        check_invariant(result, 2, 6)
        assert {ex.blocks.num_blocks for ex in run.executors} == {blocks}
        said = capsys.readouterr().err
        assert said.count("vocabulary blocks") == (1 if extra else 0), (workers, said)
        assert not extra or "the job has 5 workers but 3 vocabulary blocks" in said and "blocks=5 or more" in said


@pytest.mark.timeout(120)
def test_default_blocks_and_ahead_through_litz_run(tmp_path) -> None:
    """Over-partitioned on a small corpus (16 executors a worker) the default takes 2 blocks, not 32, and sends
    rounds ahead; 3 workers at the start take 3. A job scaled out past its blocks says so on stderr."""
    config = {**SMALL, "epochs": 3, "check_counts": 1}
    over = litz.run("apps.lda", workers=2, servers=1, executors=32, progress=False, config=config)
    assert over["blocks"] == 2 and over["schedule"]["ahead"] and over["schedule"]["dispatched_ahead"] > 0
    check_invariant(over, 3, 32)
    three = litz.run("apps.lda", workers=3, servers=1, executors=6, progress=False, config=config)
    assert three["blocks"] == 3 and three["schedule"]["ahead"]
    check_invariant(three, 3, 6)
    name, m = "lda-few-blocks", tmp_path / "m.jsonl"
    with Processes() as procs:
        job = procs.start(endless(name, 4, "--workers", "1", "--metrics", str(m)))
        wait_for(lambda: counts_reports(m), 20, "a first epoch")
        assert ctl(name, "scale", "--workers", "3").returncode == 0
        wait_for_more_checks(m, len(counts_reports(m)), 2, 15)
        assert ctl(name, "stop").returncode == 0
        _, stderr = job.communicate(timeout=15)
        assert job.returncode == 0, stderr
    assert stderr.count("the job has 3 workers but 2 vocabulary blocks") == 1, stderr
    check_reports(m)


# ------------------------------------------------------------------------------------ elastic and recovery
def counts_reports(path) -> list[dict]:
    return [m for m in metric_rows(path) if "counts_ok" in m]


def wait_for_more_checks(path, after: int, more: int, timeout: float) -> None:
    wait_for(lambda: len(counts_reports(path)) >= after + more, timeout, f"{more} more epochs with counts checked")


def job_status(name: str) -> dict | None:
    """The job's published status, read from the local registry in this process (no litzctl process: fast)."""
    from litz.membership import Membership, connect_kv

    return Membership(connect_kv(), name).get("status")


def endless(name: str, executors: int, *extra: str) -> list[str]:
    config = [f"{k}={v}" for k, v in SMALL.items()]
    return ["litz", "run", "apps.lda", "--name", name, "--executors", str(executors), "--no-progress",
            "--config", *config, "epochs=100000", "check_counts=1", *extra]


def check_reports(path) -> None:
    checks = counts_reports(path)
    assert checks and all(m["counts_ok"] is True for m in checks), checks
    assert all(m["schedule_violations"] == 0 for m in metric_rows(path) if "schedule_violations" in m)


@pytest.mark.timeout(240)  # more than the waits and litzctl calls inside add up to
def test_scale_out_and_in_during_a_run_keeps_the_counts(tmp_path) -> None:
    name, m, out = "lda-elastic", tmp_path / "m.jsonl", tmp_path / "out.json"
    with Processes() as procs:
        job = procs.start(endless(name, 6, "--workers", "1", "--metrics", str(m), "--output", str(out),
                                  "--placement", "even"))  # the exact even spread after scale-out is checked
        wait_for(lambda: counts_reports(m), 20, "a first epoch")
        assert ctl(name, "scale", "--workers", "2").returncode == 0

        def spread():
            st = job_status(name)
            return st and sorted(len(w["executors"]) for w in st["workers"]) == [3, 3]

        wait_for(spread, 15, "6 executors spread over 2 workers")
        wait_for_more_checks(m, len(counts_reports(m)), 2, 10)
        res = ctl(name, "scale", "--workers", "1")  # returns once the released worker has exited
        assert res.returncode == 0 and "released" in res.stdout, res.stdout + res.stderr
        wait_for_more_checks(m, len(counts_reports(m)), 2, 10)
        assert ctl(name, "stop").returncode == 0
        _, stderr = job.communicate(timeout=15)
        assert job.returncode == 0, stderr
    check_reports(m)
    events = json.loads(out.read_text())["events"]
    moved = {e["kind"]: e["executors_moved"] for e in events if e["kind"] in ("scale_out", "scale_in")}
    assert moved.get("scale_out", 0) == 3 and moved.get("scale_in", 0) == 3, events
    epochs = [r for r in metric_rows(m) if "log_likelihood" in r]
    assert epochs[-1]["log_likelihood"] > epochs[0]["log_likelihood"]


@pytest.mark.timeout(210)  # more than the waits and litzctl calls inside add up to
def test_killed_worker_recovers_from_a_checkpoint_with_the_counts_intact(tmp_path) -> None:
    name, m, out, ckpt = "lda-recover", tmp_path / "m.jsonl", tmp_path / "out.json", tmp_path / "ckpt"
    with Processes() as procs:
        job = procs.start(endless(name, 6, "--metrics", str(m), "--output", str(out),
                                  "--checkpoint-dir", str(ckpt), "--checkpoint-every", "0.5"))
        def checkpointed():
            return counts_reports(m) and ckpt.is_dir() and any(p.name.startswith("ckpt-") for p in ckpt.iterdir())

        wait_for(checkpointed, 20, "a checked epoch and a checkpoint")
        epoch = wait_for(lambda: job_status(name), 10, "the job's status")["epoch"]  # +1 with every recovery
        assert ctl(name, "kill", "w1").returncode == 0
        wait_for(lambda: (st := job_status(name)) and st["epoch"] > epoch, 20, "the recovery")
        t_recovered = time.time()
        wait_for(lambda: [r for r in counts_reports(m) if r["time"] > t_recovered][1:], 20,
                 "two epochs checked after the recovery")
        assert ctl(name, "stop").returncode == 0
        _, stderr = job.communicate(timeout=15)
        assert job.returncode == 0, stderr
    check_reports(m)
    events = json.loads(out.read_text())["events"]
    recoveries = [e for e in events if e["kind"] == "recovery"]
    assert recoveries and "w1" in recoveries[0]["lost"], events


def test_topic_recovery_metric() -> None:
    truth = np.eye(3)
    assert topic_recovery(truth[::-1] * 5, truth) == pytest.approx(1.0)
    assert topic_recovery(np.ones((3, 3)), truth) == pytest.approx(1 / np.sqrt(3))


@pytest.mark.timeout(200)  # more than the waits and litzctl calls inside add up to
@pytest.mark.parametrize("ahead", [0, 1])
def test_killed_server_with_partial_recovery_recounts_the_counts(tmp_path, ahead: int) -> None:
    """SCAR partial recovery puts the lost shard's counts back to a checkpoint while every z kept going: the
    driver recounts them from the executors' z, and the counts invariant holds again for every later epoch. With
    ahead=1 the driver also stops dispatching ahead and waits for the rounds in flight (held on their workers or at
    the master) before it recounts."""
    name, m, out, ckpt = f"lda-partial-{ahead}", tmp_path / "m.jsonl", tmp_path / "out.json", tmp_path / "ckpt"
    with Processes() as procs:
        job = procs.start(endless(name, 6, "blocks=6", f"ahead={ahead}", "--servers", "2", "--metrics", str(m),
                                  "--output", str(out), "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2",
                                  "--partial-recovery"))

        def checkpointed():
            return counts_reports(m) and ckpt.is_dir() and any(p.name.startswith("ckpt-") for p in ckpt.iterdir())

        wait_for(checkpointed, 20, "a checked epoch and a checkpoint")

        def newest_checkpoint() -> float:
            """When the newest checkpoint was written (older ones are pruned meanwhile: keep 3)."""
            times = []
            for p in ckpt.iterdir():
                try:
                    if p.name.startswith("ckpt-"):
                        times.append(p.stat().st_mtime)
                except FileNotFoundError:
                    pass
            return max(times, default=float("inf"))

        # the kill lands once the counts moved on past the newest checkpoint, an epoch checked after it (a kill
        # right after a checkpoint would leave nothing stale to recount)
        wait_for(lambda: [r for r in counts_reports(m) if r["time"] > newest_checkpoint()], 20,
                 "an epoch checked after the newest checkpoint")
        assert ctl(name, "kill", "s1").returncode == 0
        recount = wait_for(lambda: [r for r in metric_rows(m) if "recounts" in r], 20, "the recount")[0]
        wait_for(lambda: [r for r in counts_reports(m) if r["time"] > recount["time"]][1:], 20,
                 "two epochs checked after the recount")
        assert ctl(name, "stop").returncode == 0
        _, stderr = job.communicate(timeout=15)
        assert job.returncode == 0, stderr
    check_reports(m)  # every epoch checked, before and after: counts consistent, no schedule violation
    events = json.loads(out.read_text())["events"]
    assert [e["lost"] for e in events if e["kind"] == "partial_recovery"] == [["s1"]], events
    assert not [e for e in events if e["kind"] == "recovery"]
    recounts = [r for r in metric_rows(m) if "recounts" in r]
    assert len(recounts) == 1 and recounts[0]["recount_fixed"] > 0, recounts  # the counts had gone stale
    if ahead:  # rounds went out before a predecessor ended
        assert max(r.get("dispatched_ahead", 0) for r in metric_rows(m)) > 0


# ------------------------------------------------------------------------------------ dispatch ahead (ahead=1)
class AfterInProcess(inprocess.InProcess):
    """The in-process runtime with ``dispatch_task(..., after=)``: a task may start once the tasks it names have
    completed, in a random order among those that may; it reads the server as of the latest of its dispatch and its
    named tasks' completions (the stalest view the rule allows). ``lose_at``: after that many completed tasks, the
    keys of one shard of two go back to their values after ``lose_at // 2`` tasks, and the driver hears of a partial
    recovery, as SCAR's restore of a lost server does."""

    def __init__(self, *args, lose_at: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tasks: dict[int, list] = {}  # id -> [executor, args, pending ids, snapshot]
        self.completed: set[int] = set()
        self.next_tid = 0
        self.lose_at, self.saved, self.lost = lose_at, None, False
        self.kinds: list[str] = []  # the kind of every task completed, and "lost" where the partial recovery came

    def dispatch_task(self, executor: int, args: object, after=None) -> int:
        tid, self.next_tid = self.next_tid, self.next_tid + 1
        pending = {t for t in (after or ()) if t not in self.completed}
        self.tasks[tid] = [executor, args, pending, None if pending else dict(self.ps)]
        return tid

    def run(self):
        self.driver.dispatch_initial_tasks()
        while not self.finished:
            ready = [t for t, task in self.tasks.items() if not task[2]]
            tid = ready[self.rng.randrange(len(ready))]
            executor, args, _, snapshot = self.tasks.pop(tid)
            self.view = snapshot
            self.log = []
            result = self.executors[executor].run_task(args)
            for key, delta in self.log:
                old = self.ps.get(key)
                value = (np.array(delta, copy=True) if isinstance(delta, np.ndarray) else delta) if old is None \
                    else add_into(key, old, check_delta(key, delta), in_place=False)
                if isinstance(value, np.ndarray):
                    value.flags.writeable = False
                self.ps[key] = value
            self.completed.add(tid)
            for task in self.tasks.values():
                if tid in task[2]:
                    task[2].discard(tid)
                    if not task[2]:
                        task[3] = dict(self.ps)
            self.kinds.append(result["kind"])
            self.driver.handle_task_completion(result)
            if self.lose_at is not None and len(self.completed) == self.lose_at // 2:
                self.saved = dict(self.ps)
            if self.lose_at is not None and len(self.completed) == self.lose_at and not self.lost:
                self.lost = True
                for key in [k for k in self.ps if zlib.crc32(repr(k).encode()) % 2]:  # one shard's keys go back
                    if key in self.saved:
                        self.ps[key] = self.saved[key]
                    else:
                        del self.ps[key]
                self.kinds.append("lost")
                self.driver.handle_partial_recovery({"lost": ["s1"]})
        assert not self.tasks
        return self.result


def ahead_in_process(config: dict, num_executors: int, seed: int, **kwargs) -> AfterInProcess:
    import apps.lda as lda

    return AfterInProcess(lda.LDADriver, lda.LDAExecutor, {**config, "ahead": 1}, num_executors, seed=seed,
                          **kwargs)


def schedule_predecessors(executors: int, blocks: int, rounds: int) -> dict:
    """(executor, round) -> its two predecessors in the schedule (its previous round, its block's previous holder),
    from the holders of each block listed in (round, executor) order: computed here, not with the driver's code."""
    last: dict[int, tuple] = {}
    preds = {}
    for r in range(rounds):
        for b in range(blocks):
            turns = list(range((b - r) % blocks, executors, blocks))  # the round's holders of b, in id order,
            start = (b - r) % blocks * len(turns) // blocks           # from the one the rotation starts at
            for e in turns[start:] + turns[:start]:
                preds[(e, r)] = (((e, r - 1),) if r else ()) + ((last[b],) if b in last else ())
                last[b] = (e, r)
    return preds


def ancestors(preds: dict, task: tuple, memo: dict) -> frozenset:
    if task not in memo:
        out: set = set()
        for p in preds[task]:
            out |= {p} | ancestors(preds, p, memo)
        memo[task] = frozenset(out)
    return memo[task]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("executors, blocks", [(5, None), (3, 7), (7, 3), (4, 1)])
def test_ahead_totals_are_those_of_the_tasks_before_but_the_two_predecessors(monkeypatch, executors, blocks) -> None:
    """With ahead=1 a task is dispatched once its two predecessors are dispatched and everything else before it has
    completed; its totals are the initial ones plus the changes of every task before it but those two, plus its own
    executor's previous change where that is not among them: checked against the schedule's DAG built here."""
    import apps.lda as lda

    config = {**SMALL, "docs": 300, "epochs": 3, "check_counts": 1, "blocks": blocks or executors}
    B = blocks or executors
    preds = schedule_predecessors(executors, B, 3 * B)
    memo: dict = {}
    original_sampled, original_start = lda.LDADriver._sampled, lda.LDADriver._start
    delta: dict = {}  # (executor, round) -> its change of the totals, once complete
    dispatched: list = []

    def start(self) -> None:
        self.nk0 = sum(i["nk"] for i in self.infos.values())
        original_start(self)

    def sampled(self, res: dict) -> None:
        delta[(res["executor"], res["round"])] = res["nk_delta"]
        original_sampled(self, res)

    def dispatch_task(self, e: int, args=None, after=None) -> int:
        if args[0] == "sample":
            r, totals, own = args[1], args[3], args[7]
            task = (e, r)
            p = preds[task]
            assert all(q in dispatched for q in p), (task, p)  # never before its predecessors are dispatched
            before = set().union(*(ancestors(preds, q, memo) for q in p)) if p else set()
            assert before <= set(delta), (task, before - set(delta))  # complete: one deep
            assert own == (r > 0 and (e, r - 1) not in before)
            want = self.nk0 + sum((delta[q] for q in before), np.zeros_like(self.nk0))
            np.testing.assert_array_equal(totals, want)
            assert len(after) == len(p)
            dispatched.append(task)
        return litz.Driver.dispatch_task(self, e, args, after)

    monkeypatch.setattr(lda.LDADriver, "_start", start)
    monkeypatch.setattr(lda.LDADriver, "_sampled", sampled)
    monkeypatch.setattr(lda.LDADriver, "dispatch_task", dispatch_task, raising=False)
    for seed in range(2):
        delta.clear()
        dispatched.clear()
        check_invariant(ahead_in_process(config, executors, seed).run(), 3, executors)
        assert sorted(dispatched) == sorted(preds)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("executors, blocks", [(5, None), (3, 7), (7, 3)])
def test_ahead_recount_after_a_partial_recovery_in_process(executors, blocks) -> None:
    """A partial recovery while tasks are dispatched ahead, a third into the second epoch: the driver stops
    dispatching, waits for the tasks in flight (at most two an executor), recounts, and every counts check after
    it holds."""
    config = {**SMALL, "docs": 300, "epochs": 4, "check_counts": 1, "blocks": blocks or executors}
    E, B = executors, blocks or executors
    for seed in range(2):
        run = ahead_in_process(config, E, seed, lose_at=E + E * B + 2 * E + E * B // 3)  # inits, epoch, checks
        result = run.run()
        after = run.kinds[run.kinds.index("lost"):run.kinds.index("recount")]
        assert after.count("sample") <= 2 * E, after  # only those in flight at the loss
        assert len(result["recounts"]) == 1 and result["recounts"][0]["entries_fixed"] > 0, result["recounts"]
        assert result["counts_ok"] is True and len(result["counts_checks"]) == 4, result["counts_checks"]
        sched = result["schedule"]
        assert sched["violations"] == [] and sched["holds"] == sched["expected_holds"], sched


@pytest.mark.timeout(60)
def test_ahead_schedule_checks_catch_a_task_dispatched_after_its_previous_round_only(monkeypatch) -> None:
    """A driver that names only P1 in after= (not the block's previous holder): a task can run while the block's
    previous holder has not, and the completion-order and hold-count checks catch it."""
    import apps.lda as lda

    def p1_only(self, e: int, args=None, after=None) -> int:
        if args[0] == "sample" and after:
            after = [self.tid_exec[e]]  # P1's id (the driver records T's own once this returns)
        return litz.Driver.dispatch_task(self, e, args, after)

    monkeypatch.setattr(lda.LDADriver, "dispatch_task", p1_only, raising=False)
    result = ahead_in_process({**SMALL, "docs": 300, "epochs": 2, "check_counts": 1, "blocks": 4}, 4, seed=0).run()
    violations = result["schedule"]["violations"]
    assert any("read hold count" in v for v in violations), violations
    assert any("completed before the earlier holder" in v for v in violations), violations


@pytest.mark.timeout(120)
def test_ahead_through_litz_run_keeps_the_counts_and_the_same_seed_gives_the_same_topics(tmp_path) -> None:
    """ahead=1 end to end: `litz run` on 2 workers (8 executors, rounds sent ahead to their workers or held at the
    master) keeps the counts invariant and the block schedule; the same seed on 1 worker, where every round is
    sent ahead, learns exactly the same counts: the totals are a function of the schedule, not of timing."""
    config = {**SMALL, "epochs": 4, "check_counts": 1, "ahead": 1}
    out, model = tmp_path / "out.json", tmp_path / "a.npz"
    res = run_cli(["litz", "run", "apps.lda", "--workers", "2", "--servers", "2", "--no-progress", "--output",
                   str(out), "--config", *[f"{k}={v}" for k, v in {**config, "output": model}.items()]], timeout=100)
    assert res.returncode == 0, res.stderr
    first = json.loads(out.read_text())["result"]
    assert first["executors"] == 8
    check_invariant(first, 4, 8)
    assert first["schedule"]["dispatched_ahead"] > 0  # rounds went out before a predecessor had completed
    one = litz.run("apps.lda", workers=1, servers=2, executors=8, progress=False,
                   config={**config, "output": str(tmp_path / "b.npz")})
    check_invariant(one, 4, 8)
    assert [h["log_likelihood"] for h in one["history"]] == [h["log_likelihood"] for h in first["history"]]
    np.testing.assert_array_equal(np.load(tmp_path / "b.npz")["topic_word"], np.load(model)["topic_word"])
