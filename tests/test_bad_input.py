"""Bad input ends with one clear line on stderr, a non-zero exit, and no process left behind."""
import textwrap

import pytest

from tests.support.badapps import (
    GOOD_DRIVER,
    GOOD_EXECUTOR,
    assert_clean_failure,
    run_app,
    write_app,
)
from tests.support.processes import Processes, app_path, run_cli


@pytest.mark.timeout(60)
def test_unknown_app():
    assert_clean_failure(run_app("no_such_app_module", "j-unknown"), "unknown app 'no_such_app_module'",
                         "j-unknown", 2)
    assert_clean_failure(run_app("/nonexistent/app.py", "j-unknown2"), "no such file", "j-unknown2", 2)


@pytest.mark.timeout(60)
def test_no_or_two_drivers(tmp_path):
    app = write_app(tmp_path, "nodriver", GOOD_EXECUTOR)
    assert_clean_failure(run_app(app, "j-nod"), "must define or import a litz.Driver subclass (found: none)",
                         "j-nod", 2)
    app = write_app(tmp_path, "twodrivers", GOOD_EXECUTOR + GOOD_DRIVER + GOOD_DRIVER.replace("class D", "class D2"))
    assert_clean_failure(run_app(app, "j-two"), "more than one litz.Driver subclass (D, D2): choose one with --driver",
                         "j-two", 2)


@pytest.mark.timeout(60)
def test_syntax_error(tmp_path):
    app = write_app(tmp_path, "broken", GOOD_EXECUTOR + "def oops(:\n    pass\n")
    assert_clean_failure(run_app(app, "j-syn"), "syntax error in app", "j-syn", 2)
    assert "broken.py:5" in run_app(app, "j-syn").stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers,message", [("0", "must be at least 1, got 0"), ("abc", "expected a whole number")])
def test_bad_worker_count(workers, message):
    assert_clean_failure(run_app(app_path("noop"), "j-w", "--workers", workers), message, "j-w", 2)


@pytest.mark.timeout(60)
def test_bad_config_value():
    assert_clean_failure(run_app(app_path("noop"), "j-cfg", "--config", "tasks"), "bad --config value 'tasks'",
                         "j-cfg", 2)


@pytest.mark.timeout(60)
def test_unreachable_etcd():
    res = run_app(app_path("noop"), "j-etcd", "--etcd", "127.0.0.1:9", timeout=60)
    assert_clean_failure(res, "cannot reach etcd at 127.0.0.1:9 (", "j-etcd", 2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where,body", [
    ("executor 0 run_task", GOOD_DRIVER + "class E(litz.Executor):\n    def run_task(self, a):\n"
                                          "        raise ValueError('bad task input 42')\n"),
    ("driver handle_task_completion", GOOD_EXECUTOR + GOOD_DRIVER.replace("self.finish(r)", "1 / 0")),
    ("load_input", GOOD_DRIVER + "class E(litz.Executor):\n    def load_input(self):\n"
                                 "        open('/nonexistent/data.npz')\n"
                                 "    def run_task(self, a):\n        return a\n"),
])
def test_app_exceptions(tmp_path, where, body):
    app = write_app(tmp_path, "raising", body)
    res = run_app(app, "j-raise")
    assert_clean_failure(res, where, "j-raise", 1, app_trace=True)
    assert "raising.py" in res.stderr  # the app's own traceback names its file


def test_executor_class_shipped_by_value_keeps_its_file_names(tmp_path):
    """Methods, module helpers they call and functions nested in them name the app's file on a worker
    (cloudpickle >= 3.1.3 ships code as ``<dynamic-code>``)."""
    from litz.appload import load_app, load_executor_class

    app = load_app(write_app(tmp_path, "named", GOOD_DRIVER + textwrap.dedent("""\
        def helper(a):
            return (lambda: a)()
        class E(litz.Executor):
            @staticmethod
            def run_task(a):
                return helper(a)
        """)))
    cls = load_executor_class(app.executor_blob())
    helper = cls.run_task.__globals__["helper"]
    nested = [c for c in helper.__code__.co_consts if hasattr(c, "co_filename")]
    assert nested and {cls.run_task.__code__.co_filename, helper.__code__.co_filename,
                       *(c.co_filename for c in nested)} == {str(tmp_path / "named.py")}
    assert cls.run_task(7) == 7
    package = load_executor_class(load_app("apps.kmeans").executor_blob())  # submodules reached as modules
    assert package._train.__globals__["model"].batch_delta.__code__.co_filename.endswith("apps/kmeans/model.py")


@pytest.mark.timeout(60)
def test_driver_without_tasks_in_flight(tmp_path):
    app = write_app(tmp_path, "stalls", GOOD_EXECUTOR + GOOD_DRIVER.replace("self.finish(r)", "pass"))
    assert_clean_failure(run_app(app, "j-stall"), "no micro-tasks in flight", "j-stall", 2)


ORPHAN_APP = GOOD_DRIVER + """\
import subprocess
class E(litz.Executor):
    def load_input(self):
        subprocess.Popen(["sleep", "120"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # outlives the job
        raise ValueError("bad input")
    def run_task(self, a):
        return a
"""


@pytest.mark.timeout(120)
def test_a_process_left_in_the_launchers_group_fails_the_test(tmp_path):
    """The leftover checks of run_cli and Processes look before they kill: a process of the job's group that
    outlives the launcher (here one the app started) fails the test instead of being killed unseen."""
    app = write_app(tmp_path, "orphan", ORPHAN_APP)
    with pytest.raises(AssertionError, match="left processes behind.*sleep 120"):
        run_cli(["litz", "run", app, "--name", "j-orphan", "--no-progress"], timeout=60)
    with pytest.raises(AssertionError, match="left behind when the test ended.*sleep 120"):
        with Processes() as procs:
            procs.start(["litz", "run", app, "--name", "j-orphan2", "--no-progress"]).wait(timeout=60)
