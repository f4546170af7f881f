"""The balancing policy (litz.placement.plan_moves): even spread, fewest moves, processes about to join; the
policies by name, and the one owner of the maps (litz.owners.Placement) that consults them."""
import pytest

from litz.errors import LitzError
from litz.owners import Placement
from litz.placement import (
    EvenPolicy,
    SpeedMeter,
    SpeedPolicy,
    leaving_first,
    make_policy,
    plan_moves,
    quotas,
    speed_plan,
)


def apply(owner: list[str], moves: list[tuple[int, str, str]]) -> list[str]:
    out = list(owner)
    for item, src, dest in moves:
        assert out[item] == src
        out[item] = dest
    return out


def spread(owner: list[str]) -> list[int]:
    return sorted(owner.count(p) for p in set(owner))


def test_scale_out_moves_only_the_excess():
    owner = ["w0"] * 8 + ["w1"] * 8
    moves = plan_moves(owner, {}, ["w0", "w1", "w2", "w3"])
    assert len(moves) == 8 and spread(apply(owner, moves)) == [4, 4, 4, 4]


def test_processes_about_to_join_are_planned_for_so_nothing_moves_twice():
    owner = ["w0"] * 8 + ["w1"] * 8
    # w2 has joined, w3 is starting: w2 gets its final share (4), not a third of everything (5 or 6)
    first = plan_moves(owner, {}, ["w0", "w1", "w2"], ["w3"])
    assert len(first) == 4 and all(dest == "w2" for _, _, dest in first)
    owner = apply(owner, first)
    second = plan_moves(owner, {}, ["w0", "w1", "w2", "w3"])
    assert len(second) == 4 and all(src != "w2" and dest == "w3" for _, src, dest in second)
    assert spread(apply(owner, second)) == [4, 4, 4, 4]
    # the same for 64 shards going from 1 to 3 servers: 42 moves (without the plan for s2: 32 + 21 = 53)
    shards = ["s0"] * 64
    a = plan_moves(shards, {}, ["s0", "s1"], ["s2"])
    shards = apply(shards, a)
    b = plan_moves(shards, {}, ["s0", "s1", "s2"])
    assert len(a) + len(b) == 42 and spread(apply(shards, b)) == [21, 21, 22]


def test_leaving_processes_give_up_everything_and_moving_items_stay_put():
    owner = ["w0"] * 4 + ["w1"] * 4 + ["w2"] * 4
    moves = plan_moves(owner, {}, ["w0", "w1"])
    assert len(moves) == 4 and all(src == "w2" for _, src, _ in moves)
    assert spread(apply(owner, moves)) == [6, 6]
    assert plan_moves(owner, {8: "w0", 9: "w0", 10: "w1", 11: "w1"}, ["w0", "w1"]) == []


def test_scale_in_releases_the_newest_by_start_order_not_join_order():
    # w3 took its id after w2 but joined first (started together by one scale-out)
    started = {"w0": (1.0, 1), "w1": (1.0, 2), "w3": (5.2, 3), "w2": (5.1, 4)}
    assert leaving_first(started, 3) == ["w3"]
    assert leaving_first(started, 2) == ["w2", "w3"]
    assert leaving_first(started, 4) == []


# -- the speed policy: quotas in proportion to measured speeds, hysteresis, the smoothed speed -------------------
def test_speed_plan_gives_executors_in_proportion_to_speed_with_fewest_moves():
    owner = ["w0"] * 8 + ["w1"] * 8
    moves = speed_plan(owner, {}, ["w0", "w1"], {"w0": 3.0, "w1": 1.0})  # w1 at a third of w0's speed
    after = apply(owner, moves)
    assert after.count("w0") == 12 and after.count("w1") == 4
    assert len(moves) == 4 and all(src == "w1" and dest == "w0" for _, src, dest in moves)  # only the excess
    # three workers, 2:1:1 over 16 executors -> 8, 4, 4 whatever they hold now
    owner = ["a"] * 6 + ["b"] * 5 + ["c"] * 5
    after = apply(owner, speed_plan(owner, {}, ["a", "b", "c"], {"a": 2.0, "b": 1.0, "c": 1.0}))
    assert [after.count(p) for p in "abc"] == [8, 4, 4]
    # items already moving count at their destination and are not moved again
    moving = {0: "w1"}
    moves = speed_plan(["w0"] * 8 + ["w1"] * 8, moving, ["w0", "w1"], {"w0": 1.0, "w1": 3.0})
    assert all(item != 0 for item, _, _ in moves) and len(moves) == 3


def test_speed_plan_hysteresis_no_move_back_and_forth_on_noise():
    owner = ["w0"] * 8 + ["w1"] * 8
    # equal speeds with a few per cent of noise either way: never worth a move
    for noise in (0.97, 1.03, 0.94, 1.06, 1.0):
        assert speed_plan(owner, {}, ["w0", "w1"], {"w0": 1.0, "w1": noise}) == []
    # once placed for 3:1, noise around 3:1 does not move anything back
    placed = apply(owner, speed_plan(owner, {}, ["w0", "w1"], {"w0": 3.0, "w1": 1.0}))
    for w1 in (0.9, 1.1, 0.95, 1.05):
        assert speed_plan(placed, {}, ["w0", "w1"], {"w0": 3.0, "w1": w1}) == []
    # but the worker recovering its speed gets its executors back
    back = apply(placed, speed_plan(placed, {}, ["w0", "w1"], {"w0": 1.0, "w1": 1.0}))
    assert back.count("w0") == 8
    # a one-executor gain under the threshold is not taken: 9:7 against 8:8 shortens the step by 2 %
    assert plan_moves(owner, {}, ["w0", "w1"], weights={"w0": 1.15, "w1": 1.0})  # the quotas differ...
    assert speed_plan(owner, {}, ["w0", "w1"], {"w0": 1.15, "w1": 1.0}, threshold=0.1) == []  # ...not worth it


def test_quotas_add_up_and_a_process_without_weight_counts_at_the_mean():
    q = quotas(10, ["a", "b", "c"], {"a": 1.0, "b": 1.0})
    assert sum(q.values()) == 10 and q["c"] in (3, 4)
    assert quotas(7, ["a", "b"]) == {"a": 4, "b": 3}  # no weights: the even policy, extras to the first ranked
    assert sum(quotas(17, ["a", "b", "c"], {"a": 0.3, "b": 0.3, "c": 0.4}).values()) == 17


def test_speed_meter_is_an_ema_robust_to_one_slow_task():
    m = SpeedMeter(alpha=0.2, window_s=0.0)  # every report folds into the EMA
    assert m.speed is None
    m.add(10, 1.0, 0.9)  # 0.1 s a task
    assert abs(m.speed - 10.0) < 1e-9
    m.add(1, 100.0, 0.1)  # one task stalled for 100 s: clipped at 3x, moves the estimate by at most 40 %
    assert m.per_task <= 0.1 * (1 + 0.2 * 2) + 1e-12
    for _ in range(30):  # a real slowdown (4x) is followed
        m.add(5, 2.0, 0.5)
    assert abs(m.per_task - 0.4) < 0.01 and abs(m.speed - 2.5) < 0.1
    m.add(0, 0.0, 0.0)  # an empty report changes nothing
    assert abs(m.speed - 2.5) < 0.1


def test_speed_meter_pools_reports_over_a_window_so_quota_stalls_count_in_full():
    """A 25 % CPU quota: 25 ms running, 75 ms frozen per 100 ms. Tasks of 1 ms, reported five at a time: one report
    in five holds the stall. Per report, the clip would throw most of the stall away; pooled over 0.5 s it counts."""
    pooled, per_report = SpeedMeter(window_s=0.5), SpeedMeter(window_s=0.0)
    t = 0.0
    for i in range(500):  # 10 s
        wall = 5 * 0.001 + (0.075 if i % 5 == 4 else 0.0)
        t += wall
        for m in (pooled, per_report):
            m.add(5, wall, 5 * 0.001, t)
    assert abs(pooled.per_task - 0.004) < 0.0004  # 4x the 1 ms of a task: the worker runs at a quarter
    assert per_report.per_task < 0.8 * pooled.per_task  # what clipping each report alone would have made of it


def test_speed_meter_follows_a_step_change_within_two_windows_but_not_one_odd_window():
    m = SpeedMeter(window_s=0.0)
    m.add(10, 1.0, 1.0)  # 0.1 s a task
    m.add(10, 4.0, 1.0)  # one window 4x slower: clipped, EMA only
    assert m.per_task <= 0.1 * 1.4 + 1e-12
    m.add(10, 1.0, 1.0)  # back to normal: the odd window is forgotten
    m.add(10, 4.0, 1.0)
    before = m.per_task
    assert before < 0.2
    m.add(10, 4.0, 1.0)  # a second slow window in a row: a quota was set, follow it at once
    assert m.per_task == pytest.approx(0.4)
    m.add(10, 1.0, 1.0)
    m.add(10, 1.0, 1.0)  # released: two fast windows in a row, back at once
    assert m.per_task == pytest.approx(0.1)
    for i in range(40):  # noise of +-40 % around the estimate never jumps: the EMA stays near the middle
        m.add(10, 1.4 if i % 2 else 0.6, 1.0)
    assert 0.08 < m.per_task < 0.12


def test_speed_meter_drops_its_warmup_windows():
    m = SpeedMeter(window_s=0.0, warmup=1)
    m.add(1, 5.0, 5.0)  # the first report also holds loading the input
    assert m.speed is None
    m.add(10, 1.0, 1.0)
    assert abs(m.speed - 10.0) < 1e-9


def test_every_worker_keeps_an_executor_so_it_is_still_measured():
    owner = ["w0"] * 8 + ["w1"] * 8
    after = apply(owner, speed_plan(owner, {}, ["w0", "w1"], {"w0": 100.0, "w1": 1.0}))
    assert after.count("w1") == 1 and after.count("w0") == 15
    assert quotas(3, ["a", "b", "c"], {"a": 100.0, "b": 1.0, "c": 1.0}) == {"a": 1, "b": 1, "c": 1}


# -- the one owner of the maps (litz.owners.Placement) and the policies it consults ------------------------------
def blocks(owner) -> list[tuple[str, int]]:
    """Runs of one owner in order: contiguous blocks have each owner once."""
    runs: list[tuple[str, int]] = []
    for p in owner:
        if runs and runs[-1][0] == p:
            runs[-1] = (p, runs[-1][1] + 1)
        else:
            runs.append((p, 1))
    return runs


def test_first_and_full_recovery_placement_give_contiguous_even_blocks_and_forget_moves():
    p = Placement(EvenPolicy())
    p.place(["w0", "w1", "w2"], ["s0", "s1"], 10, 6)
    assert blocks(p.executor_owner) == [("w0", 4), ("w1", 3), ("w2", 3)]
    assert p.shard_owner == ("s0", "s1") * 3
    # the job runs: executors and shards move, some are on their way
    for eid, dest in ((0, "w2"), (5, "w0"), (9, "w1")):
        p.start_executor_move(eid, dest, copy_input=False)
        p.executor_moved(eid, dest)
    p.start_executor_move(1, "w1", copy_input=True)
    p.start_shard_move(2, "s1")
    # a full recovery onto the survivors: contiguous blocks again, nothing in flight any more
    p.place(["w0", "w2"], ["s1"], 10, 6)
    assert blocks(p.executor_owner) == [("w0", 5), ("w2", 5)]
    assert p.shard_owner == ("s1",) * 6
    assert not p.moving_executors and not p.copying_input and not p.moving_shards


def test_partial_recovery_rehomes_only_the_lost_shards_evenly_over_the_survivors():
    p = Placement(EvenPolicy())
    p.place(["w0", "w1"], ["s0", "s1", "s2"], 8, 12)
    executors = p.executor_owner
    before = p.shard_owner
    rehomed = p.rehome_shards(["s2"], ["s0", "s1"])
    assert rehomed == [s for s, o in enumerate(before) if o == "s2"]
    assert all(p.shard_owner[s] == before[s] for s in range(12) if s not in rehomed)  # nothing else moves
    assert sorted(p.shard_owner.count(s) for s in ("s0", "s1")) == [6, 6] and "s2" not in p.shard_owner
    assert p.executor_owner == executors
    # survivors holding unequal shares (after scale moves): the lost ones fill the emptier survivor first
    p = Placement(EvenPolicy())
    p.place(["w0"], ["s0", "s1", "s2"], 4, 12)
    for shard in (1, 4):  # s1 -> s0 twice: s0 6, s1 2, s2 4
        p.start_shard_move(shard, "s0")
        p.shard_moved(shard, "s0")
    p.rehome_shards(["s2"], ["s0", "s1"])
    assert (p.shard_owner.count("s0"), p.shard_owner.count("s1")) == (6, 6)


def test_the_maps_change_only_through_the_owner():
    p = Placement(EvenPolicy())
    p.place(["w0", "w1"], ["s0"], 4, 2)
    with pytest.raises(TypeError):
        p.executor_owner[0] = "w1"  # a tuple: a reader cannot write it
    with pytest.raises(TypeError):
        p.moving_executors[0] = "w1"  # a read-only view of the moves in flight
    p.start_executor_move(3, "w0", copy_input=True)  # input first: the executor keeps running at w1
    assert dict(p.copying_input) == {3: "w0"} and not p.moving_executors
    assert p.input_copied(3) == "w0" and dict(p.moving_executors) == {3: "w0"} and not p.copying_input
    assert p.executor_moved(3, "w0") == "w1" and p.executor_owner == ("w0", "w0", "w1", "w0")
    assert not p.moving_executors


class Recording:
    """A policy of the test's own: fixed weights, and a record of what the owner asked it."""

    name, uses_speeds = "recording", True

    def __init__(self, weights):
        self.fixed, self.asked, self.offers = weights, 0, []

    def weights(self):
        self.asked += 1
        return self.fixed

    def offer(self, owner, workers, speeds, now):
        self.offers.append((tuple(owner), workers, speeds, now))
        return True


def test_the_policy_object_passed_in_is_the_one_consulted():
    policy = Recording({"w0": 3.0, "w1": 1.0})
    p = Placement(policy)
    p.place(["w0", "w1"], ["s0"], 16, 4)
    assert blocks(p.executor_owner) == [("w0", 12), ("w1", 4)] and policy.asked == 1
    # a third worker joins: it counts at the mean of the others' weights (2), so 3 : 1 : 2 of 16 is 8 : 3 : 5
    ex_moves, shard_moves = p.plan(["w0", "w1", "w2"], ["s0"])
    assert policy.asked == 2 and not shard_moves
    after = apply(list(p.executor_owner), ex_moves)
    assert [after.count(w) for w in ("w0", "w1", "w2")] == [8, 3, 5] and len(ex_moves) == 5
    assert p.reconsider(["w0", "w1"], {"w0": 1.0, "w1": 1.0}, 5.0) is True
    assert policy.offers == [(p.executor_owner, ["w0", "w1"], {"w0": 1.0, "w1": 1.0}, 5.0)]
    # shards follow no policy: always even
    p.place(["w0", "w1"], ["s0", "s1"], 16, 4)
    assert sorted(p.shard_owner.count(s) for s in ("s0", "s1")) == [2, 2]


def test_policies_are_found_by_name_and_an_unknown_name_is_one_clear_line():
    assert isinstance(make_policy("even"), EvenPolicy) and isinstance(make_policy("speed"), SpeedPolicy)
    assert make_policy("speed") is not make_policy("speed")  # each job adopts its own weights
    mine = Recording(None)
    assert make_policy(mine) is mine
    with pytest.raises(LitzError, match=r"^unknown placement 'fastest': choose even or speed$"):
        make_policy("fastest")


def test_speed_policy_adopts_only_worthwhile_speeds_and_not_too_often():
    owner = ["w0"] * 8 + ["w1"] * 8
    sp = SpeedPolicy(threshold=0.1, min_s=2.0, every_s=10.0)
    assert sp.weights() is None
    assert not sp.offer(owner, ["w0", "w1"], {"w0": 1.0}, 0.0)  # w1 not measured yet
    assert not sp.offer(owner, ["w0", "w1"], {"w0": 1.0, "w1": 1.04}, 0.0)  # noise: not worth a move
    assert sp.offer(owner, ["w0", "w1"], {"w0": 3.0, "w1": 1.0}, 1.0) and sp.weights() == {"w0": 3.0, "w1": 1.0}
    placed = apply(owner, speed_plan(owner, {}, ["w0", "w1"], sp.weights()))
    assert not sp.offer(placed, ["w0", "w1"], {"w0": 1.0, "w1": 1.0}, 2.5)  # within min_s of the last one
    assert sp.offer(placed, ["w0", "w1"], {"w0": 1.0, "w1": 1.0}, 3.5)  # the speeds moved past the threshold
    assert sp.weights() == {"w0": 1.0, "w1": 1.0}


def test_speed_placement_after_a_full_recovery_keeps_the_survivors_adopted_weights():
    sp = SpeedPolicy()
    p = Placement(sp)
    p.place(["w0", "w1", "w2"], ["s0"], 12, 4)  # first placement: nothing measured, even
    assert blocks(p.executor_owner) == [("w0", 4), ("w1", 4), ("w2", 4)]
    assert sp.offer(p.executor_owner, ["w0", "w1", "w2"], {"w0": 2.0, "w1": 1.0, "w2": 1.0}, 0.0)
    # w2 is lost; a replacement w3 joins before the restore: w0 keeps twice w1's share, w3 counts at their mean
    p.place(["w0", "w1", "w3"], ["s0"], 12, 4)
    assert blocks(p.executor_owner) == [("w0", 5), ("w1", 3), ("w3", 4)]
    assert p.plan(["w0", "w1", "w3"], ["s0"]) == ([], [])  # and the next plan moves nothing back


# -- what the worker reports on DONE (litz.worker.SpeedMeasure), on clocks the test moves ------------------------
def fake_clocks(monkeypatch) -> dict:
    from litz import clock

    t = {"wall": 100.0, "cpu": 5.0, "wanted": 7.0}
    monkeypatch.setattr(clock, "perf_counter", lambda: t["wall"])
    monkeypatch.setattr(clock, "thread_time", lambda: t["cpu"])
    return t


def test_the_worker_counts_the_time_it_held_tasks_not_its_waits(monkeypatch):
    from litz.worker import SpeedMeasure

    t = fake_clocks(monkeypatch)
    m = SpeedMeasure(schedstat=False)  # where /proc tells no run delay: wall time holding unfinished tasks
    t["wall"] += 2.0
    t["cpu"] += 1.0
    m.wait_begins()  # nothing held: the wait for messages is not the tasks' cost
    t["wall"] += 10.0
    m.wait_ends()
    t["wall"] += 1.0
    assert m.take(3)[:3] == (3, 3.0, 1.0)
    assert m.take(0) == (0, 0.0, 0.0, {})  # each DONE reports what came since the previous one


def test_with_schedstat_the_worker_counts_cpu_run_delay_and_time_tasks_blocked(monkeypatch):
    from litz import worker
    from litz.worker import SpeedMeasure

    t = fake_clocks(monkeypatch)
    monkeypatch.setattr(worker, "open_schedstat", lambda: -1)
    monkeypatch.setattr(worker, "wanted", lambda fd: t["wanted"])
    m = SpeedMeasure()
    m.start_slice(t["wall"])
    t["wall"] += 1.0  # a slice of 1 s: 0.25 s running or waiting for a CPU, 0.75 s blocked (a sleep)
    t["wanted"] += 0.25
    m.stop_slice()
    assert m.blocked == 0.75
    t["wall"] += 5.0  # outside slices only CPU and run delay count (the event loop's own work, its waits too)
    t["wanted"] += 0.5
    t["cpu"] += 0.5
    assert m.take(2) == (2, 1.5, 0.5, {}) and m.blocked == 0.0


def test_executor_costs_follow_each_executor_and_a_task_across_two_reports_counts_whole():
    from litz.placement import ExecutorCosts

    c = ExecutorCosts(alpha=0.5)
    c.add({0: (2, 0.02, 0.01), 1: (0, 0.005, 0.005)})  # executor 1's task is still running at this report
    assert c.of(0) == (10.0, 5.0) and c.of(1) is None
    c.add({0: (1, 0.03, 0.01), 1: (1, 0.005, 0.005)})  # it completes: both parts are its one task
    assert c.of(0) == (20.0, 7.5) and c.of(1) == (10.0, 10.0)
    c.forget([0])  # moved: measured afresh where it went
    assert c.of(0) is None and c.of(1) == (10.0, 10.0)


def test_the_worker_reports_what_each_executors_tasks_ran(monkeypatch):
    from litz.worker import SpeedMeasure

    fake_clocks(monkeypatch)
    m = SpeedMeasure(schedstat=False)
    m.task_ran(3, 0.5, 0.25)
    m.task_ran(3, 0.25, 0.25)  # a second slice of the same task
    m.task_ran(5, 0.125, 0.0)
    assert m.take(1, {3: 1})[3] == {3: (1, 0.75, 0.5), 5: (0, 0.125, 0.0)}
    assert m.take(0)[3] == {}  # each DONE tells what came since the previous one
