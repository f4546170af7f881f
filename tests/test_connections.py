"""The master tells a dead peer process from a live one by its connection: a killed process's connection
drops and nothing accepts the retries; a peer that is back on its address within the grace is not lost."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from litz import transport
from litz.transport import ZmqEndpoint
from tests.support.processes import ROOT, free_port

PEER = textwrap.dedent("""
    import errno, sys, time
    import zmq
    from litz.transport import ZmqEndpoint
    try:
        ep = ZmqEndpoint("peer", "job-secret", port=int(sys.argv[1]))
    except zmq.ZMQError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        print("taken", flush=True)  # another process bound the port after free_port() found it free
        sys.exit(3)
    ep.connect("master", sys.argv[2])
    print("up", flush=True)
    while True:
        if ep.poll(100):
            for sender, msg in ep.drain():
                if msg[0] == "spin":  # the Python thread busy, the GIL held: only ZeroMQ's I/O thread runs
                    end = time.time() + msg[1]
                    while time.time() < end:
                        pass
                ep.send(sender, ("echo", msg))
""")


def start_peer(port: int, master: ZmqEndpoint) -> subprocess.Popen | None:
    """The peer process listening on ``port``, or None if that port was taken."""
    proc = subprocess.Popen([sys.executable, "-c", PEER, str(port), master.address], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    said = proc.stdout.readline().strip()
    if said == "taken":
        proc.wait()
        return None
    assert said == "up"
    return proc


def first_peer(master: ZmqEndpoint) -> tuple[int, subprocess.Popen]:
    """A peer on a port from free_port(), another one if a process took that port meanwhile."""
    for _ in range(5):
        port = free_port()
        proc = start_peer(port, master)
        if proc is not None:
            return port, proc
    raise AssertionError("five free ports in a row were taken before the peer bound them")


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def echo(ep: ZmqEndpoint, timeout: float = 10.0, msg: tuple = ("ping",)) -> None:
    """A round trip through the watched connection: its handshake is done."""
    ep.send("peer", msg)
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert ep.unreachable(0.3) == []
        if ep.poll(50) and list(ep.drain()) == [("peer", ("echo", msg))]:
            return
    pytest.fail("no answer from the peer")


@pytest.mark.timeout(60)
def test_a_killed_peer_is_unreachable_and_a_busy_or_restarted_one_is_not(monkeypatch):
    monkeypatch.setattr(transport, "HEARTBEAT_IVL_MS", 100)  # short, so that a busy peer would trip them
    monkeypatch.setattr(transport, "HEARTBEAT_TIMEOUT_MS", 1000)
    ep = ZmqEndpoint("master", "job-secret")
    port, peer = first_peer(ep)
    peers = [peer]
    try:
        ep.connect("peer", f"tcp://127.0.0.1:{port}", watch=True)
        echo(ep)
        echo(ep, msg=("spin", 3.0))  # no answer for 3 s, but its I/O thread answers the heartbeats
        grace = 3.0  # generous: a new Python process must bind the port again within it
        stop(peers[0])
        t_kill = time.monotonic()
        peers.append(start_peer(port, ep))  # back on the same address (a restart, or a connection reset)
        # below the ephemeral range, nothing but another test picking the same port can take it in between
        assert peers[-1] is not None, f"port {port} was taken while the peer restarted"
        deadline = t_kill + 2 * grace
        while time.monotonic() < deadline:
            assert ep.unreachable(grace) == [], "a peer that came back was reported unreachable"
            time.sleep(0.05)
        echo(ep)
        stop(peers[1])  # now it is gone for good
        t_kill = time.monotonic()
        gone = []
        while not gone and time.monotonic() < t_kill + 4 * grace:
            gone = ep.unreachable(grace)
            time.sleep(0.02)
        assert gone == ["peer"]
        assert time.monotonic() - t_kill >= grace  # not before the grace: the retries had their chance
        assert ep.unreachable(grace) == []  # reported once
    finally:
        for proc in peers:
            if proc is not None:
                stop(proc)
        ep.close()


@pytest.mark.timeout(60)
def test_a_peer_that_stops_answering_is_unreachable(monkeypatch):
    """A stopped process keeps its connections open (its kernel acknowledges), like a host cut off without a
    reset: only the heartbeats tell. Short heartbeats here; the job's are 1 s and 5 s."""
    monkeypatch.setattr(transport, "HEARTBEAT_IVL_MS", 100)
    monkeypatch.setattr(transport, "HEARTBEAT_TIMEOUT_MS", 1000)
    ep = ZmqEndpoint("master", "job-secret")
    port, peer = first_peer(ep)
    try:
        ep.connect("peer", f"tcp://127.0.0.1:{port}", watch=True)
        echo(ep)
        os.kill(peer.pid, signal.SIGSTOP)
        t_stop = time.monotonic()
        gone = []
        while not gone and time.monotonic() < t_stop + 20:
            gone = ep.unreachable(0.3)
            time.sleep(0.02)
        assert gone == ["peer"]
        assert time.monotonic() - t_stop >= 1.0  # the heartbeat timeout passed first
    finally:
        stop(peer)
        ep.close()
