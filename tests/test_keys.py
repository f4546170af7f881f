"""Parameter keys: the stable hash that places a key on its shard in every process, and across versions."""
from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from litz.keys import ShardMap, stable_hash

# A key's shard must be the same in every process of a job (Python's own str hash is salted per process) and in
# every Litz version that can resume another's checkpoint: its shard files are per logical shard, so a key whose
# hash changed would be looked for in the wrong shard. These values are the format; never change them.
PINNED = [(0, 0), (1, 11400714819323198485), (-1, 7046029254386353131), (2**40, 5367187945662971904),
          ("a", 13240095320189717465), ("weights", 15164561323059707528), ("", 0), ((), 14695981039346656037),
          ((1,), 2856389037799358096), (("k", 3), 2483624619559136795),
          (("own", (2, "x")), 14218927967490935530)]

keys = st.recursive(st.integers() | st.text(max_size=8), lambda inner: st.tuples(inner, inner) | st.tuples(inner),
                    max_leaves=6)


@pytest.mark.parametrize("key,value", PINNED, ids=[repr(k) for k, _ in PINNED])
def test_the_hash_of_a_key_never_changes(key, value):
    assert stable_hash(key) == value


@given(keys)
def test_a_hash_is_64_bits_and_a_shard_is_one_of_the_jobs(key):
    assert 0 <= stable_hash(key) < 2**64
    assert 0 <= ShardMap(7, ["s0"] * 7).shard(key) < 7


def test_keys_that_print_alike_are_different_keys():
    assert len({stable_hash(k) for k in [1, "1", (1,), ("1",), (1, 1), ((1,), 1), (1, (1,))]}) == 7
    assert stable_hash(("a", "b")) != stable_hash(("b", "a"))  # order matters in a tuple key


@pytest.mark.parametrize("key", [True, (1, False), 1.5, None, b"k", np.int64(3), [1], ("a", [1])])
def test_only_str_int_and_tuples_of_them_are_keys(key):
    with pytest.raises(TypeError, match="parameter keys are str, int or tuples of them"):
        stable_hash(key)


def test_shards_spread_keys_evenly_and_a_key_keeps_its_shard():
    m = ShardMap(8, [f"s{i % 2}" for i in range(8)])
    for key_set in (range(4000), [f"w{i}" for i in range(4000)], [("k", i) for i in range(4000)]):
        counts = collections.Counter(m.shard(k) for k in key_set)
        assert sorted(counts) == list(range(8)) and max(counts.values()) < 1.25 * 500, counts
    fresh = ShardMap(8, m.owners)
    assert [m.shard(k) for k in range(50)] == [fresh.shard(k) for k in range(50)] == [m.shard(k) for k in range(50)]
    assert [ShardMap(16, ["s"] * 16).shard(k) for k in [0, 1, 2, 3, "a", "b", ("k", 3)]] == [0, 15, 15, 14, 9, 8, 5]
    assert m.num_shards == 8 and m.owners[m.shard("a")] == "s1"
