"""Starting one worker or server process: find the job, get its secret, register, serve until told to stop."""
from __future__ import annotations

import os
import signal
import time
from typing import Any

from .appoutput import send_prints_to_stderr
from .endpoint import listen_address
from .errors import LitzError
from .membership import Membership, connect_kv
from .process import batch_scheduling, die_with_parent, tune_malloc


def job_secret(membership: Membership, secret_file: str | None = None, wait_s: float = 10.0) -> str:
    """The job secret: from $LITZ_SECRET, a file, or the job registry (published there by the master, unless it
    was given one itself). ``wait_s``: how long to wait for the master to publish it (right after it registers)."""
    if os.environ.get("LITZ_SECRET"):
        return os.environ["LITZ_SECRET"]
    if secret_file:
        try:
            with open(secret_file) as f:
                secret = f.read().strip()
        except OSError as exc:
            raise LitzError(f"cannot read secret file {secret_file}: {exc.strerror}") from None
        if not secret:
            raise LitzError(f"secret file {secret_file} is empty")
        return secret
    deadline = time.time() + wait_s
    while True:
        secret = membership.get("secret")
        if secret or time.time() >= deadline:
            break
        time.sleep(0.1)
    if not secret:
        raise LitzError(f"job {membership.job!r} keeps its secret out of the registry (its master was given one): "
                        "pass the same --secret-file, or set LITZ_SECRET")
    return secret


def serve(role: str, name: str, *, etcd: Any = None, home: str | None = None,
          secret_file: str | None = None, host: str = "127.0.0.1", bind_host: str | None = None,
          ident: str | None = None, start_timeout: float = 60.0, port: int = 0,
          memory_limit: int | None = None) -> None:
    local = bool(os.environ.get("LITZ_PARENT_PID"))
    if local:
        # not SIGTERM, which asks to drain (below); and SIGHUP at its default first: under `nohup litz run` it
        # arrives ignored (inherited), and the launcher's death would leave this process running
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        die_with_parent(signal.SIGHUP)
        if os.getppid() != int(os.environ["LITZ_PARENT_PID"]):
            return  # the launcher is already gone
        # Ctrl-C reaches the whole process group; the launcher stops the job and says so, once
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    from .server import Server
    from .worker import Worker

    tune_malloc()
    if role == "worker":  # before any thread starts: threads take their creator's policy
        batch_scheduling()
    membership = Membership(connect_kv(etcd, home), name)
    master = membership.wait_master(start_timeout)
    secret = job_secret(membership, secret_file)
    if ident:
        if membership.member(ident) is not None:
            raise LitzError(f"process id {ident!r} is in use by a live process of job {name!r}")
        membership.claim_id(ident)  # a restarted pod may reuse its id
    ident = ident or membership.allocate_id(role)
    cls = Worker if role == "worker" else Server
    # a child of `litz run` (litz.local): every process of its job is on this machine
    listen = listen_address(host, port, os.environ.get("LITZ_LOCAL_DIR") or None)
    proc = cls(ident, membership, secret, listen, bind_host=bind_host)
    # stdout is for the job's result alone (the launcher's, a local job's children share it): app prints go to stderr
    send_prints_to_stderr(proc.output_prefix if role == "worker" else lambda: f"[{ident}] ")
    if role == "server":
        if memory_limit is not None:
            proc.shards.budget = memory_limit
        # SCAR's running checkpoint starts as the initial values (§5.4.2): with priority checkpoints, keep each
        # key's first value. Read from the registry before this server can receive any update, so no
        # message ordering between the master and the workers is assumed.
        proc.running_ckpt.seeding = bool(master.get("running_checkpoint"))
    # SIGTERM (docker stop, Kubernetes without a preStop hook, Slurm preemption): leave gracefully
    signal.signal(signal.SIGTERM, lambda *_: proc.request_drain())
    if local:  # the parent died: the launcher, whose process ran the master, is gone, and the job with it
        signal.signal(signal.SIGHUP, lambda *_: proc.leave_now())
    if role == "worker":  # a kernel compiling in a task (a cold numba cache) shows in the job's status
        from . import kernels

        kernels.watch(proc.compile_notice)
    membership.register(role, ident, {"address": proc.endpoint.address})
    try:
        proc.run(start_timeout)
    finally:
        membership.unregister()
        proc.close()
