"""What every Litz process shares: an endpoint, the job membership, and finding peers by id."""
from __future__ import annotations

import copy
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

from . import clock
from . import protocol as P
from .endpoint import listen_address, open_endpoint
from .errors import AppError, InputError, LitzError, RegistryUnavailable, describe_app_exception
from .guard import describe
from .membership import Membership

# A member takes the job for over once the master's registry key has been missing this long (a finished job
# tells its members to stop over the data plane first: this is the fallback for a master that died), so that
# a registry reset, after which the master writes its key again, ends nothing (docs/design.md, R3).
MASTER_GONE_GRACE_S = 10.0

STRANGER_RECHECK_S = 1.0  # a sender the registry did not know is looked up again after this long


def resident_bytes() -> int:
    """This process's resident memory (for status and memory budgets). Workers and servers call it as
    ``process.resident_bytes()``: :mod:`litz.sim`, which runs many of them in one interpreter, gives them a
    fixed reading instead."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss


def plausible_id(ident: str) -> bool:
    """Whether ``ident`` could be a process id, worth a registry read: ids off the wire may be anything."""
    return ident.isprintable() and "/" not in ident and 0 < len(ident) <= 200


MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 64 << 20


def tune_malloc() -> None:
    """Fixed glibc mmap and trim thresholds for worker and server processes.

    glibc raises its mmap threshold after a large buffer is freed, so later large arrays come from the heap
    and their memory never goes back to the OS: an evicted executor would not lower the process's memory.
    Fixed at 4 MiB, buffers at least that big are mmap'd and returned on free; smaller ones (typical
    parameter blocks) stay on the heap and skip page faults on every message.

    Fixing the mmap threshold also fixes the trim threshold, at 128 KiB: every time the top of a heap
    has that much free, glibc hands it back (``madvise``), and the next 1 MiB message faults it in again,
    page by page. That churn, in the worker's and server's ZeroMQ I/O threads (CURVE allocates two
    message-sized buffers per frame) and in the update log, halved parameter-server bandwidth
    (bench/ps_bandwidth.py: update 450 -> 900 MB/s with 64 MiB). Up to 64 MiB of freed small buffers may
    stay resident per heap; buffers of 4 MiB and more (executor state, large arrays) still go back at once.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, TRIM_THRESHOLD)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def batch_scheduling() -> bool:
    """Put the calling thread (a worker's main thread, before it starts others) under Linux's ``SCHED_BATCH``;
    False where there is no such policy or it is refused. ``LITZ_WORKER_BATCH=0`` leaves it as it is.

    Why: a Unix socket wakes its reader with a *sync* wakeup, which queues the reader on the writer's core and
    lets it preempt the writer there, on the assumption that the writer is about to sleep. A server answering
    two workers' reads in a row, or a master dispatching two tasks, is not: the first worker woken took the
    core for its whole task while the second one's answer waited in a preempted process, and the other core
    idled (LDA's 270k-token corpus, 2 workers: the second read of a round took a median 0.9 ms, the first
    0.3 ms). A ``SCHED_BATCH`` thread never preempts on wakeup: it runs when a core is free. Workers are the
    job's computation, so nothing waits on their wake-up latency as it does on the server's and the master's:
    that corpus samples 17% faster (4 pairs: 1.21-1.37 s against 1.47-1.59 s), 2 and 32 executors on 3.6M
    tokens 1-4% faster, no-op task throughput is unchanged. Its CPU share (nice) is unchanged too."""
    if os.environ.get("LITZ_WORKER_BATCH", "1") == "0" or not hasattr(os, "SCHED_BATCH"):
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError:
        return False
    return True


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Local children end when their launcher ends, even if it is killed (Linux PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Process:
    """Base of master, worker and server.

    A process that sets ``borrows_frames`` handles each message before taking the next and copies every
    array it keeps (see :meth:`Endpoint.drain`); the others get messages they may keep as they are.

    Every message carries the sender's *epoch*, the number of recoveries it has seen. The master's
    messages set a process's epoch (its channel is ordered, so the first one of a new epoch is the restore
    order); a message from a peer of an older epoch predates the last recovery and is dropped, so nothing
    from before a recovery is ever applied after it.

    A message is handled only if it is well-formed (:meth:`admit`), and a handler that fails on one does not
    take the process down (:meth:`handle_message`): malformed messages are dropped through the endpoint's guard
    (:mod:`litz.guard`).
    """

    role = "process"  # master, worker or server: names the shapes it takes (litz.protocol.SHAPES)

    borrows_frames = False
    watches_peers = False  # its endpoint follows every connection it makes (Endpoint.unreachable)

    def __init__(self, ident: str, membership: Membership, secret: str, listen: str | None = None, *,
                 bind_host: str | None = None, host: str = "127.0.0.1", port: int = 0, local_dir: str | None = None):
        """``listen``: where the endpoint listens, ``scheme://...`` (:func:`litz.endpoint.open_endpoint`); without
        it, ``unix://local_dir`` for a one-machine job, else ``tcp://host:port``. ``bind_host``: for ``tcp://``."""
        self.ident = ident
        self.membership = membership
        self.listen = listen or listen_address(host, port, local_dir)
        options = {"bind_host": bind_host} if bind_host else {}
        self.endpoint = open_endpoint(ident, secret, self.listen, watch=self.watches_peers, **options)
        self.endpoint.guard.on_offender = self.offender
        self.shapes = P.SHAPES.get(self.role, {})
        self.peers_ok: set[str] = {"master"}  # senders known to be processes of this job
        self._strangers: dict[str, float] = {}  # sender -> when the registry last said it is not of this job
        self.pid = os.getpid()
        self.epoch = 0
        self._future: list[tuple[str, int, Any]] = []
        self.drain_requested = False
        self._drain_sent = 0.0
        self._master_missing_since: float | None = None
        self._held: dict[str, list[tuple[Any, Any]]] = {}  # peer -> messages waiting for the registry to name it
        self.stopped = False  # the master told it to stop: the job is over, nothing left to deliver

    def handle_lifecycle(self, tag: str, msg: tuple) -> bool:
        """Messages every worker and server handles alike: stop, refused drain, injected fault."""
        if tag == P.STOP:
            self.running = False
            self.stopped = True
        elif tag == P.DRAIN_REFUSED:
            sys.stderr.write(f"litz: {self.role} {self.ident}: cannot leave gracefully ({msg[1]}); exiting\n")
            self.running = False
        elif tag == P.DIE:
            os.kill(os.getpid(), msg[1])
        elif tag == P.PEER:
            if self.endpoint.knows(msg[1]):
                self.endpoint.connect(msg[1], msg[2])  # a connection to the old process's address would be dead
            self.peer_rejoined(msg[1])
        elif tag == P.REFUSED:  # this process is of another Litz version than the master: it says so, and exits
            raise LitzError(msg[1])
        else:
            return False
        return True

    def peer_rejoined(self, ident: str) -> None:
        """A process of a lost or retired one's id joined the job again: it is a new process."""

    def job_goes_on(self) -> bool:
        """The worker's and server's once-a-second registry check: False once the job is over (its master is
        gone); raises if the master took this process out of the job while it ran (it lost contact with it),
        so that a supervisor sees a failed process and can start a new one, which joins afresh. A registry
        that cannot be read changes nothing until ``--etcd-timeout`` has passed (docs/design.md, R1)."""
        try:
            if self._held:
                self.send_held()
            if self.master_gone():
                return False
            if self.membership.evicted():
                raise LitzError(f"{self.role} {self.ident} was taken out of the job: the master lost contact "
                                "with it")
        except RegistryUnavailable as exc:
            if exc.down_for > self.membership.give_up_after:
                raise exc.gave_up(f"{self.role} {self.ident}: ") from None
        return True

    def master_gone(self) -> bool:
        """Whether the master's registration has been missing from a reachable registry for
        ``MASTER_GONE_GRACE_S`` (R3); raises :class:`RegistryUnavailable` if the registry cannot be read."""
        if self.membership.master() is not None:
            self._master_missing_since = None
            return False
        now = clock.time()
        since = self._master_missing_since
        if since is None:
            self._master_missing_since = since = now
        return now - since >= MASTER_GONE_GRACE_S

    def leave_now(self) -> None:
        """Signal-safe: the launcher of a local job died, and the master with it: end the event loop at once,
        without asking to drain (nobody is left to answer) or delivering what is queued."""
        self.running = False
        self.stopped = True

    def request_drain(self) -> None:
        """Signal-safe: the event loop asks the master to move this process's work away."""
        self.drain_requested = True

    def leave_on_request(self) -> bool:
        """Called by the event loop: True once this process should just exit (master gone)."""
        now = clock.time()
        if now - self._drain_sent > 5.0:
            self._drain_sent = now
            try:
                if self.master_gone():
                    return True
            except RegistryUnavailable:
                pass  # the master is there, as far as anyone knows: ask it
            self.send("master", (P.DRAIN_ME,))
        return False

    def reach(self, peer: str) -> None:
        """Connect to ``peer`` (by its registry entry) unless connected already."""
        ep = self.endpoint
        if not ep.knows(peer):
            info = self.membership.master() if peer == "master" else self.membership.member(peer)
            if info is None:
                raise LitzError(f"{self.ident}: unknown peer {peer}")
            ep.connect(peer, info["address"])

    def send(self, peer: str, msg: Any, pickler: Any = None) -> int:
        """Send ``msg`` to ``peer``; 0 bytes if the peer is gone from the registry: a lost process, whose loss the
        master handles (the message would be lost on the way to it as well), must not take this one down
        (docs/design.md, M4)."""
        held = self._held.get(peer)
        if held is not None:  # earlier messages wait for its address: this one waits behind them
            held.append(((self.epoch, copy.deepcopy(msg)), pickler))
            return 0
        try:
            self.reach(peer)
        except LitzError as exc:
            if self.may_be_named_later(exc):
                self._held[peer] = [((self.epoch, copy.deepcopy(msg)), pickler)]
            return 0
        return self.endpoint.send(peer, (self.epoch, msg), pickler)

    def registry_settled(self) -> bool:
        """Whether a peer missing from the registry is gone (M4), not yet registered again (R3)."""
        try:
            return self.membership.registry_settled()
        except RegistryUnavailable:
            return False

    def may_be_named_later(self, exc: LitzError) -> bool:
        """Whether a peer :meth:`reach` could not find (``exc``) is unknown rather than gone: the registry cannot
        be read (R1), or came back empty and the peer has not written its key again yet (R3). Its messages
        wait; a peer gone from a settled registry is lost, and so is what is sent to it (M4)."""
        return isinstance(exc, RegistryUnavailable) or not self.registry_settled()

    def send_held(self) -> None:
        """Send what waited for the registry to name its peer (called once a second, from the registry check)."""
        for peer in list(self._held):
            try:
                self.reach(peer)
            except LitzError as exc:
                if not self.may_be_named_later(exc):
                    del self._held[peer]  # gone from the registry: lost with the peer, as any message to it (M4)
                continue
            for wrapped, pickler in self._held.pop(peer):
                self.endpoint.send(peer, wrapped, pickler)

    def receive(self) -> Iterator[tuple[str, Any]]:
        """Well-formed messages received so far that belong to this process's epoch."""
        for sender, envelope in self.endpoint.drain(borrow=self.borrows_frames):
            msg = self.admit(sender, envelope)
            if msg is None:
                continue
            epoch = envelope[0]
            if sender == "master":
                if epoch > self.epoch:
                    self.epoch = epoch
                    yield sender, msg
                    yield from self._replay()
                    continue
                yield sender, msg
            elif epoch == self.epoch:
                yield sender, msg
            elif epoch > self.epoch:
                self._future.append((sender, epoch, copy.deepcopy(msg) if self.borrows_frames else msg))

    def admit(self, sender: str, envelope: Any) -> tuple | None:
        """The message in ``envelope`` if it may be handled: an ``(epoch, message)`` pair whose message fits this
        role's shapes (:func:`litz.protocol.check`), from a process of this job. Else None: dropped, with a
        warning now and then (:class:`litz.guard.MessageGuard`)."""
        if type(envelope) is not tuple or len(envelope) != 2 or type(envelope[0]) is not int:
            self.endpoint.guard.refuse(sender, "not an (epoch, message) pair", type(envelope).__name__)
            return None
        msg = envelope[1]
        why = P.check(self.shapes, sender, msg)
        if why is None and sender not in self.peers_ok:
            why = self.stranger(sender, msg)
        if why is not None:
            self.endpoint.guard.refuse(sender, *why)
            return None
        return msg

    def stranger(self, sender: str, msg: tuple) -> tuple[str, str] | None:
        """Why ``sender``, not heard before, is not a process of this job, or None (it is, and is remembered).
        Every process of a job holds an id in its registry, never reused within the job: it is looked up once
        per sender, and again for one it did not know at most once a second. A registry that cannot be read, or
        was cleared as the job ended (its processes' last messages may still arrive), does not make a sender a
        stranger: the message did come through the job's authenticated endpoint."""
        now = clock.monotonic()
        if now - self._strangers.get(sender, now - STRANGER_RECHECK_S) < STRANGER_RECHECK_S:
            return "not a process of this job", ""
        if plausible_id(sender):
            try:
                known = (self.membership.get(f"ids/{sender}") is not None or self.membership.master() is None
                         or not self.registry_settled())  # just back empty: it may not have written its id (R3)
            except Exception:  # the registry is unreachable
                known = True
        else:
            known = False  # no process takes such an id
        if not known:
            if len(self._strangers) > 1024:
                self._strangers = {k: t for k, t in self._strangers.items() if now - t < STRANGER_RECHECK_S}
            self._strangers[sender] = now
            return "not a process of this job", ""
        self._strangers.pop(sender, None)
        self.peers_ok.add(sender)
        return None

    def handle_message(self, sender: str, msg: tuple) -> None:
        """:meth:`handle` one admitted message. An application error it raises (app code run by the handler) stops
        the job: the master raises it, a worker or server reports it to the master. Another :class:`LitzError`
        ends this process on purpose (a refusal). Any other exception is the message's fault, never the app's (the
        shapes do not look inside batches, nor at the receiver's state): it is dropped as malformed, with where
        the handler failed, and the process goes on serving. At the master, a process of this job whose message
        could not be handled is also taken out of the job at once: what it sent is lost (a DONE's completions, a
        MOVED), so the job would wait for it forever; without it the master recovers, or ends the job saying why."""
        try:
            self.handle(sender, msg)
        except (AppError, InputError) as exc:
            if self.role == "master":
                raise
            self.send("master", (P.FAIL, *describe_app_exception("", exc)))
        except LitzError:
            raise
        except Exception as exc:
            self.endpoint.guard.refuse(sender, f"{msg[0]} that could not be handled", describe(exc))
            # nothing is lost with a HELLO (answered or refused, the process says it again) or STATS (sent again)
            if self.role == "master" and sender in self.peers_ok and msg[0] not in (P.HELLO, P.STATS):
                self.take_out(sender, f"its {msg[0]} could not be handled ({describe(exc)})")

    def offender(self, peer: str) -> bool:
        """``peer`` sent more malformed messages than the guard allows: cut it off for a while (True), unless it
        is the master, whose messages a worker or server cannot do without: those it keeps hearing. A process of
        this job that does so is broken, and what it sent was lost: it is also taken out of the job, so that the
        master recovers without it instead of the job waiting on it (and it stops, should it live)."""
        if peer == "master":
            return False
        if peer in self.peers_ok:
            self.take_out(peer, "it sends malformed messages")
        return self.endpoint.cut_off(peer)

    def take_out(self, peer: str, why: str) -> None:
        """Take ``peer``, a process of this job, out of it (its registration goes): the master handles that as
        the loss of a member, as if it had died."""
        sys.stderr.write(f"litz: {self.ident}: taking {peer} out of the job: {why}\n")  # as the guard says drops
        try:
            self.membership.evict(peer)
        except Exception:  # the registry is unreachable: the master hears of it by other ways, or not at all
            pass

    def _replay(self) -> Iterator[tuple[str, Any]]:
        future, self._future = self._future, []
        for sender, epoch, msg in future:
            if epoch == self.epoch:
                yield sender, msg
            elif epoch > self.epoch:
                self._future.append((sender, epoch, msg))

    def await_welcome(self, timeout: float) -> None:
        """Handle nothing until the master's first message: none means it cannot hear us (wrong secret?)."""
        ep = self.endpoint
        deadline = clock.time() + timeout
        while not ep.poll(100):
            if clock.time() > deadline:
                raise LitzError(f"{self.role} {self.ident}: the master at {ep.address_of('master')} did not answer "
                                f"within {timeout:.0f} s; is the job secret right?")
            try:
                if self.master_gone():
                    raise LitzError(f"{self.role} {self.ident}: the job's master is gone")
            except RegistryUnavailable:
                pass  # waiting for the master is all there is to do

    def close(self) -> None:
        self.endpoint.guard.summary()
        self.endpoint.close(discard=self.stopped)
