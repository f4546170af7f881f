"""Real processes for tests: running the console scripts, waiting for a condition, ports, the job's status and
metrics."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
APPS = os.path.join(ROOT, "tests", "apps")


def app_path(name: str) -> str:
    return os.path.join(APPS, name + ".py")


def run_cli(args: list[str], timeout: float = 90, cwd: str = ROOT, **kw) -> subprocess.CompletedProcess:
    """Run ``python -m litz.cli.<tool>`` in its own process group. Once it has exited, nothing of its group may
    outlive it (a grace of ``LEFTOVER_GRACE_S`` for children ending on their parent-death signal): a leftover
    fails the test. The group is killed whatever happens, so nothing leaks either way."""
    tool = args[0]
    proc = subprocess.Popen([sys.executable, "-m", f"litz.cli.{tool}", *args[1:]], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **kw)
    left: list[str] = []
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            if proc.poll() is None:
                raise
            # it exited, but something of its group holds its stdout or stderr open
            left, out, err = group_leftovers(proc.pid, within=0), "", "(its output is held by what it left)"
        else:
            left = group_leftovers(proc.pid)  # before anything is killed: a kill would hide them
    finally:
        _kill_group(proc)
    assert not left, f"{' '.join(args)[:200]} exited and left processes behind: {left}\n{err[-3000:]}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


LEFTOVER_GRACE_S = 10.0  # children end on their launcher's death signal a moment after it, later when loaded


def group_leftovers(pgid: int, within: float = LEFTOVER_GRACE_S) -> list[str]:
    """The live processes of process group ``pgid`` (pid and command line) still there after up to ``within``
    seconds; zombies do not count (they have ended, and only wait for their reaper)."""
    import time

    import psutil

    deadline = time.monotonic() + within
    while True:
        left = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:200]}")
            except (psutil.Error, ProcessLookupError):
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


class Processes:
    """Processes a test starts, each in its own process group; on exit nothing of them may be left, and all
    groups are killed."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, args: list[str], **kw) -> subprocess.Popen:
        tool = args[0]
        proc = subprocess.Popen([sys.executable, "-m", f"litz.cli.{tool}", *args[1:]], cwd=kw.pop("cwd", ROOT),
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                **kw)
        self.procs.append(proc)
        return proc

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        """On a passing test every process must have ended with its whole group (within ``LEFTOVER_GRACE_S``):
        what is still there is a leftover and fails the test, after it is killed. A process the test means to
        leave running, it kills itself. On a failing test everything is killed at once."""
        left = [] if exc_type is not None else [pid for proc in self.procs for pid in group_leftovers(proc.pid)]
        for proc in self.procs:
            _kill_group(proc)
        if exc_type is not None:  # the test failed: what the processes said is the first clue
            for proc in self.procs:
                if proc.stderr is not None and not proc.stderr.closed:
                    _, err = proc.communicate(timeout=10)
                    print(f"--- stderr of {' '.join(map(str, proc.args[2:]))[:200]}:\n{(err or '')[-6000:]}",
                          file=sys.stderr)
        assert not left, f"processes left behind when the test ended: {left}"


def run_in_fresh_process(body, timeout: float = 100) -> None:
    """Run ``body`` (a module-level function of a test module, taking no arguments) in a fresh interpreter and
    fail with its stderr if it fails. For tests whose subject is the launcher process itself (what its forks
    inherit), which must not depend on what earlier tests left in the pytest process: an etcd client's gRPC
    threads make the fork server a fresh interpreter (litz.forkserver), and app classes stay loaded."""
    code = f"import {body.__module__} as m; m.{body.__name__}()"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{body.__name__} failed in a fresh interpreter:\n{done.stderr[-4000:]}"


PORTS_FROM = 10000  # free_port() picks between this and the start of the kernel's ephemeral range


def free_port() -> int:
    """A TCP port on the loopback that nothing is bound to right now, for a process the test starts to listen on.

    It comes from below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``), at random: the kernel
    hands those ports to no other socket (bind to port 0, connect), so between this check and the process's own
    bind only another test picking the same port can take it. A port of the ephemeral range, as bind(0) gives,
    could meanwhile be any process's outgoing connection. Where the process can report the port it bound,
    prefer port 0; else retry on EADDRINUSE (support.etcd.start_etcd, test_connections.start_peer)."""
    import random
    import socket

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768  # Linux's default
    rng = random.SystemRandom()  # not the random module's state, which pytest-randomly seeds alike in every run
    for _ in range(200):
        port = rng.randrange(PORTS_FROM, max(ephemeral, PORTS_FROM + 1000))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free TCP port between {PORTS_FROM} and {ephemeral}")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    """Poll ``predicate`` until it returns something truthy; fail the test with ``what`` on timeout."""
    import time

    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def metric_rows(path) -> list[dict]:
    """The rows of a JSON-lines file a job writes (``--metrics``), complete lines only: a running job may be half
    way through its last one. Empty before the file exists."""
    import json

    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines() if line.strip()]


def status(name: str, etcd: str | None = None) -> dict | None:
    """The job's published status, read through litzctl (None while it has none)."""
    import json

    args = ["litzctl", *(["--etcd", etcd] if etcd else []), "--name", name, "status", "--json"]
    res = run_cli(args, timeout=30)
    return json.loads(res.stdout) if res.returncode == 0 else None


def resize(mnt, size: str) -> None:
    """Change the size of a tmpfs from the ``small_disk`` fixture (conftest.py)."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mnt)], check=True)


def ctl(name: str, *args: str, etcd: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``litzctl --name NAME ARGS...`` (against ``etcd`` in cluster mode), as a user types it."""
    return run_cli(["litzctl", *(["--etcd", etcd] if etcd else []), "--name", name, *args], timeout=timeout)
