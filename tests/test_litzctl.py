"""litzctl as a new user meets it: a job that waits for members, options where people put them, one-line errors,
and `list` with what each job is."""
import json
import time

import pytest

from tests.helpers import Processes, app_path, run_cli, status, wait_for


def cluster(kind: str, etcd: str, name: str, *extra: str) -> list[str]:
    return ["litz", kind, "--etcd", etcd, "--name", name, *extra]


@pytest.mark.timeout(120)
def test_a_master_waiting_for_members_says_so_and_stops_at_once(etcd):
    e, name = etcd.endpoint, "waiting-job"
    with Processes() as procs:
        master = procs.start(["litz", "master", app_path("noop"), "--etcd", e, "--name", name, "--no-progress"])
        worker = procs.start(cluster("worker", e, name))
        st = wait_for(lambda: (s := status(name, e)) and len(s["workers"]) == 1 and s, 30, "the worker to join")
        assert st["state"] == "waiting" and st["waiting"] == "waiting for 1 server (have 0)", st
        shown = run_cli(["litzctl", "--etcd", e, "status", "--name", name], timeout=30)
        assert shown.returncode == 0 and "waiting for 1 server (have 0)" in shown.stdout, shown.stderr

        refused = run_cli(["litzctl", "--etcd", e, "--name", name, "checkpoint"], timeout=30)
        assert refused.returncode == 2 and "has not started (waiting for 1 server (have 0)): only stop works" \
            in refused.stderr, refused.stderr

        t0 = time.time()
        stop = run_cli(["litzctl", "--etcd", e, "--name", name, "stop"], timeout=60)
        assert stop.returncode == 0, stop.stderr
        out, err = master.communicate(timeout=30)
        took = time.time() - t0
        assert master.returncode == 0 and json.loads(out) is None, err
        assert took < 10, f"stopping a waiting job took {took:.1f} s"
        assert worker.wait(timeout=30) == 0, worker.communicate()[1]
    from litz.membership.etcdkv import EtcdKV

    assert EtcdKV(e).get_prefix(f"litz/jobs/{name}/") == {}  # the usual end: its keys are gone


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", [["litzctl", "list"], ["litzctl", "status", "--name", "x"],
                                     ["litz", "master", app_path("noop"), "--name", "x"],
                                     ["litz", "worker", "--name", "x"], ["litz", "server", "--name", "x"]])
def test_an_unreachable_etcd_is_said_at_once_with_its_address(command):
    """A first connection that cannot be made is said after CONNECT_WAIT_S (2 s), not after --etcd-timeout's 300 s
    (or litzctl's 10 s); a running process still rides out an outage that long (tests/test_etcd_outages.py)."""
    from tests.helpers import free_port

    address = f"127.0.0.1:{free_port()}"
    res = run_cli([*command, "--etcd", address], timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [f"{command[0]}: error: cannot reach etcd at {address} (connect: "
                                               "ConnectionFailedError; tried for 2 s): is it running there? "
                                               "(--etcd-timeout SECONDS waits for it)"], res.stderr


@pytest.mark.timeout(60)
def test_scale_without_a_count_is_an_error():
    res = run_cli(["litzctl", "--name", "x", "scale"], timeout=30)
    assert res.returncode == 2 and res.stderr == "litzctl: error: scale needs --workers N, --servers M or both\n"
