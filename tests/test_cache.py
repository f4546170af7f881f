"""The worker's parameter cache: live entries (own acknowledged updates applied, other workers' writes
invalidate), unit-level and end to end."""
import types

import numpy as np
import pytest

import litz
from litz.cache import MISS, ParamCache
from litz.worker import Flush
from tests.support.handbuilt import bare_server, bare_worker
from tests.support.processes import app_path


def test_version_rule_without_live():
    c = ParamCache()
    c.store("k", 5, 1.0)  # no ticket: never live
    assert c.lookup("k", 5) == 1.0 and c.lookup("k", 3, live_ok=True) == 1.0
    assert c.lookup("k", 6, live_ok=True) is MISS


def test_live_entry_serves_later_versions_and_takes_own_updates():
    c = ParamCache()
    c.store("k", 5, np.zeros(3), c.ticket())
    assert c.is_live("k")
    assert c.lookup("k", 9) is MISS  # only tasks dispatched behind the master's invalidations may use it
    before = c.lookup("k", 9, live_ok=True)
    c.write_through([(0, "k", np.ones(3))])
    after = c.lookup("k", 9, live_ok=True)
    assert np.array_equal(after, np.ones(3)) and np.array_equal(before, np.zeros(3))  # a new object
    c.write_through([(0, "missing", 1)])  # not cached: nothing to do
    assert c.lookup("missing", 0, live_ok=True) is MISS


def test_write_through_of_a_never_written_key():
    c = ParamCache()
    c.store("k", 1, None, c.ticket())
    c.write_through([(0, "k", np.arange(3, dtype=np.int16))])
    value = c.lookup("k", 2, live_ok=True)
    assert value.dtype == np.int16 and value.tolist() == [0, 1, 2]


def test_foreign_write_invalidates_entry():
    c = ParamCache()
    c.store("a", 1, 1, c.ticket())
    c.store("b", 1, 2, c.ticket())
    c.invalidate(["a"])
    assert c.lookup("a", 2, live_ok=True) is MISS
    assert c.lookup("b", 2, live_ok=True) == 2
    c.write_through([(0, "a", 5)])  # not live any more: the cached value is not touched
    assert c.lookup("a", 1) == 1
    c.invalidate(None)
    assert c.lookup("b", 2, live_ok=True) is MISS


def test_fetch_in_flight_during_invalidation_is_not_live():
    """The value may have been read before the other worker's write reached the server."""
    c = ParamCache()
    ticket = c.ticket()
    c.invalidate(["a"])  # arrives while the fetch is out
    c.store("a", 3, 10, ticket)
    assert not c.is_live("a") and c.lookup("a", 4, live_ok=True) is MISS
    assert c.lookup("a", 3) == 10  # the version rule still holds for it
    c.store("a", 4, 11, c.ticket())  # a fetch sent after the invalidation is live again
    assert c.lookup("a", 9, live_ok=True) == 11
    ticket = c.ticket()
    c.invalidate(None)
    c.store("z", 5, 1, ticket)
    assert not c.is_live("z")


def test_older_answer_does_not_replace_newer_entry():
    c = ParamCache()
    c.store("k", 7, 70, c.ticket())
    c.store("k", 3, 30, c.ticket())
    assert c.lookup("k", 7) == 70 and c.is_live("k")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("workers,servers,executors,seed", [(2, 1, 4, 0), (3, 2, 6, 1)])
def test_other_workers_writes_are_seen(workers, servers, executors, seed):
    """Tasks one after another on random executors: a task after one on the same worker is served from
    the live cache, after one on another worker it must see that worker's write."""
    result = litz.run(app_path("foreign_writes"), workers=workers, servers=servers, executors=executors,
                      config={"steps": 240, "seed": seed})
    assert result["violations"] == []
    assert result["live_hits"] > 0  # the live path was exercised, not only fetches


def _bare_worker():
    """A Worker with only what on_values/on_ack touch (no sockets): messages it sends are recorded."""
    from litz.worker import Fetch

    w = bare_worker()
    # a DONE is recorded without its timing field (the speed measure's, tested in test_placement.py)
    w.send = lambda peer, msg, pickler=None: w.sent.append((peer, msg[:3] if msg[0] == "done" else msg))
    return w, Fetch


def _worker_on_two_servers():
    """A bare worker that also has what servers_lost touches: 4 shards on s0 and s1, disconnects recorded."""
    from collections import defaultdict

    from litz.keys import ShardMap

    w, Fetch = _bare_worker()
    w.ident, w.lost_servers, w.out_gets, w.next_fid, w.map_version = "w0", set(), defaultdict(list), 5, 1
    w.shardmap = ShardMap(4, ["s0", "s1", "s0", "s1"])
    w.reach = lambda peer: None
    w.endpoint = types.SimpleNamespace(disconnect=lambda peer: w.sent.append(("disconnect", peer)))
    return w, Fetch


def test_forwarded_ack_with_a_coincident_count_drops_liveness():
    """s2 acknowledges items s1 forwarded to it (a shard moved) before its own: the count alone would match
    s2's own items, so without the forwarded flag the worker would add them before s2 applied them."""
    w, _ = _bare_worker()
    w.cache.store("k", 1, 10, w.cache.ticket())
    w.cache.store("j", 1, 20, w.cache.ticket())
    # a flush in flight: updates unacknowledged, results, parts by server, keys written, tasks
    w.flushing[0] = Flush(2, ["result"], {"s1": [(0, "k", 1)], "s2": [(1, "j", 2)]}, ["k", "j"], [])
    w.on_ack("s2", 0, 1, [], forwarded=True)
    assert not w.cache.is_live("k") and not w.cache.is_live("j")
    assert w.sent == []  # the flush is not complete yet
    w.on_ack("s1", 0, 1, [])
    assert w.sent == [("master", ("done", ["result"], ["k", "j"]))]
    assert w.cache.lookup("j", 1) == 20  # untouched: the version rule still serves it


def test_fetch_answered_before_the_forwarded_update_is_not_left_live():
    """A flush under the old map holds a key whose shard moved (s1 forwards it to s2) and one s1 keeps. s1's ack
    covers only its own key; a task under the new map then fetches the moved key from s2, which answers before
    the forwarded update reaches it. When s2 acknowledges the forwarded part, the flush completes: that stale
    answer must not stay live, or the next task (dispatched behind the completion) would read it
    (docs/design.md, invariant I2; found by python -m litz.sim, seed 229)."""
    w, Fetch = _bare_worker()
    w.flushing[0] = Flush(2, ["result"], {"s1": [(0, "k", 1), (1, "j", 1)]}, ["k", "j"], [])
    w.cache.invalidate(None)  # the new shard map arrived
    w.on_ack("s1", 0, 1, [])  # s1 applied "j" and forwarded "k"
    w.fetches[3] = Fetch("k", 5, "s2", w.cache.ticket())
    w.on_values("s2", [(3, 10)])  # s2's value without the forwarded update
    w.on_ack("s2", 0, 1, [], forwarded=True)
    assert w.sent == [("master", ("done", ["result"], ["k", "j"]))]
    assert w.cache.lookup("k", 6, live_ok=True) is MISS  # fetched again, now with the update


def test_late_ack_from_the_old_owner_is_not_added_into_the_new_owners_value():
    """A flush to s1 is applied there, then its shard moves to s0 with the update in the table; under the new map
    the worker fetches the key from s0 (live). s1's acknowledgement arrives only then: adding the delta into the
    entry would count it twice (found by python -m litz.sim, seed 13903)."""
    w, Fetch = _worker_on_two_servers()
    w.flushing[5] = Flush(1, ["result"], {"s1": [(1, "k", 1)]}, ["k"], [])
    w.on_shard_map(4, ["s0", "s0", "s0", "s0"], 2)
    w.fetches[3] = Fetch("k", 5, "s0", w.cache.ticket())
    w.on_values("s0", [(3, 12)])  # s0's value: s1's table, the flush's update included
    w.on_ack("s1", 5, 1, [])
    assert ("master", ("done", ["result"], ["k"])) in w.sent
    assert w.cache.lookup("k", 6, live_ok=True) in (12, MISS)  # never 13


def test_direct_acks_write_through_and_forwarded_answers_are_not_live():
    w, Fetch = _bare_worker()
    w.cache.store("k", 1, 10, w.cache.ticket())
    w.flushing[0] = Flush(1, ["r"], {"s1": [(0, "k", 5)]}, ["k"], [])
    w.on_ack("s1", 0, 1, [])
    assert w.cache.lookup("k", 9, live_ok=True) == 15
    w.fetches[7] = Fetch("m", 3, "s1", w.cache.ticket())
    w.on_values(None, [(7, 4)])  # answered by another server after forwarding
    assert not w.cache.is_live("m") and w.cache.lookup("m", 3) == 4
    w.fetches[8] = Fetch("n", 3, "s1", w.cache.ticket())
    w.on_values("s1", [(8, 6)])
    assert w.cache.is_live("n")


def test_live_entries_off_serve_by_the_version_rule_alone():
    c = ParamCache(live=False)  # LITZ_LIVE_CACHE=0
    c.store("k", 5, np.zeros(3), c.ticket())
    assert not c.is_live("k") and c.lookup("k", 6, live_ok=True) is MISS and c.lookup("k", 5) is not MISS


def test_after_a_partial_recovery_what_lost_servers_never_answered_goes_to_the_new_owners():
    """Unacknowledged flush parts of the lost server s1 go to its shards' new owners, under flush ids of their
    own, and every outstanding get is asked again (one s0 owes may have gone on to s1); a late answer from s1 is
    ignored; the flush completes once every part is acknowledged."""
    from litz import protocol as P

    w, Fetch = _worker_on_two_servers()
    key = {}
    for i in range(1000):
        key.setdefault(w.shardmap.shard(f"k{i}"), f"k{i}")
    w.fetches[3] = Fetch(key[1], 2, "s1", w.cache.ticket())
    w.fetches[4] = Fetch(key[0], 2, "s0", w.cache.ticket())
    w.flushing[4] = Flush(3, ["res"], {"s0": [(0, key[0], 1)], "s1": [(1, key[1], 2), (3, key[3], 4)]}, None, [])
    w.servers_lost({"s1"}, (P.SHARDS, 4, ["s0", "s2", "s0", "s0"], 2))
    assert ("disconnect", "s1") in w.sent and w.sent[-1] == ("master", (P.RESTORED,))
    assert dict(w.out_gets) == {"s2": [(3, 1, key[1])], "s0": [(4, 0, key[0])]}
    assert ("s2", (P.UPDATES, 5, [(1, key[1], 2)])) in w.sent and ("s0", (P.UPDATES, 6, [(3, key[3], 4)])) in w.sent
    w.handle("s1", (P.ACK, 4, 2, []))  # s1's answer read late: it must not count
    w.on_ack("s0", 4, 1, [])
    w.on_ack("s2", 5, 1, [])
    assert not [m for m in w.sent if m[0] == "master" and m[1][0] == P.DONE]
    w.on_ack("s0", 6, 1, [])
    assert w.sent[-1] == ("master", (P.DONE, ["res"], None)) and not w.flushing and not w.resent_fids


def test_a_partial_recovery_asks_again_a_get_a_retired_server_passed_on_and_refuses_its_update_part():
    """s3 retired after forwarding what w sent it, maybe to the lost s1. The get is asked again of its key's owner
    (reads change nothing); the update part may or may not have been applied at s1 before it was lost, so the
    worker refuses and the job restores from a full checkpoint (docs/design.md, S1; python -m litz.sim, seed
    89124: the get was never asked again and its task waited for ever)."""
    from litz import protocol as P

    w, Fetch = _worker_on_two_servers()
    w.fetches[3] = Fetch("k", 2, "s3", w.cache.ticket())
    w.servers_lost({"s1"}, (P.SHARDS, 4, ["s0", "s0", "s0", "s0"], 2), {"s0"})
    assert dict(w.out_gets) == {"s0": [(3, w.shardmap.shard("k"), "k")]}
    w, _ = _worker_on_two_servers()
    w.flushing[4] = Flush(1, ["res"], {"s3": [(1, "j", 2)]}, None, [])
    w.servers_lost({"s1"}, (P.SHARDS, 4, ["s0", "s0", "s0", "s0"], 2), {"s0"})
    assert w.sent[-1][1][0] == P.RESTORE_FAILED and "forwarded" in w.sent[-1][1][1]


def test_a_lost_servers_id_that_joins_again_is_heard_before_the_map_names_it():
    """s1 was lost and its late answers ignored. A new process joins as s1 and gets shards by moves, so it
    answers what s0 forwards to it before any shard map lists s1: the master's PEER message comes first
    and makes the worker hear it."""
    from litz import protocol as P

    w, Fetch = _worker_on_two_servers()
    w.endpoint.knows = lambda peer: False
    w.servers_lost({"s1"}, (P.SHARDS, 4, ["s0", "s0", "s0", "s0"], 2))
    w.fetches[9] = Fetch("k", 2, "s0", w.cache.ticket())
    w.fetches[9].waiters.append((types.SimpleNamespace(values=[None], missing=1), 0))
    w.handle("s1", (P.VALUES, [(9, 41)], True))  # the old s1, read late: ignored
    assert 9 in w.fetches
    w.handle("master", (P.PEER, "s1", "tcp://10.0.0.9:4000"))
    w.handle("s1", (P.VALUES, [(9, 42)], True))  # the new s1 answers what s0 forwarded to it
    assert 9 not in w.fetches and w.runnable and w.runnable[0].values == [42]
    w.handle("s0", (P.VALUES, [(9, 43)]))  # a second answer (asked again after a partial recovery): ignored
    assert w.runnable[0].values == [42]


def test_a_resent_flush_part_completes_when_a_moving_shards_server_splits_it():
    """After a partial recovery a part goes again to s0, which has meanwhile moved one of its shards to s2:
    s0 acknowledges what it applied and s2 the rest, both under the resent flush id."""
    from litz import protocol as P

    w, _ = _worker_on_two_servers()
    w.flushing[4] = Flush(2, ["res"], {"s1": [(1, "a", 2), (3, "b", 4)]}, None, [])
    w.servers_lost({"s1"}, (P.SHARDS, 4, ["s0", "s0", "s0", "s0"], 2))
    assert ("s0", (P.UPDATES, 5, [(1, "a", 2), (3, "b", 4)])) in w.sent
    w.on_ack("s0", 5, 1, [])  # s0 applied one item and forwarded the other to s2
    assert not [m for m in w.sent if m[0] == "master" and m[1][0] == P.DONE]
    w.on_ack("s2", 5, 1, [], forwarded=True)
    assert w.sent[-1] == ("master", (P.DONE, ["res"], None)) and not w.flushing and not w.resent_fids


def test_a_worker_refuses_to_resend_a_flush_whose_acknowledgements_it_cannot_match():
    """5 updates unacknowledged but only 2 of them in a part sent to a known server: a moving shard's server
    forwarded the other 3, maybe to the lost server. Sending all 5 again could apply some twice."""
    from litz import protocol as P

    w, _ = _bare_worker()
    w.ident = "w0"
    w.flushing[7] = Flush(5, [], {"s1": [(0, "a", 1), (1, "b", 1)]}, None, [])
    w.servers_lost({"s1"}, (P.SHARDS, 2, ["s0", "s0"], 3))
    assert [(peer, msg[0]) for peer, msg in w.sent] == [("master", P.RESTORE_FAILED)]


def _assert_read_only(value):
    assert isinstance(value, np.ndarray) and not value.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        value += 1


def test_values_a_task_gets_are_read_only():
    """One cached object serves every task on the worker: a task writing into it would change what later
    tasks read while the server keeps the old value. Received arrays (out-of-band frames, or pickled in-band
    as small arrays are) arrive writable: the worker hands them out read-only, without copying."""
    import pickle

    from litz import wire

    w, Fetch = _bare_worker()
    big = wire.decode(wire.encode([(1, np.arange(512.0))]))[0][1]  # 4 KiB: an out-of-band frame
    small = pickle.loads(pickle.dumps(np.arange(3)))  # in-band: a fresh writable array
    assert big.flags.writeable and small.flags.writeable  # as received
    task = types.SimpleNamespace(values=[None, None], missing=2)
    for rid, key, value in ((1, "big", big), (2, "small", small)):
        w.fetches[rid] = Fetch(key, 1, "s0", w.cache.ticket())
        w.fetches[rid].waiters.append((task, rid - 1))
        w.on_values("s0", [(rid, value)])
    for i, key in enumerate(("big", "small")):
        got = w.cache.lookup(key, 1)
        assert got is task.values[i]  # the same object: not copied
        _assert_read_only(got)
        _assert_read_only(w.cache.lookup(key, 5, live_ok=True))
    assert list(w.cache.lookup("small", 1)) == [0, 1, 2]  # the failed write changed nothing


def test_values_written_through_are_read_only():
    c = ParamCache()
    c.store("k", 1, np.zeros(3, np.float32), c.ticket())
    c.store("new", 1, None, c.ticket())
    c.write_through([(0, "k", np.ones(3, np.float32)), (0, "new", np.arange(3))])
    for key in ("k", "new"):
        _assert_read_only(c.lookup(key, 2, live_ok=True))
    assert c.lookup("k", 2, live_ok=True).tolist() == [1.0, 1.0, 1.0]
    c.write_through([(0, "k", 2.0)])  # a scalar delta into an array value
    _assert_read_only(c.lookup("k", 2, live_ok=True))


@pytest.mark.timeout(60)
def test_ps_get_values_are_read_only_end_to_end():
    """Fetched (in-band and out-of-band) and written-through values: no task can write into them."""
    result = litz.run(app_path("readonly"), workers=1, servers=1, executors=1)
    probes = {(step, key): (writeable, raised) for step, key, writeable, raised in result["probes"]}
    assert set(probes) == {(1, "small"), (1, "big"), (2, "small"), (2, "big"), (2, "fresh")}
    assert all(p == (False, True) for p in probes.values()), probes


@pytest.mark.timeout(60)
def test_writing_into_a_ps_get_value_fails_the_job_naming_the_read_only_value():
    from tests.support.processes import run_cli

    res = run_cli(["litz", "run", app_path("readonly"), "--workers", "1", "--servers", "1", "--executors", "1",
                   "--no-progress", "--config", "write=true"], timeout=60)
    assert res.returncode != 0, res.stdout
    last = res.stderr.strip().splitlines()[-1]
    assert "executor 0 run_task" in last and "read-only" in last, res.stderr


# -- update dtypes: one rule on every path (a delta goes into the value's dtype under "same_kind") --------


def _add_both_ways(current, delta):
    """add_into in place and not in place: (result or error type and text) of each."""
    from litz.cache import add_into

    outcomes = []
    for in_place in (True, False):
        value = current.copy()
        try:
            got = add_into("k", value, delta, in_place=in_place)
        except (TypeError, ValueError) as exc:
            outcomes.append(("error", str(exc)))
            assert np.array_equal(value, current)  # a refused update changes nothing
        else:
            assert (got is value) == in_place
            outcomes.append((got.dtype, got.shape, got.tolist()))
    return outcomes


@pytest.mark.parametrize("delta", [np.full(3, 0.5), 0.5, np.float64(0.5)], ids=["array", "py-float", "np-float"])
def test_float_delta_into_int_value_is_refused_in_place_or_not(delta):
    in_place, copied = _add_both_ways(np.arange(3), delta)
    assert in_place == copied and in_place[0] == "error"
    text = in_place[1]
    assert "'k'" in text and "int64" in text and ("float64" in text or "float" in text), text


@pytest.mark.parametrize("current,delta,dtype,values", [
    (np.arange(3.0), np.arange(3), np.float64, [0.0, 2.0, 4.0]),  # int delta into a float value
    (np.ones(3, np.float32), np.full(3, 0.25), np.float32, [1.25] * 3),  # same kind: stays float32
    (np.arange(3, dtype=np.int16), 2, np.int16, [2, 3, 4]),  # a Python int follows the value (NEP 50)
    (np.arange(3, dtype=np.int32), np.ones(3, np.int64), np.int32, [1, 2, 3]),
])
def test_same_kind_deltas_keep_the_values_dtype_in_place_or_not(current, delta, dtype, values):
    in_place, copied = _add_both_ways(current, delta)
    assert in_place == copied == (np.dtype(dtype), current.shape, values)


def test_float32_value_with_float64_delta_rounds_the_same_in_place_or_not():
    current = np.array([1.0, 3.0, 1e8], np.float32)
    delta = np.array([1e-9, 1 / 3, 1.5], np.float64)
    in_place, copied = _add_both_ways(current, delta)
    assert in_place == copied and in_place[0] == np.float32


@pytest.mark.parametrize("delta", [np.full(3, 0.5), 0.5], ids=["array", "py-float"])
def test_server_refuses_a_float_delta_into_an_int_key_whether_just_read_or_not(delta):
    """The server adds in place unless the value was just read (exported to ZeroMQ): the outcome must not
    depend on that (a float delta was refused in place and truncated otherwise)."""
    errors = []
    for read_first in (False, True):
        s = bare_server()
        try:
            s.update(0, "k", np.arange(3))
            s.update(0, "k", np.ones(3, np.int64))  # now a writable array of its own
            if read_first:
                s.get(0, "k")
                assert (0, "k") in s.exported
            with pytest.raises((TypeError, ValueError)) as info:
                s.update(0, "k", delta)
            errors.append(str(info.value))
            value = s.get(0, "k")
            assert value.dtype == np.int64 and value.tolist() == [1, 2, 3]
        finally:
            s.shards.close()
    assert errors[0] == errors[1] and "'k'" in errors[0] and "int64" in errors[0], errors


def test_write_through_follows_the_servers_rule():
    """The worker adds its acknowledged updates into live entries (never in place): same dtype as the server
    keeps, and a delta the server refuses stops the entry being served."""
    c = ParamCache()
    c.store("f32", 1, np.ones(3, np.float32), c.ticket())
    c.store("i", 1, np.arange(3), c.ticket())
    c.write_through([(0, "f32", np.full(3, 0.5)), (0, "i", 0.5)])
    got = c.lookup("f32", 2, live_ok=True)
    assert got.dtype == np.float32 and got.tolist() == [1.5] * 3
    assert not c.is_live("i") and c.lookup("i", 2, live_ok=True) is MISS  # the server refused it too


def test_update_log_sums_deltas_without_refusing_what_the_value_accepts():
    """A task's int delta then float delta into a float value: applied one by one both are accepted, so
    their sum in the update log (which does not know the value's dtype) must not be refused or truncated."""
    from litz.cache import UpdateLog, add_into

    log = UpdateLog()
    log.add("k", np.ones(3, np.int64))
    log.add("k", np.full(3, 0.5))
    other = UpdateLog()
    other.add("k", 0.25)
    log.merge(other)
    [(key, total)] = log.take().items()
    assert total.tolist() == [1.75] * 3
    assert add_into("k", np.zeros(3), total, in_place=True).tolist() == [1.75] * 3
    with pytest.raises(TypeError, match="'k'"):  # into an int value the sum is refused, as its float part is
        add_into("k", np.zeros(3, np.int64), total, in_place=True)
