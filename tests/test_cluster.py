"""Cluster mode with real etcd: roles started separately, joining and leaving, and the ways it can go wrong."""
import json
import os
import signal
import time

import pytest

from litz.membership.etcdkv import RPC_TIMEOUT_S
from litz.server import FORWARD_SETTLE_S
from tests.support.chains import CHAINS, STEPS_LONG, check_result, master_args, role
from tests.support.etcd import start_one
from tests.support.processes import Processes, ctl, run_cli, status, wait_for
from tests.support.scenario import Record, scenario


@pytest.fixture(scope="module")
def cluster_job(tmp_path_factory) -> Record:
    """One cluster job, run once for the tests below: roles started in any order, a second master and a worker
    with the wrong secret turned away, a scale-out waiting for a worker to join, etcd paused for longer than one
    call's timeout, a drain, and the end. Each test asserts one point on what it recorded."""
    tmp = tmp_path_factory.mktemp("cluster-job")
    etcd = start_one(tmp)
    e, name, out = etcd.endpoint, "cluster-job", tmp / "out.json"
    try:
        etcd.wait_ready()
        with scenario(str(tmp / "litz-home")) as rec, Processes() as procs:
            # roles in any order: workers and a server first, then the master
            procs.start(role("worker", e, name))
            procs.start(role("server", e, name))
            # even placement: the tests check the balancer spreads a joining worker's share exactly
            master = procs.start(master_args(e, name, "--output", str(out), "--placement", "even"))
            procs.start(role("worker", e, name))
            wait_for(lambda: (s := status(name, e)) and s["tasks_completed"] > 0, 30, "the cluster job running")

            rec["second master"] = run_cli(master_args(e, name), timeout=30)
            bad_secret = tmp / "wrong.secret"
            bad_secret.write_text("not-the-job-secret")
            rec["intruder"] = run_cli(role("worker", e, name, "--id", "intruder", "--secret-file", str(bad_secret),
                                           "--start-timeout", "3"), timeout=30)
            rec["scale"] = ctl(name, "scale", "--workers", "3", etcd=e)
            procs.start(role("worker", e, name))

            def three_balanced():
                st = status(name, e)
                return st and sorted(len(w["executors"]) for w in st["workers"]) == [4, 4, 4] and st

            rec.step("three balanced", wait_for, three_balanced, 30, "a third worker to join and get executors")

            # etcd unreachable for longer than one call's timeout (RPC_TIMEOUT_S): calls fail and are retried, and
            # no member is taken for lost; the sleep is the outage's length, not a wait
            etcd.proc.send_signal(signal.SIGSTOP)
            time.sleep(RPC_TIMEOUT_S + 1.5)
            etcd.proc.send_signal(signal.SIGCONT)
            # leases ran out while etcd stood still: every member's keeper writes its key again within a fraction
            # of the TTL (R3), and until the master's is back litzctl finds no job
            st = rec.step("registered again", wait_for, lambda: status(name, e), 20,
                          "the job registered again after the outage")
            rec["drain"] = ctl(name, "drain", st["workers"][0]["id"], etcd=e)
            stdout, stderr = master.communicate(timeout=90)
            rec["master"] = (master.returncode, stdout, stderr)
            rec["events"] = json.loads(out.read_text())["events"]
            rec["status after"] = ctl(name, "status", etcd=e)
    finally:
        etcd.kill()
    return rec


CLUSTER_JOB = pytest.mark.timeout(150)  # the first of these tests runs the scenario


@CLUSTER_JOB
def test_cluster_job_ran_to_its_end_leaving_nothing_behind(cluster_job):
    assert cluster_job.ended_by is None, repr(cluster_job.ended_by)


@CLUSTER_JOB
def test_cluster_job_refuses_a_second_master(cluster_job):
    second = cluster_job["second master"]
    assert second.returncode == 2 and "already has a master" in second.stderr, second.stderr


@CLUSTER_JOB
def test_cluster_job_refuses_a_worker_with_the_wrong_secret(cluster_job):
    intruder = cluster_job["intruder"]
    assert intruder.returncode == 2 and "is the job secret right?" in intruder.stderr, intruder.stderr


@CLUSTER_JOB
def test_cluster_scale_out_waits_for_a_worker_to_join(cluster_job):
    res = cluster_job["scale"]
    assert res.returncode == 0 and "waiting for 1 more worker(s) to join" in res.stdout, res.stderr


@CLUSTER_JOB
def test_cluster_joining_worker_gets_an_even_share_and_the_intruder_none(cluster_job):
    st = cluster_job["three balanced"]
    assert "intruder" not in json.dumps(st) and len(st["workers"]) == 3


@CLUSTER_JOB
def test_cluster_drain_releases_a_worker_after_an_etcd_pause(cluster_job):
    res = cluster_job["drain"]
    assert res.returncode == 0 and "released" in res.stdout, res.stderr


@CLUSTER_JOB
def test_cluster_job_result_is_exact(cluster_job):
    code, stdout, stderr = cluster_job["master"]
    assert code == 0, stderr
    check_result(json.loads(stdout), steps=STEPS_LONG)


@CLUSTER_JOB
def test_cluster_job_scaled_out_and_in(cluster_job):
    kinds = [ev["kind"] for ev in cluster_job["events"]]
    assert "scale_out" in kinds and "scale_in" in kinds, kinds


@CLUSTER_JOB
def test_cluster_etcd_pause_was_felt_and_cost_no_recovery(cluster_job):
    kinds = [ev["kind"] for ev in cluster_job["events"]]
    assert "registry_outage" in kinds and "recovery" not in kinds, kinds


@CLUSTER_JOB
def test_cluster_job_leaves_the_registry_when_it_ends(cluster_job):
    assert cluster_job["status after"].returncode == 2


@pytest.mark.timeout(120)
def test_etcd_lost_for_longer_than_etcd_timeout_ends_the_job_clearly(etcd):
    e, name, patience = etcd.endpoint, "cluster-etcd-dies", ("--etcd-timeout", "4")
    with Processes() as procs:
        master = procs.start(master_args(e, name, "--min-workers", "1", *patience))
        worker = procs.start(role("worker", e, name, *patience))
        server = procs.start(role("server", e, name, *patience))
        wait_for(lambda: (s := status(name, e)) and s["tasks_completed"] > 0, 30, "the job running")
        etcd.proc.kill()
        etcd.proc.wait()
        _, stderr = master.communicate(timeout=60)
        assert master.returncode == 2, stderr
        last = stderr.strip().splitlines()[-1]
        assert last.startswith("litz: error: etcd at") and "unreachable since" in last, stderr
        assert "gave up (--etcd-timeout)" in last, stderr
        for proc in (worker, server):  # they end on their own: told to stop, or they lose the registry
            proc.wait(timeout=30)


@pytest.mark.timeout(150)
def test_killed_worker_and_server_are_noticed_by_their_connections_and_recovered(etcd, tmp_path):
    """No launcher watches these processes, so before connection watching a loss was noticed only when its
    registry lease lapsed (seconds); a killed process's connection drops at once and is not taken back."""
    e, name, out = etcd.endpoint, "cluster-kill", tmp_path / "out.json"
    with Processes() as procs:
        workers = [procs.start(role("worker", e, name)) for _ in range(2)]
        servers = [procs.start(role("server", e, name)) for _ in range(2)]
        master = procs.start(master_args(e, name, "--min-servers", "2", "--output", str(out), "--checkpoint-dir",
                                         str(tmp_path / "ckpt"), "--checkpoint-every", "0.3"))
        st = wait_for(lambda: (s := status(name, e)) and s["checkpoints"] >= 1 and s, 60, "a checkpoint")
        ids = {p["pid"]: p["id"] for p in st["workers"] + st["servers"]}
        victims = [workers[1], servers[0]]
        for proc in victims:
            os.kill(proc.pid, signal.SIGKILL)
        stdout, stderr = master.communicate(timeout=120)
        assert master.returncode == 0, stderr
    check_result(json.loads(stdout), steps=STEPS_LONG)
    recoveries = [ev for ev in json.loads(out.read_text())["events"] if ev["kind"] == "recovery"]
    noticed = {k: v for ev in recoveries for k, v in ev["noticed"].items()}
    assert noticed == {ids[p.pid]: "connection dropped" for p in victims}, recoveries


@pytest.mark.timeout(150)
def test_steps_handed_off_between_workers_over_curve_survive_a_killed_worker(etcd, tmp_path):
    """Cluster mode (etcd, ZeroMQ with CURVE): chains whose steps go ahead with after= the step before, handed off
    from worker to worker (docs/design.md, A9), and a worker killed mid-job: the recovery forgets what was held
    and owed, and the restored driver's chains still read every step before them."""
    e, name, out = etcd.endpoint, "cluster-after", tmp_path / "out.json"
    with Processes() as procs:
        workers = [procs.start(role("worker", e, name)) for _ in range(3)]
        procs.start(role("server", e, name))
        master = procs.start(master_args(e, name, "--min-workers", "3", "--output", str(out), "--checkpoint-dir",
                                         str(tmp_path / "ckpt"), "--checkpoint-every", "0.3", "--config", "ahead=3"))
        wait_for(lambda: (s := status(name, e)) and s["checkpoints"] >= 1 and s, 60, "a checkpoint")
        os.kill(workers[2].pid, signal.SIGKILL)
        stdout, stderr = master.communicate(timeout=120)
        assert master.returncode == 0, stderr
    result = json.loads(stdout)
    check_result(result, steps=STEPS_LONG)
    assert result["remote"] > 0  # steps sent ahead with a predecessor on another worker
    assert [ev["kind"] for ev in json.loads(out.read_text())["events"]].count("recovery") == 1


@pytest.mark.timeout(150)
def test_a_worker_restarted_under_its_id_at_a_new_address_is_answered_there(etcd, tmp_path):
    """A container that restarts in its pod or compose service keeps its --id but listens on a new port. The
    server and the other worker had connections to the old address; messages sent there are never read."""
    e, name, out = etcd.endpoint, "cluster-same-id", tmp_path / "out.json"
    with Processes() as procs:
        procs.start(role("worker", e, name))
        victim = procs.start(role("worker", e, name, "--id", "wx"))
        procs.start(role("server", e, name))
        master = procs.start(master_args(e, name, "--output", str(out), "--checkpoint-dir", str(tmp_path / "ckpt"),
                                         "--checkpoint-every", "0.3"))
        st = wait_for(lambda: (s := status(name, e)) and s["checkpoints"] >= 1 and len(s["workers"]) == 2 and s,
                      60, "a checkpoint")
        old_address = next(w["address"] for w in st["workers"] if w["id"] == "wx")
        os.kill(victim.pid, signal.SIGKILL)
        wait_for(lambda: (s := status(name, e)) and [w["id"] for w in s["workers"]] != ["wx"] and
                 "wx" not in [w["id"] for w in s["workers"]] and s["state"] == "running", 60, "the recovery")
        procs.start(role("worker", e, name, "--id", "wx"))
        st = wait_for(lambda: (s := status(name, e)) and any(w["id"] == "wx" and w["executors"] for w in s["workers"])
                      and s, 60, "wx back, with executors")
        assert next(w["address"] for w in st["workers"] if w["id"] == "wx") != old_address
        stdout, stderr = master.communicate(timeout=120)
        assert master.returncode == 0, stderr
    check_result(json.loads(stdout), steps=STEPS_LONG)
    events = json.loads(out.read_text())["events"]
    assert [ev["lost"] for ev in events if ev["kind"] == "recovery"] == [["wx"]], events


@pytest.mark.timeout(150)
@pytest.mark.parametrize("recovery", ["recovery", "partial_recovery"])
def test_a_server_restarted_under_its_id_at_a_new_address_gets_its_shards(etcd, tmp_path, recovery):
    """The first server moved shards to sx when sx joined, so it has a connection to sx's first address. sx is
    killed and restarts with its --id: the next moves to it must go to its new address, although the new sx
    never sends the first server anything itself. After a partial recovery the workers ignore the lost sx;
    the new one, answering what the first server forwards to it, must be heard."""
    e, name, out = etcd.endpoint, f"cluster-same-server-id-{recovery[:4]}", tmp_path / "out.json"
    partial = ["--partial-recovery"] if recovery == "partial_recovery" else []
    with Processes() as procs:
        procs.start(role("worker", e, name))
        procs.start(role("worker", e, name))
        procs.start(role("server", e, name))
        master = procs.start(master_args(e, name, "--output", str(out), "--checkpoint-dir", str(tmp_path / "ckpt"),
                                         "--checkpoint-every", "0.3", *partial))
        wait_for(lambda: (s := status(name, e)) and s["checkpoints"] >= 1 and s, 60, "a checkpoint")

        def sx_with_shards():
            st = status(name, e)
            return st and st["state"] == "running" and next(
                (s for s in st["servers"] if s["id"] == "sx" and s["shards"]), None)

        victim = procs.start(role("server", e, name, "--id", "sx"))
        old_address = wait_for(sx_with_shards, 60, "sx joined, with shards")["address"]
        if partial:  # partial recovery is exact only once the first server exchanged no forwarded request with sx
            # for FORWARD_SETTLE_S: its status says how long ago it last did, as of its last report (about once a
            # second, published every second: the true age is larger), or never (None) in a report made after the move
            moved = time.monotonic()

            def settled():
                st = status(name, e)
                ago = st and next(s for s in st["servers"] if s["id"] != "sx")["forwarded_ago_s"]
                return ago > FORWARD_SETTLE_S if ago is not None else st and time.monotonic() > moved + 4

            wait_for(settled, FORWARD_SETTLE_S + 30, "forwarding between the servers to settle")
        wait_for(lambda: (s := status(name, e)) and s["checkpoints"] >= 2, 60, "a checkpoint with sx")
        os.kill(victim.pid, signal.SIGKILL)
        wait_for(lambda: (s := status(name, e)) and s["state"] == "running" and
                 [s["id"] for s in s["servers"]] != ["sx"] and "sx" not in [s["id"] for s in s["servers"]], 60,
                 "the recovery")
        procs.start(role("server", e, name, "--id", "sx"))
        assert wait_for(sx_with_shards, 60, "sx back, with shards")["address"] != old_address
        stdout, stderr = master.communicate(timeout=120)
        assert master.returncode == 0, stderr
    result = json.loads(stdout)
    if partial:  # the lost shards went back to a checkpoint (SCAR): only what ran is exact
        assert result["tasks_ran"] == CHAINS * STEPS_LONG
    else:
        check_result(result, steps=STEPS_LONG)
    events = json.loads(out.read_text())["events"]
    assert [ev["lost"] for ev in events if ev["kind"] == recovery] == [["sx"]], events
