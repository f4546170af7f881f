"""Work stealing's decision (litz.stealing.decide): which executor, from whom to whom, and when not; and that what a
steal leaves is kept by every later plan instead of moved back (steal_weights)."""
import random

import pytest

from litz.placement import plan_moves, speed_plan
from litz.stealing import Steal, Stealing, View, decide, steal_weights

FAST, SLOW = 0.005, 0.02  # seconds per task: w1 at a quarter of w0's speed


def view(**kw) -> View:
    """w0 idle with 8 executors, w1 with 8 executors and queued tasks, w1 four times slower."""
    base = dict(owner=["w0"] * 8 + ["w1"] * 8, outstanding={8: 1, 9: 3, 10: 2, 11: 3, 12: 1},
                workers=["w0", "w1"], per_task={"w0": FAST, "w1": SLOW}, cost_s=0.05)
    return View(**{**base, **kw})


def counts(owner: list[str]) -> dict[str, int]:
    return {w: owner.count(w) for w in sorted(set(owner))}


def test_an_idle_worker_takes_the_executor_with_the_most_queued_tasks_from_the_one_behind():
    steal = decide(view())
    # 10 tasks outstanding on w1 at 20 ms: 0.2 s of backlog; executors 9 and 11 have two queued each
    assert steal == Steal(executor=9, victim="w1", thief="w0", queued=2, backlog_s=pytest.approx(0.2))
    # the executor with the most queued tasks (of two equally queued ones, the lower: 9 above)
    assert decide(view(outstanding={**view().outstanding, 11: 4})).executor == 11


def test_the_fastest_idle_worker_steals_from_the_worker_with_the_longest_backlog():
    owner = ["w0"] * 4 + ["w1"] * 4 + ["w2"] * 4 + ["w3"] * 4
    outstanding = {4: 2, 5: 2, 8: 3, 9: 3, 10: 2}  # w1: 4 tasks, w2: 8 tasks
    per_task = {"w0": 0.01, "w1": 0.01, "w2": 0.02, "w3": 0.008}
    steal = decide(View(owner, outstanding, ["w0", "w1", "w2", "w3"], per_task, cost_s=0.01))
    assert (steal.victim, steal.thief) == ("w2", "w3")
    # a victim behind by its slowness, not its count: w1's 4 tasks at 50 ms outweigh w2's 8 at 20 ms
    steal = decide(View(owner, outstanding, ["w0", "w1", "w2", "w3"], {**per_task, "w1": 0.05}, cost_s=0.01))
    assert steal.victim == "w1"


@pytest.mark.parametrize("flag", ["steal_in_flight", "operation", "recovery", "moving"])
def test_no_steal_while_anything_else_is_under_way(flag):
    assert decide(view()) is not None
    assert decide(view(**{flag: True})) is None


def test_no_steal_without_an_idle_worker_or_a_queued_task():
    assert decide(view(outstanding={0: 1, 9: 3})) is None  # w0 runs a task: not idle
    # every executor of w1 has one task: it may be running, and a move would only wait for it
    assert decide(view(outstanding={e: 1 for e in range(8, 16)})) is None
    assert decide(view(outstanding={})) is None


def test_a_nearly_empty_queue_is_not_stolen():
    # 3 tasks at 20 ms (60 ms of backlog) do not pay for a 50 ms move plus 2 tasks on the thief
    assert decide(view(outstanding={9: 3})) is None
    # the same queue with a cheap move does
    assert decide(view(outstanding={9: 3}, cost_s=0.01)) is not None
    # and a long backlog elsewhere on the victim makes the same move worth it
    assert decide(view(outstanding={9: 3, 10: 1, 11: 1, 12: 1, 13: 1})) is not None


def test_a_worker_is_never_left_without_an_executor():
    owner, per_task = ["w0"] * 15 + ["w1"], {"w0": FAST, "w1": 0.2}  # w1 forty times slower
    assert decide(View(owner, {15: 20}, ["w0", "w1"], per_task)) is None
    assert decide(View(owner[:14] + ["w1", "w1"], {15: 20}, ["w0", "w1"], per_task)) is not None


def test_no_steal_until_every_worker_has_a_measured_speed():
    assert decide(view(per_task={"w0": FAST})) is None
    assert decide(view(per_task={"w1": SLOW})) is None


def test_a_steal_moves_toward_the_quotas_with_hysteresis_so_equally_fast_workers_never_steal():
    equal = {"w0": 0.01, "w1": 0.01}
    # a long queue and an idle worker: 8 + 8 -> 9 + 7 is past the thief's quota
    assert decide(view(per_task=equal, outstanding={9: 10, 10: 10})) is None
    assert decide(View(["w0"] * 32 + ["w1"] * 32, {40: 10, 41: 10}, ["w0", "w1"], equal)) is None
    # a faster thief takes one executor at a time up to its quota with the speeds shaded by 10 % against it
    # (12 + 4; the speeds' own quotas are 13 + 3, which the next rebalance completes)
    owner, taken = ["w0"] * 8 + ["w1"] * 8, 0
    while (steal := decide(View(owner, {e: 5 for e in range(16) if owner[e] == "w1"}, ["w0", "w1"],
                                {"w0": FAST, "w1": SLOW}))) is not None:
        owner[steal.executor] = steal.thief
        taken += 1
    assert counts(owner) == {"w0": 12, "w1": 4} and taken == 4
    # the same with many executors: a single move shortens the step by little, and steals still go on
    owner = ["w0"] * 32 + ["w1"] * 32
    while (steal := decide(View(owner, {e: 5 for e in range(64) if owner[e] == "w1"}, ["w0", "w1"],
                                {"w0": FAST, "w1": SLOW}))) is not None:
        owner[steal.executor] = steal.thief
    assert counts(owner) == {"w0": 49, "w1": 15}  # 51.2 + 12.8 at the measured speeds
    # from 13 + 3 the slowed worker, idle now and then, takes none back while the speeds hold or move a little
    owner = ["w0"] * 13 + ["w1"] * 3
    busy_w0 = {e: 5 for e in range(13)}
    assert decide(View(owner, busy_w0, ["w0", "w1"], {"w0": FAST, "w1": SLOW})) is None
    assert decide(View(owner, busy_w0, ["w0", "w1"], {"w0": SLOW / 3.0, "w1": SLOW})) is None  # quotas 12 + 4
    assert decide(View(owner, busy_w0, ["w0", "w1"], {"w0": SLOW / 2.5, "w1": SLOW})).thief == "w1"


def test_what_a_steal_leaves_is_kept_by_the_next_plan_and_the_next_rebalance():
    adopted = {"w0": 100.0, "w1": 100.0}  # a rebalance adopted these while both were as fast
    owner = ["w0"] * 8 + ["w1"] * 8
    steal = decide(view())  # w1 has slowed to a quarter since
    owner[steal.executor] = steal.thief
    # with the weights the rebalance adopted, the plan at the end of any operation would move it straight back
    assert [m[1:] for m in plan_moves(owner, {}, ["w0", "w1"], weights=adopted)] == [("w0", "w1")]
    speeds = {"w0": 1 / FAST, "w1": 1 / SLOW}
    weights = steal_weights(counts(owner), speeds)
    assert plan_moves(owner, {}, ["w0", "w1"], weights=weights) == []
    assert sum(weights.values()) == pytest.approx(sum(speeds.values()))  # the rebalance's unit
    # and the next rebalance at the measured speeds moves on in the same direction, never back
    assert {m[1:] for m in speed_plan(owner, {}, ["w0", "w1"], speeds)} == {("w1", "w0")}


def test_no_steal_is_ever_moved_back_by_a_plan_or_undone_by_a_rebalance_at_the_same_speeds():
    rng = random.Random(7)
    steals = 0
    for _ in range(3000):
        workers = [f"w{i}" for i in range(rng.randint(2, 4))]
        n = rng.randint(len(workers) * 2, 24)
        owner = [rng.choice(workers) for _ in range(n)]
        for w in workers:  # every worker holds one, as the quotas keep it
            if w not in owner:
                owner[rng.randrange(n)] = w
        if any(w not in owner for w in workers):
            continue
        per_task = {w: rng.choice([0.005, 0.01, 0.012, 0.02, 0.04]) for w in workers}
        outstanding = {e: rng.choice([0, 0, 1, 2, 3, 6]) for e in range(n)}
        for e in range(n):  # one worker idle
            if owner[e] == workers[0]:
                outstanding[e] = 0
        steal = decide(View(owner, outstanding, workers, per_task, cost_s=rng.choice([0.0, 0.02, 0.05])))
        if steal is None:
            continue
        steals += 1
        assert owner[steal.executor] == steal.victim and outstanding[steal.executor] >= 2
        assert owner.count(steal.victim) >= 2
        after = list(owner)
        after[steal.executor] = steal.thief
        speeds = {w: 1 / s for w, s in per_task.items()}
        assert plan_moves(after, {}, workers, weights=steal_weights(counts(after), speeds)) == []
        assert not [m for m in speed_plan(after, {}, workers, speeds) if m[1:] == (steal.thief, steal.victim)]
    assert steals > 300  # the property was checked on many steals, not vacuously


class FakeMaster:
    """What Stealing.view reads of the master, enough to check its task counts."""

    def __init__(self):
        self.executor_owner = ["w0", "w0", "w1", "w1"]
        self.num_executors = 4


def test_outstanding_tasks_are_counted_per_executor_from_dispatches_and_completions():
    """A task id is seq * executors + executor (Master.dispatch_task): a DONE's ids give their executors."""
    st = Stealing(FakeMaster(), threshold=0.1)
    tasks = [(seq * 4 + eid, eid, 0, None) for seq, eid in enumerate([2, 2, 3, 2, 0])]
    st.sent(tasks[:3])  # two batches, as two flushes of the outbox send them
    st.sent(tasks[3:])
    assert st.outstanding == {2: 3, 3: 1, 0: 1}
    st.done([(tasks[0][0], "r"), (tasks[4][0], "r")])
    assert {e: n for e, n in st.outstanding.items() if n} == {2: 2, 3: 1}
    st.done([(tasks[2][0], None), (tasks[1][0], None), (tasks[3][0], None)])
    assert not +st.outstanding  # nothing outstanding
    st.sent(tasks)
    st.reset()
    assert not st.outstanding



def test_a_dones_completions_are_taken_from_the_workers_count_per_executor():
    """With a DONE's timing the master subtracts the worker's completions per executor, a step per executor (one
    that only ran a task counts nothing); the sim checks the two counts agree at every job's end."""
    st = Stealing(FakeMaster(), threshold=0.1)
    st.sent([(seq * 4 + eid, eid, 0, None) for seq, eid in enumerate([2, 2, 3, 2, 0])])
    st.done([(4, None), (12, None), (7, None)], {2: (2, 0.1, 0.1), 3: (1, 0.0, 0.0), 0: (0, 0.2, 0.2)})
    assert {e: n for e, n in st.outstanding.items() if n} == {2: 1, 0: 1}
