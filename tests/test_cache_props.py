"""litz.cache against its rules, stated independently of the code: the cache's version and live rules as a small
reference model driven by random operation sequences (hypothesis), and the update rule's edge cases."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from litz.cache import MISS, ParamCache, UpdateLog, add_into, check_delta, sum_deltas

KEYS = ["a", "b", ("c", 1)]
ops = st.lists(st.one_of(
    st.tuples(st.just("fetch"), st.sampled_from(KEYS), st.integers(0, 5), st.integers(-50, 50), st.booleans()),
    st.tuples(st.just("answer")),  # the oldest fetch in flight is answered
    st.tuples(st.just("invalidate"), st.one_of(st.none(), st.lists(st.sampled_from(KEYS), max_size=2))),
    st.tuples(st.just("lookup"), st.sampled_from(KEYS), st.integers(0, 6), st.booleans()),
    st.tuples(st.just("own_update"), st.sampled_from(KEYS), st.integers(-3, 3)),
), max_size=40)


class Model:
    """The rules of litz.cache's docstrings, written out plainly.

    An entry is the answer of the highest version so far (a later answer of the same version replaces it). It is
    live when its fetch took a ticket and no invalidation of its key (or of every key) came after that ticket;
    a lookup is served when its version is at most the entry's, or (live_ok) when the entry is live; a live
    entry adds this worker's acknowledged updates."""

    def __init__(self, live: bool) -> None:
        self.live_on = live
        self.entries: dict = {}  # key -> [version, value, ticket or None]
        self.invalidations: list = []  # keys or None, in order
        self.live_hits = 0

    def live(self, key) -> bool:
        e = self.entries.get(key)
        return bool(self.live_on and e is not None and e[2] is not None and not any(
            keys is None or key in keys for keys in self.invalidations[e[2]:]))

    def store(self, key, version, value, ticket) -> None:
        e = self.entries.get(key)
        if e is None or version >= e[0]:
            self.entries[key] = [version, value, ticket]

    def lookup(self, key, version, live_ok):
        e = self.entries.get(key)
        if e is None:
            return MISS
        if version <= e[0]:
            return e[1]
        if live_ok and self.live(key):
            self.live_hits += 1
            return e[1]
        return MISS

    def own_update(self, key, delta) -> None:
        if self.live(key):
            self.entries[key][1] += delta


@settings(max_examples=150, deadline=None)
@given(ops, st.booleans())
def test_the_cache_follows_the_version_and_live_rules(operations, live_on):
    cache, model, in_flight = ParamCache(live=live_on), Model(live_on), []
    for op in operations:
        if op[0] == "fetch":
            _, key, version, value, ticketed = op
            in_flight.append((key, version, value, cache.ticket() if ticketed else None,
                              len(model.invalidations) if ticketed else None))
        elif op[0] == "answer" and in_flight:
            key, version, value, ticket, model_ticket = in_flight.pop(0)
            cache.store(key, version, value, ticket)
            model.store(key, version, value, model_ticket)
        elif op[0] == "invalidate":
            cache.invalidate(op[1])
            model.invalidations.append(op[1])
        elif op[0] == "lookup":
            _, key, version, live_ok = op
            assert cache.lookup(key, version, live_ok) == model.lookup(key, version, live_ok), op
        elif op[0] == "own_update":
            cache.write_through([(0, op[1], op[2])])
            model.own_update(op[1], op[2])
        for key in KEYS:
            assert cache.is_live(key) == model.live(key), (key, op)
    assert cache.live_hits == model.live_hits
    assert len(cache) == len(model.entries)


def test_a_fetch_again_at_the_same_version_replaces_the_entry_and_can_make_it_live():
    c = ParamCache()
    ticket = c.ticket()
    c.invalidate(["k"])
    c.store("k", 4, 1, ticket)
    assert not c.is_live("k")
    c.store("k", 4, 2, c.ticket())  # asked again after the invalidation: the newer value, live
    assert c.is_live("k") and c.lookup("k", 9, live_ok=True) == 2
    c.store("k", 5, 3)  # a newer answer without a ticket (a forwarded one) is not live
    assert not c.is_live("k") and c.lookup("k", 5) == 3 and c.lookup("k", 6, live_ok=True) is MISS


def test_live_hits_count_only_what_the_version_rule_alone_would_miss_and_nbytes_the_arrays():
    c = ParamCache()
    c.store("a", 2, np.zeros(10), c.ticket())
    c.store("b", 2, 7, c.ticket())
    c.lookup("a", 1, live_ok=True), c.lookup("a", 2, live_ok=True), c.lookup("a", 3)
    assert c.live_hits == 0
    c.lookup("a", 3, live_ok=True), c.lookup("b", 8, live_ok=True)
    assert c.live_hits == 2
    assert c.nbytes() == 80 and len(c) == 2


def test_write_through_copies_and_keeps_the_python_number_or_array_a_task_would_get():
    c = ParamCache()
    c.store("n", 1, None, c.ticket())
    c.store("v", 1, None, c.ticket())
    delta = np.arange(3.0)
    c.write_through([(0, "n", 5), (0, "v", delta)])
    n, v = c.lookup("n", 2, live_ok=True), c.lookup("v", 2, live_ok=True)
    assert n == 5 and type(n) is int  # a Python number stays one (results are JSON)
    assert v is not delta and v.tolist() == [0, 1, 2] and not v.flags.writeable
    assert delta.flags.writeable  # the updater's own array is left alone
    c.write_through([(0, "v", np.ones(4))])  # a shape the server refuses: the entry stops being served live
    assert not c.is_live("v") and c.lookup("v", 1).tolist() == [0, 1, 2]


def test_check_delta_passes_numbers_and_arrays_through_and_makes_array_likes_arrays():
    arr, f32 = np.ones(2), np.float32(2)
    assert check_delta("k", arr) is arr and check_delta("k", 3) == 3 and check_delta("k", f32) is f32
    listed = check_delta("k", [1, 2])
    assert isinstance(listed, np.ndarray) and listed.tolist() == [1, 2]
    assert isinstance(check_delta("k", True), np.ndarray)  # a bool is not a number here: a bool array
    for bad, name in [({"x": 1}, "dict"), ([[1], [1, 2]], "list"), (object(), "object"), ("abc", "str"),
                      (b"ab", "bytes"), (np.array(["a"]), "<U1 array"), (np.array([None]), "object array")]:
        # strings too: as a key's first update one would be stored as its value, and later additions fail
        with pytest.raises(TypeError, match=rf"ps_update\('k'\): delta must be a number or numeric numpy array, "
                                            rf"not {name}"):
            check_delta("k", bad)


def test_add_into_refuses_another_shape_and_keeps_python_numbers_python():
    with pytest.raises(ValueError, match=r"ps_update\('w'\): delta shape \(3,\) does not match value shape \(2,\)"):
        add_into("w", np.zeros(2), np.ones(3), in_place=True)
    total = add_into("n", 2, 3, in_place=True)
    assert total == 5 and type(total) is int
    assert add_into("n", 2, np.arange(2), in_place=False).tolist() == [2, 3]


def test_the_update_log_sums_per_key_without_touching_the_apps_buffers():
    log = UpdateLog()
    buf = np.ones(3, dtype=np.int64)
    log.add("w", buf)
    buf[:] = 5  # the app reuses its buffer
    log.add("w", buf)
    log.add("n", 1)
    log.add("n", 2.5)
    log.add("s", 2)
    log.add("s", np.arange(3))
    assert len(log) == 3
    other = UpdateLog()
    other.add("w", np.full(3, 0.5))  # promoted: the sum may hold what a float value accepts
    other.add("x", 4)
    log.merge(other)
    taken = log.take()
    assert len(log) == 0 and log.take() == {}
    assert taken["w"].tolist() == [6.5] * 3 and taken["w"].dtype == np.float64 and buf.tolist() == [5] * 3
    assert taken["n"] == 3.5 and taken["s"].tolist() == [2, 3, 4] and taken["x"] == 4
    assert type(sum_deltas("n", 1, 2)) is int
    log.add("l", [1, 2])  # array-likes are arrays in the log: summed, not concatenated
    log.add("l", (1, 2))
    assert log.take()["l"].tolist() == [2, 4]
    with pytest.raises(TypeError, match=r"ps_update\('d'\): delta must be a number or numeric numpy array, not dict"):
        log.add("d", {"x": 1})  # refused as the task calls ps_update, naming the key
    with pytest.raises(ValueError, match=r"delta shape \(2,\) does not match the shape \(3,\) of an earlier delta"):
        sum_deltas("w", np.zeros(3), np.zeros(2))
    total = np.zeros(3)
    assert sum_deltas("w", total, np.ones(3)) is total  # in place when the dtype holds the sum
    assert sum_deltas("w", np.zeros(3, np.int32), np.ones(3)).dtype == np.float64
