"""One simulated schedule: a job of the check app on the real master, workers and servers, random
elasticity and faults on simulated time, and the checks that must hold at the end."""
from __future__ import annotations

import contextlib
import io
import random
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .. import clock, outofcore, process
from ..appload import App, load_app
from ..endpoint import register_carrier
from ..errors import LitzError
from ..joblog import JobLog
from ..membership import Membership
from . import checks
from .world import InlinePool, SimEndpoint, SimKV, SimProcess, World

EVENTS = ("scale", "drain", "kill", "checkpoint", "memory", "registry")
EVENTS_BEFORE_REGISTRY = EVENTS[:5]  # the kinds the plans of the recorded bug replays were drawn from
# what the events led to, counted from the job's events
OUTCOMES = ("recovery", "partial_recovery", "evict", "rebalance", "steal", "choice", "prefetch", "ahead",
            "ahead_remote")
JOB = "sim"
SECRET = "sim"  # the job secret of every simulated process (sim:// carries no keys; requests are signed with it)
TIME_LIMIT_S = 900.0  # simulated: a schedule still running by then has hung

_world: World | None = None  # the world whose processes open sim:// endpoints now
_app: App | None = None


def _open_sim_endpoint(ident: str, secret: str, listen: str, watch: bool = False, **_: Any) -> SimEndpoint:
    if _world is None:
        raise RuntimeError("sim:// endpoints exist only inside a litz.sim schedule")
    return SimEndpoint(_world, ident, watch)


register_carrier("sim", _open_sim_endpoint)


@dataclass
class Outcome:
    seed: int
    violations: list[str]
    events: Counter = field(default_factory=Counter)
    sim_s: float = 0.0
    tasks: int = 0
    messages: int = 0
    log: str = ""  # what the processes wrote to stderr (warnings), for -v
    digest: str = ""  # of every message delivered, in order, with its time, sender and receiver


@dataclass
class Plan:
    """What a seed chose: the job's size and its events."""

    workers: int
    servers: int
    executors: int
    rounds: int
    keys: int
    shards: int
    checkpoint_every: float | None
    partial_recovery: bool
    events: list[tuple[float, str, Any]]
    staleness: int | None = None  # None: each executor's tasks one after another; else SSP with this bound
    placement: str = "even"  # "speed": the master is fed random speed samples and rebalances by them
    after: bool = False  # each executor's next round dispatched ahead with after= (no SSP)
    choose: bool = False  # the driver lets the runtime choose which idle executor runs the next task (O1-O3)


def plan(seed: int, allowed: tuple[str, ...], placement: str | None = None) -> Plan:
    """The job and events seed ``seed`` draws. Its own random stream, apart from the scheduler's: a regression
    test can pin a plan while the seed picks the interleaving, and a draw added at the end changes no plan."""
    rng = random.Random(f"litz.sim plan {seed}")
    checkpoints = "kill" in allowed or ("checkpoint" in allowed and rng.random() < 0.5)
    p = Plan(workers=rng.randint(1, 3), servers=rng.randint(1, 3), executors=rng.randint(2, 8),
             rounds=rng.randint(4, 14), keys=rng.randint(3, 10), shards=rng.choice([4, 8, 16]),
             checkpoint_every=rng.choice([0.05, 0.2, 1.0]) if checkpoints else None, partial_recovery=False,
             events=[])
    t = 0.0
    for _ in range(rng.randint(1, 8)):
        t += rng.expovariate(1 / 0.05)
        kind = rng.choice(allowed)
        if kind == "scale":
            role = rng.choice(["workers", "servers"])
            arg: Any = (role, rng.randint(1, 4 if role == "workers" else 3))
        elif kind in ("drain", "kill"):
            arg = rng.choice(["worker", "server"])
        elif kind == "memory":
            arg = rng.choice([700, 1500, 4000, 1 << 20])
        elif kind == "registry":  # an etcd outage of this many seconds; True: it comes back empty
            arg = (rng.choice([0.3, 2.0, 8.0, 25.0]), rng.random() < 0.4)
        else:
            arg = None
        p.events.append((t, kind, arg))
    p.partial_recovery = checkpoints and rng.random() < 0.3
    p.staleness = rng.choice([None, None, 0, 1, 2])
    p.placement = rng.choice(["even", "speed"]) if placement is None else placement
    p.after = p.staleness is None and rng.random() < 0.4  # one schedule in five: docs/design.md, A1-A9
    p.choose = p.staleness is None and not p.after and rng.random() < 0.5  # O1-O3; not with after=
    return p


class Schedule:
    def __init__(self, seed: int, allowed: tuple[str, ...] = EVENTS, job: Plan | None = None):
        """``job``: run this plan instead of the one the seed draws (the seed still picks the interleaving)."""
        self.seed = seed
        self.world = World(seed)
        self.kv = SimKV(self.world)
        self.plan = job or plan(seed, allowed)
        self.tmp = tempfile.mkdtemp(prefix=f"litz-sim-{seed}-")
        self.members: dict[str, Any] = {}  # ident -> Worker or Server object
        self.member_procs: dict[str, SimProcess] = {}
        self.master: Any = None
        self.master_proc: SimProcess | None = None
        self.events: Counter = Counter()
        self.next_rid = 0

    # -- processes -----------------------------------------------------------------------------------
    def spawn(self, role: str) -> SimProcess:
        return self.world.start(role, lambda proc: self._serve(proc, role))

    def _serve(self, proc: SimProcess, role: str) -> None:
        from ..server import Server
        from ..worker import Worker

        membership = Membership(self.kv, JOB, pid=proc.pid)
        membership.wait_master(60)
        ident = membership.allocate_id(role)
        cls = Worker if role == "worker" else Server
        member = cls(ident, membership, SECRET, listen=f"sim://{ident}")
        self.members[ident] = member
        self.member_procs[ident] = proc
        membership.register(role, ident, {"address": member.endpoint.address})
        self._keep(membership, proc)
        try:
            member.run(60)
        finally:
            if not proc.killed:
                membership.unregister()
                member.close()

    def _run_master(self, proc: SimProcess) -> Any:
        from ..master import Master

        p = self.plan
        membership = Membership(self.kv, JOB, pid=proc.pid)
        master = Master(_app, membership, SECRET, config={"rounds": p.rounds, "keys": p.keys, "staleness": p.staleness,
                                                         "after": p.after, "choose": p.choose},
                        num_executors=p.executors, num_shards=p.shards, min_workers=p.workers,
                        min_servers=p.servers, joblog=JobLog(progress=False), start_timeout=60.0,
                        spawn=self.spawn, checkpoint_dir=f"{self.tmp}/checkpoints" if p.checkpoint_every else None,
                        checkpoint_every=p.checkpoint_every, partial_recovery=p.partial_recovery,
                        listen="sim://master", wake=False, placement=p.placement)
        self.master = master
        if p.placement == "speed":
            self._feed_speeds(master)
        master.register()
        self._keep(membership, proc)
        try:
            for role, count in (("server", p.servers), ("worker", p.workers)):
                for _ in range(count):
                    self.spawn(role)
            result = master.run()
            st = master.stealing
            if st is not None and master.in_flight == 0:  # every task completed: nothing may count as outstanding
                left = {e: n for e, n in st.outstanding.items() if n}
                if left:
                    checks.violation(f"stealing counts tasks outstanding after every task completed: {left}")
            return result
        finally:
            master.stop_all()
            membership.unregister()
            membership.clear()
            master.close()

    def _feed_speeds(self, master: Any) -> None:
        """Placement ``speed``: tasks take no simulated time, so the master is fed speed samples instead, each
        worker's speed drawn anew now and then (a straggler appears, recovers), with noise; the master's
        rebalancing periods are scaled down to the schedule's simulated seconds so rebalances interleave with
        the other events."""
        from ..placement import SpeedMeter

        master.speed_check_s = 0.01
        master.owners.policy.min_s, master.owners.policy.every_s = 0.02, 0.1
        master.speed_window_s = 0.0
        if master.stealing is not None:  # a move's cost on simulated time: fixed, as tasks take none
            st = master.stealing
            st.cost_s, st.check_s, st.learn = 0.002, 0.005, False
            # most schedules run one task per executor at a time: half of them also steal an executor whose only
            # task may have started, so steals happen in every kind of schedule
            st.min_outstanding = random.Random(f"litz.sim steal {self.seed}").choice([1, 2])
            moved = st.moved

            def no_way_back(eid: int, dest: str, nbytes: int) -> None:
                steal = st.current[0] if st.current is not None and st.current[0].executor == eid else None
                moved(eid, dest, nbytes)
                thief = master.workers.get(steal.thief) if steal else None
                if thief is None or thief.state != "active":
                    return  # the thief began to leave after its executor set off: it moves on, as every one there
                back = [m for m in master.plan()[0] if m[1:] == (steal.thief, steal.victim)]
                if back:  # the adopted quotas must keep what a steal did (docs/design.md, "Placement policy")
                    checks.violation(f"ping-pong: executor {eid} stolen by {steal.thief} from {steal.victim}, and "
                                     f"the next plan moves {back} back")

            st.moved = no_way_back
        rng = random.Random(f"litz.sim speeds {self.seed}")
        base: dict[str, float] = {}
        world = self.world

        def step() -> None:
            if master.finished:
                return
            for w in list(master.workers):
                if w not in base or rng.random() < 0.05:
                    base[w] = rng.choice([0.01, 0.01, 0.02, 0.04])
                per_task = base[w] * rng.uniform(0.9, 1.1)
                master.meters.setdefault(w, SpeedMeter(window_s=0.0)).add(4, 4 * per_task, 4 * per_task, world.now)
            world.at(world.now + 0.01, step)

        world.at(world.now + 0.01, step)

    def _keep(self, membership: Membership, proc: SimProcess) -> None:
        """The lease keeper (a thread in a real process): in schedules with registry outages only, so that the
        interleavings of every other schedule stay as they were."""
        if not any(kind == "registry" for _, kind, _ in self.plan.events):
            return
        world = self.world

        def step() -> None:
            if proc.exited or proc.killed or membership._stop.is_set():
                return
            saved, world.current = world.current, proc
            try:
                membership.tend()
            except LitzError:
                pass  # unreachable: try again next period, as the thread does
            finally:
                world.current = saved
            world.at(world.now + membership.ttl / 4, step)

        world.at(world.now + membership.ttl / 4, step)

    # -- events --------------------------------------------------------------------------------------
    def _request(self, command: str, args: dict) -> None:
        """What litzctl does: a request signed with the job secret (the master refuses any other)."""
        self.next_rid += 1
        Membership(self.kv, JOB).post_request(command, args, SECRET, rid=f"r{self.next_rid:05d}")

    def _live(self, role: str) -> list[str]:
        m = self.master
        members = (m.workers if role == "worker" else m.servers) if m is not None else {}
        return sorted(i for i, x in members.items() if x.state == "active" and i in self.member_procs
                      and not self.member_procs[i].exited)

    def _event(self, kind: str, arg: Any) -> None:
        m = self.master
        if m is None or not m.started or m.finished:
            return
        if self.kv.down_since is not None and kind != "kill":
            return  # litzctl cannot reach the registry either
        rng = self.world.rng
        if kind == "scale":
            self._request("scale", {arg[0]: arg[1]})
        elif kind == "drain":
            live = self._live(arg)
            if len(live) < 2:
                return
            self._request("drain", {"ids": [rng.choice(live)]})
        elif kind == "kill":
            # only once a checkpoint exists: without one the job must fail, and says so (tested elsewhere)
            if not any(e["kind"] == "checkpoint" for e in m.joblog.events):
                return
            live = self._live(arg)
            if not live:
                return
            self.world.kill(self.member_procs[rng.choice(live)])
        elif kind == "checkpoint":
            if m.recovery.store is None:
                return
            self._request("checkpoint", {})
        elif kind == "memory":
            self._request("memory-limit", {"bytes": arg})
        elif kind == "registry":
            if self.kv.down_since is not None:
                return
            seconds, empty = arg
            self.kv.go_down()
            self.world.at(self.world.now + seconds, lambda: self.kv.come_back(empty))
        self.events[kind] += 1

    # -- the run -------------------------------------------------------------------------------------
    def run(self) -> Outcome:
        global _world
        world = self.world
        saved_rss, saved_pool = process.resident_bytes, outofcore.background_pool
        _world = world
        clock.install(world.clock)
        process.resident_bytes = lambda: 0
        outofcore.background_pool = lambda name: InlinePool()
        checks.take()
        violations: list[str] = []
        log = io.StringIO()
        try:
            stack = contextlib.ExitStack()
            stack.enter_context(contextlib.redirect_stderr(log))
            self.master_proc = world.start("master", self._run_master)
            for t, kind, arg in self.plan.events:
                world.at(t, lambda kind=kind, arg=arg: self._event(kind, arg))
            finished = world.run(TIME_LIMIT_S, lambda: all(p.exited for p in world.processes))
            violations = checks.take()
            mp = self.master_proc
            if not finished:
                waiting = [p.name for p in world.processes if not p.exited]
                violations.append(f"hang: still running after {TIME_LIMIT_S:.0f} simulated s: {waiting}")
            elif mp.error is not None:
                violations.append(f"job failed: {type(mp.error).__name__}: {str(mp.error).strip()[-600:]}")
            elif not mp.result:
                violations.append("job finished without a result")
            # nothing in a schedule sends a malformed message: a drop is a message the protocol got wrong
            for ident, proc in [("master", self.master), *self.members.items()]:
                guard = proc.endpoint.guard if proc is not None else None
                if guard is not None and guard.dropped:
                    violations.append(f"{ident} dropped {guard.dropped} message(s) as malformed: {guard.last}")
            for p in world.processes:
                # one that started as the job ended finds no master: so would a real one
                if p is not mp and p.error is not None and not p.killed and p.ended_at < mp.ended_at:
                    violations.append(f"{p.name} {p.pid} failed: {type(p.error).__name__}: {p.error}")
        finally:
            stack.close()
            for p in world.processes:  # a hung schedule's processes
                if not p.exited:
                    world.kill(p)
            _world = None
            clock.restore()
            process.resident_bytes, outofcore.background_pool = saved_rss, saved_pool
            shutil.rmtree(self.tmp, ignore_errors=True)
        if self.master is not None:  # what the events led to
            for e in self.master.joblog.events:
                if e["kind"] in OUTCOMES:
                    self.events[e["kind"]] += 1
            if self.master.memsched is not None:  # the runtime's choices of executor, and the hints they sent (O3)
                self.events["choice"] += self.master.memsched.choices
                self.events["prefetch"] += self.master.memsched.hints_sent
            if self.master.after is not None:  # tasks sent ahead (after=), and of them across workers (A1, A9)
                self.events["ahead"] += self.master.after.sent_ahead
                self.events["ahead_remote"] += self.master.after.sent_ahead_remote
            if not self.events["kill"] and (self.events["recovery"] or self.events["partial_recovery"]):
                # only a kill loses a process here: an outage, a reset or a move must cost no member (R1-R3)
                why = [e.get("noticed") for e in self.master.joblog.events if e["kind"] == "recovery"]
                violations.append(f"recovery without a kill: {why}")
        return Outcome(self.seed, violations, self.events, world.now,
                       self.master.tasks_completed if self.master else 0, world.messages, log.getvalue(),
                       world.trace.hexdigest())


def run_schedule(seed: int, events: tuple[str, ...] = EVENTS, job: Plan | None = None,
                 placement: str | None = None) -> Outcome:
    """``placement``: force the policy (else each seed draws it)."""
    global _app
    if _app is None:
        _app = load_app("litz.sim.checkapp")
    return Schedule(seed, events, job or plan(seed, events, placement)).run()
