"""Master process: hosts the driver, keeps the version counter and the executor/shard placement.

The driver's calls land here (the master is the driver's context). Dispatched tasks are tagged with the
current version and buffered per worker; completions arrive in batches, each one increments the version
before ``handle_task_completion`` runs, so a task dispatched from that handler carries a version higher
than any cached value that might predate the completed task's updates (thesis §4.4).
"""
from __future__ import annotations

import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from . import protocol as P
from .appload import App
from .errors import AppError, InputError, LitzError, app_error
from .joblog import JobLog, check_json
from .membership import Membership
from .process import Process

MEMBERSHIP_CHECK_S = 0.5
STATUS_EVERY_S = 1.0


class Member:
    """What the master knows of one worker or server process."""

    def __init__(self, ident: str, role: str, info: dict):
        self.ident, self.role, self.info = ident, role, info
        self.executors: set[int] = set()
        self.ready: set[int] = set()


class Master(Process):
    role = "master"

    def __init__(self, app: App, membership: Membership, secret: str, *, config: dict,
                 num_executors: int | None, num_shards: int = 0, min_workers: int = 1, min_servers: int = 1,
                 joblog: JobLog | None = None, start_timeout: float = 60.0,
                 supervise: Callable[[], str | None] | None = None, **endpoint: Any):
        super().__init__("master", membership, secret, **endpoint)
        self.app = app
        self.config = config
        self.requested_executors = num_executors
        self.num_executors = 0
        self.requested_shards = num_shards
        self.min_workers, self.min_servers = min_workers, min_servers
        self.joblog = joblog or JobLog(progress=False)
        self.start_timeout = start_timeout
        self.supervise = supervise
        self.workers: dict[str, Member] = {}
        self.servers: dict[str, Member] = {}
        self.executor_owner: list[str] = []
        self.shard_owner: list[str] = []
        self.driver = None
        self.version = 0
        self.next_tid = 0
        self.in_flight = 0
        self.tasks_completed = 0
        self.outbox: dict[str, list] = defaultdict(list)
        self.started = False
        self.finished = False
        self.result: Any = None
        self.state = "starting"
        self._rate_samples: list[tuple[float, int]] = [(time.time(), 0)]

    # -- lifecycle -----------------------------------------------------------------------------------
    def register(self) -> None:
        self.membership.register_master({"address": self.endpoint.address, "app": self.app.name})

    def run(self) -> Any:
        """Start the job, drive it to ``finish()``, and return the result."""
        self.wait_for_members()
        self.place_and_create()
        self.start_driver()
        last_check = last_status = time.time()
        ep = self.endpoint
        while not self.finished:
            if ep.poll(100):
                for sender, msg in ep.drain():
                    self.handle(sender, msg)
                    if self.finished:
                        break
                self.flush_outbox()
                self.check_progress()
            now = time.time()
            if now - last_check > MEMBERSHIP_CHECK_S:
                last_check = now
                self.check_members()
                self.take_requests()
            if now - last_status > STATUS_EVERY_S:
                last_status = now
                self.publish_status()
            self.joblog.show(self.tasks_completed, self.rate(), len(self.workers), len(self.servers))
        self.state = "finished"
        self.joblog.show(self.tasks_completed, self.rate(), len(self.workers), len(self.servers), force=True)
        self.joblog.end_progress()
        return self.result

    def stop_all(self) -> None:
        """Tell every worker and server to exit (best effort: some may already be gone)."""
        for ident in list(self.workers) + list(self.servers):
            try:
                self.send(ident, (P.STOP,))
            except Exception:
                pass

    def wait_for_members(self) -> None:
        deadline = time.time() + self.start_timeout
        ep = self.endpoint
        while len(self.workers) < self.min_workers or len(self.servers) < self.min_servers:
            if ep.poll(100):
                for sender, msg in ep.drain():
                    self.handle(sender, msg)
            self._supervise()
            if time.time() > deadline:
                raise LitzError(f"job did not start: {len(self.workers)} of {self.min_workers} workers and "
                                f"{len(self.servers)} of {self.min_servers} servers joined within "
                                f"{self.start_timeout:.0f} s")

    def place_and_create(self) -> None:
        workers, servers = sorted(self.workers), sorted(self.servers)
        self.num_executors = self.requested_executors or 4 * len(workers)
        num_shards = self.requested_shards or max(64, 8 * len(servers))
        self.shard_owner = [servers[s % len(servers)] for s in range(num_shards)]
        n, w = self.num_executors, len(workers)
        self.executor_owner = [workers[e * w // n] for e in range(n)]  # contiguous, balanced blocks
        shards_msg = (P.SHARDS, num_shards, self.shard_owner)
        for s in servers:
            self.send(s, shards_msg)
        blob = self.app.executor_blob()
        for ident in workers:
            mine = [e for e in range(n) if self.executor_owner[e] == ident]
            self.workers[ident].executors = set(mine)
            self.send(ident, (P.APP, blob, self.config, n))
            self.send(ident, shards_msg)
            self.send(ident, (P.CREATE, mine))
        ep = self.endpoint
        deadline = time.time() + self.start_timeout
        while any(m.ready != m.executors for m in self.workers.values()):
            if ep.poll(100):
                for sender, msg in ep.drain():
                    self.handle(sender, msg)
            self._supervise()
            if time.time() > deadline:
                raise LitzError(f"executors were not ready within {self.start_timeout:.0f} s")

    def start_driver(self) -> None:
        cls = self.app.driver_cls
        driver = cls.__new__(cls)
        driver.config, driver.num_executors, driver._litz = self.config, self.num_executors, self
        self.driver = driver
        self.state = "running"
        self.started = True
        self.joblog.start = time.time()
        self._rate_samples = [(time.time(), 0)]
        try:
            driver.__init__()
            driver.dispatch_initial_tasks()
        except InputError:
            raise
        except Exception:
            raise AppError("driver dispatch_initial_tasks", traceback.format_exc()) from None
        self.flush_outbox()
        self.check_progress()

    # -- messages ------------------------------------------------------------------------------------
    def handle(self, sender: str, msg: tuple) -> None:
        tag = msg[0]
        if tag == P.DONE:
            self.on_done(msg[1])
        elif tag == P.FAIL:
            raise app_error(msg[1], msg[2])
        elif tag == P.HELLO:
            self.on_hello(sender, msg[1], msg[2])
        elif tag == P.READY:
            self.workers[sender].ready.update(msg[1])

    def on_hello(self, ident: str, role: str, info: dict) -> None:
        self.endpoint.connect(ident, info["address"])
        members = self.workers if role == "worker" else self.servers
        members[ident] = Member(ident, role, {**(self.membership.member(ident) or {}), **info})

    def on_done(self, results: list) -> None:
        driver = self.driver
        for _tid, result in results:
            if self.finished:
                return
            self.in_flight -= 1
            self.tasks_completed += 1
            self.version += 1
            try:
                driver.handle_task_completion(result)
            except InputError:
                raise
            except Exception:
                raise AppError("driver handle_task_completion", traceback.format_exc()) from None

    def flush_outbox(self) -> None:
        if self.outbox:
            out, self.outbox = self.outbox, defaultdict(list)
            for worker, tasks in out.items():
                self.send(worker, (P.TASKS, tasks))

    def check_progress(self) -> None:
        if not self.finished and self.in_flight == 0:
            raise LitzError("the driver has no micro-tasks in flight and did not call finish()")

    # -- the driver's context (bound as Driver._litz) ------------------------------------------------
    def dispatch_task(self, executor: int, args: Any) -> None:
        if not isinstance(executor, (int, np.integer)) or not 0 <= executor < self.num_executors:
            raise ValueError(f"dispatch_task: executor must be an int in [0, {self.num_executors}), "
                             f"got {executor!r}")
        executor = int(executor)
        self.outbox[self.executor_owner[executor]].append((self.next_tid, executor, self.version, args))
        self.next_tid += 1
        self.in_flight += 1

    def report(self, metrics: dict, t: float) -> None:
        self.joblog.report(metrics, t, len(self.workers), len(self.servers))

    def finish(self, result: Any) -> None:
        self.result = check_json(result, "finish() result")
        self.finished = True

    # -- membership, requests, status ----------------------------------------------------------------
    def _supervise(self) -> None:
        if self.supervise is not None:
            problem = self.supervise()
            if problem:
                raise LitzError(problem)

    def check_members(self) -> None:
        self._supervise()
        alive = self.membership.members()
        for members in (self.workers, self.servers):
            for ident in list(members):
                if ident not in alive:
                    info = members[ident].info
                    raise LitzError(f"{members[ident].role} {ident} (pid {info.get('pid')} on "
                                    f"{info.get('host')}) was lost and there is no checkpoint to recover from")

    def take_requests(self) -> None:
        for rid, req in self.membership.take_requests():
            command = req.get("command")
            if command == "stop":
                self.joblog.event("stop", requested_by="litzctl")
                self.finish(None)
                self.state = "stopped"
                self.membership.respond(rid, {"ok": True, "message": "job stopping"})
            else:
                self.membership.respond(rid, {"ok": False,
                                              "message": f"this Litz version does not support {command!r} yet"})

    def rate(self) -> float:
        now = time.time()
        samples = self._rate_samples
        if now - samples[-1][0] >= 1.0:
            samples.append((now, self.tasks_completed))
            del samples[:-6]
        t0, c0 = samples[0]
        return (self.tasks_completed - c0) / max(now - t0, 1e-9)

    def status(self) -> dict:
        return {
            "name": self.membership.job, "app": self.app.name, "state": self.state,
            "version": self.version, "tasks_completed": self.tasks_completed,
            "tasks_per_s": round(self.rate(), 1), "elapsed_s": round(self.joblog.elapsed(), 3),
            "executors": self.num_executors, "shards": len(self.shard_owner),
            "report": self.joblog.last_report,
            "workers": [{"id": m.ident, "pid": m.info.get("pid"), "host": m.info.get("host"),
                         "executors": sorted(m.executors)} for m in self.workers.values()],
            "servers": [{"id": m.ident, "pid": m.info.get("pid"), "host": m.info.get("host"),
                         "shards": [s for s, o in enumerate(self.shard_owner) if o == m.ident]}
                        for m in self.servers.values()],
        }

    def publish_status(self) -> None:
        try:
            self.membership.put("status", self.status(), leased=True)
        except Exception:
            pass  # status is advisory; the job goes on
