"""A simulated machine room: one scheduler, simulated time, a network of FIFO connections, a registry.

Every Litz process of a simulated job (the real :class:`~litz.master.Master`, :class:`~litz.worker.Worker` and
:class:`~litz.server.Server`) runs as a greenlet of this interpreter. A process gives up the CPU only where a
real one would block: in :meth:`SimEndpoint.poll` / :meth:`SimEndpoint.wait` and in ``clock.sleep``. The
scheduler then runs whatever is due next on simulated time: a process whose wait ended, or the delivery of a
message. Ties between events at the same moment are broken by the seeded random generator, so a seed picks
one interleaving and replays it exactly.

The network keeps what ZeroMQ and Unix sockets guarantee and nothing more: messages on one connection (one
sender, one receiver) arrive in the order sent; across connections any order. Each message takes a random
latency, larger for larger messages, and now and then a long stall (``slow_p``), which also holds back the
messages behind it on its connection. A killed process loses the messages it had not yet handed over: of
what is still on its way from it, each connection delivers a random prefix.
"""
from __future__ import annotations

import hashlib
import heapq
import json
import random
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from typing import Any

import greenlet

from .. import wire
from ..endpoint import Endpoint
from ..errors import RegistryUnavailable
from ..guard import BadMessage

EPOCH = 1_800_000_000.0  # what clock.time() reads at simulated time 0
BANDWIDTH = 1e9  # bytes per simulated second on every connection


class SimKilled(BaseException):
    """Raised inside a simulated process that was killed: it unwinds and never runs again."""


class Clock:
    """What :func:`litz.clock.install` reads while a world runs."""

    def __init__(self, world: World):
        self._world = world

    def time(self) -> float:
        return EPOCH + self._world.now

    def monotonic(self) -> float:
        return self._world.now

    def perf_counter(self) -> float:
        return self._world.now

    def thread_time(self) -> float:
        return self._world.now

    def sleep(self, seconds: float) -> None:
        self._world.block(max(seconds, 0.0))


class SimProcess:
    """One simulated OS process: a greenlet, a fake pid, and how it ended."""

    def __init__(self, world: World, name: str, pid: int, body: Callable[[SimProcess], Any]):
        self.world, self.name, self.pid = world, name, pid
        self.glet = greenlet.greenlet(self._main, parent=world.loop)
        self.body = body
        self.killed = False
        self.exited = False
        self.error: BaseException | None = None
        self.result: Any = None
        self.paused: greenlet.greenlet | None = None  # the greenlet to resume (a worker task may sleep)
        self.wake_token = 0
        self.endpoint: SimEndpoint | None = None
        self.ended_at: float | None = None

    def _main(self) -> None:
        try:
            self.result = self.body(self)
        except SimKilled:
            pass
        except BaseException as exc:  # noqa: BLE001 - the simulation reports it
            self.error = exc
        finally:
            self.exited = True
            self.ended_at = self.world.now
            if self.endpoint is not None and not self.killed:
                self.endpoint.close()

    def poll(self) -> int | None:
        """Like ``subprocess.Popen.poll``: None while it runs (the master forgets spawned processes that end)."""
        if not self.exited:
            return None
        return -9 if self.killed else (1 if self.error else 0)


class World:
    """Scheduler, clock, network and registry of one simulated run."""

    def __init__(self, seed: int, slow_p: float = 0.03, slow_s: float = 0.2, step_s: float = 2e-4):
        self.rng = random.Random(seed)
        self.now = 0.0
        self.slow_p, self.slow_s, self.step_s = slow_p, slow_s, step_s
        self._heap: list[tuple[float, float, int, Callable[[], None]]] = []
        self._seq = 0
        self.loop = greenlet.getcurrent()
        self.clock = Clock(self)
        self.processes: list[SimProcess] = []
        self.endpoints: dict[str, SimEndpoint] = {}  # address -> endpoint
        self._next_pid = 1000
        self.messages = 0
        self.trace = hashlib.blake2b(digest_size=16)  # each delivery, in order: what a replay reproduces
        self.current: SimProcess | None = None

    # -- events --------------------------------------------------------------------------------------
    def at(self, t: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), self.rng.random(), self._seq, fn))

    def run(self, until: float, done: Callable[[], bool]) -> bool:
        """Run events until ``done()`` or simulated time ``until``; False if time ran out first."""
        while self._heap and not done():
            t, _, _, fn = heapq.heappop(self._heap)
            if t > until:
                heapq.heappush(self._heap, (t, 0.0, 0, fn))
                return False
            self.now = t
            fn()
        return done()

    # -- processes -----------------------------------------------------------------------------------
    def start(self, name: str, body: Callable[[SimProcess], Any]) -> SimProcess:
        proc = SimProcess(self, name, self.new_pid(), body)
        self.processes.append(proc)
        self.at(self.now + self.rng.uniform(0, 0.01), lambda: self._resume(proc, None))
        return proc

    def _resume(self, proc: SimProcess, token: int | None) -> None:
        if proc.exited or proc.killed or (token is not None and token != proc.wake_token):
            return
        proc.wake_token += 1
        target, proc.paused = proc.paused, None
        self.current = proc
        try:
            if target is None:
                proc.glet.switch()
            else:
                target.switch()
        finally:
            self.current = None

    def block(self, seconds: float, endpoint: SimEndpoint | None = None) -> None:
        """The running process waits ``seconds`` (a message to ``endpoint`` ends the wait sooner)."""
        proc = self.current
        if proc is None:
            raise RuntimeError("litz.sim: a blocking call outside a simulated process")
        if proc.killed:
            raise SimKilled()
        proc.paused = greenlet.getcurrent()
        # even a zero wait gives the CPU away: that is where other processes' steps interleave
        token = proc.wake_token
        self.at(self.now + seconds + self.rng.uniform(0, self.step_s), lambda: self._resume(proc, token))
        if endpoint is not None:
            endpoint.waiting = proc
        self.loop.switch()
        if endpoint is not None:
            endpoint.waiting = None
        if proc.killed:
            raise SimKilled()

    def wake(self, proc: SimProcess) -> None:
        token = proc.wake_token
        self.at(self.now + self.rng.uniform(0, self.step_s), lambda: self._resume(proc, token))

    def kill(self, proc: SimProcess) -> None:
        """kill -9: the process stops at once; what it had not handed to the network is lost."""
        if proc.exited or proc.killed:
            return
        proc.killed = True
        ep = proc.endpoint
        if ep is not None:
            ep.die(self.rng)
        if proc.paused is not None or proc.glet:
            target = proc.paused or proc.glet
            proc.paused = None
            if not target.dead:
                self.current = proc
                try:
                    target.throw(SimKilled())
                except SimKilled:
                    pass
                finally:
                    self.current = None
        proc.exited = True
        proc.ended_at = self.now

    def new_pid(self) -> int:
        self._next_pid += 1
        return self._next_pid

    # -- network -------------------------------------------------------------------------------------
    def latency(self, nbytes: int) -> float:
        delay = self.rng.uniform(2e-5, 5e-4) + nbytes / BANDWIDTH
        if self.rng.random() < self.slow_p:
            delay += self.rng.uniform(0.001, self.slow_s)
        return delay


class _Connection:
    """Messages from one endpoint to one address, delivered in order."""

    __slots__ = ("dest", "queue", "last")

    def __init__(self, dest: str):
        self.dest = dest
        self.queue: deque[list] = deque()
        self.last = 0.0


class SimEndpoint(Endpoint):
    """The carrier of a simulated process (scheme ``sim://``)."""

    def __init__(self, world: World, ident: str, watch: bool = False):
        self.world, self.ident = world, ident
        self.address = f"sim://{ident}.{world.new_pid()}"
        world.endpoints[self.address] = self
        self.proc = world.current
        if self.proc is not None:
            self.proc.endpoint = self
        self.inbox: deque[tuple[str, list]] = deque()
        self.waiting: SimProcess | None = None
        self.gone_at: float | None = None  # closed or killed
        self._peers: dict[str, str] = {}
        self._conns: dict[str, _Connection] = {}
        self._reported: set[str] = set()

    # -- peers ---------------------------------------------------------------------------------------
    def connect(self, peer: str, address: str, watch: bool | None = None) -> None:
        if self._peers.get(peer) != address:
            self._peers[peer] = address
            self._reported.discard(peer)

    def disconnect(self, peer: str) -> None:
        self._peers.pop(peer, None)
        self._reported.discard(peer)

    def knows(self, peer: str) -> bool:
        return peer in self._peers

    def address_of(self, peer: str) -> str | None:
        return self._peers.get(peer)

    def unreachable(self, grace_s: float) -> list[str]:
        gone = []
        now = self.world.now
        for peer, address in self._peers.items():
            ep = self.world.endpoints.get(address)
            if peer in self._reported or ep is None or ep.gone_at is None:
                continue
            if now - ep.gone_at >= grace_s:
                self._reported.add(peer)
                gone.append(peer)
        return gone

    # -- messages ------------------------------------------------------------------------------------
    def send(self, peer: str, msg: Any, pickler: Any = None) -> int:
        if self.gone_at is not None:
            return 0
        frames = wire.encode(msg) if pickler is None else wire.encode(msg, pickler)
        # the bytes are taken as they are now: a sender that changes an array it sent changes nothing here,
        # as with a socket (ZeroMQ's zero-copy frames forbid that change; the server never does it)
        frames = [bytes(memoryview(f).cast("B")) if not isinstance(f, bytes) else f for f in frames]
        nbytes = sum(len(f) for f in frames)
        address = self._peers[peer]
        conn = self._conns.get(address)
        if conn is None:
            conn = self._conns[address] = _Connection(address)
        world = self.world
        conn.last = max(conn.last, world.now + world.latency(nbytes))
        conn.queue.append(frames)
        world.at(conn.last, lambda: self._deliver(conn))
        return nbytes

    def _deliver(self, conn: _Connection) -> None:
        if not conn.queue:
            return  # dropped when this endpoint's process was killed
        frames = conn.queue.popleft()
        dest = self.world.endpoints.get(conn.dest)
        if dest is None or dest.gone_at is not None:
            return
        self.world.messages += 1
        # not the bytes: an app's token is random per interpreter; any other difference changes what follows
        self.world.trace.update(f"{self.world.now!r} {self.ident} {dest.ident} {sum(map(len, frames))}\n".encode())
        dest.inbox.append((self.ident, frames))
        if dest.waiting is not None:
            waiter, dest.waiting = dest.waiting, None
            self.world.wake(waiter)

    def drain(self, limit: int = 10_000, borrow: bool = False) -> Iterator[tuple[str, Any]]:
        inbox = self.inbox
        for _ in range(limit):
            if not inbox or self.gone_at is not None:
                return
            sender, frames = inbox.popleft()
            try:
                msg = wire.decode(frames)
            except BadMessage as exc:
                self.guard.refuse(sender, exc.reason, exc.detail)
                continue
            yield sender, msg

    def poll(self, timeout_ms: float) -> bool:
        if self.gone_at is not None:
            raise SimKilled()
        if not self.inbox:
            self.world.block(timeout_ms / 1000.0, self)
        else:
            self.world.block(0.0)
        return bool(self.inbox)

    def wait(self, timeout_ms: float, fds: tuple = ()) -> tuple[bool, set]:
        return self.poll(timeout_ms), set()

    def die(self, rng: random.Random) -> None:
        """Killed: of each connection's messages still on their way, a random prefix arrives."""
        self.gone_at = self.world.now
        for conn in self._conns.values():
            keep = rng.randint(0, len(conn.queue))
            while len(conn.queue) > keep:
                conn.queue.pop()
        self.inbox.clear()

    def close(self, discard: bool = False) -> None:
        if self.gone_at is None:
            self.gone_at = self.world.now
        self.inbox.clear()


# -- the registry ------------------------------------------------------------------------------------
class SimLease:
    renews_itself = True  # kept while its owner lives; a schedule with registry events runs keepers too

    def __init__(self, kv: SimKV, ttl: float):
        self.kv, self.ttl = kv, ttl
        self.expires: float | None = None  # None: its owner lives and keeps it
        self.keys: set[str] = set()
        self.owner = kv.world.current
        self.gone = False  # the registry was reset: it no longer knows this lease

    def refresh(self) -> bool:
        self.kv.check(probe=True)
        return not self.gone and (self.expires is None or self.expires > self.kv.world.now)

    def revoke(self) -> None:
        self.kv.check()
        self.expires = self.kv.world.now
        self.kv.expire()


class SimKV:
    """The registry (etcd's model as :class:`litz.membership.kv.KV` uses it) on simulated time."""

    GIVE_UP_S = 300.0  # --etcd-timeout

    def __init__(self, world: World):
        self.world = world
        self.data: dict[str, str] = {}
        self.leases: list[SimLease] = []
        self.key_lease: dict[str, SimLease] = {}
        self.down_since: float | None = None  # an outage: every call fails, or waits, until it ends
        self.outages: list[tuple[float, float]] = []
        self.give_up_after = self.GIVE_UP_S
        self.fail_fast: set[int] = set()  # pids whose calls fail at once while it is down (they have a keeper)

    def go_down(self) -> None:
        if self.down_since is None:
            self.down_since = self.world.clock.time()  # wall-clock time, as etcd clients count it

    def come_back(self, empty: bool) -> None:
        """The outage ends; ``empty``: etcd restarted from an empty data directory (every key and lease gone)."""
        if empty:
            for lease in self.leases:
                lease.gone = True
            self.leases.clear()
            self.key_lease.clear()
            self.data.clear()
        if self.down_since is not None:
            self.outages.append((self.down_since, self.world.clock.time()))
            self.down_since = None

    def check(self, probe: bool = False) -> None:
        """Calls while it is down: fail at once for a process with a keeper (and a keeper's probe), else wait,
        as :class:`~litz.membership.etcdkv.EtcdKV` does, up to ``give_up_after``."""
        while self.down_since is not None:
            proc = self.world.current
            if probe or proc is None or proc.pid in self.fail_fast:
                raise RegistryUnavailable("sim", self.down_since)
            if self.world.clock.time() - self.down_since > self.give_up_after:
                raise RegistryUnavailable("sim", self.down_since).gave_up()
            self.world.block(0.1)

    def expire(self) -> None:
        now = self.world.now
        for lease in self.leases:
            if lease.expires is None and lease.owner is not None and lease.owner.killed:
                lease.expires = now + lease.ttl  # nobody refreshes it any more
        for lease in [x for x in self.leases if x.expires is not None and x.expires <= now]:
            self.leases.remove(lease)
            for key in lease.keys:
                if self.key_lease.get(key) is lease:
                    del self.key_lease[key]
                    self.data.pop(key, None)

    def put(self, key: str, value: Any, lease: SimLease | None = None) -> None:
        self.check()
        self.expire()
        self.data[key] = json.dumps(value)
        old = self.key_lease.pop(key, None)
        if old is not None:
            old.keys.discard(key)
        if lease is not None:
            lease.keys.add(key)
            self.key_lease[key] = lease

    def create(self, key: str, value: Any, lease: SimLease | None = None) -> bool:
        self.check()
        self.expire()
        if key in self.data:
            return False
        self.put(key, value, lease)
        return True

    def get(self, key: str) -> Any | None:
        self.check()
        self.expire()
        raw = self.data.get(key)
        return None if raw is None else json.loads(raw)

    def get_prefix(self, prefix: str) -> dict[str, Any]:
        self.check()
        self.expire()
        return {k: json.loads(v) for k, v in sorted(self.data.items()) if k.startswith(prefix)}

    def delete(self, key: str) -> None:
        self.check()
        self.data.pop(key, None)
        lease = self.key_lease.pop(key, None)
        if lease is not None:
            lease.keys.discard(key)

    def delete_prefix(self, prefix: str) -> None:
        self.check()
        for key in [k for k in self.data if k.startswith(prefix)]:
            self.delete(key)

    def lease(self, ttl: float) -> SimLease:
        self.check()
        lease = SimLease(self, ttl)
        self.leases.append(lease)
        return lease

    def fail_fast_while_down(self, on: bool = True) -> None:
        proc = self.world.current
        if proc is not None:
            (self.fail_fast.add if on else self.fail_fast.discard)(proc.pid)

    def close(self) -> None:
        pass


class InlinePool(Executor):
    """Runs each submitted call at once: spilled executors load in the simulated process's own step."""

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever takes the result
            future.set_exception(exc)
        return future
