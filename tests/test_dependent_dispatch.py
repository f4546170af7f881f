"""Dependent dispatch (``dispatch_task(..., after=)``, docs/design.md A1-A9): tasks sent ahead see their
predecessors' updates, end to end and in simulated schedules with every elastic event, and the simulator catches a
worker that releases a held task before its predecessors ran, that hands a task off early without its predecessors'
in-flight updates or with acknowledged ones twice, that reports a dependent done before its predecessors, that keeps
stale entries across a hand-off from another worker, or a master that takes completions out of dependency order."""
from __future__ import annotations

import dataclasses
import json

import pytest

import litz
from litz import held, worker
from litz.sim import run_schedule
from litz.sim.schedule import EVENTS, plan
from tests.support.chains import check_result
from tests.support.processes import Processes, app_path, ctl, status, wait_for

SEEDS = range(40)


def after_plan(seed: int):
    return dataclasses.replace(plan(seed, EVENTS), staleness=None, after=True, choose=False)


@pytest.mark.timeout(240)
def test_schedules_with_after_keep_the_rule():
    """Every event kind (moves, steals, drains, kills, checkpoints, evictions, outages) with after= in every task."""
    bad = {s: o.violations for s in SEEDS if (o := run_schedule(s, EVENTS, after_plan(s))).violations}
    assert bad == {}


@pytest.mark.timeout(240)
def test_schedules_with_after_keep_the_rule_when_closures_are_capped(monkeypatch):
    """The same schedules with MAX_CLOSURE at 1: every task whose closure holds two or more waits at the master for
    the tasks it named, and never goes ahead; those after it start anew (A1, capped closures)."""
    from litz import after

    monkeypatch.setattr(after, "MAX_CLOSURE", 1)
    capped = []
    original = after.Pending.__init__

    def counting(self, task, where, closure, capped_now=False):
        capped.append(capped_now)
        original(self, task, where, closure, capped_now)

    monkeypatch.setattr(after.Pending, "__init__", counting)
    bad = {s: o.violations for s in SEEDS if (o := run_schedule(s, EVENTS, after_plan(s))).violations}
    assert bad == {}
    assert any(capped) and not all(capped)


@pytest.mark.timeout(240)
def test_a_planted_early_release_is_caught(monkeypatch):
    """A worker that starts a held task at once, without waiting for its closure to run and flush here: the reads
    of the tasks it released must show missing updates (and their executors' rounds out of order)."""
    def at_once(self, task, closure):
        task.fresh, task.deps, task.closure = held.ALL, 0, closure
        return True

    monkeypatch.setattr(held.HeldTasks, "arrive", at_once)
    caught = [s for s in SEEDS if run_schedule(s, EVENTS, after_plan(s)).violations]
    assert len(caught) >= 5, caught


def caught_with_after() -> list[int]:
    return [s for s in SEEDS if run_schedule(s, EVENTS, after_plan(s)).violations]


@pytest.mark.timeout(240)
def test_a_planted_hand_off_without_the_deltas_in_flight_is_caught(monkeypatch):
    """A worker that hands a task off before its closure's acknowledgements (A2) but reads the fresh keys' live
    entries without its own in-flight deltas (A3): the reads miss the predecessor's updates."""
    monkeypatch.setattr(worker.Worker, "overlay", lambda self, key: self.cache.live_plus(key, []))
    caught = caught_with_after()
    assert len(caught) >= 20, caught


@pytest.mark.timeout(240)
def test_a_planted_hand_off_that_adds_acknowledged_parts_again_is_caught(monkeypatch):
    """The overlay adding every delta of a flush in flight, also the parts a server already acknowledged (which
    are in the live entry, written through): a read counts an update twice."""
    def every_part(self, key):
        return self.cache.live_plus(key, [f.deltas[key] for f in self.flushing.values() if key in f.deltas])

    monkeypatch.setattr(worker.Worker, "overlay", every_part)
    assert caught_with_after()


@pytest.mark.timeout(240)
def test_a_planted_dependent_reported_before_its_closure_is_caught(monkeypatch):
    """A task handed off early reports its DONE as soon as its own flush is acknowledged, perhaps before its
    closure's (A7): the driver sees rounds complete out of order, or a later dispatch misses the closure's
    updates."""
    report = worker.Worker.report

    def at_once(self, fid, results, written, tasks, after):
        report(self, fid, results, written, tasks, ())

    monkeypatch.setattr(worker.Worker, "report", at_once)
    caught = caught_with_after()
    assert len(caught) >= 3, caught


@pytest.mark.timeout(240)
def test_a_planted_stale_version_is_caught(monkeypatch):
    """A master that sends a held task, once its closure completed, at the version of its dispatch instead of the
    version of that moment (A1): an entry fetched in between may predate the predecessor's flush."""
    from litz import after

    def stale(self, p):
        m = self.master
        m.route(p.task)
        p.closure = ()
        p.where = None

    monkeypatch.setattr(after.Dependencies, "route", stale)
    monkeypatch.setattr(after.Dependencies, "ahead_to", lambda self, eid, closure: None)  # always held here
    caught = [s for s in SEEDS if run_schedule(s, EVENTS, after_plan(s)).violations]
    assert caught, "no schedule caught a dependent sent at its dispatch version"


@pytest.mark.timeout(120)
def test_chains_sent_ahead_through_litz_run():
    """Through litz.run, 4 executors on 2 workers (even placement: 0, 1 on one, 2, 3 on the other): each step reads
    exactly the steps before it. Chains on the executors of one worker start most steps there without the master
    in between; chains over all four go ahead as well, the steps whose predecessor ran on the other worker handed
    off from worker to worker (A9)."""
    run = {"workers": 2, "servers": 1, "executors": 4, "placement": "even", "steal": False}
    same = litz.run(app_path("after_chain"), **run, config={"chains": 2, "steps": 80, "ahead": 2, "span": 2})
    assert same["violations"] == [] and same["tasks"] == 160
    assert same["released"] >= 120, same["released"]  # all but the first few (sent before the first after=)
    assert same["early"] >= 1, same  # handed off before the predecessor's flush was acknowledged (A2, A3)
    assert same["remote"] == 0, same
    cross = litz.run(app_path("after_chain"), **run, config={"chains": 2, "steps": 80, "ahead": 3, "span": 4})
    assert cross["violations"] == [] and cross["tasks"] == 160
    assert cross["released"] >= 120, cross["released"]
    assert cross["remote"] >= 60, cross  # half the steps follow one on the other worker


@pytest.mark.timeout(240)
def test_a_planted_hand_off_that_keeps_stale_entries_is_caught(monkeypatch):
    """A worker that releases a task on another worker's hand-off without invalidating the keys handed off (A9):
    an entry fetched before the predecessor's flush still serves, and a read misses its update."""
    handed_off = worker.Worker.handed_off

    def keeps_entries(self, items, relayed):
        invalidate, self.cache.invalidate = self.cache.invalidate, lambda keys: None
        try:
            handed_off(self, items, relayed)
        finally:
            self.cache.invalidate = invalidate

    monkeypatch.setattr(worker.Worker, "handed_off", keeps_entries)
    caught = caught_with_after()
    assert len(caught) >= 8, caught


@pytest.mark.timeout(240)
def test_a_planted_master_that_takes_completions_in_arrival_order_is_caught(monkeypatch):
    """A master that handles a completion as it arrives, although a task of its closure on another worker has not
    completed (A9): the two workers' DONEs cross, and the driver sees a task done before one it waited for."""
    from litz import after

    monkeypatch.setattr(after.Dependencies, "parks", lambda self, tid, result: False)
    caught = caught_with_after()
    assert len(caught) >= 2, caught


@pytest.mark.timeout(180)
def test_chains_handed_off_across_workers_stay_exact_through_scale_out_and_drain(tmp_path):
    """Through real processes and litzctl: chains hopping across executors, each step sent 3 ahead after the one
    before, many across workers (hand-offs, A9), while the job scales out to 3 workers and then drains the first
    (executors move with steps held for them, hand-offs owed and hand-offs on the way). Every step reads exactly
    the steps before it, every update counts once, and most steps with a predecessor elsewhere went ahead."""
    name, out = "after-elastic", tmp_path / "out.json"
    chains, steps = 8, 300
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("chains"), "--name", name, "--executors", "8",
                           "--placement", "even", "--config", f"chains={chains}", f"steps={steps}", "sleep=0.003",
                           "ahead=3", "--output", str(out), "--no-progress"])
        wait_for(lambda: (s := status(name)) and s["tasks_completed"] > 200, 30, "the job running")
        assert ctl(name, "scale", "--workers", "3").returncode == 0
        wait_for(lambda: (s := status(name)) and len(s["workers"]) == 3
                 and all(w["executors"] for w in s["workers"]), 30, "executors on the third worker")
        assert ctl(name, "drain", "w0").returncode == 0
        stdout, stderr = job.communicate(timeout=120)
        assert job.returncode == 0, stderr
    result = json.loads(stdout)
    check_result(result, steps=steps, chains=chains)
    assert result["remote"] >= chains * steps // 4, result["remote"]  # sent ahead with a predecessor elsewhere
    kinds = [e["kind"] for e in json.loads(out.read_text())["events"]]
    assert "scale_out" in kinds and "recovery" not in kinds, kinds


@pytest.mark.timeout(60)
def test_a_long_chain_dispatched_at_once_runs_in_linear_time_and_reads_every_step():
    """A chain of 2 000 steps dispatched before any completes, each after the one before: closures grow by a step a
    link, and the master once waited on every task of each (4.5 million waits for 3 000 steps: over 300 s). Now a
    held task waits for the tasks it names and a closure longer than MAX_CLOSURE is not kept (the task stays here):
    seconds, and every step still reads exactly the steps before it, on one worker (most steps going ahead) and
    across two."""
    from litz.after import MAX_CLOSURE

    run = {"workers": 2, "servers": 1, "executors": 4, "placement": "even", "steal": False}
    for span in (2, 4):
        got = litz.run(app_path("after_chain"), **run, config={"chains": 1, "steps": 2000, "ahead": 2000, "span": span})
        assert got["violations"] == [] and got["tasks"] == 2000
        if span == 2:  # ahead but for the first and every task whose closure passed MAX_CLOSURE (after each such
            assert 1500 <= got["released"] <= 2000 - 2000 // MAX_CLOSURE  # one its successors start anew)


AFTER_IDS = """
import numpy as np


class D(litz.Driver):
    def dispatch_initial_tasks(self):
        first = self.dispatch_task(0, 0)
        ids = np.array([first, self.dispatch_task(1, 1)])
        self.dispatch_task(0, 2, after=ids[0])  # numpy integers: the ids they equal
        self.dispatch_task(1, 3, after=ids)
        self.dispatch_task(0, 4, after=(int(i) for i in ids))  # any iterable
        self.got = []
        if self.config.get("bad"):
            self.dispatch_task(0, 5, after=[first, 10 ** 9])

    def handle_task_completion(self, r):
        self.got.append(r)
        if len(self.got) == 5:
            self.finish(sorted(self.got))


class E(litz.Executor):
    def run_task(self, a):
        return a
"""


@pytest.mark.timeout(60)
def test_after_takes_numpy_ids_and_any_iterable_and_refuses_an_unknown_id(tmp_path):
    from tests.support.badapps import write_app

    app = write_app(tmp_path, "afterids", AFTER_IDS)
    assert litz.run(app, workers=2, servers=1, executors=2, progress=False) == [0, 1, 2, 3, 4]
    with pytest.raises(litz.LitzError, match="after= names 1000000000, which is not the id of a dispatched task"):
        litz.run(app, workers=2, servers=1, executors=2, progress=False, config={"bad": 1})


def _worker_on_one_server():
    """A bare worker with one shard on s1, under map version 1; the DONEs it sends are recorded without timing."""
    from litz.keys import ShardMap
    from tests.support.handbuilt import bare_worker

    w = bare_worker()
    w.shardmap, w.map_version = ShardMap(1, ["s1"]), 1
    w.send = lambda peer, msg, pickler=None: w.sent.append((peer, msg[:3] if msg[0] == "done" else msg))
    return w


def test_a_hand_off_reads_the_live_entry_plus_the_deltas_in_flight_once():
    """A3: while a flush is in flight, a live entry plus its delta; after its acknowledgement the delta is in the
    entry (written through) and is not added again; a flush sent under another map, or no live entry: refused."""
    from litz.cache import MISS
    from litz.worker import Flush

    w = _worker_on_one_server()
    w.cache.store("k", 1, 10, w.cache.ticket())
    w.flushing[0] = Flush(1, [], {"s1": [(0, "k", 5)]}, ["k"], [], {"k": 5}, map_version=1)
    assert w.overlay("k") == 15
    w.on_ack("s1", 0, 1, [])
    assert w.overlay("k") == 15
    w.flushing[1] = Flush(1, [], {"s1": [(0, "k", 2)]}, ["k"], [], {"k": 2}, map_version=0)
    assert w.overlay("k") is MISS
    assert w.overlay("never-fetched") is MISS


def test_a_dependents_done_waits_for_its_closures_done():
    """A7: the dependent's flush is acknowledged first (its server answered sooner): its DONE waits, then follows
    the closure's."""
    from litz.worker import Flush

    w = _worker_on_one_server()
    w.flushing[0] = Flush(1, [(1, "closure")], {"s1": [(0, "k", 1)]}, ["k"], [], {"k": 1}, 1)
    w.flushing[1] = Flush(1, [(2, "dependent")], {"s2": [(0, "j", 1)]}, ["j"], [], {"j": 1}, 1, after=[0])
    w.on_ack("s2", 1, 1, [])
    assert w.sent == [] and 1 in w.parked
    w.on_ack("s1", 0, 1, [])
    assert [msg[1] for _, msg in w.sent] == [[(1, "closure"), (2, "dependent")]]  # one message, in order
    assert w.held.done_seq == 1  # numbered as the master counts it: one message (A4)
    assert not w.parked


def test_a_chain_of_handoffs_skips_reading_the_socket_for_at_most_the_gap(monkeypatch):
    """A8: with a released task next to run, the worker reads its socket at most every CHAIN_READ_GAP_S; with any
    other task next, or none, it reads at once."""
    from litz import clock
    from litz.worker import CHAIN_READ_GAP_S, Task

    now = [100.0]
    monkeypatch.setattr(clock, "perf_counter", lambda: now[0])
    w = _worker_on_one_server()
    w._next_read = now[0] + CHAIN_READ_GAP_S  # read just now
    assert w.reads_now()  # nothing to run
    dispatched = Task(1, 0, 0, None)
    w.runnable.append(dispatched)
    assert w.reads_now()  # the master's dispatch is no chain
    released = Task(2, 0, 0, None)
    released.fresh = set()
    w.runnable.appendleft(released)
    assert not w.reads_now()
    now[0] += CHAIN_READ_GAP_S
    assert w.reads_now()  # the bound: a long chain does not hold messages back
    now[0] -= CHAIN_READ_GAP_S / 2
    w.runnable.popleft()
    assert w.reads_now()
