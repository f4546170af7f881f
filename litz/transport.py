"""Point-to-point messaging between the processes of one job, over ZeroMQ: TCP with CURVE between hosts,
Unix sockets within a one-machine job.

Each process owns one :class:`ZmqEndpoint` (a :class:`litz.endpoint.Endpoint`, opened for ``tcp://`` listen
addresses): a ROUTER socket it binds and receives on, and one DEALER per peer it sends to (routing id = its
own process id). Receiving on one socket keeps every event loop a single poll; sending on per-peer DEALERs
keeps each peer's messages in order.

Large frames to a peer on the same host go through a shared-memory ring (:mod:`litz.shmring`) instead of
the cipher; the message itself, with the frames' positions, still crosses the authenticated socket. A
sender offers a ring on its first large frame to a peer; the peer maps it and accepts (or refuses: another
host, no ``/dev/shm``), and until it accepts every frame travels inline. ``LITZ_SHM=0`` turns rings off.

A one-machine job (``local_dir``) binds Unix sockets in a directory only its user can enter, and leaves
CURVE off: the directory's permissions keep strangers out as the keys would. It uses
:class:`litz.localtransport.LocalEndpoint` (``unix://`` listen addresses), which keeps everything here but the
carrier (no ZeroMQ I/O threads); ``LITZ_TRANSPORT=zmq`` gives it this class over ZeroMQ's ``ipc://`` instead.

Frames that are no message (see :mod:`litz.guard`) are dropped here, each with its reason, before anything acts
on them. No frame larger than :func:`max_frame_bytes` is received: ZeroMQ closes the connection that brings one
before it is buffered (``ZMQ_MAXMSGSIZE``), and a sender refuses to send one (a clear error instead of a message
lost on the way).
"""
from __future__ import annotations

import hashlib
import os
import pickle
import struct
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from . import shmring, wire
from .endpoint import Endpoint, register_carrier
from .errors import LitzError
from .guard import BadMessage
from .security import Authenticator, curve_keypair

HIGH_WATER_MARK = 1_000_000
RING_MIN_BYTES = 64 << 10  # below this the cipher costs less than the extra copy and bookkeeping
RING_BYTES = 32 << 20  # per (sender, receiver) pair; a frame that does not fit goes inline
# close() gives queued messages (final acks, results) this long to leave; ``LITZ_TEST_LINGER_S`` (tests only)
# stretches it so that a close that waits on it, where it must not, cannot pass for a slow machine
LINGER_S = float(os.environ.get("LITZ_TEST_LINGER_S") or 2.0)
WATCHED_RECONNECT_MS = 50  # a watched peer's connection is retried this often after it drops
# A watched connection that carries nothing back for this long after a heartbeat is closed (and then counts
# as dropped): a peer cut off without a reset, or stopped, answers no heartbeat. Its I/O thread answers them,
# not its Python thread, so a busy peer is not taken for a dead one.
HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS = 1000, 5000
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
# A message's first frame is a pickle stream (b"\x80...") unless it is one of these.
_CONTROL = b"LZC"  # connection hello and ring handshake: pickled (what, ring id, ...)
_RINGED = b"LZR"  # then ring id, count, (frame index, position, length) * count; then the message
_RINGED_HEAD = struct.Struct("<3sIH")
_RINGED_ENTRY = struct.Struct("<HQQ")
# control messages and their fields after the kind: (what, ring id, ...)
_CONTROL_FIELDS = {"hello": (int, str), "offer": (int, str, str), "accept": (int,), "refuse": (int,), "reset": (int,)}
CURVE_OVERHEAD_BYTES = 1024  # ZMQ_MAXMSGSIZE counts a frame as it is on the wire: with CURVE's box around it


def max_frame_bytes() -> int:
    """The largest frame a process receives or sends: ``LITZ_MAX_FRAME_BYTES`` (bytes, or with K, M, G, T), by
    default the machine's physical memory. A frame is one buffer: the pickled message, or one large array of it;
    none larger than the memory can be received anyway, so the default refuses no message that could arrive,
    only a length no process could hold (garbage, a bit flip in a length). Set it the same on every machine."""
    text = os.environ.get("LITZ_MAX_FRAME_BYTES", "").strip()
    if text:
        from .outofcore import parse_bytes

        try:
            return parse_bytes(text)
        except LitzError as exc:
            raise LitzError(f"LITZ_MAX_FRAME_BYTES: {exc}") from None
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 1 << 36


def _control_message(head: Any) -> tuple:
    """A control frame's message, ``_CONTROL`` stripped, checked against its kind's fields."""
    try:
        what = pickle.loads(head[3:])
    except Exception as exc:
        raise BadMessage("not a pickled control message", f"{type(exc).__name__}: {str(exc)[:120]}") from None
    fields = _CONTROL_FIELDS.get(what[0]) if type(what) is tuple and what and type(what[0]) is str else None
    if fields is None or len(what) != len(fields) + 1 or not all(map(isinstance, what[1:], fields)):
        raise BadMessage("malformed control message")
    return what


def _buffer(frame: Any) -> Any:
    """A received frame's bytes: ZeroMQ frames hold them in ``.buffer``, other transports hand buffers."""
    return frame.buffer if isinstance(frame, zmq.Frame) else frame


def ring_prefix(secret: str) -> str:
    """The ``/dev/shm`` name prefix of a job's rings (a digest: the secret itself must not show)."""
    return "litz-" + hashlib.sha256(b"litz-shm-v1:" + secret.encode()).hexdigest()[:16]


def _host(address: str) -> str:
    return address.rsplit(":", 1)[0].split("://", 1)[-1].strip("[]")


@dataclass
class _Watch:
    """A watched connection: its monitor socket, since when it is down (None: up), and whether that was reported."""

    monitor: zmq.Socket
    dropped_at: float | None = None
    reported: bool = False


class ZmqEndpoint(Endpoint):
    def __init__(self, ident: str, secret: str, host: str = "127.0.0.1", port: int = 0,
                 bind_host: str | None = None, watch: bool = False, local_dir: str | None = None):
        """``local_dir``: every peer is a process of this machine and user; bind a Unix socket there, no CURVE."""
        self.ident = ident
        self._watch_all = watch  # the default of connect(watch=)
        self._curve = local_dir is None
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        if self._curve:
            self._public, self._secret = curve_keypair(secret)
            self._auth = Authenticator(self.context, self._public)
            self.router.curve_server = True
            self.router.curve_publickey = self._public
            self.router.curve_secretkey = self._secret
        self.router.router_handover = 1  # a restarted peer with the same id takes over its route
        self.router.rcvhwm = HIGH_WATER_MARK
        self.max_frame = max_frame_bytes()
        # ZeroMQ closes the connection of a frame over this before buffering it (no reason is reported)
        self.router.maxmsgsize = self.max_frame + CURVE_OVERHEAD_BYTES
        self.router.linger = 0
        if local_dir is not None:  # the pid keeps a restarted process with the same id off its old socket file
            self.address = f"ipc://{local_dir}/{ident}-{os.getpid()}"
            self.router.bind(self.address)
        else:
            bind = bind_host or host
            if port:
                self.router.bind(f"tcp://{bind}:{port}")
            else:
                port = self.router.bind_to_random_port(f"tcp://{bind}")
            self.address = f"tcp://{host}:{port}"
        self._watches: dict[str, _Watch] = {}  # watched peers' connections
        self._waiter: tuple[tuple[int, ...], zmq.Poller] | None = None  # wait()'s poller and its extra fds
        self._init_peers(secret, host)

    def _init_peers(self, secret: str, host: str) -> None:
        """What every endpoint keeps of its peers, whatever carries the bytes: addresses and rings."""
        self._peers: dict[str, Any] = {}  # peer -> its outgoing connection
        self._addresses: dict[str, str] = {}
        self.pid = os.getpid()
        self._host = host
        self._ring_prefix = ring_prefix(secret)
        self._rings = os.environ.get("LITZ_SHM", "1") != "0" and shmring.available()
        self._writers: dict[str, tuple[int, shmring.RingWriter]] = {}  # accepted by the peer
        self._offered: dict[str, tuple[int, shmring.RingWriter]] = {}  # waiting for the peer's answer
        self._inline: set[str] = set()  # peers that refused a ring or are on another host
        self._readers: dict[str, tuple[int, shmring.RingReader]] = {}  # rings peers send to us through
        self._next_ring = 1

    # -- peers ---------------------------------------------------------------------------------------
    def connect(self, peer: str, address: str, watch: bool | None = None) -> None:
        """Know ``peer`` at ``address`` (reconnects if the address changed). ``watch``: follow the connection,
        for :meth:`unreachable` (default: as the endpoint was made). A connection is made on the first message
        either way, also to answer a peer's ring offer, so an endpoint that watches its peers watches all."""
        if self._addresses.get(peer) == address:
            return
        self.disconnect(peer)
        watch = self._watch_all if watch is None else watch
        sock = self.context.socket(zmq.DEALER)
        sock.routing_id = self.ident.encode()
        if self._curve:
            sock.curve_serverkey = self._public
            sock.curve_publickey = self._public
            sock.curve_secretkey = self._secret
        sock.sndhwm = HIGH_WATER_MARK
        sock.linger = int(LINGER_S * 1000)  # give queued messages (final acks, results) a moment at shutdown
        if watch:
            sock.reconnect_ivl = WATCHED_RECONNECT_MS
            sock.heartbeat_ivl, sock.heartbeat_timeout = HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS
            monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
            self._watches[peer] = _Watch(monitor)
        self._peers[peer] = sock
        try:
            sock.connect(address)
        except zmq.ZMQError:  # not an address ZeroMQ can connect to: nothing of this attempt stays open
            self._close_connection(peer)
            raise
        # First on this connection: where we listen. A peer that knew a process of our id at another address
        # (we restarted under the same --id) sends its answers to that address until it hears this.
        sock.send_multipart([_CONTROL + pickle.dumps(("hello", 0, self.address))])
        self._addresses[peer] = address
        if self._rings:  # offered now, so it is accepted before the first large frame (which would go inline)
            self._offer(peer)

    def unreachable(self, grace_s: float) -> list[str]:
        """Watched peers whose connection dropped and has not come back for ``grace_s``, each reported once.

        A peer process that dies closes its connections at once (its kernel does, whatever killed it), and
        nothing accepts the retries; a live peer's I/O thread accepts them within a retry interval, however
        busy its Python thread is. So this tells a dead process from a live one in well under a second,
        where a registry lease takes seconds. A peer that closes nothing (a lost host, a cut cable, a stopped
        process) stops answering heartbeats: its connection is closed after ``HEARTBEAT_TIMEOUT_MS`` and
        counts from then."""
        now, gone = None, []
        for peer, watch in self._watches.items():
            while True:
                try:
                    event = recv_monitor_message(watch.monitor, zmq.NOBLOCK)["event"]
                except zmq.Again:
                    break
                now = now or time.monotonic()
                if event == zmq.EVENT_DISCONNECTED:
                    watch.dropped_at = watch.dropped_at or now
                else:  # the handshake of a (re)connection succeeded
                    watch.dropped_at, watch.reported = None, False
            if watch.dropped_at is not None and not watch.reported:
                now = now or time.monotonic()
                if now - watch.dropped_at >= grace_s:
                    watch.reported = True
                    gone.append(peer)
        return gone

    def disconnect(self, peer: str) -> None:
        self._close_connection(peer)
        self._addresses.pop(peer, None)
        self._inline.discard(peer)
        for rings in (self._writers, self._offered, self._readers):
            ring = rings.pop(peer, None)
            if ring is not None:
                ring[1].close()

    def _close_connection(self, peer: str) -> None:
        sock = self._peers.pop(peer, None)
        watch = self._watches.pop(peer, None)
        if sock is not None:
            if watch is not None:
                sock.disable_monitor()
            sock.close(linger=0)
        if watch is not None:
            watch.monitor.close(linger=0)

    def knows(self, peer: str) -> bool:
        return peer in self._peers

    def address_of(self, peer: str) -> str | None:
        return self._addresses.get(peer)

    # -- messages ------------------------------------------------------------------------------------
    def send(self, peer: str, msg: Any, pickler: Any = None) -> int:
        """Send ``msg`` to ``peer``; returns the bytes handed to ZeroMQ."""
        frames = wire.encode(msg) if pickler is None else wire.encode(msg, pickler)
        sizes = [memoryview(f).nbytes for f in frames]
        if max(sizes) > self.max_frame:  # the peer would close the connection, and the message be lost
            raise LitzError(f"{self.ident}: a message to {peer} ({msg[1][0] if _tagged(msg) else type(msg).__name__}) "
                            f"has a frame of {max(sizes):,} bytes, over LITZ_MAX_FRAME_BYTES ({self.max_frame:,})")
        if self._rings and len(frames) > 1 and max(sizes[1:]) >= RING_MIN_BYTES:
            frames = self._through_ring(peer, frames, sizes)
        self._send_frames(peer, frames)
        return sum(sizes)

    def _send_frames(self, peer: str, frames: list) -> None:
        self._peers[peer].send_multipart(frames, copy=False)

    def _through_ring(self, peer: str, frames: list, sizes: list[int]) -> list:
        """``frames`` with the large ones moved into ``peer``'s ring (offering one first if needed)."""
        ring = self._writers.get(peer)
        if ring is None:
            if peer not in self._offered and peer not in self._inline:
                self._offer(peer)
            return frames
        ring_id, writer = ring
        entries = []
        for i in range(1, len(frames)):
            if sizes[i] >= RING_MIN_BYTES:
                pos = writer.put(memoryview(frames[i]).cast("B"))
                if pos is not None:
                    entries.append(_RINGED_ENTRY.pack(i, pos, sizes[i]))
                    frames[i] = b""
        if not entries:
            return frames
        return [_RINGED_HEAD.pack(_RINGED, ring_id, len(entries)) + b"".join(entries)] + frames

    def _offer(self, peer: str) -> None:
        address = self._addresses.get(peer, "")
        if not address.startswith("ipc://") and _host(address) not in LOCAL_HOSTS + (self._host,):
            self._inline.add(peer)
            return
        try:
            writer = shmring.RingWriter(self._ring_prefix, RING_BYTES)
        except OSError as exc:  # /dev/shm full or unusable: stay inline
            sys.stderr.write(f"litz: {self.ident}: no shared-memory ring for {peer} ({exc}); sending inline\n")
            self._inline.add(peer)
            return
        ring_id, self._next_ring = self._next_ring, self._next_ring + 1
        self._offered[peer] = (ring_id, writer)
        self._control(peer, ("offer", ring_id, writer.name, self.address))

    def _control(self, peer: str, what: tuple) -> None:
        if peer in self._peers:
            self._send_frames(peer, [_CONTROL + pickle.dumps(what)])

    def _on_control(self, sender: str, what: tuple) -> None:
        kind, ring_id = what[0], what[1]
        if kind == "hello":
            if self._addresses.get(sender, what[2]) != what[2]:  # a new process under a known id
                self._connect_to(sender, what[2])
            return
        if kind == "offer":
            name, address = what[2], what[3]
            if not name.startswith(self._ring_prefix + "-"):  # mapping it unlinks it: only this job's rings
                raise BadMessage("ring offer outside the job's rings", name[:80])
            if not self.knows(sender):
                self._connect_to(sender, address)
            old = self._readers.pop(sender, None)
            if old is not None:
                old[1].close()
            try:
                self._readers[sender] = (ring_id, shmring.RingReader(name))
            except (OSError, ValueError):
                self._control(sender, ("refuse", ring_id))
                return
            self._control(sender, ("accept", ring_id))
            return
        offered = self._offered.get(sender)
        if kind in ("accept", "refuse") and offered is not None and offered[0] == ring_id:
            del self._offered[sender]
            offered[1].unlink()
            if kind == "accept":
                self._writers[sender] = offered
            else:
                offered[1].close()
                self._inline.add(sender)
        elif kind == "reset":
            ring = self._writers.get(sender)
            if ring is not None and ring[0] == ring_id:
                del self._writers[sender]
                ring[1].close()

    def _connect_to(self, peer: str, address: str) -> None:
        """:meth:`connect` to an address a peer gave in a control message, which may be anything."""
        if not address.startswith(("tcp://", "ipc://")):
            raise BadMessage("control message with a bad address", address[:80])
        try:
            self.connect(peer, address)
        except (zmq.ZMQError, OSError, ValueError) as exc:
            raise BadMessage("control message with a bad address", f"{address[:80]}: {exc}") from None

    def _from_ring(self, sender: str, frames: list, borrow: bool) -> tuple[list, tuple | None]:
        """The message's frames with ring positions replaced by the frames' bytes (copies, or views when
        borrowing, then also what to release once the message is handled)."""
        head = _buffer(frames[0])
        if len(head) < _RINGED_HEAD.size:
            raise BadMessage("truncated ring header")
        _, ring_id, count = _RINGED_HEAD.unpack_from(head)
        if len(head) < _RINGED_HEAD.size + count * _RINGED_ENTRY.size:
            raise BadMessage("truncated ring header")
        ring = self._readers.get(sender)
        if ring is None or ring[0] != ring_id:
            # The peer writes into a ring this process never mapped (it restarted under the same id): the
            # message cannot be read. Tell the peer to drop that ring; the next large frame offers a new one.
            self._control(sender, ("reset", ring_id))
            raise BadMessage("frames in a ring this process does not know")
        reader = ring[1]
        rest = list(frames[1:])
        end = 0
        for k in range(count):
            index, pos, n = _RINGED_ENTRY.unpack_from(head, _RINGED_HEAD.size + k * _RINGED_ENTRY.size)
            if not 0 < index < len(rest):
                raise BadMessage("ring entry for a frame the message does not have")
            try:
                rest[index] = reader.view(pos, n) if borrow else reader.take(pos, n)
            except ValueError as exc:
                raise BadMessage("ring entry out of the ring", str(exc)) from None
            end = pos + n
        return rest, (reader, end) if borrow else None

    def poll(self, timeout_ms: float) -> bool:
        return bool(self.router.poll(timeout_ms))

    def wait(self, timeout_ms: float, fds: Iterable[int] = ()) -> tuple[bool, set[int]]:
        fds = tuple(fds)
        if self._waiter is None or self._waiter[0] != fds:  # polled by number: a reused fd number is fine
            poller = zmq.Poller()
            poller.register(self.router, zmq.POLLIN)
            for fd in fds:
                poller.register(fd, zmq.POLLIN)
            self._waiter = (fds, poller)
        events = dict(self._waiter[1].poll(timeout_ms))
        return self.router in events, {fd for fd in fds if fd in events}

    def drain(self, limit: int = 10_000, borrow: bool = False) -> Iterator[tuple[str, Any]]:
        """Yield ``(sender, message)`` for everything already received (up to ``limit``).

        ``borrow=True`` saves a copy of each frame that came through a ring: its arrays are views into the
        ring, valid only until the next message is taken, so the caller must copy whatever it keeps."""
        held = None
        guard = self.guard
        try:
            for _ in range(limit):
                if held is not None:
                    held[0].release(held[1])
                    held = None
                got = self._next_incoming()
                if got is None:
                    return
                sender, body = got
                if guard.is_cut(sender):
                    continue
                try:
                    if not body:
                        raise BadMessage("no frames")
                    head = _buffer(body[0])
                    tag = head[:3]
                    if tag == _RINGED:
                        body, held = self._from_ring(sender, body, borrow)
                    elif tag == _CONTROL:
                        self._on_control(sender, _control_message(head))
                        continue
                    msg = wire.decode(body)
                except BadMessage as exc:
                    guard.refuse(sender, exc.reason, exc.detail)
                    continue
                yield sender, msg
        finally:
            if held is not None:
                held[0].release(held[1])

    def _close_rings(self) -> None:
        for rings in (self._writers, self._offered, self._readers):
            for _, ring in rings.values():
                ring.close()
            rings.clear()

    def _next_incoming(self) -> tuple[str, list] | None:
        """The next received message as (sender, frames), or None if nothing is waiting."""
        while True:
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
            raw = frames[0].bytes
            try:
                return raw.decode(), frames[1:]
            except UnicodeDecodeError:
                peer = repr(raw)
                if not self.guard.is_cut(peer):
                    self.guard.refuse(peer, "sender id is not UTF-8")

    def close(self, discard: bool = False) -> None:
        """Close everything. Queued messages get the sockets' linger to reach their peers, unless ``discard``:
        a process the master stopped has nothing left to deliver, and a message queued for a peer that exited
        first (a ring offer or its answer, sent as a short job ended) would hold the close for the whole
        linger."""
        self._close_rings()
        for watch in self._watches.values():
            watch.monitor.close(linger=0)
        self._watches.clear()
        for sock in self._peers.values():
            sock.close(linger=0 if discard else None)
        self._peers.clear()
        self.router.close(linger=0)
        self.context.term()


def _tagged(msg: Any) -> bool:
    """Whether ``msg`` is a process's (epoch, (tag, ...)) envelope, whose tag an error message can name."""
    return type(msg) is tuple and len(msg) == 2 and type(msg[1]) is tuple and bool(msg[1])


def _open_tcp(ident: str, secret: str, where: str, *, watch: bool = False,
              bind_host: str | None = None) -> ZmqEndpoint:
    """``tcp://HOST:PORT``: peers reach it at HOST (it binds ``bind_host`` if given); PORT 0 takes a random one."""
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit():
        raise LitzError(f"cannot listen at 'tcp://{where}': a TCP address is tcp://HOST:PORT")
    return ZmqEndpoint(ident, secret, host=host, port=int(port), bind_host=bind_host, watch=watch)


register_carrier("tcp", _open_tcp)
