"""Small apps written into a test's directory and run, for what Litz does with bad apps and bad input: one clear
line, a non-zero exit, nothing left behind."""
from __future__ import annotations

import textwrap
import time

import psutil

from tests.support.errors import assert_one_line, error_lines
from tests.support.processes import run_cli

GOOD_EXECUTOR = "class E(litz.Executor):\n    def run_task(self, a):\n        return a\n"
GOOD_DRIVER = ("class D(litz.Driver):\n    def dispatch_initial_tasks(self):\n        self.dispatch_task(0, 1)\n"
               "    def handle_task_completion(self, r):\n        self.finish(r)\n")


def write_app(tmp_path, name: str, body: str) -> str:
    """An app file NAME.py in ``tmp_path``: ``body`` after ``import litz``."""
    path = tmp_path / f"{name}.py"
    path.write_text("import litz\n" + textwrap.dedent(body))
    return str(path)


def job_processes(name: str) -> list:
    """Every process whose command line holds ``name``."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if name in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            pass
    return found


def leftovers(name: str, within: float = 5.0) -> list:
    """The job's processes still alive after ``within`` seconds: a fork server ends when its launcher does
    (parent-death signal), a moment later on a loaded machine."""
    deadline = time.monotonic() + within
    while True:
        left = []
        for p in job_processes(name):
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p)
            except psutil.Error:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def assert_clean_failure(res, must_contain: str, name: str, code: int | None = None, app_trace: bool = False):
    """Job ``name`` failed (with exit status ``code`` if given) saying one line that holds ``must_contain``,
    after the app's traceback where ``app_trace``, and left no process behind."""
    assert res.returncode != 0, res.stderr
    if code is not None:
        assert res.returncode == code
    if app_trace:  # the app's own traceback, then the one line
        assert "Traceback (most recent call last)" in res.stderr
        lines = error_lines(res.stderr)
        assert lines, "nothing on stderr"
        last = lines[-1]
    else:
        last = assert_one_line(res, code=None)
    assert last.startswith(("litz: ", "litz run: ")), res.stderr
    assert must_contain in last, res.stderr
    assert not leftovers(name), "processes left behind"


def run_app(app: str, name: str, *extra: str, timeout: float = 60):
    """``litz run APP --name NAME EXTRA...`` to its end."""
    return run_cli(["litz", "run", app, "--name", name, "--no-progress", *extra], timeout=timeout)
