"""What an app hands the runtime that cannot travel (a result or a ps_update key pickle refuses) ends the job as
the app's error, naming where it came from: never as a lost worker."""
import pytest

from tests.support.badapps import GOOD_DRIVER, assert_clean_failure, run_app, write_app

LOCK_RESULT = GOOD_DRIVER + """
import threading


class E(litz.Executor):
    def run_task(self, a):
        self.ps_update("k", 1.0)  # the DONE then waits for the servers' acknowledgement: sent from its handler
        return {"w": [a, threading.Lock()]} if self.config.get("nested") else threading.Lock()
"""

ENUM_KEY = GOOD_DRIVER + """
import enum


class Key(enum.IntEnum):
    A = 1


class E(litz.Executor):
    def run_task(self, a):
        self.ps_update(Key.A, 1.0)  # an int subclass of the app's: only forks of the launcher can unpickle it
        return a
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nested,part", [(0, "result is a _thread.lock"), (1, "result['w'][1] is a _thread.lock")])
def test_a_result_that_cannot_be_pickled_is_an_application_error_naming_the_executor(tmp_path, nested, part):
    app = write_app(tmp_path, "lockresult", LOCK_RESULT)
    res = run_app(app, "j-lock", "--config", f"nested={nested}")
    assert_clean_failure(res, "application error in executor 0 run_task (task 0): TypeError: run_task's return "
                         "value cannot be sent to the driver: " + part, "j-lock", 1)
    assert "was lost" not in res.stderr and "--checkpoint-dir" not in res.stderr


@pytest.mark.timeout(60)
def test_a_ps_update_key_that_cannot_be_pickled_is_an_application_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LITZ_SPAWN", "exec")
    app = write_app(tmp_path, "enumkey", ENUM_KEY)
    res = run_app(app, "j-enum")
    assert_clean_failure(res, "application error in ps_update: TypeError: ps_update key <Key.A: 1> is a "
                         "litz_app_enumkey.Key, which cannot be sent to the parameter servers", "j-enum", 1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("spawn", ["fork", "exec"])
def test_a_result_of_a_class_the_app_defines_reaches_the_driver_as_that_class(monkeypatch, spawn):
    """A fresh interpreter gets the app by value: plain pickle finds no class of that name there (or another one,
    when the app is also importable), so such a result failed the job; the driver gets the app's own class."""
    import litz
    from tests.support.processes import app_path

    monkeypatch.setenv("LITZ_SPAWN", spawn)
    assert litz.run(app_path("appclass_result"), workers=2, servers=1, executors=3) == [2, 4, 6]


@pytest.mark.timeout(60)
def test_task_greenlets_are_reused_and_every_task_still_counts():
    """A worker runs each task in a greenlet taken from those that finished one (a new greenlet per task cost 8 us of
    the task's time): of 50 rounds of 4 tasks that each wait for a fetch, some greenlet must have run many, and the
    key every task added 1 to must count every task."""
    import litz
    from tests.support.processes import app_path

    result = litz.run(app_path("reused"), workers=2, servers=1, executors=4, progress=False)
    assert result["tasks"] == 200 and result["counted"] == 200.0
    assert result["most_per_greenlet"] >= 25  # 100 tasks a worker, at most 2 waiting at once
