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

import numpy as np
import pytest

import litz
from apps.lda import data, topic_recovery
from apps.lda.settings import Settings
from tests.support import inprocess
from tests.support.processes import Processes, ctl, wait_for

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
    config = {**SMALL, "epochs": 3, "check_counts": 1, **({"blocks": blocks} if blocks else {})}
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
    the server as it was when the task was dispatched (the stalest view the consistency rule allows)."""
    import apps.lda as lda

    return inprocess.InProcess(lda.LDADriver, lda.LDAExecutor, config, num_executors, seed=seed)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("executors, blocks", [(5, None), (3, 7), (7, 3), (4, 1)])
def test_schedule_in_process_with_random_completion_order(executors, blocks) -> None:
    config = {**SMALL, "docs": 300, "epochs": 3, "check_counts": 1, **({"blocks": blocks} if blocks else {})}
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
    config = {**SMALL, "docs": 300, "epochs": 3, "check_counts": 1, **({"blocks": blocks} if blocks else {})}
    for seed in range(2):
        check_invariant(in_process(config, executors, seed).run(), 3, executors)
    assert seen and all(n == seen[0] for n in seen)  # totals always count every token once


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
    result = in_process({**SMALL, "docs": 300, "epochs": 2, "check_counts": 1}, 4, seed=0).run()
    sched = result["schedule"]
    assert sched["overlaps"] > 0 and any("read hold count" in v for v in sched["violations"]), sched


# ------------------------------------------------------------------------------------ elastic and recovery
def metrics(path) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def counts_reports(path) -> list[dict]:
    return [m for m in metrics(path) if "counts_ok" in m]


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
    assert all(m["schedule_violations"] == 0 for m in metrics(path) if "schedule_violations" in m)


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
    epochs = [r for r in metrics(m) if "log_likelihood" in r]
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
def test_killed_server_with_partial_recovery_recounts_the_counts(tmp_path) -> None:
    """SCAR partial recovery puts the lost shard's counts back to a checkpoint while every z kept going: the
    driver recounts them from the executors' z, and the counts invariant holds again for every later epoch."""
    name, m, out, ckpt = "lda-partial", tmp_path / "m.jsonl", tmp_path / "out.json", tmp_path / "ckpt"
    with Processes() as procs:
        job = procs.start(endless(name, 6, "--servers", "2", "--metrics", str(m), "--output", str(out),
                                  "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--partial-recovery"))

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
        recount = wait_for(lambda: [r for r in metrics(m) if "recounts" in r], 20, "the recount")[0]
        wait_for(lambda: [r for r in counts_reports(m) if r["time"] > recount["time"]][1:], 20,
                 "two epochs checked after the recount")
        assert ctl(name, "stop").returncode == 0
        _, stderr = job.communicate(timeout=15)
        assert job.returncode == 0, stderr
    check_reports(m)  # every epoch checked, before and after: counts consistent, no schedule violation
    events = json.loads(out.read_text())["events"]
    assert [e["lost"] for e in events if e["kind"] == "partial_recovery"] == [["s1"]], events
    assert not [e for e in events if e["kind"] == "recovery"]
    recounts = [r for r in metrics(m) if "recounts" in r]
    assert len(recounts) == 1 and recounts[0]["recount_fixed"] > 0, recounts  # the counts had gone stale
