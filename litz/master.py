"""Master process: hosts the driver, keeps the version counter and the executor/shard placement.

The driver's calls land here (the master is the driver's context). Dispatched tasks are tagged with the
current version and buffered per worker; completions arrive in batches, each one increments the version
before ``handle_task_completion`` runs, so a task dispatched from that handler carries a version higher
than any cached value that might predate the completed task's updates (thesis §4.4).

Elasticity: after any join or leave the master re-plans placement (:mod:`.placement`) and moves
executors and shards while tasks keep running. Tasks dispatched to a moving executor are held here and
follow it; a shard's old server forwards until every worker has the new map.
"""
from __future__ import annotations

import os
import socket
import sys
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from . import clock
from . import protocol as P
from .after import Dependencies
from .appload import App
from .cache import read_only
from .checkpoint import CheckpointStore
from .control import Refusal, RequestVerifier
from .endpoint import listen_host
from .errors import LitzError, RegistryUnavailable, app_code, app_error
from .guard import BadMessage
from .joblog import JobLog, check_json, config_shown
from .kernels import FIRST_RUN, app_kernels, compile_all, preload, watch
from .keys import ShardMap
from .membership import Membership
from .memsched import MemoryScheduler
from .outofcore import parse_bytes
from .owners import Placement
from .placement import ExecutorCosts, Policy, SpeedMeter, leaving_first, make_policy
from .process import Process, plausible_id
from .recovery import CorruptCheckpoint, Recovery, RepeatedWarning, warn
from .stealing import Stealing

MEMBERSHIP_CHECK_S = 0.5
LOSS_CHECK_S = 0.02  # local children's exits and dropped connections: seen at once, not at the next registry read
CONNECTION_GRACE_S = 0.3  # a member's dropped connection not back after this: its process is gone
# A member told to retire that left the registry without its RETIRED message arriving this long after: it died
# while it still held work (killed mid-drain), and the job recovers, instead of taking it for retired.
RETIRED_GRACE_S = 5.0
LAPSE_GRACE_S = 5.0  # a member key missing this long is a lost process: longer than a late keeper's rewrite
WATCH_CONNECTIONS = os.environ.get("LITZ_CONNECTION_WATCH", "1") != "0"  # off: only leases and local children
REQUESTS_CHECK_S = 0.05  # litzctl requests, when no wake-up datagram arrives (see open_wake_socket)
STATUS_EVERY_S = 1.0
REFUSED_WARNINGS = (10.0, 5)  # refused litzctl requests: at most 5 warnings every 10 s, the rest counted
_ANY_EPOCH = (P.HELLO, P.READY)  # messages the master takes whatever epoch they were sent at
HISTORY_SAMPLES = 3600  # an hour of once-a-second samples for litzctl plot
EVENT_STATUS_S = 0.2  # a new event publishes the status this soon (a dashboard shows it within a second)
STATUS_EVENTS = 20  # the latest events in the status, for the dashboard; it fetches the rest on a gap
MAX_FOREIGN_KEYS = 4096  # more keys written elsewhere since a worker's last dispatch: it drops every live entry
# placement "speed" (docs/design.md, "Placement policy"): how often the speeds are offered to the policy (its
# hysteresis: litz.placement.SpeedPolicy), and the completions a worker must have reported before its speed counts
SPEED_CHECK_S = 1.0
SPEED_WINDOW_S = 0.5  # reports pooled this long before they move the EMA (a CPU quota slows in stalls)
SPEED_MIN_TASKS = 4


def open_wake_socket(host: str) -> socket.socket | None:
    """A UDP socket litzctl pings after posting a request, so the master takes it at once instead of at its next
    poll of the registry. The datagram carries nothing but the hint: requests themselves still come only
    through the registry. None if it cannot be bound (the master then polls only)."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, 0, type=socket.SOCK_DGRAM)[0]
        sock = socket.socket(family, socket.SOCK_DGRAM)
        sock.bind(addr)
        sock.setblocking(False)
        return sock
    except OSError:
        return None


def status_sample(st: dict) -> dict:
    """A status reduced to one point of the job's history (litzctl plot, the dashboard's charts)."""
    return {"t": st["elapsed_s"], "tasks_completed": st["tasks_completed"], "tasks_per_s": st["tasks_per_s"],
            "workers": len(st["workers"]), "servers": len(st["servers"]), "report": st["report"],
            "workers_memory": sum(w["memory"] or 0 for w in st["workers"]),
            "servers_memory": sum(s["memory"] or 0 for s in st["servers"])}


class ReadInterrupted(BaseException):
    """A worker or server was lost while the driver waited for a parameter read (docs/design.md, D2): the driver's
    callback is abandoned (a BaseException, so app code does not catch it) and the job recovers from a full
    checkpoint, after which the restored driver reads again."""


class Member:
    """What the master knows of one worker or server process."""

    _joins = 0

    def __init__(self, ident: str, role: str, info: dict):
        self.ident, self.role, self.info = ident, role, info
        Member._joins += 1
        self.joined = Member._joins
        self.id_taken = float(info.get("id_taken") or 0.0)  # when its process took its id: the start order
        self.state = "active"  # active | draining
        self.ready = False  # worker: has the app and created its initial executors
        self.retire_sent = False
        self.gone_since: float | None = None  # told to retire, then left the registry: awaiting its RETIRED
        self.missing_since: float | None = None  # its registry key was first seen missing (R2)
        self.noticed = ""  # once lost: how the master noticed (for the recovery event)
        self.first_map: int | None = None  # worker: first shard-map version it was sent
        self.stats: dict = {}


class ScaleOperation:
    """One scale-out or scale-in, from the first move to the last move (and exit of released processes)."""

    def __init__(self, kind: str, t0: float, processes: list[str]):
        self.kind, self.t0, self.processes = kind, t0, list(processes)
        self.bytes = self.executors_moved = self.shards_moved = 0


class Master(Process):
    role = "master"
    watches_peers = WATCH_CONNECTIONS  # a lost member is noticed by its dropped connection

    def __init__(self, app: App, membership: Membership, secret: str, *, config: dict,
                 num_executors: int | None, num_shards: int = 0, min_workers: int = 1, min_servers: int = 1,
                 joblog: JobLog | None = None, start_timeout: float = 60.0,
                 supervise: Callable[[], list[tuple[str, int, str]]] | None = None,
                 spawn: Callable[[str], Any] | None = None, checkpoint_dir: str | None = None,
                 checkpoint_every: float | None = None, checkpoint_keep: int = 3, resume: bool = False,
                 partial_recovery: bool = False, priority_checkpoint: float | None = None,
                 memory_limit: int | None = None, wake: bool = True, placement: str | Policy = "speed",
                 steal: bool | None = None, **endpoint: Any):
        """``wake``: open the UDP socket litzctl pings (see :func:`open_wake_socket`); without it requests are
        polled only. ``placement``: a policy's name in :data:`litz.placement.POLICIES` (``even``, or ``speed``:
        executors follow the workers' measured speeds) or a policy object. ``steal``: idle workers take executors
        with queued tasks between rebalances (default: where the policy takes steals, as ``speed`` does).
        ``endpoint``: :class:`litz.process.Process`'s listen address arguments."""
        policy = make_policy(placement)
        steals = getattr(policy, "takes_steals", False)
        if steal and not steals:
            raise LitzError("stealing needs --placement speed: a steal moves the quotas the workers' speeds set")
        super().__init__("master", membership, secret, **endpoint)
        # the one owner of the executor and shard maps and the moves in flight (docs/design.md, "Placement policy")
        self.owners = Placement(policy)
        self.meters: dict[str, SpeedMeter] = {}  # worker -> its smoothed time per task (DONE's timing)
        self.executor_costs = ExecutorCosts()  # executor -> its smoothed time per task in its worker (DONE's timing)
        self.speed_check_s = SPEED_CHECK_S
        self.speed_window_s = SPEED_WINDOW_S
        # docs/design.md, "Placement policy": stealing between rebalances
        self.stealing = Stealing(self, policy.threshold) if steals and steal is not False else None
        self.memsched: MemoryScheduler | None = None  # made by the driver's first choose_executor (O2)
        self.app = app
        self.config = config
        self.requested_executors = num_executors
        self.num_executors = 0
        self.requested_shards = num_shards
        self.min_workers, self.min_servers = min_workers, min_servers
        self.joblog = joblog or JobLog(progress=False)
        self.start_timeout = start_timeout
        self.supervise = supervise
        self._dead_children: list[tuple[str, int, str]] = []  # seen by losses_noticed, not yet handled
        self._unreachable: list[str] = []  # members whose connection dropped for good, not yet handled
        self._misbehaving: list[str] = []  # members that flooded the master with malformed messages, not yet handled
        self.refused: set[str] = set()  # ids whose HELLO was refused (another protocol version)
        self.spawn = spawn
        self.workers: dict[str, Member] = {}
        self.servers: dict[str, Member] = {}
        self.addresses: dict[str, str] = {}  # every id that joined -> its latest process's address
        self._outages_logged = 0  # registry outages already in the job's events
        self.map_version = 0
        self.map_dirty = False
        self.last_owned: dict[str, int] = {}  # server -> last map version in which it held a shard
        self.exit_fences: dict[str, list[str]] = {}  # retired server -> the servers it fenced as it exited
        self.copy_sent: set[int] = set()  # COPY_INPUT sent; the others wait for their channel
        self.channel_busy: dict[tuple[str, str], int] = {}  # (source, dest) -> the executor copying or moving on it
        self.copied_ready: dict[int, str] = {}  # copies that arrived during a snapshot: moved once it is written
        self.spawning: list[tuple[str, Any, float]] = []  # (role, process, when): started by scale, not joined
        self.held: dict[int, list] = defaultdict(list)  # tasks for moving executors
        self.operation: ScaleOperation | None = None
        self.deferred_scale: tuple[str, list[str]] | None = None  # asked for while a checkpoint or recovery ran
        self.driver = None
        self.version = 0
        self.next_tid = 0
        self.in_flight = 0
        self.tasks_completed = 0
        self.outbox: dict[str, list] = defaultdict(list)
        # (sender, envelope) received while the driver waited for a parameter read: handled after it, in order (D1)
        self.backlog: deque = deque()
        self.next_read = 0  # request ids of the driver's parameter reads
        self.lost_in_read: list[Member] = []  # lost members found while a read waited: recovered from in full (D2)
        # worker -> keys other workers' completed tasks wrote since its last dispatch (None: any key)
        self.foreign_writes: dict[str, dict | None] = {}
        self.started = False
        self.finished = False
        self.result: Any = None
        self.state = "starting"
        self._rate_samples: list[tuple[float, int]] = [(clock.time(), 0)]
        self.sent_in_flight = 0  # dispatched tasks handed to workers and not completed
        self.paused_tasks: list[tuple] = []  # dispatched while a checkpoint holds dispatch
        self.paused_after: dict[int, tuple] = {}  # task id of a paused task -> the closure it waits for (after=)
        self.after: Dependencies | None = None  # made at the driver's first after= (docs/design.md, A1-A9)
        self.done_seen: dict[str, int] = defaultdict(int)  # worker -> DONE messages handled this epoch (A4)
        self.faults: list[tuple[float, str, int]] = []  # (when, process id, signal) from litzctl kill
        store = CheckpointStore(checkpoint_dir, checkpoint_keep) if checkpoint_dir else None
        self.recovery = Recovery(self, store, checkpoint_every, partial=partial_recovery,
                                 priority=priority_checkpoint)
        self.memory_limit = memory_limit  # per worker, for executor state (out-of-core beyond it)
        self.history: list[dict] = []  # status samples over time, for litzctl plot
        self.events_published = 0  # events in the last published status
        self.compiling: str | None = None  # the numba kernel this process compiles now (litz.kernels)
        self._compiles = [0, 0]  # kernels compile_kernels has started, of how many
        self.resume = resume
        self.wake_host = listen_host(self.listen)
        self.wake = open_wake_socket(endpoint.get("bind_host") or self.wake_host) if wake else None
        # litzctl signs each request for this master (litz.control): one captured under an earlier master of
        # the job (before a --resume) is refused, although this one never saw its nonce
        self.instance = os.urandom(8).hex()
        self.verifier = RequestVerifier(secret, membership.job, self.instance)
        self.refused_requests = RepeatedWarning("refused a request", *REFUSED_WARNINGS)

    # -- the maps: read here and by the simulator and tests, written only by self.owners (litz/owners.py) ---------
    @property
    def executor_owner(self) -> tuple[str, ...]:
        return self.owners.executor_owner

    @property
    def shard_owner(self) -> tuple[str, ...]:
        return self.owners.shard_owner

    @property
    def moving_executors(self) -> Mapping[int, str]:
        return self.owners.moving_executors

    @property
    def copying_input(self) -> Mapping[int, str]:
        """Scale-out moves whose input data is on its way (eid -> dest), while the executor keeps running."""
        return self.owners.copying_input

    @property
    def moving_shards(self) -> Mapping[int, str]:
        return self.owners.moving_shards

    @property
    def placement(self) -> str:
        """The placement policy's name (the status shows it)."""
        return self.owners.policy.name

    # -- lifecycle -----------------------------------------------------------------------------------
    def register(self) -> None:
        info = {"address": self.endpoint.address, "app": self.app.name, "instance": self.instance,
                # servers read this as they start, so they keep every key's first value from the first update
                "running_checkpoint": self.recovery.priority is not None, "config": config_shown(self.config)}
        if self.wake is not None:
            info["wake"] = [self.wake_host, self.wake.getsockname()[1]]
        self.membership.register_master(info)

    def woken(self) -> bool:
        """True if litzctl pinged since the last call (datagrams are read and dropped: they only say 'look')."""
        pinged = False
        while True:
            try:
                self.wake.recv(64)
                pinged = True
            except (BlockingIOError, InterruptedError):
                return pinged
            except OSError:  # e.g. ICMP errors reported on the socket: nothing to read
                return pinged

    def close(self) -> None:
        if self.wake is not None:
            self.wake.close()
        super().close()

    def run(self) -> Any:
        """Start the job, drive it to ``finish()``, and return the result."""
        self.wait_for_members()
        if self.finished:
            pass  # stopped by litzctl while it waited: nothing was started
        elif self.resume:
            self.resume_job()
        else:
            self.recovery.start_fresh()
            self.place_and_create()
            try:
                self.start_driver()
            except ReadInterrupted:
                self.recover_interrupted_read()
        last_check = last_status = last_requests = last_losses = last_speeds = clock.time()
        wake_fd = self.wake.fileno() if self.wake is not None else None
        fds = () if wake_fd is None else (wake_fd,)
        while not self.finished:
            messages, ready = self.endpoint.wait(0 if self.backlog else 100, fds)
            if messages or self.backlog:
                try:
                    for sender, msg in self.receive():
                        self.handle_message(sender, msg)
                        if self.finished:
                            break
                except ReadInterrupted:
                    self.recover_interrupted_read()
                self.after_batch()
            now = clock.time()
            losses = False
            if now - last_losses > LOSS_CHECK_S:
                last_losses = now
                losses = self.losses_noticed()
            if losses or now - last_check > MEMBERSHIP_CHECK_S:
                last_check = now
                try:
                    self.check_members()
                except ReadInterrupted:  # a read of a completion handled during a partial recovery
                    self.recover_interrupted_read()
                self.inject_faults()
                self.after_batch()
            if (wake_fd in ready and self.woken()) or now - last_requests > REQUESTS_CHECK_S:
                last_requests = now
                try:
                    self.take_requests()
                except RegistryUnavailable:
                    pass  # litzctl cannot reach the registry either; its requests wait there (R1)
                self.after_batch()
            if now - last_status > STATUS_EVERY_S or (len(self.joblog.events) != self.events_published
                                                       and now - last_status > EVENT_STATUS_S):
                last_status = now
                self.publish_status()
            if self.owners.policy.uses_speeds and now - last_speeds > self.speed_check_s:
                last_speeds = now
                self.rebalance_for_speed()
                self.after_batch()
            self.show_progress()
        self.state = "finished" if self.state == "running" else self.state
        self.recovery.failures.settle()  # checkpoint failures and refused requests counted and not told yet
        self.refused_requests.settle()
        self.joblog.ended = True  # no ETA on the last line: a total that was an upper bound stays unreached
        self.show_progress(force=True)
        self.joblog.end_progress(self.state)
        return self.result

    def after_batch(self) -> None:
        if self.map_dirty:
            self.broadcast_map()
        self.check_retirements()
        self.recovery.tick()
        self.flush_outbox()
        if self.stealing is not None:
            self.stealing.tick()
        if self.started:
            self.check_progress()

    def receive(self):
        """Messages of the current epoch, and any HELLO (a new process starts at epoch 0) or READY (a worker that
        joined during a recovery that then started over answers at the older epoch; having the app outlives a
        restore, which resets executors anyway: docs/design.md, M2). What a driver read set aside comes first, in
        the order it arrived; once a read (while a message is handled) sets messages aside, the ones still to be
        drained are newer, and go behind them (D1)."""
        backlog = self.backlog
        while True:
            while backlog:
                sender, envelope = backlog.popleft()
                msg = self.admit(sender, envelope)
                if msg is not None and (envelope[0] >= self.epoch or msg[0] in _ANY_EPOCH):
                    yield sender, msg
            for sender, envelope in self.endpoint.drain():
                if backlog:
                    backlog.append((sender, envelope))
                    continue
                msg = self.admit(sender, envelope)
                if msg is not None and (envelope[0] >= self.epoch or msg[0] in _ANY_EPOCH):
                    yield sender, msg
            if not backlog:
                return

    def admit(self, sender: str, envelope: Any) -> tuple | None:
        """As :meth:`Process.admit`, but a HELLO of another protocol version is refused first, whatever else it
        holds: its layout may differ from this version's."""
        msg = envelope[1] if type(envelope) is tuple and len(envelope) == 2 else None
        if type(msg) is tuple and msg and type(msg[0]) is str and msg[0] == P.HELLO:
            version = msg[1] if len(msg) > 1 else None
            if type(version) is not int or version != P.VERSION:
                self.refuse_hello(sender, version)
                return None
        return super().admit(sender, envelope)

    def stranger(self, sender: str, msg: tuple) -> tuple[str, str] | None:
        """A sender is a member if it said HELLO (the registry is read as the HELLO is handled); one lost or
        retired since is still one (its last messages may arrive late, and the handlers know what to ignore)."""
        if sender in self.addresses:
            self.peers_ok.add(sender)
            return None
        if msg[0] == P.HELLO:
            return None
        return "not a member of the job", ""

    def refuse_hello(self, ident: str, version: Any) -> None:
        """A process of another protocol version: refuse it with a line on both sides, and take it out of the
        registry, which stops it even if it cannot read the refusal (a version before REFUSED existed)."""
        entry = self.membership.member(ident) if plausible_id(ident) and ident not in self.refused else None
        if entry is None or type(entry.get("address")) is not str:
            self.endpoint.guard.refuse(ident, "HELLO of another protocol version", repr(version)[:40])
            return
        self.refused.add(ident)
        theirs = f"version {version}" if type(version) is int else "without a version (an older Litz)"
        role = entry.get("role", "process")
        sys.stderr.write(f"litz: master: refused {role} {ident} (pid {entry.get('pid')} on {entry.get('host')}): it "
                         f"speaks Litz protocol {theirs}, this master version {P.VERSION}\n")
        why = (f"the master of job {self.membership.job!r} refused {role} {ident}: this process speaks Litz protocol "
               f"version {version}, the master version {P.VERSION}; run the same Litz version on every machine")
        try:
            self.endpoint.connect(ident, entry["address"], watch=False)
            self.send(ident, (P.REFUSED, why))
        except Exception as exc:  # an address this version cannot reach: taken out of the registry, it stops anyway
            warn(f"cannot send {ident} its refusal ({type(exc).__name__}: {exc})")
        self.membership.evict(ident)

    def offender(self, peer: str) -> bool:
        """A member that floods the master with malformed messages is broken, and some of what it sent is lost:
        it is treated as lost (the job recovers without it, or stops with a clear error), never heard again.
        Anyone else is cut off for a while."""
        if peer in self.workers or peer in self.servers:
            self._misbehaving.append(peer)
        return self.endpoint.cut_off(peer)

    def pump(self, timeout_s: float) -> None:
        """Handle whatever arrives within ``timeout_s`` (used while waiting for something specific)."""
        if self.backlog or self.endpoint.poll(timeout_s * 1000):
            for sender, msg in self.receive():
                self.handle_message(sender, msg)

    def stop_all(self) -> None:
        """Tell every worker and server to exit (best effort: some may already be gone)."""
        for ident in list(self.workers) + list(self.servers):
            try:
                self.send(ident, (P.STOP,))
            except Exception:
                pass

    def _pump(self, until: Callable[[], bool], what: Callable[[], str], doing: Callable[[], str]) -> None:
        """Handle messages until ``until()``; ``what()`` says why if it times out, ``doing()`` is the progress
        line's phase meanwhile (a job loading its input shows so, not nothing)."""
        deadline = clock.time() + self.start_timeout
        while not until():
            self.joblog.show(self.tasks_completed, 0.0, len(self.workers), len(self.servers), phase=doing())
            self.pump(0.1)
            dead = self.supervise() if self.supervise else []
            if dead:
                raise LitzError("; ".join(f"{role} process {pid} {how}" for role, pid, how in dead))
            if clock.time() > deadline:
                raise LitzError(what())

    def wait_for_members(self) -> None:
        """Wait for the first workers and servers; meanwhile the status says what is missing, and litzctl stop
        ends the job at once (:meth:`take_requests`)."""
        self.state = "waiting"
        last_status = last_requests = -float("inf")

        def started() -> bool:
            nonlocal last_status, last_requests
            if len(self.workers) >= self.min_workers and len(self.servers) >= self.min_servers:
                return True
            now = clock.time()
            if now - last_status >= STATUS_EVERY_S:
                last_status = now
                self.publish_status()
            if (self.wake is not None and self.woken()) or now - last_requests > REQUESTS_CHECK_S:
                last_requests = now
                try:
                    self.take_requests()
                except RegistryUnavailable:
                    pass  # they wait in the registry (R1)
            return self.finished

        self._pump(started, lambda: f"job did not start: {len(self.workers)} of {self.min_workers} workers and "
                                    f"{len(self.servers)} of {self.min_servers} servers joined within "
                                    f"{self.start_timeout:.0f} s",
                   lambda: f"starting: {len(self.workers)} of {self.min_workers} workers and {len(self.servers)} of "
                           f"{self.min_servers} servers joined")
        if not self.finished:
            self.state = "starting"

    def waiting_for(self) -> str:
        """What a job that has not started waits for: 'waiting for 1 server (have 0)'."""
        missing = [f"{need} {role}{'s' * (need > 1)} (have {have})"
                   for role, need, have in (("worker", self.min_workers, len(self.workers)),
                                            ("server", self.min_servers, len(self.servers))) if have < need]
        return "waiting for " + " and ".join(missing) if missing else "starting"

    def place_and_create(self, create: bool = True) -> None:
        workers, servers = sorted(self.workers), sorted(self.servers)
        self.num_executors = self.requested_executors or 4 * len(workers)
        num_shards = self.requested_shards or max(64, 8 * len(servers))
        self.owners.place(workers, servers, self.num_executors, num_shards)
        for s in servers:
            self.last_owned[s] = 0
        for s in servers:
            self.send(s, self.map_message())
        for ident in workers:
            self.join_worker(ident, self.owners.executors_of(ident) if create else [])
        self._pump(lambda: all(m.ready for m in self.workers.values()),
                   lambda: f"executors were not ready within {self.start_timeout:.0f} s",
                   lambda: f"starting: loading input ({sum(m.ready for m in self.workers.values())} of "
                           f"{len(self.workers)} workers ready)")

    def join_worker(self, ident: str, executors: list[int]) -> None:
        member = self.workers[ident]
        # with a shard move just done (map_dirty) the map it is sent already is the next version's: a server
        # that owned shards only until this version never was in its map, and must not wait for its fence
        member.first_map = self.map_version + 1 if self.map_dirty else self.map_version
        # a worker forked from this launcher has the class already (by token): no need to pickle or send it
        blob = None if self.app.token in member.info.get("app_tokens", ()) else self.app.executor_blob()
        self.send(ident, (P.APP, blob, self.app.token, self.config, self.num_executors))
        self.send(ident, (P.MEMORY_LIMIT, self.memory_limit))
        self.send(ident, self.map_message())
        self.send(ident, (P.CREATE, executors))

    def map_message(self) -> tuple:
        return (P.SHARDS, len(self.shard_owner), self.shard_owner, self.map_version)

    def start_driver(self) -> None:
        cls = self.app.driver_cls
        driver = cls.__new__(cls)
        driver.config, driver.num_executors, driver._litz = self.config, self.num_executors, self
        self.driver = driver
        self.state = "running"
        self.started = True
        self.joblog.start = clock.time()
        self._rate_samples = [(clock.time(), 0)]
        with app_code("driver dispatch_initial_tasks"):
            driver.__init__()
            driver.dispatch_initial_tasks()
        self.flush_outbox()
        self.check_progress()
        self.rebalance("scale_out", [])  # workers that joined between placement and start

    def resume_job(self) -> None:
        """Continue a job from the latest complete checkpoint in --checkpoint-dir (--resume)."""
        checkpoints = self.recovery.usable(any_run=True)
        if not checkpoints:
            where = self.recovery.store.root if self.recovery.store else "(no --checkpoint-dir given)"
            raise LitzError(f"--resume: no complete checkpoint in {where}")
        self.requested_executors = checkpoints[0].manifest["num_executors"]
        self.requested_shards = checkpoints[0].manifest["num_shards"]
        self.place_and_create(create=False)
        t0 = clock.time()
        while True:
            try:
                self.recovery.restore(checkpoints[0])
                break
            except CorruptCheckpoint as exc:
                warn(f"checkpoint {checkpoints[0].path} cannot be restored ({exc}); trying the previous one")
                checkpoints = checkpoints[1:]
                if not checkpoints:
                    raise LitzError(f"--resume: no checkpoint could be restored: {exc}") from None
        self.recovery.store.adopt(checkpoints[0])  # a failure before this run's first checkpoint goes back to it
        self.joblog.event("resume", checkpoint=checkpoints[0].path, seq=checkpoints[0].seq,
                          duration_s=round(clock.time() - t0, 4), tasks_completed=self.tasks_completed)
        self.flush_outbox()

    def reset_for_restore(self, num_executors: int, num_shards: int) -> None:
        """Forget every task, move and hold of the previous epoch (the processes forget theirs)."""
        self.num_executors = num_executors
        self.owners.clear_moves()
        self.copy_sent.clear()
        self.channel_busy.clear()
        self.copied_ready.clear()
        self.held.clear()
        self.paused_tasks.clear()
        self.paused_after.clear()
        self.done_seen.clear()
        if self.after is not None:
            self.after.reset()
        self.outbox.clear()
        self.foreign_writes.clear()  # the workers start with empty caches
        self.exit_fences.clear()  # and the servers with no forwards and no fences
        self.operation = None
        self.map_dirty = False
        self.in_flight = self.sent_in_flight = 0
        self.started = False
        if self.stealing is not None:
            self.stealing.reset()
        if self.memsched is not None:
            self.memsched.reset(num_executors)
        for member in (*self.workers.values(), *self.servers.values()):
            member.retire_sent = False

    def restore_driver(self, state: dict) -> None:
        driver = state["driver"]
        driver.config, driver.num_executors, driver._litz = self.config, self.num_executors, self
        self.driver = driver
        self.version = max(self.version, state["version"]) + 1
        self.tasks_completed = state["tasks_completed"]
        self.next_tid = max(self.next_tid, state.get("next_tid", 0))  # ids the restored driver holds stay unique
        self.started = True
        self.state = "running"
        for held in state["held"]:  # (tid, eid, args, closure): again under its id, after the same tasks (A6)
            if len(held) == 2:
                self.dispatch_task(*held)
            else:
                self.dispatch_task(held[1], held[2], after=held[3] or None, tid=held[0])

    # -- messages ------------------------------------------------------------------------------------
    def handle(self, sender: str, msg: tuple) -> None:
        tag = msg[0]
        if tag == P.DONE:
            self.done_seen[sender] += 1  # told back on TASKS: the worker may forget these tasks (A4)
            if not all(type(r) is tuple and len(r) == 2 for r in msg[1]):  # never the driver's fault: checked first
                raise BadMessage("DONE with a result that is not a (task id, result) pair")
            per_executor = None
            if len(msg) > 3:  # how long the batch's tasks ran: the worker's speed
                timing = msg[3]
                if (len(timing) != 4 or not all(isinstance(x, (int, float)) for x in timing[:3])
                        or not self.valid_executor_timing(timing[3])):
                    raise BadMessage("DONE with a timing that is not (tasks, wall s, cpu s, {executor: (tasks, "
                                     "ran s, cpu s)})")
                meter = self.meters.get(sender)
                if meter is None:
                    meter = self.meters[sender] = SpeedMeter(window_s=self.speed_window_s, warmup=1)
                    if sender in self.workers:
                        meter.limit(self.workers[sender].stats.get("cpu_limit"))
                meter.add(*timing[:3], clock.time())
                self.executor_costs.add(timing[3])
                per_executor = timing[3]
            self.note_writes(sender, msg[2])  # before the driver dispatches anything behind these completions
            if self.after is not None and self.after.destinations:
                self.after.note_written(msg[1], msg[2])
            if self.memsched is not None:
                self.memsched.done(msg[1])
            self.on_done(msg[1], per_executor, (sender, self.done_seen[sender]))
        elif tag == P.STATS:
            member = self.workers.get(sender) or self.servers.get(sender)
            if member is not None:
                member.stats = msg[1]
                if sender in self.meters:
                    self.meters[sender].limit(msg[1].get("cpu_limit"))
                self.on_compile_notice(sender, msg[1])
        elif tag == P.MOVED:
            self.on_executor_moved(sender, msg[1], msg[2])
        elif tag == P.INPUT_READY:
            self.on_input_copied(sender, msg[1])
        elif tag == P.SHARD_MOVED:
            self.on_shard_moved(sender, msg[1], msg[2])
        elif tag == P.RETIRED:
            self.on_retired(sender, msg[1] if len(msg) > 1 else ())
        elif tag == P.DRAIN_ME:
            member = self.workers.get(sender) or self.servers.get(sender)
            if member is not None and member.state == "active":
                try:
                    self.drain([sender])
                except LitzError as exc:
                    self.send(sender, (P.DRAIN_REFUSED, str(exc)))
        elif tag == P.CHECKPOINTED:
            self.recovery.on_part(sender, msg[1], None)
        elif tag == P.CHECKPOINT_FAILED:
            self.recovery.on_part(sender, None, msg[1])
        elif tag == P.RESTORED:
            self.recovery.on_restored(sender, None)
        elif tag == P.RESTORE_FAILED:
            self.recovery.on_restored(sender, msg[1])
        elif tag == P.MEMORY_EVENT:
            self.joblog.event(msg[1], worker=sender, executor=msg[2], bytes=msg[3], seconds=msg[4])
            if self.memsched is not None:
                self.memsched.memory_event(msg[1], msg[2])
        elif tag == P.PRIORITY_DISTANCES:
            self.recovery.on_priority_distances(sender, msg[1], msg[2])
        elif tag == P.PRIORITY_SAVED:
            self.recovery.on_priority_saved(sender, tuple(msg[1:5]), msg[5])
        elif tag == P.FAIL:
            raise app_error(msg[1], msg[2])
        elif tag == P.HELD_BACK:
            if self.after is not None:
                self.after.given_back(msg[1])
        elif tag == P.VALUES:
            pass  # a late answer to a driver read that a loss interrupted (D2)
        elif tag == P.HELLO:
            self.on_hello(sender, msg[2], msg[3])
        elif tag == P.READY:
            if sender not in self.workers:
                return
            self.workers[sender].ready = True
            if self.started and not self.recovery.paused:
                self.rebalance("scale_out", [sender])
        else:
            raise BadMessage("unexpected tag", repr(tag))  # the shapes let none through

    def on_hello(self, ident: str, role: str, info: dict) -> None:
        try:
            registered, id_taken = self.membership.member(ident), self.membership.get(f"ids/{ident}")
        except RegistryUnavailable:  # it registered a moment ago, and holds the job key: take it (R1)
            registered, id_taken = {"role": role}, None
        if role not in ("worker", "server") or registered is None or registered.get("role") != role:
            raise BadMessage("HELLO from a process not registered in the job", f"{role!r:.20}")
        if type(info.get("address")) is not str:
            raise BadMessage("HELLO without an address")
        if ident in self.refused:  # of another version before, of this one now: its connection is not watched
            self.refused.discard(ident)
            self.endpoint.disconnect(ident)
        self.endpoint.connect(ident, info["address"])  # watched (watches_peers), maybe made already
        if self.addresses.get(ident, info["address"]) != info["address"]:
            # an id seen before (a container restarted with its --id): connections to the old process are dead
            for peer in [*self.workers, *self.servers]:
                if peer != ident:
                    self.send(peer, (P.PEER, ident, info["address"]))
        self.addresses[ident] = info["address"]
        members = self.workers if role == "worker" else self.servers
        members[ident] = Member(ident, role, {**registered, **info, "id_taken": id_taken})
        if isinstance(info.get("stats"), dict):  # its memory from the first --metrics row on, not after a second
            members[ident].stats = info["stats"]
        self.membership.note_ids([ident])
        pid = members[ident].info.get("pid")
        self.spawning = [s for s in self.spawning if getattr(s[1], "pid", None) != pid]
        if not self.executor_owner:
            return  # placement not made yet: the newcomer is part of the initial one
        if role == "worker":
            self.join_worker(ident, [])
        else:
            self.last_owned[ident] = self.map_version
            self.send(ident, self.map_message())
            if not self.recovery.paused:
                self.rebalance("scale_out", [ident])

    def on_done(self, results: list, per_executor: dict | None = None, origin: tuple[str, int] | None = None) -> None:
        """``per_executor``: the DONE's timing per executor, whose first field counts its completions here;
        ``origin``: the worker and the number of its DONE message (A4, A9)."""
        driver = self.driver
        if self.stealing is not None:
            self.stealing.done(results, per_executor)
        after = self.after
        with app_code("driver handle_task_completion"):  # once for the batch: this runs for every task
            for tid, result in results:
                if after is not None and after.parks(tid, result, origin):
                    continue  # a closure task on another worker has not completed yet: it comes first (A9)
                ready = [(tid, result, None)]
                while ready:
                    tid, result, parked_from = ready.pop()
                    if self.finished:
                        return
                    if parked_from is not None:
                        after.settled(parked_from)
                    self.in_flight -= 1
                    self.sent_in_flight -= 1
                    self.tasks_completed += 1
                    self.version += 1
                    if after is not None:
                        after.completed(tid)
                        if after.ready:  # completions parked for this one, in the order they came
                            ready.extend(reversed(after.take_ready()))
                    driver.handle_task_completion(result)

    def on_partial_recovery(self, info: dict) -> bool | None:
        with app_code("driver handle_partial_recovery"):
            return self.driver.handle_partial_recovery(info)

    def note_writes(self, writer: str, keys: Any) -> None:
        """Completions from ``writer`` wrote ``keys`` (None: any): the other workers' caches must hear of it
        before their next task (see :class:`litz.cache.ParamCache`, live entries)."""
        if keys is not None and not keys:
            return
        foreign = self.foreign_writes
        for worker in self.workers:
            if worker == writer:
                continue
            pending = foreign.get(worker, ())
            if pending is None:
                continue
            if keys is None or len(pending) + len(keys) > MAX_FOREIGN_KEYS:
                foreign[worker] = None
            elif pending:
                pending.update(dict.fromkeys(keys))
            else:
                foreign[worker] = dict.fromkeys(keys)  # a dict, not a set: the keys go out in the order written

    def flush_outbox(self) -> None:
        if self.after is not None:
            self.flush_outbox_after()
            return
        if self.outbox:
            out, self.outbox = self.outbox, defaultdict(list)
            foreign = self.foreign_writes
            for worker, tasks in out.items():
                if self.stealing is not None:
                    self.stealing.sent(tasks)
                written = foreign.pop(worker, ())
                self.send(worker, (P.TASKS, tasks, None if written is None else list(written)))
            if self.memsched is not None and self.memsched.hints:
                self.send_prefetch_hints()

    def flush_outbox_after(self) -> None:
        """flush_outbox once the driver has used after=: TASKS also carry the DONE count (A4) and the tasks sent
        ahead, with their closures (A1)."""
        after = self.after
        if not self.outbox and not after.has_news():
            return
        out, self.outbox = self.outbox, defaultdict(list)
        foreign = self.foreign_writes
        for worker in list(dict.fromkeys([*out, *after.ahead, *after.handoffs, *after.relays])):
            tasks, (early, handoffs, relayed) = out.get(worker, []), after.take_ahead(worker)
            if self.stealing is not None:
                self.stealing.sent(tasks + early)
            written = foreign.pop(worker, ())
            seen = after.handled(worker, self.done_seen[worker])  # A4 (a DONE with a completion parked: not yet, A9)
            msg = (P.TASKS, tasks, None if written is None else list(written), seen, early)
            self.send(worker, (*msg, handoffs, relayed) if handoffs or relayed else msg)
        if self.memsched is not None and self.memsched.hints:
            self.send_prefetch_hints()

    def check_progress(self) -> None:
        if not self.finished and self.in_flight == 0:
            raise LitzError("the driver has no micro-tasks in flight and did not call finish()")

    # -- the driver's context (bound as Driver._litz) ------------------------------------------------
    def dispatch_task(self, executor: int, args: Any, after: Any = None, tid: int | None = None) -> int:
        """``tid``: a restore dispatches a checkpoint's held task again under its id (A6)."""
        if not isinstance(executor, (int, np.integer)) or not 0 <= executor < self.num_executors:
            raise ValueError(f"dispatch_task: executor must be an int in [0, {self.num_executors}), "
                             f"got {executor!r}")
        eid = int(executor)
        if after is not None and self.after is None:
            self.after = Dependencies(self)  # before this task counts: the ones in flight now are the early ones
        # the id names the executor too (id % executors): the stealing extension counts a DONE's tasks per executor
        # with no table of ids
        if tid is None:
            tid = self.next_tid * self.num_executors + eid
            self.next_tid += 1
        task = (tid, eid, self.version, args)
        self.in_flight += 1
        if self.memsched is not None:
            self.memsched.dispatched(task[0], eid)
        if self.after is not None:
            self.after.dispatch(task, [after] if isinstance(after, (int, np.integer)) else after)
            return tid
        if self.recovery.paused:
            self.paused_tasks.append(task)  # a checkpoint is being taken: part of it, sent after it
        else:
            self.route(task)
        return tid

    def choose_executor(self, executors: Iterable[int]) -> int:
        """``Driver.choose_executor``: the candidate cheapest to run a task on now (docs/design.md, O1-O3); a spilled
        one to prefetch behind it goes out with the next dispatch to that worker."""
        eids = []
        for executor in executors:
            if not isinstance(executor, (int, np.integer)) or not 0 <= executor < self.num_executors:
                raise ValueError(f"choose_executor: executors must be ints in [0, {self.num_executors}), "
                                 f"got {executor!r}")
            eids.append(int(executor))
        if self.memsched is None:
            self.memsched = MemoryScheduler(self.num_executors)
        moving = self.moving_executors
        eid, hint = self.memsched.choose(eids, lambda e: moving.get(e) or self.executor_owner[e],
                                         self.speeds(sustained=False))
        if hint is not None and not self.recovery.paused and eid not in moving:
            self.memsched.hints[self.executor_owner[eid]] = (hint, eid)
        return eid

    def send_prefetch_hints(self) -> None:
        """Behind the TASKS just sent (O3): each worker's hinted executor, if it is still there."""
        for worker, (eid, chosen) in self.memsched.take_hints().items():
            if self.executor_owner[eid] == worker and eid not in self.moving_executors and worker in self.workers:
                self.send(worker, (P.PREFETCH, eid, chosen))

    def driver_get_many(self, keys: list) -> list:
        """The driver's ``ps_get_many``: each key's value from the server of its shard in this master's map, read-only,
        or None for a key nobody updated. Nothing else is handled until every value is here (docs/design.md, D1); a
        loss meanwhile raises :class:`ReadInterrupted` (D2)."""
        if not self.started or self.finished or not self.shard_owner:
            raise LitzError("ps_get: the driver can read parameters only while the job runs")
        shards = ShardMap(len(self.shard_owner), self.shard_owner)
        by_server: dict[str, list] = defaultdict(list)
        want: dict[int, int] = {}  # request id -> index in keys
        for i, key in enumerate(keys):
            shard = shards.shard(key)  # a bad key fails here, in the driver's own call
            want[self.next_read] = i
            by_server[self.shard_owner[shard]].append((self.next_read, shard, key))
            self.next_read += 1
        for server, items in by_server.items():
            self.send(server, (P.GETS, items))
        values: list = [None] * len(keys)
        last_check = clock.time()
        while want:
            if self.endpoint.poll(LOSS_CHECK_S * 1000):
                for sender, envelope in self.endpoint.drain():
                    msg = envelope[1] if type(envelope) is tuple and len(envelope) == 2 else None
                    if type(msg) is not tuple or not msg or msg[0] != P.VALUES:
                        self.backlog.append((sender, envelope))  # handled after the driver's callback, in order
                        continue
                    if self.admit(sender, envelope) is None:
                        continue
                    for item in msg[1]:
                        i = want.pop(item[0], None) if type(item) is tuple and len(item) == 2 else None
                        if i is not None:
                            values[i] = read_only(item[1])
            now = clock.time()
            if want and (self.losses_noticed() or now - last_check > MEMBERSHIP_CHECK_S):
                last_check = now
                lost = self.find_lost()
                if lost:
                    self.lost_in_read.extend(lost)
                    raise ReadInterrupted()
        return values

    def recover_interrupted_read(self) -> None:
        """A loss interrupted a driver read: recover from a full checkpoint, whose driver reads again (D2)."""
        while True:
            try:
                self.check_members()
                return
            except ReadInterrupted:  # another loss, during a read of a completion the recovery handled
                continue

    def route(self, task: tuple) -> None:
        eid = task[1]
        if eid in self.moving_executors:
            self.held[eid].append(task)  # follows the executor once it has arrived
        else:
            self.outbox[self.executor_owner[eid]].append(task)
            self.sent_in_flight += 1

    def release_paused(self) -> None:
        tasks, self.paused_tasks = self.paused_tasks, []
        for task in tasks:
            if self.after is not None:
                self.after.unpause(task)
            else:
                self.route(task)
        self.flush_outbox()

    def held_for_checkpoint(self) -> list[tuple]:
        """Tasks dispatched and not sent, for a checkpoint: ``(tid, eid, args, closure)`` (A6)."""
        if self.after is not None:
            return self.after.held_tasks()
        return [(tid, eid, args, ()) for tid, eid, _, args in self.paused_tasks]

    def quiet(self) -> bool:
        """No dispatched task unfinished and nothing moving: the state is a consistent cut."""
        return (self.sent_in_flight == 0 and not self.moving_executors and not self.moving_shards
                and not self.map_dirty)

    def report(self, metrics: dict, t: float) -> None:
        memory = {"workers_rss": sum(m.stats.get("rss") or 0 for m in self.workers.values()),
                  "servers_rss": sum(m.stats.get("rss") or 0 for m in self.servers.values()),
                  "executor_state_bytes": sum(m.stats.get("state_bytes") or 0 for m in self.workers.values()),
                  "evicted_executors": sum(len(m.stats.get("evicted") or ()) for m in self.workers.values())}
        self.joblog.report(metrics, t, len(self.workers), len(self.servers), memory)

    def set_total(self, total: float, unit: str) -> None:
        self.joblog.set_total(total, unit)

    def finish(self, result: Any) -> None:
        self.result = check_json(result, "finish() result")
        self.finished = True

    def executor_speed(self, executor: int) -> float | None:
        """``Driver.executor_speed``: the measured speed of the worker that holds ``executor`` (the destination of a
        move under way) divided by the executors it holds so; None before that worker's speed counts."""
        if not isinstance(executor, (int, np.integer)) or not 0 <= executor < self.num_executors:
            raise ValueError(f"executor_speed: executor must be an int in [0, {self.num_executors}), "
                             f"got {executor!r}")
        if len(self.executor_owner) != self.num_executors:  # not placed yet (or being re-placed by a recovery)
            return None
        where, held = self.owners.destinations()
        worker = where[int(executor)]
        speed = self.speeds().get(worker)
        return None if speed is None else speed / held[worker]

    def num_workers(self) -> int:
        """``Driver.num_workers``: the workers that are not draining."""
        return sum(1 for m in self.workers.values() if m.state != "draining")

    # -- elasticity ----------------------------------------------------------------------------------
    def rebalance(self, kind: str, processes: list[str]) -> None:
        """Plan and start the moves that spread executors and shards over the active processes."""
        if not self.started or self.recovery.in_progress is not None or self.recovery.restoring is not None:
            # a recovery that joins newcomers (replacements) balances once it is done, a checkpoint when it is
            # written; what was asked for meanwhile keeps its kind (a drain is a scale-in) and its processes
            if self.started and (processes or kind == "scale_in"):
                self.deferred_scale = self._with_deferred(kind, processes)
            return
        kind, processes = self._with_deferred(kind, processes)
        self.deferred_scale = None
        self.flush_outbox()  # tasks already dispatched must reach a source before its move order
        for eid, dest in list(self.copied_ready.items()):
            self.on_input_copied(dest, eid)
        self.start_copies()  # calls off copies to processes that are leaving before planning
        ex_moves, shard_moves = self.plan()
        if ex_moves or shard_moves or kind == "scale_in":
            if self.operation is None:
                self.operation = ScaleOperation(kind, clock.time(), processes)
            else:
                self.operation.processes.extend(processes)
                if self.operation.kind == "rebalance":  # a scale asked for during a rebalance: logged as the scale
                    self.operation.kind = kind
        draining = {m.ident for m in self.workers.values() if m.state == "draining"}
        for eid, src, dest in ex_moves:
            # leaving: its input data is dropped and re-loaded at the destination; else the input data first, from
            # memory, while the executor keeps running; then the executor
            self.owners.start_executor_move(eid, dest, copy_input=src not in draining)
            if src in draining:
                self.send(src, (P.MOVE_EXECUTOR, eid, dest, False, False))
        self.start_copies()
        for shard, src, dest in shard_moves:
            self.owners.start_shard_move(shard, dest)
            self.send(src, (P.MOVE_SHARD, shard, dest))
        self.check_retirements()
        self.maybe_end_operation()

    def _with_deferred(self, kind: str, processes: list[str]) -> tuple[str, list[str]]:
        """This request merged with the one deferred before it: a scale-in if either was one."""
        if self.deferred_scale is None:
            return kind, processes
        earlier_kind, earlier = self.deferred_scale
        return ("scale_in" if "scale_in" in (kind, earlier_kind) else kind,
                earlier + [p for p in processes if p not in earlier])

    def start_copies(self) -> bool:
        """Send the input of waiting scale-out moves, one executor at a time per (source, dest) pair.

        A pair's messages share one ordered channel: had every input been sent at once, the first executor's
        state would queue behind the others' input data, and stall. Copies to a destination that is leaving
        are called off (True if any was: the caller re-plans)."""
        dropped = False
        for eid, dest in list(self.copying_input.items()):
            if eid in self.copy_sent:
                continue
            member = self.workers.get(dest)
            if member is None or member.state != "active":
                self.owners.call_off_copy(eid)
                dropped = True
                continue
            src = self.executor_owner[eid]
            if (src, dest) not in self.channel_busy:
                self.channel_busy[(src, dest)] = eid
                self.copy_sent.add(eid)
                self.send(src, (P.COPY_INPUT, eid, dest))
        return dropped

    def on_input_copied(self, dest: str, eid: int) -> None:
        """The input data of ``eid`` has reached ``dest``: move the executor itself (state and queued tasks)."""
        if self.copying_input.get(eid) != dest or eid not in self.copy_sent:
            return
        if self.recovery.in_progress is not None:  # a snapshot is being written: move once it is complete
            self.copied_ready[eid] = dest
            return
        self.copied_ready.pop(eid, None)
        self.copy_sent.discard(eid)
        src = self.executor_owner[eid]
        member = self.workers.get(dest)
        if member is None or member.state != "active":  # dest is leaving: call this move off
            self.owners.call_off_copy(eid)
            self.channel_busy.pop((src, dest), None)
            for ident in (dest, src):
                if ident in self.workers:
                    self.send(ident, (P.DROP_INPUT, eid))
            self.rebalance(self.operation.kind if self.operation else "scale_out", [])
            self.check_retirements()
            self.maybe_end_operation()
            return
        self.owners.input_copied(eid)  # the pair's channel stays busy until the executor has arrived
        self.flush_outbox()  # tasks already dispatched to it must reach the source before the move order
        self.send(src, (P.MOVE_EXECUTOR, eid, dest, False, True))

    def valid_executor_timing(self, per_executor: Any) -> bool:
        """DONE's per-executor timing: executors of this job, each with (tasks, seconds, CPU seconds)."""
        n = self.num_executors
        return type(per_executor) is dict and all(
            type(e) is int and 0 <= e < n and type(v) is tuple and len(v) == 3
            and type(v[0]) is int and all(isinstance(x, (int, float)) for x in v[1:])
            for e, v in per_executor.items())

    def on_executor_moved(self, dest: str, eid: int, nbytes: int) -> None:
        src = self.owners.executor_moved(eid, dest)
        self.executor_costs.forget((eid,))
        for task in self.held.pop(eid, ()):
            self.route(task)
        if self.operation:
            self.operation.bytes += nbytes
            self.operation.executors_moved += 1
        if self.stealing is not None:
            self.stealing.moved(eid, dest, nbytes)
        if self.memsched is not None:
            self.memsched.moved(eid)
        if self.channel_busy.get((src, dest)) == eid:
            del self.channel_busy[(src, dest)]
            if self.start_copies():
                self.rebalance(self.operation.kind if self.operation else "scale_out", [])
        self.maybe_end_operation()

    def on_shard_moved(self, dest: str, shard: int, nbytes: int) -> None:
        self.owners.shard_moved(shard, dest)
        self.map_dirty = True
        if self.operation:
            self.operation.bytes += nbytes
            self.operation.shards_moved += 1

    def broadcast_map(self) -> None:
        self.map_version += 1
        self.map_dirty = False
        for s in set(self.shard_owner):
            self.last_owned[s] = self.map_version
        msg = self.map_message()
        for ident in self.workers:
            self.send(ident, msg)
        self.maybe_end_operation()

    def check_retirements(self) -> None:
        for m in list(self.workers.values()):
            # a draining worker exits once it has shipped its executors and flushed its results: it need not
            # wait for the destinations to re-load input data (that is what makes scale-in release fast)
            if (m.state == "draining" and not m.retire_sent and m.ident not in self.moving_executors.values()
                    and m.ident not in self.copying_input.values()):
                m.retire_sent = True
                self.send(m.ident, (P.RETIRE, []))
        if self.map_dirty:
            return  # servers retire only once workers have been sent the map without them
        for m in list(self.servers.values()):
            if (m.state == "draining" and not m.retire_sent and m.ident not in self.shard_owner
                    and m.ident not in self.moving_shards.values()):
                m.retire_sent = True
                last = self.last_owned.get(m.ident, -1)
                waiting = [w.ident for w in self.workers.values() if w.first_map is not None and w.first_map <= last]
                # requests also reach it forwarded by servers (through an older move): each fences it
                others = [s for s in self.servers if s != m.ident]
                for s in others:
                    self.send(s, (P.UNFORWARD, m.ident, self.shard_owner))
                waiting += others + [s for s, fenced in self.exit_fences.items() if m.ident in fenced]
                self.send(m.ident, (P.RETIRE, waiting, last))  # fences from maps after `last` count

    def on_retired(self, ident: str, fenced: Iterable[str] = ()) -> None:
        """``fenced``: the servers a retiring server fenced itself, behind what it forwarded to them."""
        fenced = list(fenced)
        if ident in self.servers and fenced:
            self.exit_fences[ident] = fenced
        self.workers.pop(ident, None)
        self.servers.pop(ident, None)
        for s in self.servers.values():  # it sent its last request before it said so: fence on its behalf
            if s.state == "draining" and s.ident not in fenced:
                self.send(s.ident, (P.FENCE, self.map_version, ident))
        self.endpoint.disconnect(ident)
        self.recovery.member_left(ident)
        self.maybe_end_operation()

    def maybe_end_operation(self) -> None:
        op = self.operation
        if op is None or self.moving_executors or self.copying_input or self.moving_shards or self.map_dirty:
            return
        if self.plan_needed():  # processes joined while items were in flight: keep going until balanced
            self.rebalance(op.kind, [])
            if self.moving_executors or self.copying_input or self.moving_shards:
                return
        if any(m.state == "draining" for m in (*self.workers.values(), *self.servers.values())):
            return
        if self.pending("worker") or self.pending("server"):
            return  # processes this operation started have not all joined yet
        end = clock.time()
        weights = self.owners.policy.weights() if op.kind == "rebalance" else None
        extra = {"speeds": {w: round(v, 3) for w, v in weights.items()}} if weights else {}
        self.joblog.event(op.kind, t=round(op.t0 - self.joblog.start, 4), end=round(end - self.joblog.start, 4),
                          duration_s=round(end - op.t0, 4), bytes=op.bytes, executors_moved=op.executors_moved,
                          shards_moved=op.shards_moved, processes=op.processes, workers=len(self.workers),
                          servers=len(self.servers), **extra)
        self.operation = None

    def plan_needed(self) -> bool:
        ex_moves, shard_moves = self.plan()
        return bool(ex_moves or shard_moves)

    def pending(self, role: str) -> list[str]:
        """Processes about to join as ``role``: started by ``scale`` and not heard from, or (workers) joined and
        still loading the app. The balancer plans for them, so a multi-process scale-out moves each item once."""
        pending = [f"+{role}{i}" for i, s in enumerate(self.spawning) if s[0] == role]
        if role == "worker":
            pending += [m.ident for m in self.workers.values() if m.state == "active" and not m.ready]
        return pending

    def plan(self) -> tuple[list, list]:
        """Executor and shard moves that balance the active processes (see :func:`.placement.plan_moves`)."""
        workers = sorted(m.ident for m in self.workers.values() if m.state == "active" and m.ready)
        servers = sorted(m.ident for m in self.servers.values() if m.state == "active")
        leaving = any(m.state == "draining" for m in (*self.workers.values(), *self.servers.values()))
        if leaving:  # a leaving process cannot wait
            return self.owners.plan(workers, servers)
        return self.owners.plan(workers, servers, self.pending("worker"), self.pending("server"))

    def speeds(self, sustained: bool = True) -> dict[str, float]:
        """Measured speed (tasks per second of the worker's time: CPU plus waiting for a CPU) of each worker that has
        reported enough tasks: what it sustains (bounded by its CPU limit, design P2) for placement, stealing and
        ``executor_speed``; or, ``sustained=False``, what it measures at its current load, for the choice of the
        executor that would run one task soonest (O2), a short-horizon question a quota's burst does answer."""
        return {w: s for w, m in self.meters.items()
                if m.tasks >= SPEED_MIN_TASKS and (s := m.speed if sustained else m.measured)}

    def rebalance_for_speed(self) -> None:
        """A policy that uses speeds (``speed``): offer it the measured speeds, and when it adopts them as the
        executor quotas (its hysteresis decides) move executors (scale-out moves, event ``rebalance``). Only when
        nothing else is under way (docs/design.md, "Placement policy")."""
        if (not self.started or self.finished or self.operation is not None or self.deferred_scale is not None
                or self.recovery.in_progress is not None or self.recovery.restoring is not None
                or self.recovery.paused or self.moving_executors or self.copying_input or self.moving_shards
                or self.pending("worker") or any(m.state != "active" for m in self.workers.values())):
            return
        workers = sorted(m.ident for m in self.workers.values() if m.ready)
        if self.owners.reconsider(workers, self.speeds(), clock.time()):
            self.rebalance("rebalance", [])

    def drain(self, idents: list[str]) -> str:
        """Move everything off these processes; each exits once empty. Returns what is happening."""
        unknown = [i for i in idents if i not in self.workers and i not in self.servers]
        if unknown:
            raise LitzError(f"unknown process id(s): {', '.join(unknown)} (see litzctl status)")
        for role, members in (("worker", self.workers), ("server", self.servers)):
            left = [m for m in members.values() if m.state == "active" and m.ident not in idents]
            if not left and any(i in members for i in idents):
                raise LitzError(f"refused: draining {', '.join(i for i in idents if i in members)} would leave "
                                f"no active {role}; a job needs at least one")
        for ident in idents:
            (self.workers.get(ident) or self.servers[ident]).state = "draining"
        self.rebalance("scale_in", list(idents))
        return f"draining {', '.join(idents)}"

    def scale(self, workers: int | None, servers: int | None) -> str:
        said = []
        for role, target, members in (("worker", workers, self.workers), ("server", servers, self.servers)):
            if target is None:
                continue
            if target < 1:
                raise LitzError(f"refused: cannot scale to {target} {role}s; a job needs at least one")
            active = sorted((m for m in members.values() if m.state == "active"), key=lambda m: m.ident)
            if target > len(active):
                more = target - len(active)
                if self.spawn is not None:
                    for _ in range(more):
                        self.spawning.append((role, self.spawn(role), clock.time()))
                    said.append(f"starting {more} {role}(s)")
                else:
                    said.append(f"waiting for {more} more {role}(s) to join: start `litz {role} --etcd ... "
                                f"--name {self.membership.job}` on the new machines")
            elif target < len(active):
                leaving = leaving_first({m.ident: (m.id_taken, m.joined) for m in active}, target)
                said.append(self.drain(leaving))
            else:
                said.append(f"already {target} {role}(s)")
        return "; ".join(said) or "nothing to do"

    # -- membership, requests, status ----------------------------------------------------------------
    def find_lost(self) -> list[Member]:
        """Members that died: a local child that exited badly, a connection that dropped and did not come
        back, or a lapsed registry lease (what is left: a lost host closes no connection)."""
        lost: dict[str, Member] = {}
        members = {**self.workers, **self.servers}
        self.losses_noticed()
        dead, self._dead_children = self._dead_children, []
        for role, pid, how in dead:
            match = [m for m in members.values() if m.info.get("pid") == pid]
            if not match:
                if not self.started and not self.executor_owner:
                    raise LitzError(f"{role} process {pid} {how} during start-up")
                continue
            match[0].noticed = f"process {how}"
            lost[match[0].ident] = match[0]
        misbehaving, self._misbehaving = self._misbehaving, []
        for ident in misbehaving:
            m = members.get(ident)
            if m is not None and ident not in lost:
                m.noticed = "sent malformed messages"
                lost[ident] = m
                self.membership.evict(ident)  # if it lives, it sees this and stops
        unreachable, self._unreachable = self._unreachable, []
        for ident in unreachable:
            m = members.get(ident)
            if m is not None and not m.retire_sent and ident not in lost:
                m.noticed = "connection dropped"
                lost[ident] = m
                self.membership.evict(ident)  # if it lives after all, it sees this and stops
        try:
            alive = self.membership.members()
        except RegistryUnavailable as exc:
            if exc.down_for > self.membership.give_up_after:
                raise exc.gave_up() from None
            return list(lost.values())  # unknown is not absent (R1)
        try:
            settled = self.membership.registry_settled()
        except RegistryUnavailable:
            settled = False
        if not settled:
            return list(lost.values())  # the registry came back empty: members are writing their keys (R3)
        now = clock.time()
        for ident, m in members.items():
            if ident in alive:
                m.missing_since = None
            elif ident not in lost:
                m.missing_since = m.missing_since or now
                if m.retire_sent:
                    # Its RETIRED message may still be on its way (handled as it arrives); a process killed after
                    # it was told to retire, before it shipped everything, never sends one, and what it held is
                    # lost: a recovery, not a retirement (python -m litz.sim, seed 1291).
                    m.gone_since = m.gone_since or now
                    if now - m.gone_since > RETIRED_GRACE_S:
                        m.noticed = "exited without retiring"
                        lost[ident] = m
                elif now - m.missing_since >= LAPSE_GRACE_S:
                    # a keeper that reached etcd late after a restart finds its lease expired and writes its key
                    # again: only a key that stays missing is a lost process (docs/design.md, R2)
                    m.noticed = "registration lapsed"
                    lost[ident] = m
        return list(lost.values())

    def losses_noticed(self) -> bool:
        """Whether a local child exited badly or a member's connection dropped for good (kept for
        :meth:`find_lost`): cheap enough to ask often."""
        if self.supervise:
            self._dead_children += self.supervise()
        self._unreachable += self.endpoint.unreachable(CONNECTION_GRACE_S)
        return bool(self._dead_children or self._unreachable or self._misbehaving)

    def forget(self, ident: str) -> None:
        self.meters.pop(ident, None)
        self.workers.pop(ident, None)
        self.servers.pop(ident, None)
        self.endpoint.disconnect(ident)

    def check_spawning(self) -> None:
        """Forget started processes that died or did not join in time, and balance without them."""
        now = clock.time()
        gone = [s for s in self.spawning if (getattr(s[1], "poll", None) is not None and s[1].poll() is not None)
                or now - s[2] > self.start_timeout]
        if gone:
            self.spawning = [s for s in self.spawning if s not in gone]
            self.rebalance("scale_out", [])
            self.maybe_end_operation()

    def check_members(self) -> None:
        if self._held:
            self.send_held()
        self.check_spawning()
        interrupted, self.lost_in_read = self.lost_in_read, []
        seen = {m.ident for m in interrupted}
        lost = interrupted + [m for m in self.find_lost() if m.ident not in seen]
        if lost:
            why = ", ".join(f"{m.role} {m.ident} (pid {m.info.get('pid')} on {m.info.get('host')})" for m in lost)
            # a driver callback abandoned mid-read left the driver half-changed: only a full restore is sound (D2)
            self.recovery.recover(lost, f"{why} was lost", full=bool(interrupted))
            self.flush_outbox()

    def inject_faults(self) -> None:
        now = clock.time()
        for fault in [f for f in self.faults if f[0] <= now]:
            self.faults.remove(fault)
            if fault[1] in self.workers or fault[1] in self.servers:
                self.send(fault[1], (P.DIE, fault[2]))

    def take_requests(self) -> None:
        """Carry out litzctl's requests, each only if signed with the job secret, fresh and not seen before
        (:mod:`litz.control`); anything else is refused with a warning and changes nothing."""
        for rid, req in self.membership.take_requests():
            refusal = self.verifier.check(rid, req)
            if refusal is not None:
                self.refuse(rid, req, refusal)
                continue
            command, args = req["command"], req["args"]
            try:
                if self.state == "waiting" and command not in ("stop", "plot"):
                    raise LitzError(f"job {self.membership.job!r} has not started ({self.waiting_for()}): only stop "
                                    "works until it does")
                if command == "stop":
                    self.joblog.event("stop", requested_by="litzctl")
                    self.finish(None)
                    self.state = "stopped"
                    message = "job stopping"
                elif command == "drain":
                    message = self.drain(list(args.get("ids", [])))
                elif command == "scale":
                    message = self.scale(args.get("workers"), args.get("servers"))
                elif command == "checkpoint":
                    message = self.recovery.request()
                elif command == "plot":
                    self.membership.respond(rid, {"ok": True, "message": "history", "history": self.history,
                                                  "metrics": list(self.joblog.rows)[-2000:],
                                                  "events": self.joblog.events[-1000:], "name": self.membership.job,
                                                  "events_n": len(self.joblog.events)})
                    continue
                elif command == "memory-limit":
                    self.memory_limit = parse_bytes(args["bytes"])
                    for ident in self.workers:
                        self.send(ident, (P.MEMORY_LIMIT, self.memory_limit))
                    self.joblog.event("memory_limit", bytes=self.memory_limit)
                    message = f"memory limit per worker set to {self.memory_limit:,} bytes"
                elif command == "kill":
                    ident = args.get("id")
                    if ident not in self.workers and ident not in self.servers:
                        raise LitzError(f"unknown process id: {ident} (see litzctl status)")
                    self.faults.append((clock.time() + float(args.get("after") or 0), ident,
                                        int(args.get("signal") or 9)))
                    message = f"{ident} will be killed (signal {int(args.get('signal') or 9)}) in " \
                              f"{float(args.get('after') or 0):g} s"
                else:
                    raise LitzError(f"this Litz version does not support {command!r} yet")
                leaving = [m.ident for m in (*self.workers.values(), *self.servers.values()) if m.state == "draining"]
                self.membership.respond(rid, {"ok": True, "message": message, "leaving": leaving})
            except LitzError as exc:
                self.membership.respond(rid, {"ok": False, "message": str(exc)})
            except Exception as exc:  # a bad request must never take the job down
                self.membership.respond(rid, {"ok": False, "message": f"{command}: {type(exc).__name__}: {exc}"})

    def refuse(self, rid: str, req: Any, refusal: Refusal) -> None:
        """Warn (rate-limited: a flood must not bury stderr) and answer a forgery only that it is one."""
        command = req.get("command") if isinstance(req, dict) else None
        what = f"{command[:40]!r} request" if isinstance(command, str) else "request"
        self.refused_requests.warn(f"refused a {what} (id {rid[:64]!r}) from the registry: {refusal.reason}; "
                                   "nothing was done", f"{what} {refusal.reason}")
        if refusal.answer is not None:
            self.membership.respond(rid, {"ok": False, "message": refusal.answer})

    def rate(self) -> float:
        now = clock.time()
        samples = self._rate_samples
        if now - samples[-1][0] >= 1.0:
            samples.append((now, self.tasks_completed))
            del samples[:-6]
        t0, c0 = samples[0]
        return (self.tasks_completed - c0) / max(now - t0, 1e-9)

    # -- numba kernels compiling (litz.kernels): the first run of an app, before its cache has them -------------
    def compiling_now(self) -> dict[str, str]:
        """Process -> the kernel it compiles now: what a job that shows no progress yet is doing."""
        busy = {m.ident: m.stats["compiling"] for m in self.workers.values() if m.stats.get("compiling")}
        return {"master": self.compiling, **busy} if self.compiling else busy

    def phase(self) -> str | None:
        busy = self.compiling_now()
        if not busy:
            return None
        by_kernel: dict[str, list[str]] = defaultdict(list)
        for ident, kernel in busy.items():
            by_kernel[kernel].append(ident)
        return f"{FIRST_RUN}: " + ", ".join(f"{k} on {' '.join(p)}" for k, p in by_kernel.items())

    def show_progress(self, force: bool = False) -> None:
        self.joblog.show(self.tasks_completed, self.rate(), len(self.workers), len(self.servers), force=force,
                         phase=self.phase())

    def on_compile_notice(self, sender: str, stats: dict) -> None:
        """A worker's STATS sent as a kernel starts or ends compiling: redraw at once, log each as an event."""
        done = stats.get("compiled")
        if isinstance(done, (list, tuple)) and len(done) == 2:
            self.joblog.event("compile", process=sender, kernel=str(done[0]), seconds=round(float(done[1]), 3))
        if "compiled" in stats or stats.get("compiling"):
            self.show_progress(force=True)

    def compile_notice(self, kind: str, kernel: str, seconds: float) -> None:
        """This process compiles a kernel (litz.kernels.watch): the status and the progress line say so."""
        if kind == "start":
            self._compiles[0] += 1
            done, todo = self._compiles
            self.compiling = f"{kernel} ({done}/{todo})" if todo > 1 else kernel
            self.show_progress(force=True)
        else:
            self.compiling = None
            self.joblog.event("compile", process="master", kernel=kernel, seconds=round(seconds, 3))
        self.publish_status()

    def compile_kernels(self) -> None:
        """Before a local job starts its workers: compile the app's declared kernels its cache lacks, here, once,
        with the status saying so; the workers then load them from the cache instead of each compiling them
        with nothing to show (a cold cache: the first run of an app, or after ``pip install``)."""
        declared = app_kernels(self.app.module)
        missing = preload(declared) if declared else []
        if missing:
            self._compiles = [0, len(missing)]
            previous = watch(self.compile_notice)
            try:
                compile_all(declared)
            finally:
                watch(previous)

    def status(self) -> dict:
        owned: dict[str, list[int]] = defaultdict(list)
        for e, w in enumerate(self.executor_owner):
            owned[w].append(e)
        shards: dict[str, list[int]] = defaultdict(list)
        for s, o in enumerate(self.shard_owner):
            shards[o].append(s)
        return {
            "name": self.membership.job, "app": self.app.name, "state": self.state,
            "version": self.version, "tasks_completed": self.tasks_completed,
            "tasks_per_s": round(self.rate(), 1), "elapsed_s": round(self.joblog.elapsed(), 3),
            "executors": self.num_executors, "shards": len(self.shard_owner), "epoch": self.epoch,
            "checkpoints": self.joblog.kinds["checkpoint"],
            "checkpoints_failed": self.joblog.kinds["checkpoint_failed"],
            # a checkpoint under way holds new dispatches: why a job's rate drops to zero for a moment
            "checkpointing": None if not self.recovery.paused else {
                "held_s": round(clock.time() - self.recovery.pause_t0, 3), "held_tasks": len(self.paused_tasks)},
            "moving": {"executors": len(self.moving_executors) + len(self.copying_input),
                       "shards": len(self.moving_shards)},
            "report": self.joblog.last_report,
            "progress": self.joblog.progress_now(),  # Driver.set_total: {unit, done, total, eta_s}
            "compiling": self.compiling_now(),  # process -> the numba kernel it compiles (a cold cache)
            "waiting": self.waiting_for() if self.state == "waiting" else None,
            "placement": self.placement, "stealing": self.stealing is not None,
            "steals": self.stealing.count if self.stealing is not None else 0,
            # the latest events and how many there are, so a reader of the status (the dashboard) misses none
            "events_n": len(self.joblog.events), "events": self.joblog.events[-STATUS_EVENTS:],
            "workers": [{"id": m.ident, "pid": m.info.get("pid"), "host": m.info.get("host"), "state": m.state,
                         "address": m.info.get("address"),
                         "executors": owned.get(m.ident, []), "memory": m.stats.get("rss"),
                         "budget": m.stats.get("budget"), "state_bytes": m.stats.get("state_bytes"),
                         "evicted": m.stats.get("evicted", []), **self.speed_status(m.ident),
                         # each of its executors' (ms per task, CPU ms per task) there, None before it completed one
                         "executor_task_ms": [self.executor_costs.of(e) for e in owned.get(m.ident, [])]}
                        for m in self.workers.values()],
            "servers": [{"id": m.ident, "pid": m.info.get("pid"), "host": m.info.get("host"), "state": m.state,
                         "address": m.info.get("address"),
                         "shards": shards.get(m.ident, []), "memory": m.stats.get("rss"),
                         "budget": m.stats.get("budget"), "state_bytes": m.stats.get("state_bytes"),
                         "evicted": m.stats.get("evicted", []),
                         # requests it forwarded for moved shards, and how long ago one last went to or came
                         # from another server (partial recovery waits FORWARD_SETTLE_S after that)
                         "forwarded": m.stats.get("forwarded", 0), "forwarded_ago_s": m.stats.get("forwarded_ago_s")}
                        for m in self.servers.values()],
        }

    def speed_status(self, worker: str) -> dict:
        """A worker's measured speed for the status: tasks per second of running time (at most what its CPU limit
        sustains), ms per task (wall, CPU), and the limit in cores."""
        m = self.meters.get(worker)
        if m is None or m.per_task is None:
            return {"speed": None, "task_ms": None, "task_cpu_ms": None, "cpu_limit": None}
        return {"speed": round(m.speed, 3), "task_ms": round(m.per_task * 1e3, 3),
                "task_cpu_ms": round(m.cpu_per_task * 1e3, 3),
                "cpu_limit": None if m.cores is None else round(m.cores, 3)}

    def publish_status(self) -> None:
        st = self.status()
        self.events_published = st["events_n"]
        self.history.append(status_sample(st))
        del self.history[:-HISTORY_SAMPLES]
        outages = self.membership.registry_outages()
        for since, until in outages[self._outages_logged:]:
            self.joblog.event("registry_outage", since=round(since, 3), seconds=round(until - since, 3))
        self._outages_logged = len(outages)
        if self.membership.registry_down_since() is not None:
            return  # written again once it answers (R1)
        try:
            self.membership.put("status", st, leased=True)
        except Exception:
            pass  # status is advisory; the job goes on
