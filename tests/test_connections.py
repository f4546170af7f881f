"""The master tells a dead peer process from a live one by its connection: a killed process's connection
drops and nothing accepts the retries; a peer that is back on its address within the grace is not lost."""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from litz.transport import Endpoint
from tests.helpers import ROOT

PEER = textwrap.dedent("""
    import sys, time
    from litz.transport import Endpoint
    ep = Endpoint("peer", "job-secret", port=int(sys.argv[1]))
    ep.connect("master", sys.argv[2])
    print("up", flush=True)
    while True:
        if ep.poll(100):
            for sender, msg in ep.drain():
                ep.send(sender, ("echo", msg))
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_peer(port: int, master: Endpoint) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", PEER, str(port), master.address], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def echo(ep: Endpoint, timeout: float = 10.0) -> None:
    """A round trip through the watched connection: its handshake is done."""
    ep.send("peer", "ping")
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ep.poll(50) and list(ep.drain()) == [("peer", ("echo", "ping"))]:
            return
    pytest.fail("no answer from the peer")


@pytest.mark.timeout(60)
def test_a_killed_peer_is_unreachable_and_a_restarted_one_is_not():
    port = free_port()
    ep = Endpoint("master", "job-secret")
    peers = [start_peer(port, ep)]
    try:
        ep.connect("peer", f"tcp://127.0.0.1:{port}", watch=True)
        echo(ep)
        grace = 3.0  # generous: a new Python process must bind the port again within it
        stop(peers[0])
        t_kill = time.monotonic()
        peers.append(start_peer(port, ep))  # back on the same address (a restart, or a connection reset)
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
            stop(proc)
        ep.close()
