"""Helpers for tests: test app paths and running the console scripts as real processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APPS = os.path.join(ROOT, "tests", "apps")


def app_path(name: str) -> str:
    return os.path.join(APPS, name + ".py")


def run_cli(args: list[str], timeout: float = 90, cwd: str = ROOT, **kw) -> subprocess.CompletedProcess:
    """Run ``python -m litz.cli.<tool>`` in its own process group; the group is killed whatever happens."""
    tool = args[0]
    proc = subprocess.Popen([sys.executable, "-m", f"litz.cli.{tool}", *args[1:]], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
