"""Shared test fixtures: an isolated registry per test, and no process may outlive its test."""
from __future__ import annotations

import time
from collections.abc import Callable

import psutil
import pytest

from tests.helpers import free_port


@pytest.fixture(autouse=True)
def litz_home(tmp_path, monkeypatch):
    home = tmp_path / "litz-home"
    monkeypatch.setenv("LITZ_HOME", str(home))
    return home


def _descendants() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Every process a test starts must be gone when it ends; leftovers are killed and fail the test."""
    before = {p.pid for p in _descendants()}
    yield
    deadline = time.time() + 5
    left = [p for p in _descendants() if p.pid not in before]
    while left and time.time() < deadline:
        time.sleep(0.1)
        left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    assert not left, f"processes left behind: {[(p.pid, p.cmdline()) for p in left]}"


@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem whose size the test can change (``helpers.resize``): a tmpfs mounted for the test."""
    import subprocess

    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


class EtcdServer:
    """One etcd member (or a whole one-member etcd) that a test can kill and start again."""

    def __init__(self, name: str, data_dir: str, client: int, peer: int, cluster: str, state: str = "new"):
        self.name, self.data_dir, self.client, self.peer = name, data_dir, client, peer
        self.endpoint = f"127.0.0.1:{client}"
        self.argv = ["etcd", "--data-dir", data_dir, "--name", name,
                     "--listen-client-urls", f"http://127.0.0.1:{client}",
                     "--advertise-client-urls", f"http://127.0.0.1:{client}",
                     "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                     "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                     "--initial-cluster", cluster, "--initial-cluster-state", state,
                     "--initial-cluster-token", "litz-test"]
        self.proc = None

    def start(self) -> None:
        import shutil
        import subprocess

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
        import shutil

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


@pytest.fixture
def etcd(tmp_path):
    """A real etcd server on free loopback ports (``.endpoint`` is 'HOST:PORT'), killed after the test."""
    def make(attempt: int) -> list[EtcdServer]:
        peer = free_port()
        return [EtcdServer("test", str(tmp_path / f"etcd-{attempt}"), free_port(), peer,
                           f"test=http://127.0.0.1:{peer}")]

    [server] = start_etcd(make)
    try:
        server.wait_ready()
        yield server
    finally:
        server.kill()


@pytest.fixture
def etcd_cluster(tmp_path):
    """Three etcd members forming one cluster on loopback ports, all killed after the test."""
    def make(attempt: int) -> list[EtcdServer]:
        ports = [(free_port(), free_port()) for _ in range(3)]
        cluster = ",".join(f"e{i}=http://127.0.0.1:{peer}" for i, (_, peer) in enumerate(ports))
        return [EtcdServer(f"e{i}", str(tmp_path / f"etcd{i}-{attempt}"), client, peer, cluster)
                for i, (client, peer) in enumerate(ports)]

    members = start_etcd(make)
    try:
        for m in members:
            m.wait_ready(30)
        yield members
    finally:
        for m in members:
            m.kill()


def pytest_terminal_summary(terminalreporter, config) -> None:
    """The order's seed, also under -q (which hides pytest-randomly's header): rerun an order-dependent failure
    with ``-p randomly --randomly-seed=N``."""
    seed = config.getoption("randomly_seed", None) if config.pluginmanager.hasplugin("randomly") else None
    if seed is not None:
        terminalreporter.write_line(f"tests ran in random order, seed {seed} (rerun: --randomly-seed={seed})")
