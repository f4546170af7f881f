"""Placement ``speed`` end to end: a worker slowed by the test hook (LITZ_TEST_SLOW_WORKER: it sleeps three times
as long as each slice of a task ran, as a 25 % CPU quota would make it) loses executors while the job runs and
gets them back once released, the speeds show in litzctl status, each rebalance is a job event with the speeds and
bytes, and the result stays exact (the chains app: causal chains across executors, exact totals, executor state
that must move with them). The rebalance tests run with --no-steal, so the moves they see are the rebalance's; the
stealing tests show an idle worker taking executors from the slowed one between rebalances, and none taken between
equally fast workers."""
import json
import os
import re

import pytest

from litz.cli.litzctl import format_status
from tests.support.chains import CHAINS, check_result
from tests.support.errors import assert_one_line
from tests.support.processes import Processes, app_path, metric_rows, run_cli, status, wait_for

STEPS = 200
LONG = 600  # the job that is released too: it must outlast both moves, even on a loaded machine


@pytest.mark.timeout(180)
def test_a_slow_worker_loses_executors_and_the_result_stays_exact(tmp_path):
    name, out = "straggler", tmp_path / "out.json"
    env = {**os.environ, "LITZ_TEST_SLOW_WORKER": "w1:0.75"}
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("chains"), "--name", name, "--executors", "16", "--placement",
                           "speed", "--no-steal", "--config", f"chains={CHAINS}", f"steps={STEPS}", "sleep=0.004",
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
        # w1 runs at about a quarter of w0's speed; the status's smoothed speeds measured 2.44x once, in a CI run
        # under load just after the shift (as the first rebalance's below), so 2x: a measure that missed the
        # straggler would be near 1x
        assert speeds["w0"] > 2.0 * speeds["w1"], speeds
        assert len(st["workers"][0]["executors"]) + len(st["workers"][1]["executors"]) == 16
        # each executor's own time per task there: w1's tasks take the hook's 3x sleep on top; the tasks sleep
        # (sleep=0.004), so their CPU time is a small part of their time
        costs = {w["id"]: [c for c in w["executor_task_ms"] if c is not None] for w in st["workers"]}
        assert costs["w0"] and costs["w1"], st["workers"]
        median = {w: sorted(ms for ms, _ in c)[len(c) // 2] for w, c in costs.items()}
        assert median["w1"] > 2.5 * median["w0"] and median["w0"] >= 4.0, costs
        assert all(cpu < 0.5 * ms for c in costs.values() for ms, cpu in c), costs
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
    # the first rebalance comes about 2 s in, while the estimate still converges on w1's quarter speed (4x):
    # quiet runs measured 2.8-3.9x there, and one CI run under load 2.47x
    assert first["speeds"]["w0"] > 2.0 * first["speeds"]["w1"], first
    # no rebalance follows another within 10 s unless the speeds moved past the threshold: with a steady
    # straggler, at most a second one corrects the first (measured before w1's queue drained)
    assert len(rebalances) <= 2, rebalances


@pytest.mark.timeout(180)
def test_cluster_mode_speed_placement_moves_executors_off_a_slow_worker(etcd, tmp_path):
    """The same through cluster mode: real etcd, `litz master --placement speed` and the roles started apart, the
    slow worker named by its --id (the hook matches the worker's id in the job)."""
    from tests.support.chains import role

    e, name, out = etcd.endpoint, "cluster-straggler", tmp_path / "out.json"
    with Processes() as procs:
        procs.start(role("server", e, name))
        procs.start(role("worker", e, name, "--id", "fast"))
        procs.start(role("worker", e, name, "--id", "slow"), env={**os.environ, "LITZ_TEST_SLOW_WORKER": "slow:0.75"})
        master = procs.start(["litz", "master", app_path("chains"), "--etcd", e, "--name", name, "--min-workers", "2",
                              "--executors", "16", "--placement", "speed", "--no-steal", "--config",
                              f"chains={CHAINS}",
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
    assert first["speeds"]["fast"] > 2.0 * first["speeds"]["slow"], first  # measured early: as above



CPU_CGROUP = "/sys/fs/cgroup/cpu"  # cgroup v1's cpu controller, where this kind of machine has one


def writable_cpu_cgroup() -> bool:
    return os.access(os.path.join(CPU_CGROUP, "cgroup.procs"), os.W_OK) and os.path.exists(
        os.path.join(CPU_CGROUP, "cpu.cfs_quota_us"))


@pytest.mark.skipif(not writable_cpu_cgroup(), reason="needs a writable cgroup v1 cpu controller (root)")
@pytest.mark.timeout(180)
def test_a_worker_under_a_real_cpu_quota_loses_executors(tmp_path):
    """No test hook: worker w1's process goes into a cgroup whose cpu.cfs_quota_us gives it a tenth of a core (a
    tenth: on a machine loaded by other work w0 may get as little as a third of a core, and the test must still see
    a gap), and the tasks spin on the CPU, so only the kernel slows it down. The speed policy sees it through the
    worker's measure (CPU time plus run delay) and moves executors to w0; the result stays exact."""
    name, out = "straggler-cgroup", tmp_path / "out.json"
    group = os.path.join(CPU_CGROUP, f"litz-test-{os.getpid()}")
    os.makedirs(group)
    try:
        period = int(open(os.path.join(group, "cpu.cfs_period_us")).read())
        with open(os.path.join(group, "cpu.cfs_quota_us"), "w") as f:
            f.write(str(period // 10))
        with Processes() as procs:
            job = procs.start(["litz", "run", app_path("chains"), "--name", name, "--executors", "16",
                               "--no-steal", "--config", f"chains={CHAINS}", f"steps={LONG}", "spin=0.003",
                               "--output", str(out), "--no-progress"])
            st = wait_for(lambda: (s := status(name)) and {w["id"] for w in s["workers"]} == {"w0", "w1"} and s, 30,
                          "both workers")
            w1 = next(w["pid"] for w in st["workers"] if w["id"] == "w1")
            with open(os.path.join(group, "cgroup.procs"), "w") as f:
                f.write(str(w1))

            seen = {}

            def shifted():
                s = seen["last"] = status(name)
                held = {w["id"]: len(w["executors"]) for w in s["workers"]} if s and s["state"] == "running" else {}
                return s if held.get("w1", 8) <= 6 and not s["moving"]["executors"] else None

            try:
                st = wait_for(shifted, 60, "w1 (a tenth of a core) down to 6 or fewer of 16 executors")
            except AssertionError:
                last = [(w["id"], len(w["executors"]), w["speed"]) for w in (seen["last"] or {}).get("workers", [])]
                raise AssertionError(f"w1 kept its executors: {last}") from None
            speeds = {w["id"]: w["speed"] for w in st["workers"]}
            assert speeds["w0"] > 1.5 * speeds["w1"], speeds
            # w1 reads its group's quota and says so; placement's speed for it is at most what a tenth of a core
            # sustains over its tasks' CPU time (w0 has no limit)
            limits = {w["id"]: w["cpu_limit"] for w in st["workers"]}
            assert limits == {"w0": None, "w1": 0.1}, limits
            w1_status = next(w for w in st["workers"] if w["id"] == "w1")
            assert w1_status["speed"] <= 0.1 / (w1_status["task_cpu_ms"] / 1e3) * 1.01, w1_status
            assert "cpu limit 0.10 cores" in format_status(st)
            _, err = job.communicate(timeout=120)
            assert job.returncode == 0, err
        doc = json.loads(out.read_text())
        check_result(doc["result"], LONG)
        rebalances = [e for e in doc["events"] if e["kind"] == "rebalance"]
        # each rebalance followed w1's measured slowness (the first may move just one executor: a shared machine's
        # load slows w0 too, so the measured gap opens over a few seconds), and they took at least 2 executors
        assert rebalances and all(e["speeds"]["w0"] > e["speeds"]["w1"] for e in rebalances), rebalances
        assert sum(e["executors_moved"] for e in rebalances) >= 2, rebalances
    finally:
        for pid in open(os.path.join(group, "cgroup.procs")).read().split():  # anything left: back to the root
            with open(os.path.join(CPU_CGROUP, "cgroup.procs"), "w") as f:
                f.write(pid)
        os.rmdir(group)

def test_speed_placement_is_the_default_and_an_unknown_one_is_refused(tmp_path):
    name = "default-placement"
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("chains"), "--name", name, "--executors", "4", "--config",
                           "chains=2", "steps=400", "sleep=0.004", "--no-progress"])
        st = wait_for(lambda: status(name), 30, "the job's status")
        assert st["placement"] == "speed" and st["stealing"] is True, st
        assert run_cli(["litzctl", "--name", name, "stop"]).returncode == 0
        job.communicate(timeout=60)
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
                           "speed", "--no-steal", "--config", f"chains={CHAINS}", f"steps={LONG}", "sleep=0.004",
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


# ------------------------------------------------------------------------------------ Driver.executor_speed
def test_executor_speed_is_the_worker_speed_shared_by_the_executors_it_holds(litz_home):
    """The master's answer to Driver.executor_speed: unknown before the worker is measured, then its speed over the
    executors it holds; an executor being moved counts at its destination; a bad executor is the driver's error."""
    from litz.appload import load_app
    from litz.master import Master
    from litz.membership import Membership, connect_kv
    from litz.placement import SpeedMeter

    membership = Membership(connect_kv(home=str(litz_home)), "job")
    master = Master(load_app(app_path("noop")), membership, "secret", config={}, num_executors=4,
                    listen="tcp://127.0.0.1:0", wake=False)
    try:
        master.num_executors = 4
        assert master.executor_speed(0) is None  # not placed yet
        master.owners.place(["w0", "w1"], ["s0"], 4, 1)
        master.owners.executor_moved(2, "w0")  # w0 holds 0, 1, 2; w1 holds 3
        assert [master.executor_speed(e) for e in range(4)] == [None] * 4  # nobody measured

        def measured(tasks: int, seconds: float) -> SpeedMeter:
            meter = SpeedMeter(window_s=0.0)
            meter.add(tasks, seconds, seconds, 0.0)
            return meter

        master.meters["w0"] = measured(60, 2.0)  # 30 tasks/s
        master.meters["w1"] = measured(2, 0.2)  # too few tasks to count yet
        assert [master.executor_speed(e) for e in range(4)] == [pytest.approx(10.0)] * 3 + [None]
        master.meters["w1"] = measured(20, 2.0)  # 10 tasks/s
        assert master.executor_speed(3) == pytest.approx(10.0)
        master.owners.start_executor_move(2, "w1", copy_input=False)  # on its way to w1, which will hold two
        assert [master.executor_speed(e) for e in range(4)] == pytest.approx([15.0, 15.0, 5.0, 5.0])
        master.owners.executor_moved(2, "w1")  # arrived
        assert master.executor_speed(2) == pytest.approx(5.0)
        master.forget("w1")  # lost: a replacement is not measured yet
        assert master.executor_speed(3) is None and master.executor_speed(0) == pytest.approx(15.0)
        for bad in (4, -1, "0", 1.0):
            with pytest.raises(ValueError, match=r"executor_speed: executor must be an int in \[0, 4\)"):
                master.executor_speed(bad)
    finally:
        master.close()


def probe_rows(out, metrics) -> tuple[dict, list[dict]]:
    doc = json.loads(out.read_text())
    rows = metric_rows(metrics)
    return doc, [r for r in rows if "round" in r]


@pytest.mark.timeout(120)
def test_a_driver_sees_the_slow_workers_executors_slower(tmp_path):
    """Even placement (nothing moves): executors 8..15 sit on w1, slowed to a quarter by the hook, and the driver's
    executor_speed shows each of them at about a quarter of w0's executors' speed once both workers are measured."""
    out, metrics = tmp_path / "out.json", tmp_path / "m.jsonl"
    env = {**os.environ, "LITZ_TEST_SLOW_WORKER": "w1:0.75"}
    res = run_cli(["litz", "run", app_path("speedprobe"), "--executors", "16", "--placement", "even", "--config",
                   "rounds=40", "--output", str(out), "--metrics", str(metrics), "--no-progress"], env=env, timeout=100)
    assert res.returncode == 0, res.stderr
    _, rows = probe_rows(out, metrics)
    assert rows[0]["speeds"] == [None] * 16  # nothing measured after the first round
    known = [r for r in rows if None not in r["speeds"]]
    assert len(known) >= 10, [r["speeds"] for r in rows]
    for r in known[-5:]:
        assert len(set(r["pids"][:8])) == 1 and set(r["pids"][:8]).isdisjoint(r["pids"][8:])  # w0's and w1's
        fast, slow = r["speeds"][:8], r["speeds"][8:]
        assert min(fast) > 2.5 * max(slow), r["speeds"]  # the hook: w1 at a quarter of w0's speed


@pytest.mark.timeout(150)
def test_under_speed_placement_the_executors_speeds_even_out(tmp_path):
    """--placement speed: before the first rebalance the driver sees the slow worker's executors about 4x slower;
    after the last one, w1 holds fewer executors, each of which the driver sees about as fast as w0's (the point of
    the policy: an executor's share of its worker's speed is the same everywhere)."""
    out, metrics = tmp_path / "out.json", tmp_path / "m.jsonl"
    env = {**os.environ, "LITZ_TEST_SLOW_WORKER": "w1:0.75"}
    res = run_cli(["litz", "run", app_path("speedprobe"), "--executors", "16", "--placement", "speed",
                   "--no-steal", "--config", "rounds=150", "--output", str(out), "--metrics", str(metrics),
                   "--no-progress"],
                  env=env, timeout=130)
    assert res.returncode == 0, res.stderr
    doc, rows = probe_rows(out, metrics)
    rebalances = [e for e in doc["events"] if e["kind"] == "rebalance"]
    assert rebalances, [e["kind"] for e in doc["events"]]
    w1 = rows[0]["pids"][8]  # the first placement: contiguous blocks, w1 holds 8..15
    before = [r for r in rows if None not in r["speeds"] and r["t"] < rebalances[0]["t"]]
    for r in before:
        fast = [s for s, p in zip(r["speeds"], r["pids"], strict=True) if p != w1]
        slow = [s for s, p in zip(r["speeds"], r["pids"], strict=True) if p == w1]
        assert min(fast) > 2.5 * max(slow), r["speeds"]
    after = [r for r in rows if r["t"] > rebalances[-1]["end"] + 1.0]
    assert len(after) >= 5, (len(rows), rebalances)
    for r in after[1:]:  # a round after the last move: every executor ran where it is now
        slow = [s for s, p in zip(r["speeds"], r["pids"], strict=True) if p == w1]
        fast = [s for s, p in zip(r["speeds"], r["pids"], strict=True) if p != w1]
        assert 1 <= len(slow) <= 5, r["pids"]
        assert 0.5 < sum(slow) / len(slow) / (sum(fast) / len(fast)) < 2.0, r["speeds"]


@pytest.mark.timeout(180)
def test_an_idle_worker_steals_from_a_slow_one_and_the_result_stays_exact(tmp_path):
    name, out = "stealing", tmp_path / "out.json"
    env = {**os.environ, "LITZ_TEST_SLOW_WORKER": "w1:0.75"}
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("chains"), "--name", name, "--executors", "16", "--placement",
                           "speed", "--config", f"chains={CHAINS}", f"steps={STEPS}", "sleep=0.004",
                           "--output", str(out), "--no-progress"], env=env)
        st = wait_for(lambda: (s := status(name)) and s["steals"] >= 1 and s, 60, "a steal counted in the status")
        assert st["stealing"] is True and st["placement"] == "speed"
        shown = run_cli(["litzctl", "--name", name, "status"])
        assert shown.returncode == 0 and re.search(r"\(speed placement, \d+ steals?\)", shown.stdout), shown.stdout
        _, err = job.communicate(timeout=150)
        assert job.returncode == 0, err
    doc = json.loads(out.read_text())
    check_result(doc["result"], STEPS)
    steals = [e for e in doc["events"] if e["kind"] == "steal"]
    # the fast worker, idle while chains queue up on the slowed one, takes executors with their queued tasks
    assert steals and all((e["from"], e["to"]) == ("w1", "w0") for e in steals), steals
    assert all(e["bytes"] > 0 and e["queued"] >= 1 and e["backlog_s"] > 0 for e in steals), steals
    # nothing goes back and forth: 8 + 8 -> 13 + 3 (the speeds' quotas) is 5 moves, 14 + 2 (within 10 % of them) 6
    moved = len(steals) + sum(e["executors_moved"] for e in doc["events"] if e["kind"] == "rebalance")
    assert moved <= 8, [e for e in doc["events"] if e["kind"] in ("steal", "rebalance")]


@pytest.mark.timeout(120)
def test_equally_fast_workers_do_not_steal(tmp_path):
    """Three chains over four executors of 50 ms tasks: now and then two chains queue on one executor while the
    other worker has none, long enough to pay for a move; but a steal would make the step 50 % longer than the
    equal speeds' quotas (2 + 2), which the next rebalance would undo: none is taken (without that rule, this job
    stole back and forth 9 times)."""
    out = tmp_path / "out.json"
    res = run_cli(["litz", "run", app_path("chains"), "--executors", "4", "--placement", "speed", "--config",
                   "chains=3", "steps=60", "sleep=0.05", "--output", str(out), "--no-progress"], timeout=110)
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert doc["result"]["violations"] == [] and doc["result"]["total"] == 3 * 60
    kinds = [e["kind"] for e in doc["events"]]
    assert "steal" not in kinds and "rebalance" not in kinds, doc["events"]


def test_stealing_without_speed_placement_is_refused():
    res = run_cli(["litz", "run", app_path("chains"), "--placement", "even", "--steal", "--no-progress"])
    line = assert_one_line(res, code=None)
    assert line.endswith("stealing needs --placement speed: a steal moves the quotas the workers' speeds set"), line
    import litz
    from litz.errors import LitzError

    with pytest.raises(LitzError, match="stealing needs --placement speed"):
        litz.run(app_path("chains"), workers=1, placement="even", steal=True, progress=False)
