"""One-machine jobs: the master runs in this process, workers and servers as child processes.

Membership uses the directory registry (``$LITZ_HOME``), so ``litzctl`` finds local jobs the same way
it finds cluster jobs in etcd. Children die with their launcher (PR_SET_PDEATHSIG), and the launcher
ends them on every way out: finish, error, Ctrl-C.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import ModuleType
from typing import Any

from .appload import App, load_app
from .errors import LitzError
from .joblog import JobLog
from .master import Master
from .membership import Membership, connect_kv
from .membership.membership import litz_home
from .security import new_secret


def positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LitzError(f"{what} must be a whole number >= 1, got {value!r}")
    return value


class LocalProcesses:
    """The child processes of a local job."""

    def __init__(self, name: str, home: str, secret: str, etcd: str | None = None):
        self.name, self.home, self.etcd = name, home, etcd
        self.env = {**os.environ, "LITZ_SECRET": secret, "LITZ_PARENT_PID": str(os.getpid())}
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.stopping = False

    def start(self, role: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "litz.cli.litz", role, "--name", self.name, "--home", self.home]
        if self.etcd:
            cmd += ["--etcd", self.etcd]
        proc = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL)
        self.procs.append((role, proc))
        return proc

    def check(self) -> str | None:
        """A one-line problem if a child ended that should still be running."""
        if self.stopping:
            return None
        for role, proc in self.procs:
            code = proc.poll()
            if code is not None:
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                return f"{role} process {proc.pid} {how}"
        return None

    def stop(self, grace: float = 3.0) -> None:
        self.stopping = True
        deadline = time.time() + grace
        for _, proc in self.procs:
            try:
                proc.wait(max(deadline - time.time(), 0.01))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)
        for _, proc in self.procs:
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run(app: str | ModuleType | App, workers: int = 2, servers: int = 1, executors: int | None = None,
        config: dict | None = None, **options: Any) -> Any:
    """Run a job on this machine and return the driver's ``finish(result)``.

    Options: ``name``, ``etcd`` (HOST:PORT: register in etcd instead of the local directory), ``shards``,
    ``output`` (result JSON path), ``metrics`` (JSONL path), ``progress``
    (default: only when stderr is a terminal), ``start_timeout`` (seconds).
    """
    positive_int(workers, "workers")
    positive_int(servers, "servers")
    if executors is not None:
        positive_int(executors, "executors")
    if isinstance(app, ModuleType):
        app = app.__name__
    if isinstance(app, str):
        app = load_app(app)
    unknown = set(options) - {"name", "shards", "output", "metrics", "progress", "start_timeout", "home", "etcd"}
    if unknown:
        raise LitzError(f"unknown option(s): {', '.join(sorted(unknown))}")
    config = dict(config or {})
    home = options.get("home") or litz_home()
    name = options.get("name") or f"{app.name.rsplit('.', 1)[-1].replace('/', '_')}-{os.getpid()}-{int(time.time())}"
    etcd = options.get("etcd")
    membership = Membership(connect_kv(etcd, home), name)
    secret = new_secret()
    progress = options.get("progress")
    joblog = JobLog(options.get("metrics"), progress=sys.stderr.isatty() if progress is None else progress)
    children = LocalProcesses(name, home, secret, etcd)
    master = Master(app, membership, secret, config=config, num_executors=executors,
                    num_shards=options.get("shards") or 0, min_workers=workers, min_servers=servers,
                    joblog=joblog, start_timeout=options.get("start_timeout", 60.0), supervise=children.check)
    result: Any = None
    try:
        master.register()
        for _ in range(servers):
            children.start("server")
        for _ in range(workers):
            children.start("worker")
        result = master.run()
        return result
    finally:
        children.stopping = True
        master.stop_all()
        children.stop()
        if options.get("output"):
            joblog.write_output(options["output"], {
                "result": result, "state": master.state, "app": app.name, "name": name,
                "elapsed_s": round(joblog.elapsed(), 4), "tasks_completed": master.tasks_completed,
                "workers": len(master.workers), "servers": len(master.servers),
                "executors": master.num_executors})
        joblog.close()
        membership.unregister()
        membership.clear()
        master.close()
