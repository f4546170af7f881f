"""A long end-to-end scenario run once for several small tests, each asserting one point on what it recorded: one
failure does not hide the next, and the scenario's processes run once."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest


class Record:
    """What a scenario did: each step's outcome under a name, or the exception it ended with. A failed step does
    not stop the scenario where the next can still run (``step``); a failure that ends it is kept too, and a
    test reading a step it never reached fails with that."""

    def __init__(self) -> None:
        self.outcomes: dict[str, object] = {}
        self.ended_by: BaseException | None = None

    def step(self, name: str, fn: Callable, *args, **kw):
        """Run ``fn(*args, **kw)`` and keep its value (returned) or its exception (None returned) under ``name``."""
        try:
            value = fn(*args, **kw)
        except Exception as exc:  # noqa: BLE001 - kept for the test that reads this step
            self.outcomes[name] = exc
            return None
        self.outcomes[name] = value
        return value

    def __setitem__(self, name: str, value: object) -> None:
        self.outcomes[name] = value

    def __getitem__(self, name: str):
        """The step's value; the test fails if the step failed or was never reached."""
        if name not in self.outcomes:
            pytest.fail(f"the scenario never reached '{name}': it ended with {self.ended_by!r}", pytrace=False)
        value = self.outcomes[name]
        if isinstance(value, Exception):
            pytest.fail(f"step '{name}' of the scenario failed: {value}", pytrace=False)
        return value


@contextmanager
def scenario(home: str) -> Iterator[Record]:
    """Run a scenario body in this ``with`` block, recording into the yielded ``Record``. An exception that ends
    the body is kept in the record, not raised: the tests that need what came after it fail with it, the others
    still pass or fail on their own. ``home``: the scenario's ``$LITZ_HOME`` (conftest's ``litz_home`` is
    per test, and a module-scoped scenario runs before it)."""
    record = Record()
    old = os.environ.get("LITZ_HOME")
    os.environ["LITZ_HOME"] = home
    try:
        yield record
    except Exception as exc:  # noqa: BLE001 - reported by the tests that read what never happened
        record.ended_by = exc
    finally:
        if old is None:
            os.environ.pop("LITZ_HOME", None)
        else:
            os.environ["LITZ_HOME"] = old
