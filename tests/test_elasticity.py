"""Scale-out, scale-in and drain of running jobs, end to end through real processes and litzctl.

The job is the chains app: causal chains hopping across executors (consistency), concurrent updates to
shared keys (exact totals), executors counting their tasks (state that must move with them, nothing run
twice or lost) and checking their input data (re-loaded on scale-in)."""
import json
import os
import signal

import numpy as np
import pytest

from tests.support.chains import CHAINS, STEPS, check_result
from tests.support.errors import assert_one_line
from tests.support.handbuilt import bare_master, bare_server, bare_worker
from tests.support.processes import Processes, app_path, ctl, metric_rows, status, wait_for
from tests.support.scenario import Record, scenario

LONG = 400  # a job that outlasts a test's whole script of litzctl calls, even on a loaded machine


def counts(st: dict) -> tuple[int, int]:
    return len(st["workers"]), len(st["servers"])


@pytest.fixture(scope="module", params=["unix", "zmq"])
def elastic_job(request, tmp_path_factory) -> Record:
    """One job scaled out, drained and scaled in while it runs, once per carrier: also over ZeroMQ
    (``LITZ_TRANSPORT=zmq``), the carrier jobs across hosts use. Each test asserts one point on the record."""
    transport = request.param
    tmp = tmp_path_factory.mktemp(f"elastic-{transport}")
    name, out = f"elastic-local-{transport}", tmp / "out.json"
    with pytest.MonkeyPatch.context() as mp, scenario(str(tmp / "litz-home")) as rec, Processes() as procs:
        mp.setenv("LITZ_TRANSPORT", transport)
        job = procs.start(["litz", "run", app_path("chains"), "--name", name, "--executors", "16",
                           "--placement", "even",  # the tests check the exact even spread after scale-out
                           "--config", f"chains={CHAINS}", f"steps={LONG}", "sleep=0.004",
                           "--output", str(out), "--no-progress"])
        wait_for(lambda: status(name), 30, "the job's status")
        rec["scale out"] = ctl(name, "scale", "--workers", "4", "--servers", "3")
        seen = {}

        def balanced():
            st = seen["last"] = status(name)
            return st and (sorted(len(w["executors"]) for w in st["workers"]) == [4, 4, 4, 4]
                           and sorted(len(s["shards"]) for s in st["servers"]) == [21, 21, 22]) and st

        def wait_balanced():
            try:
                return wait_for(balanced, 30, "16 executors spread 4/4/4/4 and 64 shards 21/21/22")
            except AssertionError as exc:  # say where it got stuck
                last = seen.get("last") or {}
                workers = [(w["id"], w["executors"]) for w in last.get("workers", [])]
                servers = [(s["id"], len(s["shards"])) for s in last.get("servers", [])]
                raise AssertionError(f"{exc}; last status: workers {workers}, servers {servers}") from None

        rec.step("balanced", wait_balanced)
        rec["drain"] = ctl(name, "drain", "w0", "s0")  # waits until both have exited
        rec.step("after drain", wait_for, lambda: (s := status(name)) and counts(s) == (3, 2) and s, 10,
                 "w0 and s0 gone")
        rec["scale in"] = ctl(name, "scale", "--workers", "2")
        stdout, stderr = job.communicate(timeout=90)
        rec["job"] = (job.returncode, stdout, stderr)
        rec["events"] = json.loads(out.read_text())["events"]
    return rec


ELASTIC_JOB = pytest.mark.timeout(120)  # the first of these tests runs the scenario


@ELASTIC_JOB
def test_scale_out_in_and_drain_ran_to_the_end_leaving_nothing_behind(elastic_job):
    assert elastic_job.ended_by is None, repr(elastic_job.ended_by)


@ELASTIC_JOB
def test_scale_out_starts_the_missing_workers_and_servers(elastic_job):
    res = elastic_job["scale out"]
    assert res.returncode == 0, res.stderr
    assert "starting 2 worker(s)" in res.stdout and "starting 2 server(s)" in res.stdout, res.stdout


@ELASTIC_JOB
def test_scale_out_spreads_executors_and_shards_evenly(elastic_job):
    st = elastic_job["balanced"]
    assert all(w["pid"] and w["id"] for w in st["workers"])


@ELASTIC_JOB
def test_drain_releases_the_named_worker_and_server(elastic_job):
    res = elastic_job["drain"]
    assert res.returncode == 0 and "released w0, s0" in res.stdout, res.stderr
    assert {w["id"] for w in elastic_job["after drain"]["workers"]} == {"w1", "w2", "w3"}


@ELASTIC_JOB
def test_scale_in_releases_the_newest_worker(elastic_job):
    res = elastic_job["scale in"]
    assert res.returncode == 0 and "released w3" in res.stdout, res.stdout + res.stderr


@ELASTIC_JOB
def test_scaled_job_result_is_exact(elastic_job):
    code, stdout, stderr = elastic_job["job"]
    assert code == 0, stderr
    check_result(json.loads(stdout), steps=LONG)


@ELASTIC_JOB
def test_scale_events_say_what_moved_and_when(elastic_job):
    events = elastic_job["events"]
    kinds = [e["kind"] for e in events]
    assert kinds.count("scale_in") >= 2 and "scale_out" in kinds, kinds
    for e in events:
        if e["kind"] in ("scale_out", "scale_in"):
            assert e["end"] >= e["t"] and e["duration_s"] >= 0, e
            assert e["executors_moved"] + e["shards_moved"] > 0, e


@ELASTIC_JOB
def test_scale_out_sends_input_data_from_memory(elastic_job):
    out_ev = next(e for e in elastic_job["events"] if e["kind"] == "scale_out" and e["executors_moved"])
    assert out_ev["bytes"] >= 8000  # 1000 float64 per executor


@pytest.mark.timeout(120)
def test_a_shard_move_forwards_requests_and_never_pauses_the_workers(tmp_path):
    """A second server takes half the shards while tasks run. Requests that still reach the old owner under the
    old map are forwarded (its status counts them) and every one is answered (the result is exact); and no
    worker stops for the move: on every worker some task was running while the shards moved. A move that
    waited for no task to be in flight (as a checkpoint does) would have neither."""
    name, out, m = "elastic-forward", tmp_path / "out.json", tmp_path / "m.jsonl"
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("chains"), "--name", name, "--executors", "8",
                           "--placement", "even",  # no executor moves: every worker keeps its tasks
                           "--config", f"chains={CHAINS}", f"steps={LONG}", "sleep=0.004", "log_runs=1",
                           "--metrics", str(m), "--output", str(out), "--no-progress"])
        wait_for(lambda: (s := status(name)) and s["tasks_completed"] > 0, 30, "the job running")
        assert ctl(name, "scale", "--servers", "2").returncode == 0
        wait_for(lambda: (s := status(name)) and sorted(len(x["shards"]) for x in s["servers"]) == [32, 32]
                 and not s["moving"]["shards"], 30, "32 of the 64 shards moved to the new server")
        # servers send their counters about once a second
        st = wait_for(lambda: (s := status(name)) and next(x for x in s["servers"] if x["id"] == "s0")["forwarded"]
                      and s, 10, "s0 to count requests it forwarded")
        assert next(x for x in st["servers"] if x["id"] == "s1")["forwarded"] == 0  # s1 forwards nothing back
        stdout, stderr = job.communicate(timeout=90)
        assert job.returncode == 0, stderr
    result = json.loads(stdout)
    check_result(result, steps=LONG)
    moves = [e for e in json.loads(out.read_text())["events"] if e["kind"] == "scale_out"]
    assert len(moves) == 1 and moves[0]["shards_moved"] == 32 and moves[0]["executors_moved"] == 0, moves
    row = next(r for r in metric_rows(m) if "log_runs" in r)
    start = row["time"] - row["t"]  # the job log's start: events' times are relative to it
    began, ended = start + moves[0]["t"], start + moves[0]["end"]
    assert len(result["runs"]) == 2  # the two workers' pids
    for pid, spans in result["runs"].items():
        assert any(s < ended and e > began for s, e in spans), f"worker {pid} ran no task while the shards moved"

@pytest.mark.timeout(90)
def test_refusals_and_unknowns(tmp_path):
    name = "elastic-refusals"
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("chains"), "--name", name, "--workers", "1",
                           "--config", "chains=4", "steps=100000", "sleep=0.001"])  # progress on: the stop line
        wait_for(lambda: status(name), 30, "the job's status")
        for args, message in [
            (["scale", "--workers", "0"], "cannot scale to 0 workers"),
            (["drain", "w0"], "would leave no active worker"),
            (["drain", "s0"], "would leave no active server"),
            (["drain", "w9"], "unknown process id(s): w9"),
        ]:
            assert_one_line(ctl(name, *args), message)
        res = ctl("no-such-job", "status")
        assert res.returncode == 2 and "no running job named 'no-such-job'" in res.stderr
        png = tmp_path / "job.png"
        wait_for(lambda: ctl(name, "plot", str(png)).returncode == 0, 30, "litzctl plot")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        res = ctl(name, "stop")
        assert res.returncode == 0, res.stderr
        stdout, stderr = job.communicate(timeout=30)
        assert job.returncode == 0 and json.loads(stdout) is None, stderr
        assert stderr.strip().splitlines()[-1].endswith("stopped by litzctl: the result is null"), stderr


@pytest.mark.timeout(90)
def test_sigterm_makes_a_worker_and_a_server_leave_gracefully(tmp_path):
    """docker stop / Kubernetes without a preStop hook: SIGTERM drains the process instead of losing it."""
    name, out = "elastic-sigterm", tmp_path / "out.json"
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("chains"), "--name", name, "--workers", "3", "--servers", "2",
                           "--executors", "12", "--config", f"chains={CHAINS}", f"steps={STEPS}", "sleep=0.003",
                           "--output", str(out), "--no-progress"])
        st = wait_for(lambda: (s := status(name)) and s["tasks_completed"] > 0 and s, 30, "the job running")
        victims = {p["id"]: p["pid"] for p in st["workers"][:1] + st["servers"][:1]}
        for pid in victims.values():
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: (s := status(name)) and not {p["id"] for p in s["workers"] + s["servers"]} & set(victims),
                 30, "the signalled processes to leave")
        stdout, stderr = job.communicate(timeout=90)
        assert job.returncode == 0, stderr
    check_result(json.loads(stdout))
    kinds = [e["kind"] for e in json.loads(out.read_text())["events"]]
    assert "scale_in" in kinds and "recovery" not in kinds


def test_a_task_for_an_executor_waiting_to_move_travels_with_it(tmp_path):
    """A task dispatched to an executor that a move order reached first (it waits for a started task to end)
    must go with the executor's state. It was queued to run here, and once the executor had shipped it
    failed with KeyError (or was lost with a worker that retired)."""
    from litz import protocol as P

    w = bare_worker("w0", spill_root=str(tmp_path))
    w.install(0, {})
    w.started[0] = 1  # a task of executor 0 is under way (waiting for a value)
    w.handle("master", (P.MOVE_EXECUTOR, 0, "w1", False, True))
    assert 0 in w.moving and not [m for m in w.sent if m[1][0] == P.EXECUTOR]
    w.handle("master", (P.TASKS, [(7, 0, 3, "late")], []))
    assert not w.runnable
    w.started[0] = 0  # the started task ended
    w.ship_ready_executors()
    [(dest, msg)] = [m for m in w.sent if m[1][0] == P.EXECUTOR]
    assert dest == "w1" and msg[3] == [(7, 0, 3, "late")]


def test_a_worker_joining_as_a_shard_move_ends_is_not_awaited_by_the_old_owner():
    """A worker joining in the batch where a draining server's last shard moved is sent the map without
    that server. The server must not wait for its fence: it never sends one, and the scale-in never ended."""
    from types import SimpleNamespace

    from litz import protocol as P
    from litz.master import Master, Member
    from litz.owners import Placement
    from litz.placement import EvenPolicy

    owners = Placement(EvenPolicy())
    owners.place(["w0"], ["s0", "s1"], 2, 2)
    owners.start_shard_move(0, "s1")
    sent = []
    m = bare_master(("shard_owner", "moving_shards", "moving_executors", "copying_input", "map_message"),
                    map_version=3, map_dirty=False, owners=owners, last_owned={"s0": 3, "s1": 3}, operation=None,
                    app=SimpleNamespace(token="t", executor_blob=lambda: b""), config={}, num_executors=2,
                    memory_limit=None, send=lambda ident, msg: sent.append((ident, msg)),
                    maybe_end_operation=lambda: None, exit_fences={})
    m.workers = {"w0": Member("w0", "worker", {})}
    m.workers["w0"].first_map = 0
    m.servers = {"s0": Member("s0", "server", {}), "s1": Member("s1", "server", {})}
    m.servers["s0"].state = "draining"
    Master.on_shard_moved(m, "s1", 0, 100)  # s0's last shard: the map is dirty until the batch ends
    m.workers["w1"] = Member("w1", "worker", {})
    Master.join_worker(m, "w1", [])
    [shards] = [msg for ident, msg in sent if ident == "w1" and msg[0] == P.SHARDS]
    assert "s0" not in shards[2]
    Master.broadcast_map(m)
    Master.check_retirements(m)
    [(_, retire)] = [(i, msg) for i, msg in sent if i == "s0" and msg[0] == P.RETIRE]
    assert retire[1] == ["w0", "s1"]  # w0 had s0 in its map and fences it, s1 may forward to it; w1 neither


def test_a_fence_from_before_the_servers_last_shard_does_not_let_it_retire():
    """w0 fenced s1 at map 5 (s1 lost its shards), then a move planned earlier gave s1 shard 2 again (map 7) and
    w0 sent it a flush part. The old fence must not let s1 exit with that part still on its way: only w0's fence
    from a map after 7 does (docs/design.md, M3; found by python -m litz.sim, seed 3333)."""
    from litz import protocol as P

    sent: list = []
    s1 = bare_server("s1", lambda to, msg: sent.append((to, msg)))
    s1.handle("w0", (P.FENCE, 5))
    s1.shards[2] = {"k": np.ones(2)}
    s1.move_shard(2, "s0")  # map 8 takes it away again
    s1.handle("master", (P.RETIRE, ["w0"], 7))
    assert s1.running, "w0's fence predates s1's last shard: w0 may still send to it"
    s1.handle("w0", (P.UPDATES, 9, [(2, "k", np.ones(2))]))  # sent under map 7: forwarded before s1 may leave
    s1.handle("w0", (P.FENCE, 8))
    assert not s1.running
    assert [(to, msg[0]) for to, msg in sent] == [("s0", P.SHARD_DATA), ("s0", P.FWD_UPDATES), ("s0", P.FENCE),
                                                  ("master", P.RETIRED)]


def test_a_retiring_server_waits_for_what_other_servers_forward_to_it():
    """Shard 0 moved s0 -> s1, then s1 drained it to s2. A worker with a map older than both asks s0, which
    forwards to s1. The worker's own fence can reach s1 before that forward: s1 must not exit until s0 has
    fenced it too, and s0 must send later requests for the shard to s2 directly."""
    from litz import protocol as P

    sent: list = []
    servers = {i: bare_server(i, lambda to, msg, i=i: sent.append((i, to, msg))) for i in ("s0", "s1", "s2")}
    s0, s1, s2 = servers.values()
    s0.move_shard(0, "s1")
    s1.receive_shard(0, {"k": np.ones(2)})
    s1.move_shard(0, "s2")
    s2.receive_shard(0, s1.shards.pop(0, {}) or {"k": np.ones(2)})
    sent.clear()
    s0.handle("w0", (P.GETS, [(1, 0, "k")]))  # on its way to s1
    s1.handle("master", (P.RETIRE, ["w0", "s0", "s2"]))
    s1.handle("w0", (P.FENCE, 5))
    s2.handle("master", (P.UNFORWARD, "s1", ["s2"]))
    s1.handle("s2", next(msg for frm, to, msg in sent if (frm, to) == ("s2", "s1")))
    assert s1.running, "s0 has not fenced it: its forwarded request is still on the way"
    s0.handle("master", (P.UNFORWARD, "s1", ["s2"]))
    s0.handle("w0", (P.GETS, [(2, 0, "k")]))  # after the fence: straight to the owner
    from_s0 = [msg for frm, to, msg in sent if (frm, to) == ("s0", "s1")]
    assert [m[0] for m in from_s0] == [P.FWD_GETS, P.FENCE]
    assert [(to, msg[0], msg[2]) for frm, to, msg in sent if frm == "s0" and to != "s1"] == [
        ("s2", P.FWD_GETS, [(2, 0, "k")])]
    for msg in from_s0:  # in order on the s0 -> s1 channel: the request first
        s1.handle("s0", msg)
    assert not s1.running
    assert [(to, msg[0]) for frm, to, msg in sent if frm == "s1"][-3:] == [
        ("s2", P.FWD_GETS), ("s2", P.FENCE), ("master", P.RETIRED)]  # it passed the request on, then left
    assert sent[-1][2] == (P.RETIRED, ["s2"])
