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
from .errors import LitzError, RegistryUnavailable
from .membership import Membership
from .membership.membership import REREGISTER_GRACE_S

# A member takes the job for over once the master's registry key has been missing this long (a finished job
# tells its members to stop over the data plane first: this is the fallback for a master that died), so that
# a registry reset, after which the master writes its key again, ends nothing (docs/design.md, R3).
MASTER_GONE_GRACE_S = 10.0


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
    """

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
                raise LitzError(f"{self.role} {self.ident}: {exc}; gave up (--etcd-timeout)") from None
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
            # unknown is not absent (R1), nor is a peer missing from a registry that just came back empty and
            # that it has not written its key to again yet (R3): wait until the registry can tell
            if isinstance(exc, RegistryUnavailable) or not self.registry_settled():
                self._held[peer] = [((self.epoch, copy.deepcopy(msg)), pickler)]
            return 0
        return self.endpoint.send(peer, (self.epoch, msg), pickler)

    def registry_settled(self) -> bool:
        """Whether a peer missing from the registry is gone (M4), not yet registered again (R3)."""
        try:
            return self.membership.settled_for() >= REREGISTER_GRACE_S
        except RegistryUnavailable:
            return False

    def send_held(self) -> None:
        """Send what waited for the registry to name its peer (called once a second, from the registry check)."""
        for peer in list(self._held):
            try:
                self.reach(peer)
            except LitzError as exc:
                if not isinstance(exc, RegistryUnavailable) and self.registry_settled():
                    del self._held[peer]  # gone from the registry: lost with the peer, as any message to it (M4)
                continue
            for wrapped, pickler in self._held.pop(peer):
                self.endpoint.send(peer, wrapped, pickler)

    def receive(self) -> Iterator[tuple[str, Any]]:
        """Messages received so far that belong to this process's epoch."""
        for sender, (epoch, msg) in self.endpoint.drain(borrow=self.borrows_frames):
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
        self.endpoint.close(discard=self.stopped)
