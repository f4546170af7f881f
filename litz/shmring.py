"""Shared-memory rings: large frames between two processes of one host, without the socket's cipher.

CURVE encrypts every byte that crosses a socket (about 0.4 ms per MiB on a typical VM core), which caps one
stream near 2.5 GB/s, far below what loopback ZeroMQ moves in the clear. Between processes on the same host
the bytes never leave the machine, so a sender copies each large frame into a ring in ``/dev/shm`` that
only it and its receiver have mapped, and sends just the frame's position over the authenticated socket.
The ring is an optimisation, never a requirement: a frame that does not fit travels inline.

One ring per (sender, receiver) pair, single producer and single consumer. Positions are monotonic byte
counts; the receiver publishes how far it has consumed in the ring's header, and the sender reuses space
only behind that mark. The name exists only until the receiver has mapped it (it unlinks it at once), so a
killed process leaves nothing behind in ``/dev/shm`` except a ring that was never accepted.
"""
from __future__ import annotations

import glob
import mmap
import os
import secrets

import numpy as np

SHM_DIR = "/dev/shm"
HEADER_BYTES = 64  # bytes 0..7: the consumed position, written by the receiver
RESERVE_STEP = 4 << 20


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def remove_all(prefix: str) -> None:
    """Unlink every ring name left under ``prefix`` (rings offered by processes killed before acceptance)."""
    for path in glob.glob(os.path.join(SHM_DIR, glob.escape(prefix) + "-*")):
        try:
            os.unlink(path)
        except OSError:
            pass


class _Mapping:
    def __init__(self, mm: mmap.mmap):
        self._mm = mm
        self.consumed = np.frombuffer(mm, np.uint64, 1, 0)
        self.data = np.frombuffer(mm, np.uint8, len(mm) - HEADER_BYTES, HEADER_BYTES)
        self.capacity = len(self.data)
        self.closed = False

    def close(self) -> None:
        del self.consumed, self.data  # the mmap refuses to close while numpy views export it
        try:
            self._mm.close()
        except BufferError:  # a borrowed frame is still referenced: the mapping goes with it
            pass
        self.closed = True


class RingWriter:
    """The sending end. Space is reserved (``posix_fallocate``) as the ring first grows into it, so a full
    tmpfs refuses a frame (it then travels inline) instead of killing the process with SIGBUS, and a ring
    whose traffic is request/response sized holds only that much memory: an empty ring starts over at 0."""

    def __init__(self, prefix: str, capacity: int):
        self.name = f"{prefix}-{secrets.token_hex(8)}"
        self.path = os.path.join(SHM_DIR, self.name)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(self._fd, HEADER_BYTES + capacity)
            os.posix_fallocate(self._fd, 0, HEADER_BYTES)
            mm = mmap.mmap(self._fd, HEADER_BYTES + capacity)
        except BaseException:
            self.close()
            raise
        self._map = _Mapping(mm)
        self._reserved = 0  # bytes of the data area backed by memory
        self.head = 0

    def put(self, frame: memoryview) -> int | None:
        """Copy ``frame`` (contiguous bytes) into the ring: its position, or None if there is no room now."""
        n = frame.nbytes
        cap = self._map.capacity
        pos = self.head
        offset = pos % cap
        consumed = int(self._map.consumed[0])
        if offset and (consumed == pos or offset + n > cap):  # empty, or never split a frame: start over
            pos += cap - offset
            offset = 0
        if pos + n - consumed > cap or not self._reserve(offset + n):
            return None
        self._map.data[offset:offset + n] = np.frombuffer(frame, np.uint8)
        self.head = pos + n
        return pos

    def _reserve(self, end: int) -> bool:
        if end <= self._reserved:
            return True
        end = min(max(end, self._reserved + RESERVE_STEP), self._map.capacity)
        try:
            os.posix_fallocate(self._fd, HEADER_BYTES + self._reserved, end - self._reserved)
        except OSError:
            return False
        self._reserved = end
        return True

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.unlink()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if hasattr(self, "_map"):
            self._map.close()


class RingReader:
    """The receiving end: maps a ring offered by a peer (FileNotFoundError if it is on another host)."""

    def __init__(self, name: str):
        if "/" in name or not name:
            raise FileNotFoundError(name)
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size <= HEADER_BYTES:
                raise FileNotFoundError(name)
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        os.unlink(path)  # mapped by both ends now: the name is no longer needed
        self._map = _Mapping(mm)

    def take(self, pos: int, n: int) -> memoryview:
        """A private copy of the frame at ``pos`` (writable, like a received ZeroMQ frame); frees its space."""
        frame = self.view(pos, n)  # checked before allocating: a bad length must not ask for any size
        out = np.empty(n, np.uint8)
        out[:] = frame
        self.release(pos + n)
        return memoryview(out)

    def view(self, pos: int, n: int) -> memoryview:
        """The frame at ``pos`` in place: valid only until :meth:`release` lets the sender reuse it."""
        offset = pos % self._map.capacity
        if offset + n > self._map.capacity or n < 0:
            raise ValueError(f"ring frame out of bounds ({pos}, {n})")
        return memoryview(self._map.data[offset:offset + n])

    def release(self, end: int) -> None:
        """Everything before position ``end`` has been read."""
        if not self._map.closed:
            self._map.consumed[0] = end

    def close(self) -> None:
        self._map.close()
