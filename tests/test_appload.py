"""Loading an app as ordinary Python code loads: a module next to the app's file, a base class of the app's own
or a bundled app's driver subclassed, a name mistyped, a path written without .py."""
import json
import textwrap

import pytest

import litz
from tests.support.badapps import assert_clean_failure, run_app
from tests.support.processes import Processes, metric_rows

HELPER = "def double(x):\n    return 2 * x\n"

# `helper` is referenced from run_task: a worker unpickles the executor class with a reference to the module
# `helper`, so every process that runs it needs the app's directory on sys.path, not only the launcher.
IMPORTER = """
import litz

import helper


class D(litz.Driver):
    def dispatch_initial_tasks(self):
        for e in range(self.num_executors):
            self.dispatch_task(e, e)
        self.left = self.num_executors
        self.total = 0

    def handle_task_completion(self, r):
        self.total += r
        self.left -= 1
        if not self.left:
            self.finish(self.total)


class E(litz.Executor):
    def run_task(self, a):
        return helper.double(a)
"""

BASE_CLASSES = """
import litz


class Base(litz.Driver):  # the app's own base: helpers, no dispatch_initial_tasks of its own
    def send(self, e):
        self.dispatch_task(e, e)


class Counting(Base):
    def dispatch_initial_tasks(self):
        self.send(0)

    def handle_task_completion(self, r):
        self.finish({"driver": type(self).__name__, "r": r})


class Louder(Counting):
    def handle_task_completion(self, r):
        self.finish({"driver": type(self).__name__, "r": r * 10})


class BaseExecutor(litz.Executor):
    def run_task(self, a):
        return a + 1


class Executor2(BaseExecutor):
    def run_task(self, a):
        return a + 2
"""

SUBCLASSED_BUNDLED = """
from apps.mlr import MLRDriver, MLRExecutor


class MyDriver(MLRDriver):
    def _finish(self):
        self.report(mine=1)
        super()._finish()
"""

TWO_LEAVES = BASE_CLASSES + """

class Quieter(Counting):
    def handle_task_completion(self, r):
        self.finish({"driver": type(self).__name__, "r": -r})
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("spawn", ["fork", "exec"])
def test_an_app_imports_a_module_next_to_it(tmp_path, monkeypatch, spawn):
    monkeypatch.setenv("LITZ_SPAWN", spawn)
    write(tmp_path, "helper.py", HELPER)
    app = write(tmp_path, "importer.py", IMPORTER)
    res = run_app(app, "j-importer", "--workers", "2", "--executors", "4")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == 2 * (0 + 1 + 2 + 3)
    res = run_app(app.removesuffix(".py"), "j-importer2", "--executors", "2")  # the path without .py
    assert res.returncode == 0 and json.loads(res.stdout) == 2, res.stderr


@pytest.mark.timeout(150)
def test_a_cluster_job_imports_a_module_next_to_its_app(etcd, tmp_path):
    write(tmp_path, "helper.py", HELPER)
    app = write(tmp_path, "importer.py", IMPORTER)
    e, name = etcd.endpoint, "cluster-importer"
    with Processes() as procs:
        master = procs.start(["litz", "master", app, "--etcd", e, "--name", name, "--executors", "3",
                              "--no-progress"])
        procs.start(["litz", "server", "--etcd", e, "--name", name])
        procs.start(["litz", "worker", "--etcd", e, "--name", name])
        out, err = master.communicate(timeout=90)
        assert master.returncode == 0, err
    assert json.loads(out) == 2 * (0 + 1 + 2)


@pytest.mark.timeout(60)
def test_the_most_derived_classes_are_the_app(tmp_path):
    app = write(tmp_path, "bases.py", BASE_CLASSES)
    res = run_app(app, "j-bases")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"driver": "Louder", "r": 20}  # Louder over Counting, Executor2 over its base


@pytest.mark.timeout(120)
def test_a_bundled_apps_driver_subclassed(tmp_path):
    app = write(tmp_path, "mymlr.py", SUBCLASSED_BUNDLED)
    metrics = tmp_path / "m.jsonl"
    res = run_app(app, "j-mymlr", "--config", "synthetic=1", "epochs=1", "n=2000", "n_test=500",
                  "--metrics", str(metrics))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["epochs"] == 1
    assert any(r.get("mine") == 1 for r in metric_rows(metrics))  # MyDriver ran


@pytest.mark.timeout(90)
def test_ambiguous_classes_are_named_and_chosen_by_option(tmp_path):
    app = write(tmp_path, "leaves.py", TWO_LEAVES)
    assert_clean_failure(run_app(app, "j-leaves"), "app '" + app + "' has more than one litz.Driver subclass "
                         "(Louder, Quieter): choose one with --driver NAME", "j-leaves", 2)
    res = run_app(app, "j-leaves2", "--driver", "Quieter", "--executor", "BaseExecutor")
    assert res.returncode == 0 and json.loads(res.stdout) == {"driver": "Quieter", "r": -1}, res.stderr
    assert litz.run(app, driver="Counting", executor="Executor2", progress=False) == {"driver": "Counting", "r": 2}
    assert_clean_failure(run_app(app, "j-leaves3", "--driver", "Nope"),
                         "has no litz.Driver subclass named 'Nope' (found: Base, Counting, Louder, Quieter)",
                         "j-leaves3", 2)


@pytest.mark.timeout(60)
def test_a_mistyped_app_gets_a_suggestion_and_a_package_directory_runs():
    assert_clean_failure(run_app("apps.mrl", "j-typo"), "unknown app 'apps.mrl': no module named 'apps.mrl' "
                         "(did you mean apps.mlr?)", "j-typo", 2)
    assert_clean_failure(run_app("examples/linre", "j-typo2"), "no such file (did you mean examples/linreg.py?)",
                         "j-typo2", 2)
    res = run_app("examples/linreg", "j-nopy", "--config", "steps=3")
    assert res.returncode == 0 and "loss" in json.loads(res.stdout), res.stderr
    res = run_app("apps/kmeans", "j-dir", "--config", "synthetic=1", "n=2000", "epochs=1")
    assert res.returncode == 0 and json.loads(res.stdout)["n"] == 2000, res.stderr

