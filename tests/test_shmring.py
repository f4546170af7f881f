"""Large frames between processes of one host travel through shared-memory rings, never losing a message."""
import glob
import os
import time

import numpy as np
import pytest

import litz
from litz import shmring
from litz.transport import RING_BYTES, ZmqEndpoint, ring_prefix
from tests.support.processes import ROOT, wait_for

MIB = 1 << 20


def receive(ep: ZmqEndpoint, n: int, timeout: float = 5.0) -> list:
    got, deadline = [], time.time() + timeout
    while len(got) < n and time.time() < deadline:
        if ep.poll(20):
            got.extend(ep.drain())
    return got


def pump(ep: ZmqEndpoint, seconds: float = 0.3) -> None:
    """Let ``ep`` handle control messages (ring answers) that reached it."""
    assert receive(ep, 1, seconds) == []


@pytest.fixture
def pair():
    a, b = ZmqEndpoint("a", "job-secret"), ZmqEndpoint("b", "job-secret")
    a.connect("b", b.address)
    b.connect("a", a.address)
    yield a, b
    a.close()
    b.close()


def test_ring_wraps_and_refuses_what_does_not_fit():
    writer = shmring.RingWriter("litz-test", 1000)
    reader = shmring.RingReader(writer.name)
    try:
        assert not os.path.exists(writer.path)  # the reader unlinked the name once mapped
        a, b = (np.full(400, i, np.uint8) for i in (1, 2))
        assert writer.put(memoryview(a)) == 0
        assert writer.put(memoryview(b)) == 400
        assert writer.put(memoryview(a)) is None  # 200 bytes left at the end, 0 consumed: no room
        assert bytes(reader.take(0, 400)) == a.tobytes()
        pos = writer.put(memoryview(a))  # does not fit the 200 bytes at the end: starts over at 0
        assert pos == 1000
        assert bytes(reader.take(400, 400)) == b.tobytes()
        assert bytes(reader.take(pos, 400)) == a.tobytes()
        with pytest.raises(ValueError):
            reader.take(900, 400)
    finally:
        writer.close()
        reader.close()


def test_empty_ring_starts_over_and_holds_only_what_was_in_flight():
    writer = shmring.RingWriter("litz-test", 64 * MIB)
    reader = shmring.RingReader(writer.name)
    try:
        frame = np.ones(MIB, np.uint8)
        for _ in range(100):  # request/response traffic: one frame in flight at a time
            pos = writer.put(memoryview(frame))
            assert pos % (64 * MIB) == 0
            assert bytes(reader.take(pos, MIB)[:3]) == b"\x01\x01\x01"
        assert os.fstat(writer._fd).st_blocks * 512 <= shmring.RESERVE_STEP + 4096  # not the 64 MiB
    finally:
        writer.close()
        reader.close()


@pytest.mark.timeout(30)
def test_large_frames_go_through_the_ring_in_order(pair):
    a, b = pair
    x = np.arange(MIB // 4, dtype=np.float32)
    a.send("b", ("m", 0, x))  # the first large frame offers a ring and travels inline
    got = receive(b, 1)
    assert np.array_equal(got[0][1][2], x)
    pump(a)  # a learns that b accepted
    ring_id, writer = a._writers["b"]
    count = 2 * RING_BYTES // MIB  # more than the ring holds before b reads: the rest travels inline
    for i in range(count):
        a.send("b", ("m", i, x + i))
    assert writer.head >= RING_BYTES - MIB  # the ring was used until it was full
    got = receive(b, count)
    assert [m[1] for _, m in got] == [i for i in range(count)]
    for _, (_, i, value) in got:
        assert np.array_equal(value, x + i)
        assert value.flags.writeable  # the same whether it came through the ring or inline
    a.send("b", ("m", -1, x))  # b consumed everything: the ring has room again
    assert writer.head > RING_BYTES
    assert np.array_equal(receive(b, 1)[0][1][2], x)


@pytest.mark.timeout(30)
def test_a_peer_that_cannot_map_the_ring_gets_frames_inline(pair):
    a, b = pair
    x = np.ones(MIB // 4, np.float32)
    a.send("b", ("m", x))
    os.unlink(a._offered["b"][1].path)  # as if b were on another host
    assert np.array_equal(receive(b, 1)[0][1][1], x)
    pump(a)
    assert "b" not in a._writers and "b" in a._inline
    a.send("b", ("m", 2 * x))
    assert np.array_equal(receive(b, 1)[0][1][1], 2 * x)


@pytest.mark.timeout(30)
def test_restarted_receiver_resets_the_ring(pair):
    """A receiver restarted under the same id never mapped the sender's ring: the message that cannot be
    read is dropped, the sender drops its ring, and the next large frame offers a new one."""
    a, b = pair
    x = np.ones(MIB // 4, np.float32)
    a.send("b", ("m", 0, x))
    receive(b, 1)
    pump(a)
    b._readers.pop("a")[1].close()  # b forgets the ring, as a new process would
    a.send("b", ("m", 1, x))
    assert receive(b, 1, 1.0) == []
    pump(a)
    assert "b" not in a._writers
    a.send("b", ("m", 2, x))  # inline, with a new offer
    a.send("b", ("m", 3, x))
    assert [m[1] for _, m in receive(b, 2)] == [2, 3]


@pytest.mark.timeout(120)
def test_job_moves_large_arrays_through_rings_and_leaves_none(litz_home, monkeypatch):
    """End to end: ps_update/ps_get of 1 MiB arrays between worker and server processes give the right
    values (the app checks every value it gets) with rings on (Unix sockets) and off (TCP with CURVE, as
    between hosts), and no ring name is left."""
    app = os.path.join(ROOT, "bench", "apps", "psbw.py")
    before = set(glob.glob(os.path.join(shmring.SHM_DIR, "litz-*")))
    for shm, tcp in (("1", "0"), ("0", "1")):
        monkeypatch.setenv("LITZ_SHM", shm)
        monkeypatch.setenv("LITZ_LOCAL_TCP", tcp)
        result = litz.run(app, workers=2, servers=1, config={"tasks": 32, "keys_per_task": 4}, progress=False)
        assert result["phases"]["get"]["tasks"] == 32
    assert set(glob.glob(os.path.join(shmring.SHM_DIR, "litz-*"))) <= before
    assert ring_prefix("a") != ring_prefix("b")


@pytest.mark.timeout(30)
def test_borrowed_frames_hold_their_ring_space_until_the_next_message(pair):
    a, b = pair
    x = np.arange(MIB // 4, dtype=np.float32)
    a.send("b", ("m", 0, x))
    receive(b, 1)
    pump(a)
    reader = b._readers["a"][1]
    a.send("b", ("m", 1, x + 1))
    a.send("b", ("m", 2, x + 2))
    # both must be taken in one drain: hold their frames as they arrive, then hand them to drain together
    arrived, take = [], b._next_incoming

    def both_arrived() -> bool:
        got = take()
        if got is not None:
            arrived.append(got)
        return len(arrived) == 2

    wait_for(both_arrived, 5, "both messages", interval=0.01)
    b._next_incoming = lambda: arrived.pop(0) if arrived else take()
    seen = []
    for _, (_, i, value) in b.drain(borrow=True):
        assert np.array_equal(value, x + i)
        assert not value.flags.owndata
        seen.append((i, int(reader._map.consumed[0])))  # what the sender may reuse while we hold it
    assert [i for i, _ in seen] == [1, 2]
    assert seen[1][1] == seen[0][1] + MIB  # taking message 2 released message 1, not message 2
    assert int(reader._map.consumed[0]) == seen[1][1] + MIB  # the end of drain released message 2


@pytest.mark.timeout(30)
def test_rings_are_offered_on_connect_and_the_answering_connection_is_watched():
    """A ring is offered as soon as a connection is made, so the first large frame already uses it. The peer
    connects back to answer the offer; an endpoint that watches its peers (the master's) watches that
    connection too, since it is the one a later connect to the same address keeps."""
    a, b = ZmqEndpoint("a", "job-secret", watch=True), ZmqEndpoint("b", "job-secret")
    try:
        b.connect("a", a.address)  # offers b -> a
        pump(a)  # a connects back to answer (and offers a -> b)
        pump(b)  # b learns that a accepted
        assert "a" in b._writers and "b" in a._readers and "b" in a._watches
        a.connect("b", b.address)
        assert "b" in a._watches and "b" in a._readers
        x = np.arange(MIB // 4, dtype=np.float32)
        b.send("a", ("m", x))
        assert b._writers["a"][1].head > 0  # the first large frame went through the ring
        assert np.array_equal(receive(a, 1)[0][1][1], x)
        pump(b)
        assert "b" in a._writers and "a" not in b._watches  # a's offer was answered too; b watches nothing
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["unix", "zmq"])
def test_a_short_job_does_not_wait_for_ring_offers_to_processes_gone(transport):
    """Rings are offered as connections are made, so a job that ends at once leaves offers (and answers)
    queued for processes that already exited. A stopped process must not hold its exit for the sockets'
    linger over them: that made 7 in 10 one-task jobs from the command line take 2.3 s instead of 0.3. The
    linger is stretched to 30 s here, so a close that waits on it shows as a job of 30 s or more, which no
    loaded machine makes of a one-task job. (Today's transports queue little at a job's end, so this guards the
    whole shutdown path; test_localtransport shows the discarding close itself against a peer that reads
    nothing.)"""
    import subprocess
    import sys

    env = {**os.environ, "LITZ_TEST_LINGER_S": "30", "LITZ_TRANSPORT": transport}
    took = []
    for _ in range(4):
        t = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "litz.cli.litz", "run", os.path.join(ROOT, "tests", "apps",
                                                                                        "noop.py"),
                               "--no-progress", "--config", "tasks=1"], cwd=ROOT, capture_output=True, text=True,
                              timeout=100, env=env)
        took.append(time.monotonic() - t)
        assert proc.returncode == 0, proc.stderr
    assert max(took) < 20, f"one-task jobs took {[round(x, 2) for x in took]} s: a close waited out the linger"
