"""Shared test fixtures: an isolated registry per test, and no process may outlive its test."""
from __future__ import annotations

import time

import psutil
import pytest


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
