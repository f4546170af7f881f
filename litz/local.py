"""One-machine jobs: the master runs in this process, workers and servers as child processes.

The children are forks of a fork server (:mod:`litz.forkserver`) made before the job starts, or fresh
interpreters with ``LITZ_SPAWN=exec``. Membership uses the directory registry (``$LITZ_HOME``) unless
``etcd`` is given, so ``litzctl`` finds local jobs the same way it finds cluster jobs. Children die with
their launcher (PR_SET_PDEATHSIG, through the fork server), and the launcher ends them on every way out:
finish, error, Ctrl-C.
"""
from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from . import localtransport, roles, server, shmring, worker  # noqa: F401 (see below)
from .cli import litz as _cli  # noqa: F401
from .endpoint import listen_address
from .errors import LitzError
from .forkserver import ForkServer
from .job import JOB_OPTIONS, default_name, positive_int, resolve_app, run_job
from .membership import Membership, connect_kv
from .membership.membership import litz_home
from .security import new_secret
from .transport import ring_prefix

# roles, server, worker and the command line above are what a forked child runs and this process does not:
# imported here, once per launcher, each fork starts with them (9 ms of imports a child, greenlet among them).
# So does the unix:// carrier (litz.localtransport), which litz.endpoint would otherwise import in every child.

# One process per core is the model; BLAS threads in every worker would oversubscribe the cores (small
# matrix products ran ~50x slower here). A user's own setting in the environment wins.
ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


SOCKET_DIR_PREFIX = "litz-run-"  # then the launcher's pid


def make_socket_dir() -> str:
    """A new directory for a local job's Unix sockets (litz.transport), 0700 as mkdtemp makes it. In $TMPDIR,
    not the job's home, and in /tmp if $TMPDIR is so long that a socket's path would pass the 107 bytes a
    Unix socket address holds. The directories of dead launchers go first."""
    base = tempfile.gettempdir()
    base = base if len(base) <= 48 else "/tmp"
    remove_orphaned_socket_dirs(base)
    return tempfile.mkdtemp(prefix=f"{SOCKET_DIR_PREFIX}{os.getpid()}-", dir=base)


def remove_orphaned_socket_dirs(base: str) -> None:
    """Remove the socket directories of launchers that died without cleaning up (SIGKILL, a lost machine)."""
    for path in glob.glob(os.path.join(base, SOCKET_DIR_PREFIX + "*-*")):
        pid = os.path.basename(path)[len(SOCKET_DIR_PREFIX):].split("-", 1)[0]
        try:
            if not pid.isdigit() or os.stat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # alive (PermissionError: another user's process), or gone meanwhile
            continue


class LocalProcesses:
    """The child processes of a local job: forks of a fork server (see :mod:`litz.forkserver`), or fresh
    interpreters with ``LITZ_SPAWN=exec``."""

    def __init__(self, name: str, home: str, secret: str, etcd: Any = None,
                 server_memory_limit: int | None = None, app: Any = None):
        """``app``: the job's (:class:`litz.appload.App`), which a fresh fork server imports for its children."""
        self.name, self.home, self.etcd = name, home, etcd
        self.app = None if app is None else (list(app.paths), app.module.__name__)
        self.server_memory_limit = server_memory_limit
        user_blas = {k: os.environ[k] for k in ONE_BLAS_THREAD if k in os.environ}
        # LITZ_LOCAL_TCP=1: TCP with CURVE, as between hosts, instead of Unix sockets
        tcp = os.environ.get("LITZ_LOCAL_TCP", "0") == "1"
        self.local_dir = None if tcp else make_socket_dir()
        self.env = {**ONE_BLAS_THREAD, **user_blas, "LITZ_SECRET": secret, "LITZ_PARENT_PID": str(os.getpid()),
                    "LITZ_LOCAL_DIR": self.local_dir or ""}
        self.ring_prefix = ring_prefix(secret)
        self.procs: list[tuple[str, Any]] = []
        self.reported: set[int] = set()
        self.stopping = False
        forking = os.environ.get("LITZ_SPAWN", "fork") != "exec" and ForkServer.supported()
        self.forks = ForkServer.start(f"litz forkserver --name {name}") if forking else None

    def start(self, role: str) -> Any:
        argv = [role, "--name", self.name, "--home", self.home]
        if self.etcd:
            argv += self.etcd.argv() if hasattr(self.etcd, "argv") else ["--etcd", self.etcd]
        if role == "server" and self.server_memory_limit:
            argv += ["--memory-limit", str(self.server_memory_limit)]
        if self.forks is not None:
            proc = self.forks.spawn(argv, self.env, f"litz {role} --name {self.name}", self.app)
        else:
            proc = subprocess.Popen([sys.executable, "-m", "litz.cli.litz", *argv], env={**os.environ, **self.env},
                                    stdin=subprocess.DEVNULL)
        self.procs.append((role, proc))
        return proc

    def dead(self) -> list[tuple[str, int, str]]:
        """Children that failed since the last call, as (role, pid, how); a drained child exits with 0."""
        if self.stopping:
            return []
        out = []
        for role, proc in self.procs:
            code = proc.poll()
            if code and proc.pid not in self.reported:
                self.reported.add(proc.pid)
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                out.append((role, proc.pid, how))
        return out

    def stop(self, finished: bool = True) -> None:
        """End every child. After a finished job they are idle and leave at once on the master's stop. After
        an error or Ctrl-C one may be deep in a task or in ``load_input``, reading neither the stop nor
        SIGTERM (a drain request, see roles.serve) until it returns, and the user is waiting: a short grace,
        then SIGTERM, then SIGKILL."""
        self.stopping = True
        grace, term_grace = (3.0, 2.0) if finished else (0.3, 0.7)
        deadline = time.time() + grace
        for _, proc in self.procs:
            try:
                proc.wait(max(deadline - time.time(), 0.01))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)
        deadline = time.time() + term_grace
        for _, proc in self.procs:
            try:
                proc.wait(max(deadline - time.time(), 0.01))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.close_forks()
        shmring.remove_all(self.ring_prefix)  # rings a killed child offered and nobody mapped

    def close_forks(self) -> None:
        """Done with the fork server (it ends, or the shared one ends this job's children) and remove the sockets'
        directory: nothing of the job starts after this."""
        if self.forks is not None:
            self.forks.release([proc for _, proc in self.procs])
            self.forks = None
        if self.local_dir:
            shutil.rmtree(self.local_dir, ignore_errors=True)


def run(app: Any, workers: int = 2, servers: int = 1, executors: int | None = None,
        config: dict | None = None, **options: Any) -> Any:
    """Run a job on this machine and return the driver's ``finish(result)``.

    Options: ``name``, ``etcd`` (HOST:PORT: register in etcd instead of the local directory), ``shards``,
    ``output`` (result JSON path), ``metrics`` (JSONL path), ``progress`` (default: only when stderr is a
    terminal), ``start_timeout`` (seconds), ``checkpoint_dir``, ``checkpoint_every`` (seconds),
    ``checkpoint_keep`` (default 3), ``resume`` (continue from the latest checkpoint in ``checkpoint_dir``),
    ``memory_limit`` / ``server_memory_limit`` (bytes per worker / server; beyond it state is spilled to disk),
    ``partial_recovery``, ``priority_checkpoint`` (SCAR), ``placement`` (``speed``, the default: executors in
    proportion to the workers' measured speeds; ``even``: by count; or a :class:`litz.placement.Policy` object),
    ``steal`` (with ``speed``, on unless False: an idle worker takes an executor with queued tasks from one behind,
    between rebalances). ``driver`` / ``executor``: the names of the classes to run, where the app's module holds
    more than one of a kind. ``dashboard``: ``"[HOST:]PORT"``, serve the job's live web page while it runs
    (:mod:`litz.dashboard`), with its controls if ``allow_control``.
    A lost worker or server is replaced and the job recovers from the latest checkpoint.
    """
    positive_int(workers, "workers")
    positive_int(servers, "servers")
    if executors is not None:
        positive_int(executors, "executors")
    unknown = set(options) - JOB_OPTIONS
    if unknown:
        raise LitzError(f"unknown option(s): {', '.join(sorted(unknown))}")
    dashboard_at, allow_control = options.pop("dashboard", None), options.pop("allow_control", False)
    # imported here, so the forked children have it too
    app = resolve_app(app, options.pop("driver", None), options.pop("executor", None))
    home = options.pop("home", None) or litz_home()
    etcd = options.pop("etcd", None)
    name = options.pop("name", None) or default_name(app)
    secret = new_secret()
    dashboard = None
    if dashboard_at is not None:  # the port is bound now: a busy one fails before the job starts
        from .dashboard.launch import LauncherDashboard

        dashboard = LauncherDashboard(str(dashboard_at), allow_control)
    # before anything of this job starts a thread (an etcd client does): the fork server is forked now
    children = LocalProcesses(name, home, secret, etcd, options.pop("server_memory_limit", None), app)
    try:
        membership = Membership(connect_kv(etcd, home), name)
        if options.get("progress") is None:
            options["progress"] = sys.stderr.isatty()

        def start_children() -> None:
            for role, count in (("server", servers), ("worker", workers)):
                for _ in range(count):
                    children.start(role)
            if dashboard is not None:
                dashboard.start(name, home, etcd)

        # published in the registry for litzctl, which signs its requests with it (litz.control): the directory
        # registry is this user's alone (litz.private); in etcd it is as exposed as a cluster master's secret
        return run_job(app, membership, secret, config=config, executors=executors, min_workers=workers,
                       min_servers=servers, supervise=children.dead, spawn=children.start,
                       on_registered=start_children, on_exit=children.stop, publish_secret=True, home=home,
                       listen=listen_address(local_dir=children.local_dir), **options)
    finally:
        children.close_forks()  # when the job never started its children (refused, bad etcd address)
        if dashboard is not None:
            dashboard.stop()
