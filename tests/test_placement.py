"""The balancing policy (litz.placement.plan_moves): even spread, fewest moves, processes about to join."""
from litz.placement import leaving_first, plan_moves


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
