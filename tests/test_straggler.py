"""Placement ``speed`` end to end: a worker slowed by the test hook (LITZ_TEST_SLOW_WORKER: it sleeps three times
as long as each slice of a task ran, as a 25 % CPU quota would make it) loses executors while the job runs and
gets them back once released, the speeds show in litzctl status, each rebalance is a job event with the speeds and
bytes, and the result stays exact (the chains app: causal chains across executors, exact totals, executor state
that must move with them)."""
import json
import os

import pytest

from tests.helpers import Processes, app_path, run_cli, status, wait_for
from tests.test_elasticity import CHAINS, check_result

STEPS = 200
LONG = 600  # the job that is released too: it must outlast both moves, even on a loaded machine


@pytest.mark.timeout(180)
def test_a_slow_worker_loses_executors_and_the_result_stays_exact(tmp_path):
    name, out = "straggler", tmp_path / "out.json"
    env = {**os.environ, "LITZ_TEST_SLOW_WORKER": "w1:0.75"}
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("chains"), "--name", name, "--executors", "16", "--placement",
                           "speed", "--config", f"chains={CHAINS}", f"steps={STEPS}", "sleep=0.004",
                           "--output", str(out), "--no-progress"], env=env)
        wait_for(lambda: status(name), 30, "the job's status")

        def shifted():
            st = status(name)
            if not st or st["state"] != "running" or st["moving"]["executors"]:
                return None
            held = {w["id"]: w for w in st["workers"]}
            if set(held) == {"w0", "w1"} and len(held["w1"]["executors"]) <= 5:
                return st
            return None

        st = wait_for(shifted, 60, "w1 (slowed to a quarter) down to 5 or fewer of 16 executors")
        assert st["placement"] == "speed"
        speeds = {w["id"]: w["speed"] for w in st["workers"]}
        assert speeds["w0"] > 2.5 * speeds["w1"], speeds  # measured: w1 runs at about a quarter of w0's speed
        assert len(st["workers"][0]["executors"]) + len(st["workers"][1]["executors"]) == 16
        shown = run_cli(["litzctl", "--name", name, "status"])
        assert shown.returncode == 0 and "speed placement" in shown.stdout
        assert shown.stdout.count(" tasks/s (") == 2, shown.stdout  # each worker's measured speed

        _, err = job.communicate(timeout=150)
        assert job.returncode == 0, err
    doc = json.loads(out.read_text())
    check_result(doc["result"], STEPS)
    rebalances = [e for e in doc["events"] if e["kind"] == "rebalance"]
    assert rebalances, [e["kind"] for e in doc["events"]]
    first = rebalances[0]
    assert first["executors_moved"] >= 3 and first["bytes"] > 0
    assert first["speeds"]["w0"] > 2.5 * first["speeds"]["w1"]
    # no rebalance follows another within 10 s unless the speeds moved past the threshold: with a steady
    # straggler, at most a second one corrects the first (measured before w1's queue drained)
    assert len(rebalances) <= 2, rebalances


@pytest.mark.timeout(180)
def test_cluster_mode_speed_placement_moves_executors_off_a_slow_worker(etcd, tmp_path):
    """The same through cluster mode: real etcd, `litz master --placement speed` and the roles started apart, the
    slow worker named by its --id (the hook matches the worker's id in the job)."""
    from tests.test_cluster import role

    e, name, out = etcd.endpoint, "cluster-straggler", tmp_path / "out.json"
    with Processes() as procs:
        procs.start(role("server", e, name))
        procs.start(role("worker", e, name, "--id", "fast"))
        procs.start(role("worker", e, name, "--id", "slow"), env={**os.environ, "LITZ_TEST_SLOW_WORKER": "slow:0.75"})
        master = procs.start(["litz", "master", app_path("chains"), "--etcd", e, "--name", name, "--min-workers", "2",
                              "--executors", "16", "--placement", "speed", "--config", f"chains={CHAINS}",
                              f"steps={STEPS}", "sleep=0.004", "--output", str(out), "--no-progress"])

        def shifted():
            st = status(name, e)
            if not st or st["state"] != "running" or st["moving"]["executors"]:
                return None
            held = {w["id"]: len(w["executors"]) for w in st["workers"]}
            return st if set(held) == {"fast", "slow"} and held["slow"] <= 5 else None

        st = wait_for(shifted, 90, "the slow worker down to 5 or fewer of 16 executors")
        assert st["placement"] == "speed"
        speeds = {w["id"]: w["speed"] for w in st["workers"]}
        assert speeds["fast"] > 2.5 * speeds["slow"], speeds
        assert sum(len(w["executors"]) for w in st["workers"]) == 16
        stdout, stderr = master.communicate(timeout=150)
        assert master.returncode == 0, stderr
    check_result(json.loads(stdout), STEPS)
    rebalances = [ev for ev in json.loads(out.read_text())["events"] if ev["kind"] == "rebalance"]
    assert rebalances, json.loads(out.read_text())["events"]
    first = rebalances[0]
    assert first["executors_moved"] >= 3 and first["bytes"] > 0
    assert first["speeds"]["fast"] > 2.5 * first["speeds"]["slow"], first


def test_even_placement_is_the_default_and_an_unknown_one_is_refused(tmp_path):
    res = run_cli(["litz", "run", app_path("chains"), "--placement", "fastest", "--no-progress"])
    assert res.returncode != 0 and "invalid choice: 'fastest'" in res.stderr
    import litz
    from litz.errors import LitzError

    with pytest.raises(LitzError, match="unknown placement 'fastest'"):
        litz.run(app_path("chains"), workers=1, placement="fastest", progress=False)


@pytest.mark.timeout(240)
def test_a_released_worker_gets_its_executors_back(tmp_path):
    name, out, slow = "straggler-back", tmp_path / "out.json", tmp_path / "slow"
    slow.write_text("0.75")
    env = {**os.environ, "LITZ_TEST_SLOW_WORKER": f"w1:{slow}"}
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("chains"), "--name", name, "--executors", "16", "--placement",
                           "speed", "--config", f"chains={CHAINS}", f"steps={LONG}", "sleep=0.004",
                           "--output", str(out), "--no-progress"], env=env)

        def w1_holds(ok):
            st = status(name)
            if not st or st["state"] != "running" or st["moving"]["executors"]:
                return None
            held = {w["id"]: len(w["executors"]) for w in st["workers"]}
            return st if set(held) == {"w0", "w1"} and ok(held["w1"]) else None

        wait_for(lambda: w1_holds(lambda n: n <= 5), 60, "w1 (slowed) down to 5 or fewer of 16 executors")
        slow.write_text("0")  # released: as fast as w0 again
        st = wait_for(lambda: w1_holds(lambda n: n >= 7), 60, "w1 (released) back to 7 or more of 16 executors")
        speeds = {w["id"]: w["speed"] for w in st["workers"]}
        assert speeds["w1"] > 0.6 * speeds["w0"], speeds
        _, err = job.communicate(timeout=200)
        assert job.returncode == 0, err
    doc = json.loads(out.read_text())
    check_result(doc["result"], LONG)
    moved = [e for e in doc["events"] if e["kind"] == "rebalance"]
    assert len(moved) >= 2 and moved[-1]["speeds"]["w1"] > 0.6 * moved[-1]["speeds"]["w0"], moved


class FixedOnFirstOffer:
    """A policy of the test's own, passed to litz.run as an object: even until the master first offers it speeds,
    then 3 : 1 for w0 : w1 whatever was measured."""

    name, uses_speeds = "fixed", True

    def __init__(self):
        self.adopted, self.offered = None, []

    def weights(self):
        return self.adopted

    def offer(self, owner, workers, speeds, now):
        self.offered.append(tuple(owner))
        if self.adopted is None and workers == ["w0", "w1"]:
            self.adopted = {"w0": 3.0, "w1": 1.0}
            return True
        return False


@pytest.mark.timeout(120)
def test_a_policy_object_given_to_litz_run_is_the_one_the_master_follows(tmp_path):
    import litz

    policy, out = FixedOnFirstOffer(), tmp_path / "out.json"
    result = litz.run(app_path("chains"), workers=2, executors=16, placement=policy, output=str(out),
                      config={"chains": CHAINS, "steps": STEPS, "sleep": 0.004}, progress=False)
    check_result(result, STEPS)
    assert sorted(policy.offered[0].count(w) for w in ("w0", "w1")) == [8, 8]  # first placement: even
    assert any(o.count("w0") == 12 and o.count("w1") == 4 for o in policy.offered[1:]), policy.offered
    doc = json.loads(out.read_text())
    [rebalance] = [e for e in doc["events"] if e["kind"] == "rebalance"]
    assert rebalance["speeds"] == {"w0": 3.0, "w1": 1.0} and rebalance["executors_moved"] == 4
