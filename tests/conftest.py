"""Shared test fixtures: an isolated registry per test, no process may outlive its test, a small disk, etcd.
What the fixtures build comes from tests/support."""
from __future__ import annotations

import signal
import time

import psutil
import pytest

from litz.forkserver import close_shared
from tests.support.etcd import start_cluster, start_one

# A suite started in the background by a shell without job control (`(pytest &)`, a CI wrapper) inherits SIGINT
# ignored, and so does every `litz run` it starts, exec keeping it: the Ctrl-C tests then timed out (a launcher
# that never hears Ctrl-C). Begin from Python's own handler whatever the suite was started with.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
    close_shared()  # a launcher with threads keeps a shared fork server for its next job: this test's, ended here
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
    """A real filesystem whose size the test can change (``support.processes.resize``): a tmpfs mounted for the test."""
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


@pytest.fixture
def etcd(tmp_path):
    """A real etcd server on free loopback ports (``.endpoint`` is 'HOST:PORT'), killed after the test."""
    server = start_one(tmp_path)
    try:
        server.wait_ready()
        yield server
    finally:
        server.kill()


@pytest.fixture
def etcd_cluster(tmp_path):
    """Three etcd members forming one cluster on loopback ports, all killed after the test."""
    members = start_cluster(tmp_path)
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
