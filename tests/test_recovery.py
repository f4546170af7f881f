"""Consistent checkpoints and recovery, end to end: kill -9 of workers and servers at random points,
corrupted and truncated checkpoints, a full disk, resuming after the master itself was killed."""
import json
import os
import random
import signal
import subprocess
import time
import zlib

import pytest

from tests.support.chains import CHAINS, check_result
from tests.support.processes import Processes, app_path, ctl, resize, run_cli, status, wait_for

STEPS = 400
RESUME_STEPS = 1000


def job_args(name: str, ckpt: str, *extra: str, steps: int = STEPS) -> list[str]:
    return ["litz", "run", app_path("chains"), "--name", name, "--executors", "12", "--checkpoint-dir", ckpt,
            "--config", f"chains={CHAINS}", f"steps={steps}", "sleep=0.001", "--no-progress", *extra]


def events_of(path) -> list[dict]:
    return json.loads(path.read_text())["events"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("victims,scar,transport", [
    (["w0"], [], "unix"), (["s0"], [], "unix"), (["w1", "s0"], [], "unix"),
    (["w0"], ["--partial-recovery", "--priority-checkpoint", "0.25"], "unix"), (["w1", "s0"], [], "zmq")],
    ids=["w0", "s0", "w1-s0", "w0-with-scar", "w1-s0-over-zeromq"])
def test_kill_9_at_a_random_point_recovers_exactly(tmp_path, monkeypatch, victims, scar, transport):
    """With SCAR's priority checkpoints on, a lost worker still has a full checkpoint to recover from. One case
    runs the job over ZeroMQ (``LITZ_TRANSPORT=zmq``), the carrier jobs across hosts use."""
    monkeypatch.setenv("LITZ_TRANSPORT", transport)
    name, out = f"recover-{'-'.join(victims)}{'-scar' if scar else ''}", tmp_path / "out.json"
    rng = random.Random(zlib.crc32(" ".join(victims).encode()))  # hash() of str differs per interpreter
    with Processes() as procs:
        job = procs.start(job_args(name, str(tmp_path / "ckpt"), "--checkpoint-every", "0.3",
                                   "--output", str(out), *scar))
        wait_for(lambda: (s := status(name)) and s["checkpoints"] >= 1, 30, "a first checkpoint")
        time.sleep(rng.uniform(0.0, 1.0))  # not a wait: the kill's moment is what the seed varies
        for victim in victims:
            res = ctl(name, "kill", victim, "--after", f"{rng.uniform(0, 0.3):.3f}")
            assert res.returncode == 0, res.stderr
        stdout, stderr = job.communicate(timeout=120)
        assert job.returncode == 0, stderr
    check_result(json.loads(stdout), steps=STEPS)  # consistency held, no update lost or applied twice
    events = events_of(out)
    recoveries = [e for e in events if e["kind"] == "recovery"]
    assert recoveries and {v for e in recoveries for v in e["lost"]} >= set(victims)
    for e in recoveries:
        assert os.path.basename(e["checkpoint"]).startswith("ckpt-") and e["duration_s"] >= 0
    pauses = [e["pause_s"] for e in events if e["kind"] == "checkpoint"]
    assert pauses and all(p >= 0 for p in pauses)


@pytest.mark.timeout(150)
def test_a_server_lost_during_a_workers_recovery_restarts_it(tmp_path):
    """The only server dies while a worker's recovery waits for the worker's replacement: the recovery starts
    over, waits for both replacements, and its event names both processes."""
    import psutil

    name, out = "recover-twice", tmp_path / "out.json"
    with Processes() as procs:
        job = procs.start(job_args(name, str(tmp_path / "ckpt"), "--checkpoint-every", "0.3",
                                   "--output", str(out), "--config", "load_sleep=0.1"))
        st = wait_for(lambda: (s := status(name)) and s["checkpoints"] >= 1 and s, 30, "a first checkpoint")
        pids = {m["id"]: m["pid"] for m in st["workers"] + st["servers"]}
        launcher = psutil.Process(job.pid)
        before = {p.pid for p in launcher.children(recursive=True)}  # workers are the fork server's children
        os.kill(pids["w1"], signal.SIGKILL)
        # the replacement is started when the recovery begins; it loads its executors' input (0.1 s each)
        wait_for(lambda: [p for p in launcher.children(recursive=True) if p.pid not in before], 30,
                 "a replacement worker", interval=0.005)
        os.kill(pids["s0"], signal.SIGKILL)
        stdout, stderr = job.communicate(timeout=120)
        assert job.returncode == 0, stderr
    check_result(json.loads(stdout), steps=STEPS)
    recoveries = [e for e in events_of(out) if e["kind"] == "recovery"]
    assert len(recoveries) == 1 and set(recoveries[0]["lost"]) == {"w1", "s0"}, recoveries
    assert "server s0 was lost during recovery; recovery starts over" in stderr


def digests(path) -> dict[str, str]:
    """Every file under ``path`` (relative name) -> the SHA-256 of its bytes."""
    import hashlib

    return {str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in path.rglob("*") if f.is_file()}


@pytest.mark.timeout(120)
def test_a_server_killed_while_writing_a_checkpoint_leaves_the_previous_one_to_recover_from(tmp_path):
    """kill -9 in the middle of writing checkpoint 2: s0 stops itself right after its first shard file (the test
    hook LITZ_TEST_CHECKPOINT_PAUSE) and is killed there. Checkpoint 1 stays byte for byte as it was, the
    half-written one is never taken for a checkpoint, and the job recovers from checkpoint 1 exactly."""
    import psutil

    from litz.checkpoint import CheckpointStore

    name, out, ckpt = "torn-checkpoint", tmp_path / "out.json", tmp_path / "ckpt"
    with Processes() as procs:
        job = procs.start(job_args(name, str(ckpt), "--output", str(out), steps=RESUME_STEPS),  # no periodic ones
                          env={**os.environ, "LITZ_TEST_CHECKPOINT_PAUSE": "s0:2"})
        st = wait_for(lambda: (s := status(name)) and s["tasks_completed"] > 0 and s, 30, "the job running")
        s0 = psutil.Process(next(s["pid"] for s in st["servers"] if s["id"] == "s0"))
        assert ctl(name, "checkpoint").returncode == 0
        wait_for(lambda: (s := status(name)) and s["checkpoints"] == 1, 30, "checkpoint 1")
        first = ckpt / "ckpt-000001"
        before = digests(first)
        assert ctl(name, "checkpoint").returncode == 0
        wait_for(lambda: s0.status() == psutil.STATUS_STOPPED, 30, "s0 to stop after its first shard file")
        torn = ckpt / ".ckpt-000002.tmp"
        assert len(list((torn / "shards").iterdir())) == 1 and not (torn / "manifest.json").exists()
        assert [c.path for c in CheckpointStore(str(ckpt)).complete(any_run=True)] == [str(first)]
        s0.kill()
        stdout, stderr = job.communicate(timeout=90)
        assert job.returncode == 0, stderr
    check_result(json.loads(stdout), steps=RESUME_STEPS)  # back to checkpoint 1: nothing lost or applied twice
    recoveries = [e for e in events_of(out) if e["kind"] == "recovery"]
    assert [(e["lost"], e["checkpoint"]) for e in recoveries] == [(["s0"], str(first))], recoveries
    assert digests(first) == before and not torn.exists()  # untouched; the torn one was cleared away


def stopped_job_with_checkpoints(tmp_path, name: str, count: int = 3, keep: int = 5):
    """Run a job until it has ``count`` checkpoints, then stop it; returns the checkpoint directory."""
    ckpt = tmp_path / "ckpt"
    with Processes() as procs:
        job = procs.start(job_args(name, str(ckpt), "--checkpoint-every", "0.2", "--checkpoint-keep", str(keep),
                                   steps=RESUME_STEPS))
        wait_for(lambda: (s := status(name)) and s["checkpoints"] >= count, 60, f"{count} checkpoints")
        assert ctl(name, "stop").returncode == 0
        job.communicate(timeout=30)
    return ckpt


@pytest.mark.timeout(120)
def test_only_the_newest_checkpoint_keep_checkpoints_stay(tmp_path):
    ckpt = stopped_job_with_checkpoints(tmp_path, "keep-2", count=5, keep=2)
    names = sorted(os.listdir(ckpt))
    assert len(names) == 2 and all(n.startswith("ckpt-") for n in names), names  # no partial one left either
    seqs = [int(n[5:]) for n in names]
    assert seqs[1] == seqs[0] + 1 and seqs[1] >= 5, names  # the two newest of five or more


def newest(ckpt) -> str:
    return sorted(d for d in os.listdir(ckpt) if d.startswith("ckpt-"))[-1]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("damage", ["corrupt", "truncate", "no-manifest"])
def test_resume_skips_a_damaged_checkpoint(tmp_path, damage):
    ckpt = stopped_job_with_checkpoints(tmp_path, f"damaged-{damage}")
    latest = newest(ckpt)
    part = ckpt / latest / "executors" / "e00003.pkl"
    if damage == "corrupt":  # same size, different bytes: only the checksum can tell
        data = bytearray(part.read_bytes())
        data[len(data) // 2] ^= 0xFF
        part.write_bytes(bytes(data))
    elif damage == "truncate":
        part.write_bytes(part.read_bytes()[:-5])
    else:
        (ckpt / latest / "manifest.json").unlink()
    out = tmp_path / "out.json"
    res = run_cli(["litz", "run", app_path("chains"), "--name", f"resumed-{damage}", "--resume", str(ckpt),
                   "--executors", "12", "--config", f"chains={CHAINS}", f"steps={RESUME_STEPS}", "sleep=0",
                   "--no-progress", "--output", str(out)], timeout=120)
    assert res.returncode == 0, res.stderr
    assert "warning" in res.stderr and latest in res.stderr
    check_result(json.loads(res.stdout), steps=RESUME_STEPS)
    resume = next(e for e in events_of(out) if e["kind"] == "resume")
    assert os.path.basename(resume["checkpoint"]) != latest


@pytest.mark.timeout(120)
def test_resume_after_the_master_is_killed(tmp_path):
    name, ckpt = "master-dies", tmp_path / "ckpt"
    with Processes() as procs:
        job = procs.start(job_args(name, str(ckpt), "--checkpoint-every", "0.2", steps=RESUME_STEPS))
        wait_for(lambda: (s := status(name)) and s["checkpoints"] >= 2, 60, "two checkpoints")
        os.kill(job.pid, signal.SIGKILL)  # the master (litz run) itself; its children die with it
        job.wait()
        wait_for(lambda: not [p for p in procs.procs if p.poll() is None], 10, "the job gone")
    from litz.checkpoint import CheckpointStore

    latest = CheckpointStore(str(ckpt)).complete(any_run=True)[0]
    done_before = latest.part("driver.pkl")["tasks_completed"]
    assert 0 < done_before < CHAINS * RESUME_STEPS  # killed part way: there is progress to carry over
    out = tmp_path / "out.json"
    res = run_cli(["litz", "run", app_path("chains"), "--resume", str(ckpt), "--executors", "12",
                   "--config", f"chains={CHAINS}", f"steps={RESUME_STEPS}", "sleep=0", "--no-progress",
                   "--output", str(out)], timeout=90)
    assert res.returncode == 0, res.stderr
    check_result(json.loads(res.stdout), steps=RESUME_STEPS)
    # it went on from the newest complete checkpoint, not from the start: the driver's count came with it
    resume = [e for e in events_of(out) if e["kind"] == "resume"]
    assert len(resume) == 1 and resume[0]["checkpoint"] == latest.path and resume[0]["seq"] == latest.seq, resume
    assert resume[0]["tasks_completed"] == done_before


@pytest.mark.timeout(60)
def test_resume_refuses_another_apps_checkpoint_and_an_empty_dir(tmp_path):
    ckpt = stopped_job_with_checkpoints(tmp_path, "other-app", count=1)
    res = run_cli(["litz", "run", app_path("noop"), "--resume", str(ckpt), "--no-progress"], timeout=60)
    assert res.returncode == 2 and "belongs to app" in res.stderr, res.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    res = run_cli(["litz", "run", app_path("noop"), "--resume", str(empty), "--no-progress"], timeout=60)
    assert res.returncode == 2 and "no complete checkpoint" in res.stderr, res.stderr


@pytest.mark.timeout(90)
def test_full_disk_keeps_the_previous_checkpoint(small_disk, tmp_path):
    """A checkpoint is written; the disk fills up; the next checkpoints fail cleanly while the job goes on and
    the good one stays intact; once there is room again, checkpoints succeed again."""
    name, out = "full-disk", tmp_path / "out.json"
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("chains"), "--name", name, "--executors", "4",
                           "--checkpoint-dir", str(small_disk), "--config", "chains=4", "steps=3000",
                           "sleep=0.001", "--no-progress", "--output", str(out)])
        wait_for(lambda: status(name), 30, "the job")
        assert ctl(name, "checkpoint").returncode == 0
        wait_for(lambda: (s := status(name)) and s["checkpoints"] == 1, 30, "a first checkpoint")
        used_kb = int(subprocess.run(["du", "-sk", str(small_disk)], capture_output=True, text=True).stdout.split()[0])
        resize(small_disk, f"{used_kb + 8}k")  # full: no room for a second checkpoint
        for n in (1, 2, 3):
            assert ctl(name, "checkpoint").returncode == 0
            st = wait_for(lambda n=n: (s := status(name)) and s["checkpoints_failed"] == n and s, 30,
                          f"checkpoint failure {n}")
            assert st["checkpoints"] == 1
        resize(small_disk, "64m")
        assert ctl(name, "checkpoint").returncode == 0
        wait_for(lambda: (s := status(name)) and s["checkpoints"] == 2, 30, "a checkpoint after room came back")
        assert ctl(name, "stop").returncode == 0
        _, stderr = job.communicate(timeout=60)
        assert job.returncode == 0, stderr
    events = events_of(out)
    failed = [e for e in events if e["kind"] == "checkpoint_failed"]
    assert len(failed) == 3 and all("No space left on device" in e["reason"] for e in failed), failed
    warned = [ln for ln in stderr.splitlines() if "checkpoint failed" in ln]
    assert "checkpoint failed (ckpt-000001 stays the checkpoint to recover from): " in warned[0], stderr
    # the later failures are one count line, told when a checkpoint was written again
    assert len(warned) == 2, stderr
    assert "checkpoint failed 2 more times" in warned[1], stderr
    assert "before ckpt-000002 was written (latest: " in warned[1], stderr
    assert not [d for d in os.listdir(small_disk) if d.endswith(".tmp")]  # failed attempts cleaned up
    from litz.checkpoint import CheckpointStore

    good = CheckpointStore(str(small_disk)).complete(any_run=True)
    assert [g.seq for g in good] == [2, 1]  # the first checkpoint survived the full disk intact
    for g in good:
        assert g.part("driver.pkl")["tasks_completed"] > 0  # every part checks out against the manifest
        for rel in g.manifest["files"]:
            g.part(rel)


@pytest.mark.timeout(90)
def test_checkpoints_failing_with_none_written_warn_once_and_count_the_rest(small_disk):
    """A disk too small for any checkpoint: the first failure says there is nothing to recover from (not that
    a previous one stays in use), and the failures every 0.1 s after it are one line with their count."""
    resize(small_disk, "8k")
    res = run_cli(["litz", "run", app_path("chains"), "--executors", "4", "--checkpoint-dir", str(small_disk),
                   "--checkpoint-every", "0.1", "--config", f"chains={CHAINS}", "steps=150", "sleep=0.002",
                   "--no-progress"], timeout=80)
    assert res.returncode == 0, res.stderr
    check_result(json.loads(res.stdout), steps=150)
    warned = [ln for ln in res.stderr.splitlines() if "checkpoint failed" in ln]
    assert len(warned) == 2, res.stderr
    assert warned[0].startswith("litz: warning: checkpoint failed (the job has no good checkpoint yet, so a lost "
                                "process cannot be recovered): "), res.stderr
    assert "No space left on device" in warned[0] and "stays" not in res.stderr
    count = int(warned[1].split("checkpoint failed ")[1].split()[0])
    assert count >= 3 and "more times in the last" in warned[1] and "(latest: " in warned[1], res.stderr


def test_repeated_warning_tells_the_first_then_one_count_a_period(monkeypatch, capsys):
    from litz import clock
    from litz.recovery import RepeatedWarning

    now = [1000.0]
    monkeypatch.setattr(clock, "time", lambda: now[0])
    w = RepeatedWarning("checkpoint failed", every=60.0)
    for i in range(150):  # a failure every second for 150 s
        w.warn(f"checkpoint failed: full {i}", f"full {i}")
        now[0] += 1.0
    w.settle(", before ckpt-000002 was written")
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["litz: warning: checkpoint failed: full 0",
                     "litz: warning: checkpoint failed 60 more times in the last 60 s (latest: full 60)",
                     "litz: warning: checkpoint failed 60 more times in the last 60 s (latest: full 120)",
                     "litz: warning: checkpoint failed 29 more times in the last 30 s, before ckpt-000002 was "
                     "written (latest: full 149)"]
    w.warn("checkpoint failed: again", "again")  # after a settle: a new first line
    w.settle()
    assert capsys.readouterr().err.splitlines() == ["litz: warning: checkpoint failed: again"]
    burst = RepeatedWarning("refused a litzctl request", every=10.0, burst=3)
    for i in range(5):
        burst.warn(f"refused {i}", f"r{i}")
    now[0] += 10.0
    burst.warn("refused 5", "r5")
    assert capsys.readouterr().err.splitlines() == [
        "litz: warning: refused 0", "litz: warning: refused 1", "litz: warning: refused 2",
        "litz: warning: refused a litzctl request 3 more times in the last 10 s (latest: r5)"]


@pytest.mark.timeout(120)
def test_a_new_run_never_recovers_from_an_earlier_runs_checkpoints(tmp_path):
    """The same command run again without --resume, in the same --checkpoint-dir: a loss before this run's
    first checkpoint has nothing of its own to go back to. The earlier run's checkpoints (same app, same
    executors) would put it into that run's state, so they are not used; --resume still finds them."""
    ckpt = stopped_job_with_checkpoints(tmp_path, "first-run")
    earlier = sorted(os.listdir(ckpt))
    name = "second-run"
    with Processes() as procs:
        job = procs.start(job_args(name, str(ckpt), "--checkpoint-every", "600", steps=RESUME_STEPS))
        wait_for(lambda: (s := status(name)) and s["tasks_completed"] > 0, 30, "the second run")
        assert ctl(name, "kill", "w1").returncode == 0
        _, stderr = job.communicate(timeout=60)
    assert job.returncode == 2, stderr
    assert "no checkpoint to recover from" in stderr.strip().splitlines()[-1], stderr
    assert sorted(os.listdir(ckpt)) == earlier  # left as they were, for --resume


@pytest.mark.timeout(60)
def test_no_checkpoint_means_a_clear_error(tmp_path):
    name = "no-ckpt"
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("chains"), "--name", name, "--config", "chains=4", "steps=5000",
                           "sleep=0.001", "--no-progress"])
        wait_for(lambda: status(name), 30, "the job")
        assert ctl(name, "kill", "w1").returncode == 0
        _, stderr = job.communicate(timeout=30)
    assert job.returncode == 2
    assert "worker w1" in stderr and "no checkpoint to recover from" in stderr.strip().splitlines()[-1]
