"""Every socket is CURVE-authenticated with keys from the job secret: strangers get nothing delivered."""
import json
import os
import pickle
import socket
import subprocess
import tempfile
import time

import pytest
import zmq

import litz
from litz import protocol as P
from litz import wire
from litz.local import SOCKET_DIR_PREFIX
from litz.membership import Membership, connect_kv
from litz.security import curve_keypair
from litz.transport import ZmqEndpoint
from tests.support.processes import Processes, app_path, wait_for

HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def attacker_socket(ctx, address, mode, secret="job-secret"):
    """A DEALER that connects to ``address`` as "master" without the job's keys (``right-key``: with them, the
    positive control), and a monitor of its handshakes, attached before it connects."""
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    # a refused handshake leaves the DEALER without a peer, and its send would wait for one for ever
    sock.sndtimeo = 2000
    sock.routing_id = b"master"  # pretends to be the master
    if mode == "wrong-key":
        pub, sec = curve_keypair("not the job secret")
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = pub, pub, sec
    elif mode == "server-key-only":  # knows the server's public key but not the job's key pair
        pub, _ = curve_keypair(secret)
        other_pub, other_sec = zmq.curve_keypair()
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = pub, other_pub, other_sec
    elif mode == "right-key":
        pub, sec = curve_keypair(secret)
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = pub, pub, sec
    monitor = sock.get_monitor_socket(HANDSHAKE_FAILED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
    sock.connect(address)
    return sock, monitor


def handshake(monitor, timeout: float = 10.0) -> str:
    """How the first handshake on a monitored socket ended: "failed" or "succeeded" (it reached a socket)."""
    from zmq.utils.monitor import recv_monitor_message

    assert monitor.poll(int(timeout * 1000)), "no handshake at all: the attack never reached a socket"
    event = recv_monitor_message(monitor)["event"]
    if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
        return "succeeded"
    assert event & HANDSHAKE_FAILED, f"not a handshake: {zmq.Event(event).name}"
    return "failed"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", ["plain", "wrong-key", "server-key-only", "right-key"])
def test_endpoint_rejects_strangers(mode):
    """Strangers' handshakes fail and nothing of theirs is delivered; with the job's keys (the control) the
    same message from the same socket is."""
    victim = ZmqEndpoint("victim", "job-secret")
    friend = ZmqEndpoint("friend", "job-secret")
    ctx = zmq.Context()
    try:
        evil, monitor = attacker_socket(ctx, victim.address, mode)
        assert handshake(monitor) == ("succeeded" if mode == "right-key" else "failed")
        try:
            evil.send_multipart(wire.encode((P.STOP,)))
        except zmq.Again:  # a refused handshake may leave no connection to queue on: nothing can be delivered
            assert mode != "right-key"
        friend.connect("victim", victim.address)
        friend.send("victim", ("hello", 1))
        want = [("master", (P.STOP,))] * (mode == "right-key") + [("friend", ("hello", 1))]
        got, deadline = [], time.time() + 2.0
        while time.time() < deadline and len(got) < len(want):
            if victim.poll(100):
                got.extend(victim.drain())
        assert sorted(got) == sorted(want)
    finally:
        ctx.destroy(linger=0)
        victim.close()
        friend.close()


PAYLOADS = [wire.encode((P.STOP,)), wire.encode((P.FAIL, "attacker", "boom")),
            [pickle.dumps((P.TASKS, [(0, 0, 0, "evil")]))]]


def attack(addresses: list[str], ctx: zmq.Context, modes=("plain", "wrong-key"), secret: str = "job-secret") -> list:
    """Send STOP, FAIL and a pickled task batch to every address, without the job's keys; returns the sockets
    and their handshake monitors (a socket closes when it is collected, and its monitor stops)."""
    socks = [attacker_socket(ctx, a, mode, secret) for a in addresses for mode in modes]
    sent = 0
    for sock, _ in socks:
        for frames in PAYLOADS:
            try:
                sock.send_multipart(frames)
                sent += 1
            except zmq.Again:  # no connection to queue it on: the job refused the handshake
                pass
    assert sent, "no attack message could even be queued"
    return socks


def job_addresses(name: str, litz_home, count: int) -> list[str]:
    membership = Membership(connect_kv(home=str(litz_home)), name)
    wait_for(lambda: len(membership.members()) >= count - 1 and membership.master() is not None, 30,
             f"{count} processes of job {name} in the registry")
    addresses = [m["address"] for m in membership.members().values()] + [membership.master()["address"]]
    assert len(addresses) == count
    return addresses


@pytest.mark.timeout(90)
def test_running_cluster_job_ignores_unauthenticated_peers(tmp_path, litz_home):
    """An attacker who finds every address of a live cluster job (master, workers, servers; TCP) sends STOP,
    FAIL and pickled payloads to all of them; the job finishes with the right result."""
    out = tmp_path / "out.json"
    name = "auth-job"
    ctx = zmq.Context()
    with Processes() as procs:
        try:
            master = procs.start(["litz", "master", app_path("noop"), "--name", name, "--min-workers", "2",
                                  "--config", "tasks=3000", "--config", "sleep=0.001", "--output", str(out),
                                  "--no-progress"])
            for role in ("server", "worker", "worker"):
                procs.start(["litz", role, "--name", name])
            addresses = job_addresses(name, litz_home, 4)
            assert all(a.startswith("tcp://") for a in addresses)
            socks = attack(addresses, ctx)
            # every attack reached a socket of the job and its handshake failed there
            assert [handshake(m) for _, m in socks] == ["failed"] * 2 * len(addresses)
            # the control: the same payloads with a job's keys are delivered (to a decoy, not to this job)
            decoy = ZmqEndpoint("decoy", "decoy-secret")
            try:
                control = attack([decoy.address], ctx, modes=("right-key",), secret="decoy-secret")
                assert [handshake(m) for _, m in control] == ["succeeded"]
                got = []
                wait_for(lambda: (decoy.poll(100) and got.extend(decoy.drain())) or len(got) == 3, 10,
                         "the control's three payloads")
                assert [(sender, msg[0]) for sender, msg in got] == [("master", P.STOP), ("master", P.FAIL),
                                                                      ("master", P.TASKS)]
            finally:
                decoy.close()
            stdout, stderr = master.communicate(timeout=60)
            assert master.returncode == 0, stderr
            assert json.loads(stdout) == {"done": 3000}
            assert json.loads(out.read_text())["tasks_completed"] == 3000
        finally:
            ctx.destroy(linger=0)


@pytest.mark.timeout(90)
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_local_job_sockets_keep_other_users_out(tmp_path, litz_home):
    """`litz run` binds Unix sockets without CURVE in a directory only its user can enter: another user
    (nobody) who knows every address sends STOP, FAIL and pickles to all of them; the job finishes right,
    and the directory is gone afterwards."""
    out = tmp_path / "out.json"
    name = "auth-local"
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("noop"), "--name", name, "--config", "tasks=3000",
                           "--config", "sleep=0.001", "--output", str(out), "--no-progress"])
        addresses = job_addresses(name, litz_home, 4)
        directory = os.path.dirname(addresses[0].removeprefix("ipc://"))
        assert all(a.startswith(f"ipc://{directory}/") for a in addresses)
        info = os.stat(directory)
        assert (info.st_mode & 0o777, info.st_uid) == (0o700, os.getuid())
        assert attack_as_nobody(addresses) == 0  # and each of its connections was refused (below)
        for address in addresses:  # the control: the job's own user reaches every one of those sockets
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(address.removeprefix("ipc://"))
        stdout, stderr = job.communicate(timeout=60)
        assert job.returncode == 0, stderr
        assert json.loads(stdout) == {"done": 3000}
        assert json.loads(out.read_text())["tasks_completed"] == 3000
    assert not os.path.exists(directory)


def attack_as_nobody(addresses: list[str]) -> int:
    """From a forked child running as user nobody: connect to each address (ZeroMQ retries in the
    background) and send the attack's payloads. Returns the child's exit status: 0 when it ran as nobody and
    the kernel refused it every socket (a plain connect fails with EACCES), 3 when one let it connect."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            socks = attack(addresses, zmq.Context())  # queued for connections ZeroMQ keeps trying in the background
            code = 0
            for address in addresses:
                with socket.socket(socket.AF_UNIX) as sock:
                    try:
                        sock.connect(address.removeprefix("ipc://"))
                        code = 3
                    except PermissionError:
                        pass
            assert socks
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.timeout(60)
def test_a_local_job_removes_the_socket_directories_of_dead_launchers(tmp_path):
    """A launcher killed with SIGKILL cannot remove its socket directory; the next local job does, and
    leaves those of live launchers alone."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = tempfile.mkdtemp(prefix=f"{SOCKET_DIR_PREFIX}{dead.pid}-")
    live = tempfile.mkdtemp(prefix=f"{SOCKET_DIR_PREFIX}{os.getpid()}-")
    try:
        assert litz.run(app_path("noop"), config={"tasks": 10}, progress=False) == {"done": 10}
        assert not os.path.exists(orphan)
        assert os.path.isdir(live)
    finally:
        os.rmdir(live)


@pytest.mark.timeout(60)
def test_a_local_job_runs_with_a_temporary_directory_too_long_for_socket_paths(tmp_path, monkeypatch):
    """A Unix socket's path holds 107 bytes; with a long $TMPDIR the sockets go to /tmp instead."""
    long_tmp = tmp_path / ("t" * 100)
    long_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long_tmp))
    assert litz.run(app_path("noop"), config={"tasks": 10}, progress=False) == {"done": 10}
    assert not os.listdir(long_tmp)
