"""Shared test fixtures: an isolated registry per test, and no process may outlive its test."""
from __future__ import annotations

import time

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
    def __init__(self, endpoint: str, proc) -> None:
        self.endpoint, self.proc = endpoint, proc


@pytest.fixture
def etcd(tmp_path):
    """A real etcd server on free loopback ports (``.endpoint`` is 'HOST:PORT'), killed after the test."""
    import shutil
    import subprocess

    binary = shutil.which("etcd")
    assert binary, "etcd is not installed (apt-get install etcd-server; .ci/run does this)"
    client, peer = free_port(), free_port()
    proc = subprocess.Popen([binary, "--data-dir", str(tmp_path / "etcd"), "--name", "test",
                             "--listen-client-urls", f"http://127.0.0.1:{client}",
                             "--advertise-client-urls", f"http://127.0.0.1:{client}",
                             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-cluster", f"test=http://127.0.0.1:{peer}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"127.0.0.1:{client}"
    try:
        from litz.membership.etcdkv import EtcdKV

        deadline = time.time() + 20
        while True:
            try:
                EtcdKV(endpoint, timeout=1.0).close()
                break
            except Exception:
                if time.time() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield EtcdServer(endpoint, proc)
    finally:
        proc.kill()
        proc.wait()
