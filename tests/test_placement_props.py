"""litz.placement's promises as properties over random layouts (hypothesis): an even plan balances with the fewest
moves, never moves an item twice or to a process not ready for it; weighted quotas follow the weights; and the
edges of the speed policy (hysteresis, throttling, the speed meter's jumps) where one comparison decides."""
from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from litz.placement import (
    EvenPolicy,
    ExecutorCosts,
    SpeedMeter,
    SpeedPolicy,
    plan_moves,
    predicted_step,
    quotas,
    speed_plan,
)

PROCS = [f"p{i}" for i in range(6)]


@st.composite
def layouts(draw):
    """(owner, moving, active, pending): items on some processes, some of them in flight, a set of the
    processes active (others are leaving) and a few about to join."""
    owner = draw(st.lists(st.sampled_from(PROCS), min_size=1, max_size=40))
    active = draw(st.lists(st.sampled_from(PROCS), min_size=1, max_size=5, unique=True))
    pending = draw(st.lists(st.sampled_from([p for p in PROCS + ["n0", "n1"] if p not in active]), max_size=2,
                            unique=True))
    moving = draw(st.dictionaries(st.integers(0, len(owner) - 1), st.sampled_from(active), max_size=3))
    return owner, moving, active, pending


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_an_even_plan_balances_with_the_fewest_moves(layout):
    owner, moving, active, _ = layout
    moves = plan_moves(owner, moving, active)
    future = list(owner)
    for item, dest in moving.items():
        future[item] = dest
    items = [m[0] for m in moves]
    assert len(items) == len(set(items)) and not set(items) & set(moving)  # once each, never one in flight
    for item, src, dest in moves:
        assert src == owner[item] and dest in active and dest != src
        future[item] = dest
    counts = collections.Counter(future)
    assert set(counts) <= set(active)  # everything off the leaving processes
    held = [counts[p] for p in active]
    assert max(held) - min(held) <= 1 or _stuck_in_flight(moving, active, counts)
    # fewest: every move takes an item off a process that ends with fewer and gives it to one that ends with more
    before = collections.Counter(owner[i] if i not in moving else moving[i] for i in range(len(owner)))
    assert len(moves) == sum(max(0, before[p] - counts[p]) for p in before)
    if not moving:  # and no balanced layout is nearer: the extras stay with those that hold the most
        base, extra = divmod(len(owner), len(active))
        ranked = sorted(active, key=lambda p: -before[p])
        target = {p: base + (i < extra) for i, p in enumerate(ranked)}
        assert len(moves) == sum(n for p, n in before.items() if p not in active) + sum(
            max(0, before[p] - target[p]) for p in active)


def _stuck_in_flight(moving: dict, active: list, counts: collections.Counter) -> bool:
    """Items already in flight may leave a process above its share until they land (they are never moved twice)."""
    targets = collections.Counter(moving.values())
    return any(counts[p] - targets[p] < -(-sum(counts.values()) // len(active)) for p in active if targets[p])


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_moves_to_processes_about_to_join_wait_but_their_quota_counts(layout):
    owner, moving, active, pending = layout
    moves = plan_moves(owner, moving, active, pending)
    assert all(dest in active for _, _, dest in moves)
    joined = [p for p in pending if p not in active]
    everyone = plan_moves(owner, moving, active + joined)
    assert {m for m in everyone if m[2] in active} >= set(moves) or joined == []
    if not joined:
        assert moves == plan_moves(owner, moving, active)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 60), st.lists(st.floats(0.0, 10.0), min_size=1, max_size=6))
def test_weighted_quotas_add_up_follow_the_weights_and_leave_none_empty(n, ws):
    ranked = PROCS[:len(ws)]
    weights = {p: w for p, w in zip(ranked, ws, strict=True) if w > 0}
    q = quotas(n, ranked, weights)
    assert sum(q.values()) == n and set(q) == set(ranked)
    if not weights:
        assert q == quotas(n, ranked)  # nobody measured: even
        return
    mean = sum(weights.values()) / len(weights)
    w = {p: weights.get(p, mean) for p in ranked}
    ideal = {p: n * w[p] / sum(w.values()) for p in ranked}
    if n >= len(ranked):
        assert min(q.values()) >= 1
    if all(ideal[p] >= 1 for p in ranked):  # nobody lifted to one executor: largest remainder, within one
        assert all(abs(q[p] - ideal[p]) < 1 for p in ranked), (q, ideal)


def test_an_empty_cluster_plans_nothing():
    assert plan_moves(["a", "b"], {}, []) == [] and speed_plan(["a"], {}, [], {}) == []


def test_the_speed_plan_moves_exactly_at_its_threshold_and_counts_items_in_flight():
    owner = ["w0", "w0", "w1", "w1"]
    speeds = {"w0": 10.0, "w1": 30.0}  # a step now takes 0.2 s; 1:3 executors make it 0.1 s, 50 % shorter
    assert predicted_step({"w0": 2, "w1": 2}, speeds) == 0.2 and predicted_step({"w0": 0}, speeds) == 0.0
    moves = speed_plan(owner, {}, ["w0", "w1"], speeds, threshold=0.5)
    assert len(moves) == 1 and moves[0][1:] == ("w0", "w1")
    assert speed_plan(owner, {}, ["w0", "w1"], speeds, threshold=0.5000001) == []
    assert speed_plan(owner, {1: "w1"}, ["w0", "w1"], speeds, threshold=0.01) == []  # already on its way
    slow = {"w0": 0.5, "w1": 1.5}  # under a task a second: 4 s a step, 2 s after the move
    assert len(speed_plan(owner, {}, ["w0", "w1"], slow, threshold=0.5)) == 1
    on_one = ["w0"] * 4
    assert speed_plan(on_one, {}, ["w0", "w1"], {"w0": 10.0, "w1": 0.0}) == []  # not measured: no plan
    assert speed_plan(on_one, {}, ["w0", "w1"], {"w0": 10.0}) == []
    # one in flight to w1 already: 3:1 now (0.3 s), 1:3 after two more moves (0.1 s), a third of the step
    assert len(speed_plan(on_one, {0: "w1"}, ["w0", "w1"], speeds, threshold=0.6)) == 2
    # five on a worker three times as fast: 4:1 after one move; the fast source is still the slowest step
    assert speed_plan(["w0"] * 5, {}, ["w0", "w1"], {"w0": 30.0, "w1": 10.0}, threshold=0.21) == []
    assert speed_plan(["w0"] * 5, {}, ["w0", "w1"], {"w0": 30.0, "w1": 10.0}, threshold=0.19) == [(4, "w0", "w1")]
    three_one, even = ["w0"] * 3 + ["w1"], {"w0": 10.0, "w1": 10.0}  # 0.3 s a step, 0.2 s once even
    assert speed_plan(three_one, {}, ["w0", "w1"], even, threshold=0.34) == []
    assert speed_plan(three_one, {}, ["w0", "w1"], even, threshold=0.33) == [(2, "w0", "w1")]


def test_the_even_policy_never_weighs_or_moves_on_speeds():
    even = EvenPolicy()
    assert even.weights() is None
    assert even.offer(["w0"] * 4, ["w0", "w1"], {"w0": 1.0, "w1": 100.0}, 0.0) is False


def test_the_speed_policy_is_throttled_to_its_periods_exactly():
    owner = ["w0"] * 8 + ["w1"] * 8
    sp = SpeedPolicy(threshold=0.25, min_s=2.0, every_s=10.0)
    assert sp.offer(owner, ["w0"], {"w0": 1.0}, 0.0) is False  # one worker: nothing to compare
    assert sp.offer(owner, ["w0", "w1"], {"w0": 3.0, "w1": 1.0}, 100.0) is True
    moved = {"w0": 1.0, "w1": 4.0}
    assert sp.offer(owner, ["w0", "w1"], moved, 101.9) is False  # within min_s even though they moved
    assert sp.offer(owner, ["w0", "w1"], moved, 102.0) is True and sp.adopted_at == 102.0
    same = {"w0": 1.125, "w1": 4.0}  # within 25 % of the adopted: not moved, so only once every every_s
    assert sp.offer(owner, ["w0", "w1"], same, 111.5) is False
    assert sp.offer(owner, ["w0", "w1"], {"w0": 1.0, "w1": 5.0}, 111.5) is False  # exactly 25 %: not past it
    assert sp.offer(owner, ["w0", "w1"], {"w0": 1.0, "w1": 5.5}, 111.5) is True  # past it
    same = {"w0": 1.125, "w1": 5.5}  # not moved from the adopted 1.0 and 5.5: due every_s, to the dot
    assert sp.offer(owner, ["w0", "w1"], same, 121.4) is False
    assert sp.offer(owner, ["w0", "w1"], same, 121.5) is True and sp.weights() == same
    even = SpeedPolicy(threshold=0.25)
    assert even.offer(owner, ["w0", "w1"], {"w0": 1.0, "w1": 1.2}, 0.0) is False  # not worth a move
    assert sp.offer(owner, ["w0", "w1", "w2"], {**same, "w2": 1.0, "w9": 5.0}, 123.0) is False  # min_s
    assert sp.offer(owner, ["w0", "w1", "w2"], {**same, "w2": 1.0, "w9": 5.0}, 124.5) is True  # w2 is new
    assert set(sp.weights()) == {"w0", "w1", "w2"}  # only the active workers' speeds are adopted
    weights = {"w0": 2.0, "w1": 1.0}
    sp.follow(weights)
    weights["w0"] = 9.0
    assert sp.weights() == {"w0": 2.0, "w1": 1.0} and sp.adopted_at == 124.5  # a copy; the period runs on


def test_executor_costs_are_in_ms_to_the_microsecond_and_forget_what_ran_before_a_move():
    c = ExecutorCosts(alpha=0.5)
    c.add({3: (1, 0.0012345, 0.0004321)})
    assert c.of(3) == (1.234, 0.432)
    c.add({4: (0, 0.5, 0.5)})  # half a task ran here, then it moved
    c.forget([4])
    c.add({4: (1, 0.001, 0.001), 5: (1, -1.0, -1.0)})  # a clock that went back counts as nothing
    assert c.of(4) == (1.0, 1.0) and c.of(5) == (0.0, 0.0)


def test_the_speed_meter_tracks_cpu_and_ignores_empty_reports():
    m = SpeedMeter(window_s=0.0)
    for tasks, wall in [(0, 1.0), (-1, 1.0), (5, 0.0), (5, -1.0)]:
        m.add(tasks, wall, 1.0)
    assert m.speed is None and m.tasks == 0
    m.add(10, 1.0, 0.5)
    assert (m.per_task, m.cpu_per_task, m.tasks, m.speed) == (0.1, 0.05, 10, 10.0)
    m.add(10, 1.5, 0.8)  # within the jump band: the EMA, cpu clipped at clip x the estimate
    assert m.per_task == pytest.approx(0.11) and m.cpu_per_task == pytest.approx(0.056) and m.tasks == 20
    m.add(1, 0.1, 5.0)  # an absurd CPU figure moves the estimate by at most alpha * (clip x per task)
    assert m.cpu_per_task == pytest.approx(0.056 + 0.2 * (3 * m.per_task - 0.056))


def test_the_speed_meter_pools_cpu_over_its_window_and_counts_warmup_windows():
    m = SpeedMeter(window_s=1.0, warmup=3)
    for t in range(3):  # three windows of warmup, each two reports
        m.add(1, 9.0, 9.0, now=2.0 * t)
        m.add(1, 9.0, 9.0, now=2.0 * t + 1.0)
    assert m.speed is None and m.tasks == 0
    m.add(2, 0.2, -1.0, now=10.0)
    m.add(2, 0.6, 0.4, now=10.5)  # the window is still open
    assert m.speed is None
    m.add(4, 0.4, 0.4, now=11.0)
    assert (m.per_task, m.cpu_per_task, m.tasks) == (pytest.approx(0.15), pytest.approx(0.1), 8)


@pytest.mark.parametrize("mean,jumped", [(0.75, False), (0.76, True), (0.25, False), (0.24, True)])
def test_the_speed_meter_jumps_only_past_its_band(mean, jumped):
    m = SpeedMeter(window_s=0.0, jump=2.0 if mean < 0.5 else 1.5, confirm=1)
    m.add(1, 0.5, 0.25)
    m.add(1, mean, 0.25)
    ema = 0.5 + 0.2 * (mean - 0.5)
    assert m.per_task == pytest.approx(mean if jumped else ema)


def test_the_speed_meter_does_not_jump_on_a_slow_then_a_fast_window_and_jumps_to_the_pooled_cpu():
    m = SpeedMeter(window_s=0.0, jump=1.5, confirm=2)
    m.add(1, 0.5, 0.25)
    m.add(1, 2.0, 0.25)  # slow
    m.add(1, 0.1, 0.25)  # then fast: the sides differ, no step change
    assert 0.1 < m.per_task < 0.9
    m.add(2, 0.02, 0.02)  # a second fast window in a row: a step to the two's pooled means, CPU too
    assert m.per_task == pytest.approx(0.12 / 3) and m.cpu_per_task == pytest.approx(0.27 / 3)


def test_the_speed_meter_starts_afresh_after_a_jump_and_keeps_a_first_cpu_above_the_wall_time():
    m = SpeedMeter(window_s=0.0, jump=1.5, confirm=2)
    m.add(1, 0.1, 0.5)  # threads: more CPU than wall time, taken as measured at first
    assert m.cpu_per_task == 0.5
    m.add(1, 2.0, 0.5)
    m.add(1, 2.0, 0.5)
    assert m.per_task == 2.0
    m.add(1, 4.0, 0.5)  # one window beyond the band of the new estimate: only the first of a new run
    assert m.per_task == pytest.approx(2.4)
