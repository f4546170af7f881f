"""litzctl as a new user meets it: a job that waits for members, options where people put them, one-line errors,
and `list` with what each job is."""
import json

import pytest

from tests.support.processes import Processes, app_path, run_cli, status, wait_for


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

        stop = run_cli(["litzctl", "--etcd", e, "--name", name, "stop"], timeout=60)
        assert stop.returncode == 0, stop.stderr
        # "at once": not after its start timeout (600 s by default), which a master deaf to stop would wait out
        out, err = master.communicate(timeout=60)
        assert master.returncode == 0 and json.loads(out) is None, err
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
    from tests.support.processes import free_port

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


@pytest.mark.timeout(120)
def test_list_shows_app_state_and_age_and_the_jobs_that_ended(tmp_path, litz_home):
    out = tmp_path / "results" / "done.json"
    done = run_cli(["litz", "run", app_path("noop"), "--name", "done-job", "--config", "tasks=5", "--no-progress",
                    "--output", str(out)], timeout=60)
    assert done.returncode == 0, done.stderr
    summary = json.loads((litz_home / "history" / "done-job" / "summary.json").read_text())
    assert summary["app"] == app_path("noop") and summary["state"] == "finished" and summary["result"] == str(out)
    assert summary["started"] <= summary["ended"] and summary["registry"] == "local"
    with Processes() as procs:
        live = procs.start(["litz", "run", app_path("noop"), "--name", "live-job", "--config", "tasks=100000",
                            "sleep=0.01", "--no-progress"])
        wait_for(lambda: (s := status("live-job")) and s["state"] == "running", 30, "the job running")
        listed = run_cli(["litzctl", "list"], timeout=30)
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert lines[0] == "running:" and lines[1].split() == ["NAME", "APP", "STATE", "AGE"], listed.stdout
        assert lines[2].split()[:3] == ["live-job", app_path("noop"), "running"], listed.stdout
        assert lines[3] == "ended lately:", listed.stdout
        assert lines[5].split() == ["done-job", app_path("noop"), "finished", *lines[5].split()[3:6], str(out)]
        assert lines[5].split()[5] == "ago", listed.stdout
        assert run_cli(["litzctl", "stop", "--name", "live-job"], timeout=60).returncode == 0
        assert live.wait(timeout=30) == 0
    lines = run_cli(["litzctl", "list"], timeout=30).stdout.splitlines()
    assert lines[0] == "no running jobs" and lines[3].split()[:3] == ["live-job", app_path("noop"), "stopped"], lines


@pytest.mark.timeout(60)
@pytest.mark.parametrize("declared", ["    config_keys = ('steps',)\n", None])
def test_unknown_config_keys_of_a_user_app_are_warned(tmp_path, declared):
    driver = ("class D(litz.Driver):\n" + (declared or "") + "    def dispatch_initial_tasks(self):\n"
              "        self.dispatch_task(0, self.config.get('steps', 1))\n"
              "    def handle_task_completion(self, r):\n        self.finish(r)\n")
    module = "" if declared else "CONFIG = {'steps': 1}\n"
    app = tmp_path / "declares.py"
    app.write_text("import litz\n" + module + driver + "class E(litz.Executor):\n    def run_task(self, a):\n"
                   "        return a\n")
    res = run_cli(["litz", "run", str(app), "--no-progress", "--config", "stepz=3"], timeout=60)
    assert res.returncode == 0 and json.loads(res.stdout) == 1, res.stderr
    assert res.stderr.splitlines() == [f"litz: warning: unknown config key(s) 'stepz' for app '{app}' (known: steps)"]
    res = run_cli(["litz", "run", str(app), "--no-progress", "--config", "steps=3"], timeout=60)
    assert res.returncode == 0 and json.loads(res.stdout) == 3 and res.stderr == "", res.stderr
