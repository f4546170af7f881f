"""The driver reads parameters (``Driver.ps_get`` / ``ps_get_many``, docs/design.md D1 and D2), end to end:
across scale-out and scale-in that move shards, and with a server killed right before a read."""
import json

import pytest

from tests.support.processes import Processes, app_path, ctl, run_cli, status, wait_for


def check(result: dict) -> None:
    assert result["violations"] == []
    assert result["final"] == result["expected"] and sum(result["expected"]) > 0


@pytest.mark.timeout(120)
def test_driver_reads_see_every_completed_update_across_shard_moves(tmp_path):
    name, out = "driver-reads-elastic", tmp_path / "out.json"
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("driver_reads"), "--name", name, "--executors", "8",
                           "--config", "steps=400", "sleep=0.003", "--output", str(out), "--no-progress"])
        wait_for(lambda: status(name), 30, "the job's status")
        assert ctl(name, "scale", "--workers", "3", "--servers", "3").returncode == 0
        wait_for(lambda: (st := status(name)) and len([s for s in st["servers"] if s["shards"]]) == 3, 60,
                 "shards on 3 servers")
        assert ctl(name, "scale", "--workers", "1", "--servers", "1").returncode == 0
        wait_for(lambda: (st := status(name)) and len(st["servers"]) == 1 and len(st["workers"]) == 1, 60,
                 "back to 1 worker and 1 server")
        stdout, stderr = job.communicate(timeout=100)
        assert job.returncode == 0, stderr
    result = json.loads(stdout)
    check(result)
    seen = result["servers_seen"]  # servers in the master's map at each read: 1, up to 3 as shards arrive, 1 again
    assert seen[0] == 1 and 3 in seen and seen[-1] == 1, seen
    events = json.loads(out.read_text())["events"]
    moved = [e for e in events if e["kind"] in ("scale_out", "scale_in") and e.get("shards_moved")]
    assert {e["kind"] for e in moved} == {"scale_out", "scale_in"}, events
    assert result["reads"] == 8 * 400  # one after every completion


@pytest.mark.timeout(120)
def test_a_server_lost_during_a_driver_read_rolls_back_and_reads_again(tmp_path):
    """The read waits on a killed server: the callback is abandoned and the job recovers in full, even with
    --partial-recovery (D2); the replayed driver reads again, and the final read is exact."""
    marker, out = tmp_path / "killed", tmp_path / "out.json"
    res = run_cli(["litz", "run", app_path("driver_reads"), "--servers", "2", "--executors", "4",
                   "--config", "steps=150", "sleep=0.002", f"kill_marker={marker}",
                   "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "0.1", "--partial-recovery",
                   "--output", str(out), "--no-progress"], timeout=110)
    assert res.returncode == 0, res.stderr
    assert marker.exists()
    check(json.loads(res.stdout))
    kinds = [e["kind"] for e in json.loads(out.read_text())["events"]]
    assert "recovery" in kinds and "partial_recovery" not in kinds, kinds
