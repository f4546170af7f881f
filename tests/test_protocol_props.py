"""litz.protocol.check, the gate every received message passes: each role takes exactly the messages of its
:data:`SHAPES` (any value of the declared types, in the declared number of fields), and names what is wrong
with any other."""
from __future__ import annotations

import random

import numpy as np
import pytest

from litz import protocol as P

# one value of each kind a field may hold (bool is an int to isinstance, as to Python)
POOL = [0, 7, True, np.int64(3), np.int32(-1), 1.5, np.float32(2.0), "s", "", b"b", None, [], [1], (), (1,), {},
        {"a": 1}, {1}, object()]


def fitting(kind) -> list:
    return [v for v in POOL if isinstance(v, kind)]


def not_fitting(kind) -> list:
    return [v for v in POOL if not isinstance(v, kind)]


def message(rng: random.Random, tag: str, fields: tuple, count: int) -> tuple:
    return (tag, *(rng.choice(fitting(kind)) for kind in fields[:count]))


# every role's every tag, 20 random messages each (seeded: a failure replays; one test per role, since a test's
# fixtures cost more than its checks)
@pytest.mark.parametrize("role", P.SHAPES)
def test_protocol_check_takes_every_message_of_the_declared_shape(role):
    for tag, (fewest, most, fields, master) in P.SHAPES[role].items():
        rng = random.Random(f"{role}:{tag}")
        for _ in range(20):
            msg = message(rng, tag, fields, rng.randint(fewest, most))
            assert P.check(P.SHAPES[role], "master", msg) is None, (role, msg)
            if not master:
                assert P.check(P.SHAPES[role], "w3", msg) is None, (role, msg)


@pytest.mark.parametrize("role", P.SHAPES)
def test_protocol_check_names_the_wrong_field_count_type_or_sender(role):
    for tag in P.SHAPES[role]:
        rng = random.Random(f"{role}:{tag}")
        for _ in range(20):
            wrong_shape(P.SHAPES[role], tag, rng)


def wrong_shape(shapes: dict, tag: str, rng: random.Random) -> None:
    fewest, most, fields, master = shapes[tag]
    full = message(rng, tag, fields, most)
    assert P.check(shapes, "master", full + (0,)) == (f"{tag} with the wrong number of fields", str(most + 1))
    if fewest:
        assert P.check(shapes, "master", full[:fewest]) == (f"{tag} with the wrong number of fields",
                                                            str(fewest - 1))
    sender = "s1"
    assert P.check(shapes, sender, full) == ((f"{tag} not from the master", "") if master else None)
    wrong = [i for i, kind in enumerate(fields) if not_fitting(kind)]
    if wrong:
        i = rng.choice(wrong)
        bad = rng.choice(not_fitting(fields[i]))
        msg = full[:i + 1] + (bad,) + full[i + 2:]
        assert P.check(shapes, "master", msg) == (f"{tag} with a field of the wrong type",
                                                  f"field {i + 1} is a {type(bad).__name__}")


@pytest.mark.parametrize("msg,why", [
    ([P.STOP], ("not a tuple that starts with a tag", "list")), ((), ("not a tuple that starts with a tag", "tuple")),
    ((5, 1), ("not a tuple that starts with a tag", "tuple")), ("stop", ("not a tuple that starts with a tag", "str")),
    ((b"stop",), ("not a tuple that starts with a tag", "tuple")),
    (("x" * 100,), ("unknown tag", repr("x" * 40))), ((P.GETS, []), ("unexpected tag", "'gets'")),
])
def test_protocol_check_refuses_what_is_not_a_worker_message(msg, why):
    assert P.check(P.SHAPES["worker"], "master", msg) == why


def test_protocol_check_counts_optional_fields_from_the_end():
    assert P._shape(int, str, optional=1) == (1, 2, (int, str), False)
    assert P._shape(master=True) == (0, 0, (), True)
    worker = P.SHAPES["worker"]
    assert P.check(worker, "master", (P.RETIRE, ["s0"])) is None
    assert P.check(worker, "master", (P.RETIRE, ["s0"], 3)) is None
    assert P.check(worker, "master", (P.RETIRE,)) == ("retire with the wrong number of fields", "0")
    assert P.check(worker, "master", (P.RETIRE, ["s0"], "3")) == ("retire with a field of the wrong type",
                                                                  "field 2 is a str")
