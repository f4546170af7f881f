"""Real etcd members for tests: one member or a cluster on free loopback ports, killed and started again at will."""
from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable

import psutil

from tests.support.processes import free_port


class EtcdServer:
    """One etcd member (or a whole one-member etcd) that a test can kill and start again.

    ``tls`` = (server certificate, its key, the CA clients' certificates must come from): clients then reach it
    over TLS only, with a certificate. ``extra``: more etcd options. ``host``: the address it listens on."""

    def __init__(self, name: str, data_dir: str, client: int, peer: int, cluster: str, state: str = "new",
                 tls: tuple[str, str, str] | None = None, extra: tuple[str, ...] = (), host: str = "127.0.0.1"):
        self.name, self.data_dir, self.client, self.peer = name, data_dir, client, peer
        self.endpoint = f"{host}:{client}"
        scheme = "https" if tls else "http"
        self.argv = ["etcd", "--data-dir", data_dir, "--name", name,
                     "--listen-client-urls", f"{scheme}://{host}:{client}",
                     "--advertise-client-urls", f"{scheme}://{host}:{client}",
                     "--listen-peer-urls", f"http://{host}:{peer}",
                     "--initial-advertise-peer-urls", f"http://{host}:{peer}",
                     "--initial-cluster", cluster, "--initial-cluster-state", state,
                     "--initial-cluster-token", "litz-test"]
        if tls:
            cert, key, ca = tls
            self.argv += ["--cert-file", cert, "--key-file", key, "--client-cert-auth", "--trusted-ca-file", ca]
        self.argv += list(extra)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        assert shutil.which("etcd"), "etcd is not installed (apt-get install etcd-server; .ci/run does this)"
        with open(self.data_dir + ".log", "ab") as log:  # what it says if a port is taken
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=log)

    def wait_listening(self, timeout: float = 20) -> bool:
        """Wait until this etcd listens on its client and peer ports; False if it exited first because one of
        them was taken (another process bound it after ``free_port`` found it free)."""
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                with open(self.data_dir + ".log", "rb") as log:
                    if b"address already in use" in log.read():
                        return False
                raise AssertionError(f"etcd exited with {self.proc.returncode}; see {self.data_dir}.log")
            try:
                ports = {c.laddr.port for c in psutil.Process(self.proc.pid).net_connections("tcp")
                         if c.status == psutil.CONN_LISTEN}
            except psutil.Error:
                ports = set()
            if {self.client, self.peer} <= ports:
                return True
            if time.time() > deadline:
                raise AssertionError(f"etcd did not listen on ports {self.client} and {self.peer} in {timeout} s")
            time.sleep(0.05)

    def wait_ready(self, timeout: float = 20) -> None:
        """Wait until a plain client can connect (not for a member serving TLS only)."""
        from litz.membership.etcdkv import EtcdKV

        deadline = time.time() + timeout
        while True:
            try:
                EtcdKV(self.endpoint, timeout=1.0).close()
                return
            except Exception:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.2)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def restart(self, empty: bool = False) -> None:
        """Start it again on the same ports: with its data, or from an empty data directory."""
        self.kill()
        if empty:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        self.start()


def start_etcd(make: Callable[[int], list[EtcdServer]], attempts: int = 5) -> list[EtcdServer]:
    """Start the etcd members ``make(attempt)`` builds on ports from ``free_port`` (in data directories of that
    attempt) and wait until each listens on its ports. If one exits because a port was taken meanwhile, all are
    killed and it starts over with the members the next ``make`` builds, on other ports."""
    for attempt in range(attempts):
        members = make(attempt)
        try:
            for m in members:
                m.start()
            if all([m.wait_listening() for m in members]):
                return members
        except BaseException:
            for m in members:
                m.kill()
            raise
        for m in members:
            m.kill()
    raise AssertionError(f"etcd found one of its ports taken {attempts} times in a row")


def start_one(directory, name: str = "test", **kw) -> EtcdServer:
    """One one-member etcd listening on free loopback ports, its data in ``directory`` (a path); ``kw`` as for
    ``EtcdServer`` (``tls``, ``extra``)."""
    def make(attempt: int) -> list[EtcdServer]:
        peer = free_port()
        return [EtcdServer(name, str(directory / f"etcd-{attempt}"), free_port(), peer,
                           f"{name}=http://127.0.0.1:{peer}", **kw)]

    [server] = start_etcd(make)
    return server


def start_cluster(directory, size: int = 3) -> list[EtcdServer]:
    """``size`` etcd members forming one cluster on free loopback ports, their data in ``directory``."""
    def make(attempt: int) -> list[EtcdServer]:
        ports = [(free_port(), free_port()) for _ in range(size)]
        cluster = ",".join(f"e{i}=http://127.0.0.1:{peer}" for i, (_, peer) in enumerate(ports))
        return [EtcdServer(f"e{i}", str(directory / f"etcd{i}-{attempt}"), client, peer, cluster)
                for i, (client, peer) in enumerate(ports)]

    return start_etcd(make)
