"""Every socket is CURVE-authenticated with keys from the job secret: strangers get nothing delivered."""
import json
import os
import pickle
import subprocess
import sys
import time

import pytest
import zmq

from litz import protocol as P
from litz import wire
from litz.membership import Membership, connect_kv
from litz.security import curve_keypair
from litz.transport import Endpoint
from tests.helpers import ROOT, app_path


def attacker_socket(ctx, address, mode):
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.routing_id = b"master"  # pretends to be the master
    if mode == "wrong-key":
        pub, sec = curve_keypair("not the job secret")
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = pub, pub, sec
    elif mode == "server-key-only":  # knows the server's public key but not the job's key pair
        pub, _ = curve_keypair("job-secret")
        other_pub, other_sec = zmq.curve_keypair()
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = pub, other_pub, other_sec
    sock.connect(address)
    return sock


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", ["plain", "wrong-key", "server-key-only"])
def test_endpoint_rejects_strangers(mode):
    victim = Endpoint("victim", "job-secret")
    friend = Endpoint("friend", "job-secret")
    ctx = zmq.Context()
    try:
        evil = attacker_socket(ctx, victim.address, mode)
        evil.send_multipart(wire.encode((P.STOP,)))
        friend.connect("victim", victim.address)
        friend.send("victim", ("hello", 1))
        got, deadline = [], time.time() + 2.0
        while time.time() < deadline:
            if victim.poll(100):
                got.extend(victim.drain())
        assert got == [("friend", ("hello", 1))]
    finally:
        ctx.destroy(linger=0)
        victim.close()
        friend.close()


@pytest.mark.timeout(90)
def test_running_job_ignores_unauthenticated_peers(tmp_path, litz_home):
    """An attacker who finds every address of a live job (master, workers, servers) sends STOP, FAIL and
    pickled payloads to all of them; the job finishes with the right result."""
    out = tmp_path / "out.json"
    name = "auth-job"
    job = subprocess.Popen([sys.executable, "-m", "litz.cli.litz", "run", app_path("noop"), "--name", name,
                            "--config", "tasks=3000", "--config", "sleep=0.001", "--output", str(out),
                            "--no-progress"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    ctx = zmq.Context()
    try:
        membership = Membership(connect_kv(home=str(litz_home)), name)
        deadline = time.time() + 30
        while len(membership.members()) < 3 and time.time() < deadline:
            time.sleep(0.05)
        addresses = [m["address"] for m in membership.members().values()]
        addresses.append(membership.master()["address"])
        assert len(addresses) == 4
        payloads = [wire.encode((P.STOP,)), wire.encode((P.FAIL, "attacker", "boom")),
                    [pickle.dumps((P.TASKS, [(0, 0, 0, "evil")]))]]
        socks = [attacker_socket(ctx, a, mode) for a in addresses for mode in ("plain", "wrong-key")]
        for sock in socks:
            for frames in payloads:
                sock.send_multipart(frames)
        stdout, stderr = job.communicate(timeout=60)
        assert job.returncode == 0, stderr
        assert json.loads(stdout) == {"done": 3000}
        assert json.loads(out.read_text())["tasks_completed"] == 3000
    finally:
        ctx.destroy(linger=0)
        if job.poll() is None:
            os.killpg(job.pid, 9)
        job.wait()
