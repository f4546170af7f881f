"""The transport of a one-machine job: Unix stream sockets, written and read by the process's own thread.

ZeroMQ hands every message to an I/O thread on each side, so one message wakes three threads (the sender's
I/O thread, the receiver's I/O thread, the receiver's own), where a socket written directly wakes one. On
this project's 2-core VMs a wake-up costs the waker tens of microseconds and the woken core its caches; a
small round trip between two processes costs about 120 us of wall time and 55 us of the caller's CPU through
ZeroMQ's ``ipc://``, 10 and 5 us through a Unix socket. A job of many short tasks pays that on every
dispatch, fetch, flush, acknowledgement and completion, so ``litz run`` (a ``local_dir``) uses this carrier;
jobs across hosts keep ZeroMQ (TCP, CURVE, heartbeats). ``LITZ_TRANSPORT=zmq`` makes a one-machine job use
ZeroMQ too (the baseline of ``bench/local_transport.py``).

Everything above the carrier is :class:`litz.transport.ZmqEndpoint`'s: messages as frame lists (a pickle header,
then out-of-band buffers), per-peer FIFO order, shared-memory rings for large frames, the hello and ring
handshakes, :meth:`unreachable` for watched peers.

On the wire a connection starts with the sender's id (u16 length, UTF-8), then carries messages: u32 frame
count, u64 length per frame, the frames. Writes never block: what the socket does not take waits in the
connection's queue and goes out from the next :meth:`poll` or :meth:`drain` (``EPOLLOUT``), so two processes
sending each other large messages cannot deadlock. A process that dies closes its sockets (the kernel does,
whatever killed it): its peers' connections to it read end-of-file at once, and :meth:`unreachable` reports
it after the grace. There are no heartbeats: a stopped (``SIGSTOP``) local process is found by its registry
lease instead.

A connection whose bytes cannot be framed (a sender id that is not UTF-8, a frame count or length over
:func:`litz.transport.max_frame_bytes`) is closed as soon as its header is read, before any frame is buffered:
nothing after it on that stream could be told apart from garbage.
"""
from __future__ import annotations

import itertools
import os
import select
import socket
import struct
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from .endpoint import register_carrier
from .guard import BadMessage
from .transport import LINGER_S, ZmqEndpoint, max_frame_bytes

CHUNK_BYTES = 256 << 10  # a connection's read buffer: many small messages arrive in one recv
BIG_FRAME_BYTES = 64 << 10  # an incomplete frame larger than this is read into its own buffer, not the chunk
SNDBUF_BYTES = 4 << 20
CONNECT_TIMEOUT_S = 5.0  # a full listen backlog makes connect wait; a live peer accepts from its next poll
MAX_IOV = 256  # buffers per sendmsg
MAX_FRAMES = 1 << 24  # frames of one message (one per array): a count above is a broken header, not a message
_COUNT = struct.Struct("<I")
_ID_LEN = struct.Struct("<H")
_IN = select.EPOLLIN | select.EPOLLRDHUP


class _CutOff(Exception):
    """A connection from a peer the guard cut off: closed at its first bytes, without another warning."""


class _Outgoing:
    """A connection this process sends on; ``sock`` is None once it dropped (or never connected)."""

    __slots__ = ("sock", "queue", "down_since", "reported", "writable_wait")

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.queue: deque[memoryview] = deque()  # bytes the socket has not taken yet, in order
        self.down_since: float | None = None
        self.reported = False
        self.writable_wait = False  # registered for EPOLLOUT


class _Incoming:
    """A connection a peer sends on: the bytes read and not yet parsed, and the message being assembled."""

    __slots__ = ("sock", "sender", "buf", "start", "end", "lens", "frames", "big", "big_have")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.sender: str | None = None  # from the connection's first bytes
        self.buf = bytearray(CHUNK_BYTES)
        self.start = self.end = 0
        self.lens: list[int] | None = None  # frame lengths of the message being assembled
        self.frames: list = []
        self.big: bytearray | None = None  # a large frame being read straight into its own buffer
        self.big_have = 0


class LocalEndpoint(ZmqEndpoint):
    def __init__(self, ident: str, secret: str, local_dir: str, watch: bool = False):
        self.ident = ident
        self._watch_all = watch
        self._watched: set[str] = set()
        self._init_peers(secret, "127.0.0.1")
        self.max_frame = max_frame_bytes()
        # the pid keeps a restarted process with the same id off its old socket file
        self._path = os.path.join(local_dir, f"{ident}-{os.getpid()}")
        self.address = f"ipc://{self._path}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self._path)
        self._listener.listen(512)
        self._listener.setblocking(False)
        self._epoll = select.epoll()
        self._epoll.register(self._listener.fileno(), select.EPOLLIN)
        self._by_fd: dict[int, Any] = {self._listener.fileno(): self._listener}
        self._ready: deque[tuple[str, list]] = deque()
        self._waiter: tuple[tuple[int, ...], Any] | None = None  # wait()'s poll object and its extra fds

    # -- peers ---------------------------------------------------------------------------------------
    def connect(self, peer: str, address: str, watch: bool | None = None) -> None:
        if self._addresses.get(peer) == address:
            return
        self.disconnect(peer)
        conn = _Outgoing()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect(address.removeprefix("ipc://"))
            sock.setblocking(False)
        except OSError:  # nothing listens there: the process is gone
            sock.close()
            conn.down_since = time.monotonic()
        else:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF_BYTES)
            except OSError:
                pass
            conn.sock = sock
            self._epoll.register(sock.fileno(), _IN)
            self._by_fd[sock.fileno()] = conn
            ident = self.ident.encode()
            conn.queue.append(memoryview(_ID_LEN.pack(len(ident)) + ident))
        self._peers[peer] = conn
        self._addresses[peer] = address
        if self._watch_all if watch is None else watch:
            self._watched.add(peer)
        # first on this connection: where we listen (a peer that knew a process of our id at another address
        # sends its answers there until it hears this)
        self._control(peer, ("hello", 0, self.address))
        if self._rings:
            self._offer(peer)

    def _close_connection(self, peer: str) -> None:
        conn = self._peers.pop(peer, None)
        self._watched.discard(peer)
        if conn is not None and conn.sock is not None:
            self._forget(conn.sock)

    def cut_off(self, peer: str) -> bool:
        """Close every connection ``peer`` sends on, and ours to it; a new one from it is closed at its first
        bytes while it is cut off."""
        for obj in list(self._by_fd.values()):
            if isinstance(obj, _Incoming) and obj.sender == peer:
                self._forget(obj.sock)
        return super().cut_off(peer)

    def _forget(self, sock: socket.socket) -> None:
        fd = sock.fileno()
        self._by_fd.pop(fd, None)
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):
            pass
        sock.close()

    def _drop(self, conn: _Outgoing) -> None:
        """The peer closed its end: it exited or was killed. What is queued for it goes nowhere."""
        if conn.sock is not None:
            self._forget(conn.sock)
        conn.sock = None
        conn.queue.clear()
        conn.down_since = conn.down_since or time.monotonic()

    def unreachable(self, grace_s: float) -> list[str]:
        now, gone = time.monotonic(), []
        for peer in self._watched:
            conn = self._peers.get(peer)
            if conn is not None and conn.down_since is not None and not conn.reported \
                    and now - conn.down_since >= grace_s:
                conn.reported = True
                gone.append(peer)
        return gone

    # -- sending -------------------------------------------------------------------------------------
    def _send_frames(self, peer: str, frames: list) -> None:
        conn = self._peers[peer]
        if conn.sock is None:
            return
        views = []
        for f in frames:
            v = memoryview(f)
            views.append(v if v.format == "B" and v.ndim == 1 else v.cast("B"))
        head = struct.pack(f"<I{len(views)}Q", len(views), *(v.nbytes for v in views))
        conn.queue.append(memoryview(head))
        conn.queue.extend(views)
        self._flush(conn)

    def _flush(self, conn: _Outgoing) -> None:
        queue = conn.queue
        while queue:
            try:
                sent = conn.sock.sendmsg(list(itertools.islice(queue, MAX_IOV)))
            except BlockingIOError:
                break
            except OSError:  # the peer is gone (EPIPE, ECONNRESET)
                self._drop(conn)
                return
            while sent:
                first = queue[0]
                if sent >= first.nbytes:
                    sent -= first.nbytes
                    queue.popleft()
                else:
                    queue[0] = first[sent:]
                    sent = 0
            while queue and not queue[0].nbytes:
                queue.popleft()
        want = bool(queue)
        if want != conn.writable_wait:
            conn.writable_wait = want
            self._epoll.modify(conn.sock.fileno(), _IN | select.EPOLLOUT if want else _IN)

    # -- receiving -----------------------------------------------------------------------------------
    def poll(self, timeout_ms: float) -> bool:
        if self._ready:
            return True
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            self._pump(max(0.0, deadline - time.monotonic()))
            if self._ready:
                return True
            if time.monotonic() >= deadline:
                return False

    def wait(self, timeout_ms: float, fds: Iterable[int] = ()) -> tuple[bool, set[int]]:
        fds = tuple(fds)
        if not fds:
            return self.poll(timeout_ms), set()
        if self._waiter is None or self._waiter[0] != fds:  # polled by number: a reused fd number is fine
            poller = select.poll()
            poller.register(self._epoll.fileno(), select.POLLIN)  # readable while any socket has an event
            for fd in fds:
                poller.register(fd, select.POLLIN)
            self._waiter = (fds, poller)
        poller, own = self._waiter[1], self._epoll.fileno()
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            left = 0.0 if self._ready else max(0.0, deadline - time.monotonic())
            try:
                events = poller.poll(left * 1000.0)
            except InterruptedError:
                events = []
            readable = {fd for fd, _ in events if fd != own}
            if any(fd == own for fd, _ in events):
                self._pump(0.0)  # accept, read and write; a message may still be incomplete
            if self._ready or readable or time.monotonic() >= deadline:
                return bool(self._ready), readable

    def _next_incoming(self) -> tuple[str, list] | None:
        if not self._ready:
            self._pump(0.0)
        return self._ready.popleft() if self._ready else None

    def _pump(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for any socket, then accept, read and write whatever can be."""
        try:
            events = self._epoll.poll(timeout_s)
        except InterruptedError:
            return
        for fd, ev in events:
            obj = self._by_fd.get(fd)
            if obj is None:
                continue
            if obj is self._listener:
                self._accept()
            elif isinstance(obj, _Incoming):
                try:
                    more = self._read(obj)
                except BadMessage as exc:  # the stream cannot be framed from here on
                    self.guard.refuse(obj.sender or "(no id)", exc.reason, exc.detail)
                    more = False
                except _CutOff:
                    more = False
                if not more:
                    self._forget(obj.sock)
            else:
                if ev & select.EPOLLOUT and obj.sock is not None:
                    self._flush(obj)
                if ev & (_IN | select.EPOLLHUP | select.EPOLLERR) and obj.sock is not None:
                    self._drop(obj)  # a peer never writes on the connection we send on: this is its end

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            conn = _Incoming(sock)
            self._by_fd[sock.fileno()] = conn
            self._epoll.register(sock.fileno(), _IN)

    def _read(self, conn: _Incoming) -> bool:
        """Read everything the socket holds; False at end-of-file (the peer closed or died)."""
        sock = conn.sock
        while True:
            try:
                if conn.big is not None:
                    n = sock.recv_into(memoryview(conn.big)[conn.big_have:])
                else:
                    if conn.end == len(conn.buf):
                        self._fresh_buffer(conn)
                    n = sock.recv_into(memoryview(conn.buf)[conn.end:])
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            if not n:
                return False
            if conn.big is not None:
                conn.big_have += n
                if conn.big_have < len(conn.big):
                    continue
                conn.frames.append(conn.big)
                conn.big = None
            else:
                conn.end += n
            self._parse(conn)

    @staticmethod
    def _fresh_buffer(conn: _Incoming) -> None:
        """A new read buffer holding the unparsed tail: the old one may still back a header being decoded."""
        rest = conn.end - conn.start
        buf = bytearray(max(CHUNK_BYTES, 2 * rest))
        buf[:rest] = memoryview(conn.buf)[conn.start:conn.end]
        conn.buf, conn.start, conn.end = buf, 0, rest

    def _parse(self, conn: _Incoming) -> None:
        buf = conn.buf
        while True:
            avail = conn.end - conn.start
            if conn.sender is None:
                if avail < _ID_LEN.size:
                    return
                (n,) = _ID_LEN.unpack_from(buf, conn.start)
                if avail < _ID_LEN.size + n:
                    return
                raw = bytes(buf[conn.start + _ID_LEN.size: conn.start + _ID_LEN.size + n])
                conn.start += _ID_LEN.size + n
                try:
                    conn.sender = raw.decode()
                except UnicodeDecodeError:
                    conn.sender = repr(raw)
                    if self.guard.is_cut(conn.sender):
                        raise _CutOff() from None
                    raise BadMessage("sender id is not UTF-8") from None
                if self.guard.is_cut(conn.sender):
                    raise _CutOff()
                continue
            if conn.lens is None:
                if avail < _COUNT.size:
                    return
                (count,) = _COUNT.unpack_from(buf, conn.start)
                if count > MAX_FRAMES or 8 * count > self.max_frame:  # its lengths alone would take that much
                    raise BadMessage("frame count over the limit", f"{count:,} frames")
                if avail < _COUNT.size + 8 * count:
                    return
                conn.lens = list(struct.unpack_from(f"<{count}Q", buf, conn.start + _COUNT.size))
                if count and max(conn.lens) > self.max_frame:
                    raise BadMessage("frame over the size limit",
                                     f"{max(conn.lens):,} bytes, LITZ_MAX_FRAME_BYTES is {self.max_frame:,}")
                conn.start += _COUNT.size + 8 * count
                conn.frames = []
                continue
            frames, lens = conn.frames, conn.lens
            while len(frames) < len(lens):
                need = lens[len(frames)]
                avail = conn.end - conn.start
                view = memoryview(buf)[conn.start:conn.start + min(need, avail)]
                if avail >= need:
                    # The header is decoded at once: a view will do. Buffers become the message's arrays
                    # and may live long (a server's values): their own copy, or they would pin the chunk.
                    frames.append(view if not frames else bytearray(view))
                    conn.start += need
                elif need > BIG_FRAME_BYTES:
                    try:
                        big = bytearray(need)
                    except MemoryError:
                        raise BadMessage("frame too large to hold", f"{need:,} bytes") from None
                    big[:avail] = view
                    conn.big, conn.big_have = big, avail
                    conn.start = conn.end
                    return
                else:
                    return  # the rest of a small frame is still on its way
            self._ready.append((conn.sender, frames))
            conn.lens, conn.frames = None, []

    def close(self, discard: bool = False) -> None:
        if not discard:
            deadline = time.monotonic() + LINGER_S
            while any(c.queue for c in self._peers.values()) and time.monotonic() < deadline:
                self._pump(0.01)
        self._close_rings()
        for obj in list(self._by_fd.values()):
            sock = obj if isinstance(obj, socket.socket) else obj.sock
            if sock is not None:
                sock.close()
        self._by_fd.clear()
        self._peers.clear()
        self._watched.clear()
        self._epoll.close()
        try:
            os.unlink(self._path)
        except OSError:
            pass


def _open_unix(ident: str, secret: str, where: str, *, watch: bool = False,
               bind_host: str | None = None) -> ZmqEndpoint:
    """``unix://DIR``: a :class:`LocalEndpoint` with its socket in DIR (``LITZ_TRANSPORT=zmq``, or no epoll as on
    macOS: ZeroMQ's ``ipc://`` there). ``bind_host`` means nothing without a network and is ignored."""
    if os.environ.get("LITZ_TRANSPORT", "unix") != "zmq" and hasattr(select, "epoll"):
        return LocalEndpoint(ident, secret, where, watch=watch)
    return ZmqEndpoint(ident, secret, watch=watch, local_dir=where)


register_carrier("unix", _open_unix)
