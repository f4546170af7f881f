"""The one-machine transport (litz.localtransport): order, content, large frames, queued writes, dead peers.

Real Unix sockets between real endpoints; the dead-peer test kills a real child process."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from litz.localtransport import BIG_FRAME_BYTES, CHUNK_BYTES, LocalEndpoint


def _pair(tmp_path, monkeypatch, rings: bool) -> tuple[LocalEndpoint, LocalEndpoint]:
    """Two endpoints connected both ways (the sender of a large frame offers a ring; the receiver answers)."""
    monkeypatch.setenv("LITZ_SHM", "1" if rings else "0")
    a = LocalEndpoint("a", "secret", str(tmp_path))
    b = LocalEndpoint("b", "secret", str(tmp_path))
    a.connect("b", b.address)
    b.connect("a", a.address)
    return a, b


def _receive(ep: LocalEndpoint, count: int, timeout: float = 20.0, others: tuple = ()) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"received {len(got)} of {count} messages"
        for other in others:  # a sender's queued bytes go out from its own polls, ring answers from its drains
            assert list(other.drain()) == []
        if ep.poll(10):
            got.extend(ep.drain())
    return got


def _sizes() -> list[int]:
    """Sizes around every boundary the reader has: tiny, the chunk, a big frame, and a frame above the chunk."""
    return [0, 1, 7, 1023, 1024, 5000, BIG_FRAME_BYTES - 1, BIG_FRAME_BYTES + 1, CHUNK_BYTES - 3, CHUNK_BYTES + 5,
            3 * CHUNK_BYTES + 11, 9 << 20]


@pytest.mark.parametrize("rings", [False, True])
def test_messages_arrive_in_order_and_intact(tmp_path, monkeypatch, rings) -> None:
    a, b = _pair(tmp_path, monkeypatch, rings)
    try:
        rng = np.random.default_rng(0)
        sent = []
        for i in range(300):
            n = _sizes()[i % len(_sizes())] if i % 3 == 0 else int(rng.integers(0, 3000))
            arr = rng.integers(0, 255, size=n, dtype=np.uint8)
            msg = ("m", i, arr, {"k": [i] * (i % 5)})
            sent.append(msg)
            a.send("b", msg)
        got = _receive(b, len(sent), others=(a,))
        assert [s for s, _ in got] == ["a"] * len(sent)
        for (_, m), s in zip(got, sent, strict=True):
            assert m[0] == "m" and m[1] == s[1] and m[3] == s[3]
            assert np.array_equal(m[2], s[2])
        if rings:  # offered at connect, accepted by b's first drain: the later large frames went through it
            assert "b" in a._writers
        # the other direction on the other connection, with the first still open
        b.send("a", ("back", np.arange(10_000)))
        (sender, msg), = _receive(a, 1, others=(b,))
        assert sender == "b" and msg[0] == "back" and int(msg[1].sum()) == sum(range(10_000))
    finally:
        a.close(discard=True)
        b.close(discard=True)


def test_a_send_never_blocks_and_both_ways_at_once_do_not_deadlock(tmp_path, monkeypatch) -> None:
    """Each side queues 64 MB for the other before either reads: sends return at once (the socket takes a few
    MB), and polling on both sides moves everything."""
    a, b = _pair(tmp_path, monkeypatch, rings=False)
    try:
        blob = np.ones(8 << 20, np.uint8)
        for i in range(8):  # neither side reads yet: a blocking send would never return (the test's timeout)
            a.send("b", ("x", i, blob))
            b.send("a", ("y", i, blob))
        assert a._peers["b"].queue and b._peers["a"].queue  # the kernel did not take it all: it waits, queued
        got_b, got_a = [], []
        deadline = time.monotonic() + 30
        while len(got_a) < 8 or len(got_b) < 8:
            assert time.monotonic() < deadline
            if a.poll(5):
                got_a.extend(a.drain())
            if b.poll(5):
                got_b.extend(b.drain())
        assert [m[1] for _, m in got_b] == list(range(8)) and [m[1] for _, m in got_a] == list(range(8))
        assert all(int(m[2].sum()) == blob.size for _, m in got_a + got_b)
    finally:
        a.close(discard=True)
        b.close(discard=True)


def test_a_killed_peer_is_unreachable_after_the_grace_and_its_messages_go_nowhere(tmp_path) -> None:
    child_code = textwrap.dedent(f"""
        import sys, time
        from litz.localtransport import LocalEndpoint
        ep = LocalEndpoint("child", "secret", {str(tmp_path)!r})
        print(ep.address, flush=True)
        while True:
            if ep.poll(100):
                for sender, msg in ep.drain():
                    print(msg[0], flush=True)
    """)
    master = LocalEndpoint("master", "secret", str(tmp_path), watch=True)
    child = subprocess.Popen([sys.executable, "-c", child_code], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        address = child.stdout.readline().strip()
        master.connect("child", address)
        master.send("child", ("ping",))
        assert child.stdout.readline().strip() == "ping"
        assert master.unreachable(0.0) == []
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(10)
        t0 = time.monotonic()
        while not master.unreachable(0.2):
            assert time.monotonic() - t0 < 5.0, "the killed peer was never reported"
            master.poll(20)
        assert time.monotonic() - t0 >= 0.2  # not before the grace
        master.send("child", ("lost",))  # dropped quietly: the process is gone
        assert master.unreachable(0.0) == []  # reported once
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)
        master.close(discard=True)


def test_a_discarding_close_does_not_wait_for_a_peer_that_reads_nothing(tmp_path, monkeypatch) -> None:
    """A process the master stopped closes with ``discard``: what it still has queued (a ring offer or its answer for
    a peer that already exited) must not hold its exit for the linger. Here the peer reads nothing, so bytes stay
    queued; the ordinary close waits for them (the control: the queue was there), the discarding one does not."""
    import litz.localtransport as lt

    def stuffed() -> tuple[LocalEndpoint, LocalEndpoint]:
        a, b = _pair(tmp_path, monkeypatch, rings=False)
        for i in range(64):  # far more than a socket's buffer: most of it stays queued in a
            a.send("b", ("m", i, np.zeros(1 << 20, np.uint8)))
        a.poll(10)
        assert any(c.queue for c in a._peers.values()), "nothing queued: the test shows nothing"
        return a, b

    monkeypatch.setattr(lt, "LINGER_S", 1.0)
    a, b = stuffed()
    t = time.monotonic()
    a.close()
    assert time.monotonic() - t >= 0.9  # waited for the peer that never read
    b.close(discard=True)
    monkeypatch.setattr(lt, "LINGER_S", 60.0)
    a, b = stuffed()
    t = time.monotonic()
    a.close(discard=True)
    assert time.monotonic() - t < 30  # not the 60 s linger
    b.close(discard=True)
