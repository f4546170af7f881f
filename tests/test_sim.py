"""The simulator: schedules replay exactly, its checks catch planted bugs, and 1,000 schedules pass."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from litz import cache, server
from litz.sim import run_schedule
from litz.sim.__main__ import main
from tests.helpers import ROOT


def test_a_seed_replays_exactly():
    a, b = run_schedule(11), run_schedule(11)
    assert (a.sim_s, a.tasks, a.messages, a.events, a.violations) == (b.sim_s, b.tasks, b.messages, b.events,
                                                                       b.violations)
    assert a.tasks > 0 and a.messages > 0


def test_seeds_differ():
    outcomes = {(o.sim_s, o.messages) for o in (run_schedule(s) for s in range(5))}
    assert len(outcomes) == 5


def test_a_planted_double_apply_is_caught(monkeypatch):
    """Servers that apply every update twice: the totals and the upper bound of reads must say so."""
    real = server.Server.update

    def twice(self, shard, key, delta):
        real(self, shard, key, delta)
        real(self, shard, key, delta)

    monkeypatch.setattr(server.Server, "update", twice)
    found = [v for s in range(3) for v in run_schedule(s, ("scale",)).violations]
    assert any(v.startswith("total:") for v in found)
    assert any(v.startswith("double apply:") for v in found)


def test_a_planted_stale_cache_is_caught(monkeypatch):
    """A cache that serves any entry whatever its version breaks the consistency rule; the checker sees it."""
    real = cache.ParamCache.lookup

    def stale(self, key, version, live_ok=False):
        entry = self._entries.get(key)
        return entry[1] if entry is not None else real(self, key, version, live_ok)

    monkeypatch.setattr(cache.ParamCache, "lookup", stale)
    found = [v for s in range(3) for v in run_schedule(s, ("scale",)).violations]
    assert any(v.startswith("consistency:") for v in found)


def test_a_planted_lost_executor_state_is_caught(monkeypatch):
    """Executors that arrive after a move without their state: the executor-state check fails."""
    from litz import worker

    real = worker.executor_state

    def forgetful(ex, with_input):
        state = real(ex, with_input)
        if isinstance(state, dict) and "ran" in state:
            state = {**state, "ran": 0}
        return state

    monkeypatch.setattr(worker, "executor_state", forgetful)
    found = [v for s in range(40) for v in run_schedule(s, ("scale", "drain")).violations]
    assert any("executor state says" in v for v in found)


def test_the_command_reports_each_failing_seed_and_exits_nonzero(monkeypatch, capsys):
    monkeypatch.setattr(server.Server, "update", lambda self, shard, key, delta: None)  # every update lost
    assert main(["--seeds", "2", "--seed", "5", "--events", "scale"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("seed 5: total:") for line in out)
    assert any(line.startswith("seed 6: total:") for line in out)
    assert out[-1].startswith("litz.sim: 2 schedules") and "2 with violations" in out[-1]


def test_unknown_event_kind_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--events", "scale,flood"])
    assert exc.value.code == 2
    assert "unknown event kind(s) ['flood']" in capsys.readouterr().err


@pytest.mark.parametrize("seed", [1291, 1880])
def test_a_worker_killed_while_draining_is_recovered(seed):
    """Replays of the schedules that found it: a worker told to retire is killed before it ships its executors.
    The master took its leaving the registry for a retirement and the job hung without those executors."""
    o = run_schedule(seed)
    assert o.violations == [] and o.events["kill"] and o.events["drain"]


def test_a_worker_joining_a_recovery_that_starts_over_becomes_ready():
    """Replay: the only worker is killed, its replacement joins during the recovery, then the only server is
    killed and the recovery starts over at a new epoch; the replacement's READY (sent at the older epoch) was
    dropped, it never counted as ready, and the job failed with "no live worker or server left"."""
    o = run_schedule(6199)
    assert o.violations == [] and o.events["kill"] == 2


@pytest.mark.timeout(240)
def test_a_thousand_schedules_pass():
    """CI runs 1,000 schedules with every kind of event (README: the simulator)."""
    proc = subprocess.run([sys.executable, "-m", "litz.sim", "--seeds", "1000", "--jobs", "2"], cwd=ROOT,
                          capture_output=True, text=True, timeout=230)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, "\n".join(lines[-30:]) + proc.stderr[-2000:]
    summary = lines[-1]
    assert summary.startswith("litz.sim: 1000 schedules") and "; 0 with violations" in summary
    counts = {kind: int(n) for kind, n in re.findall(r"(\w+) (\d+)[,;)( ]", summary.split("events: ", 1)[1])}
    for kind in ("scale", "drain", "kill", "checkpoint", "memory", "recovery", "evict"):
        assert counts[kind] > 20, summary
    assert counts["partial_recovery"] > 0, summary
