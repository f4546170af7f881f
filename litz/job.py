"""One job's life in its master process: register, run the driver, end every process, write results.

Shared by ``litz run`` (children on this machine) and ``litz master`` (processes join through etcd).
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .appload import App, load_app
from .errors import LitzError
from .finished import record_finished, registry_name
from .joblog import JobLog, config_shown, make_parent
from .master import Master
from .membership import Membership
from .membership.membership import litz_home
from .outofcore import parse_bytes

JOB_OPTIONS = {"name", "etcd", "shards", "output", "metrics", "progress", "start_timeout", "home", "checkpoint_dir",
               "checkpoint_every", "checkpoint_keep", "resume", "partial_recovery", "priority_checkpoint",
               "memory_limit", "server_memory_limit", "driver", "executor", "placement", "steal", "dashboard",
               "allow_control"}


def positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LitzError(f"{what} must be a whole number >= 1, got {value!r}")
    return value


def resolve_app(app: Any, driver: str | None = None, executor: str | None = None) -> App:
    """``driver`` / ``executor``: the class names to run, for a module that holds several."""
    if isinstance(app, App):
        return app
    if hasattr(app, "__name__") and not isinstance(app, str):  # a module object
        app = app.__name__
    if not isinstance(app, str):
        raise LitzError(f"app must be a module, module name or .py path, not {type(app).__name__}")
    return load_app(app, driver, executor)


def default_name(app: App) -> str:
    stem = os.path.basename(app.name).removesuffix(".py").rsplit(".", 1)[-1]
    return f"{stem}-{os.getpid()}-{int(time.time())}"


def run_job(app: App, membership: Membership, secret: str, *, config: dict | None, executors: int | None,
            min_workers: int, min_servers: int, shards: int = 0, output: str | None = None,
            metrics: str | None = None, progress: bool = False, start_timeout: float = 60.0,
            supervise: Callable[[], list[tuple[str, int, str]]] | None = None,
            spawn: Callable[[str], Any] | None = None,
            on_registered: Callable[[], None] | None = None, on_exit: Callable[[bool], None] | None = None,
            publish_secret: bool = False,
            checkpoint_dir: str | None = None, checkpoint_every: float | None = None, checkpoint_keep: int = 3,
            resume: bool = False, partial_recovery: bool = False, priority_checkpoint: float | None = None,
            memory_limit: int | str | None = None, home: str | None = None, placement: Any = "speed",
            steal: bool | None = None, **endpoint: Any) -> Any:
    """Run the job to ``finish()`` and return its result; every process is told to stop on every way out.

    ``publish_secret``: put the job secret in the registry, where joining processes and litzctl (which signs
    its requests with it, :mod:`litz.control`) find it; only once this master has won the job's name, so a
    refused second master changes nothing. ``home``: the Litz home directory whose ``history/NAME`` keeps the job's
    metrics and events once it ends (default ``$LITZ_HOME``), for ``litzctl plot``."""
    for path, option in ((output, "--output"), (metrics, "--metrics")):
        if path:
            make_parent(path, option)
    warning = app.config_warning(config)
    if warning:
        sys.stderr.write(f"litz: warning: {warning}\n")
    joblog = JobLog(metrics, progress=progress)
    master = Master(app, membership, secret, config=dict(config or {}), num_executors=executors, num_shards=shards,
                    min_workers=min_workers, min_servers=min_servers, joblog=joblog, start_timeout=start_timeout,
                    supervise=supervise, spawn=spawn, checkpoint_dir=checkpoint_dir,
                    checkpoint_every=checkpoint_every, checkpoint_keep=checkpoint_keep, resume=resume,
                    partial_recovery=partial_recovery, priority_checkpoint=priority_checkpoint,
                    memory_limit=parse_bytes(memory_limit) if memory_limit is not None else None,
                    placement=placement, steal=steal, **endpoint)
    result: Any = None
    try:
        master.register()
    except BaseException:
        joblog.close()
        membership.unregister()
        master.close()
        raise  # refused (another master holds the name): leave that job's registry entries alone
    started = time.time()
    try:
        if publish_secret:  # part of the master's registration: written again after a registry reset (R2)
            membership.put("secret", secret, keep=True)
        if spawn is not None:  # local: the workers start from this machine's numba cache; fill it first if cold
            master.compile_kernels()
        if on_registered:
            on_registered()
        result = master.run()
        return result
    except BaseException:
        master.state = "failed"
        raise
    finally:
        master.stop_all()
        if on_exit:
            on_exit(master.finished)
        if output:
            joblog.write_output(output, {
                "result": result, "state": master.state, "app": app.name, "name": membership.job,
                "elapsed_s": round(joblog.elapsed(), 4), "tasks_completed": master.tasks_completed,
                "workers": len(master.workers), "servers": len(master.servers), "executors": master.num_executors})
        joblog.close()
        save_history(joblog, home, membership.job, master.history)
        record_finished(home or litz_home(), membership.job, {  # next to the history: litzctl list shows it
            "name": membership.job, "app": app.name, "state": master.state, "started": started, "ended": time.time(),
            "tasks_completed": master.tasks_completed, "result": os.path.abspath(output) if output else None,
            "registry": registry_name(membership.kv), "config": config_shown(config)})
        membership.unregister()
        membership.clear()
        master.close()


def save_history(joblog: JobLog, home: str | None, name: str, samples: list[dict]) -> None:
    """Keep the ended job's history for ``litzctl plot``; a failure to write it only warns (the job's result
    matters more)."""
    try:
        joblog.save_history(home or litz_home(), name, samples)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"litz: warning: cannot keep the job's history for litzctl plot: {exc}\n")
