"""The chains test app (tests/apps/chains.py): the sizes tests run it at, its exact-result check, and its command
lines in cluster mode."""
from __future__ import annotations

from tests.apps.chains import DTYPES, SHAPE
from tests.support.processes import app_path

CHAINS, STEPS = 24, 150
STEPS_LONG = 4 * STEPS  # a cluster job long enough for everything a test does while it runs


def check_result(result: dict, steps: int = STEPS, chains: int = CHAINS, shape: tuple = SHAPE) -> None:
    """The chains app's result is exact: no consistency violation, every task ran once, and every update to
    every key was applied exactly once (each array element got all n, so none was lost, doubled or
    overwritten), while a key nobody updated stays absent."""
    n = chains * steps
    assert result["violations"] == []
    assert result["total"] == n and result["tasks_ran"] == n
    assert result["missing"] is None
    assert sorted(result["arrays"]) == sorted(DTYPES)
    for d in DTYPES:
        dtype, got_shape, total, low, high = result["arrays"][d]
        assert dtype == d and tuple(got_shape) == tuple(shape), (d, dtype, got_shape)
        assert total == n * shape[0] * shape[1], d
        assert low == high == n, (d, low, high)


def master_args(etcd: str, name: str, *extra: str) -> list[str]:
    """A cluster-mode master of a chains job of ``STEPS_LONG`` steps that waits for 2 workers."""
    return ["litz", "master", app_path("chains"), "--etcd", etcd, "--name", name, "--min-workers", "2",
            "--executors", "12", "--config", f"chains={CHAINS}", f"steps={STEPS_LONG}", "sleep=0.002",
            "--no-progress", *extra]


def role(kind: str, etcd: str, name: str, *extra: str) -> list[str]:
    """A cluster-mode worker or server (``kind``) of job ``name``."""
    return ["litz", kind, "--etcd", etcd, "--name", name, *extra]
