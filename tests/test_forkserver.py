"""Local children as forks of a fork server (litz.forkserver), and LITZ_SPAWN=exec's fresh interpreters."""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading

import pytest

import litz
from litz.forkserver import ForkServer, blas_threads, set_blas_threads, threads_unsafe_to_fork
from tests.support.processes import Processes, app_path, run_in_fresh_process, status, wait_for


@pytest.fixture
def launcher_blas_threads():
    """The launcher runs BLAS with 2 threads, so a worker's single thread is the launcher's doing, not the default."""
    before = blas_threads()
    if not before:
        pytest.skip("no OpenBLAS loaded in this process")
    set_blas_threads(2)
    yield
    set_blas_threads(before[0])


def forks_of_the_launcher() -> None:
    """Run in a fresh interpreter (run_in_fresh_process): a launcher with one thread and BLAS set to 2 threads."""
    set_blas_threads(2)  # so a worker's single BLAS thread is the launcher's doing, not the default
    assert not threads_unsafe_to_fork()
    facts = litz.run(app_path("whoami"), workers=2, servers=1, executors=4, name="forked-job")
    assert len({f["pid"] for f in facts}) == 2, "4 executors on 2 worker processes"
    fork_servers = {f["ppid"] for f in facts}
    assert len(fork_servers) == 1 and os.getpid() not in fork_servers, "workers are forked by the fork server"
    assert {f["grandparent"] for f in facts} == {os.getpid()}, "the fork server is the launcher's child"
    assert all(f["cmdline"] == "litz worker --name forked-job" for f in facts), facts
    assert all(f["blas_threads"] and set(f["blas_threads"]) == {1} for f in facts), facts
    assert all(f["secret_set"] for f in facts)
    by_process = {f["pid"]: f["global_random"] for f in facts}
    # numpy 2 reseeds its global generator in a fork itself; with numpy 1 this is the fork server's reseed
    assert len(set(by_process.values())) == 2, "each worker has its own numpy global random stream"
    assert blas_threads()[0] == 2, "the launcher keeps its own BLAS threads"
    assert all(f["launcher_class"] for f in facts), "a fork runs the launcher's executor class, not a copy"


def test_children_are_forks_of_one_fork_server_named_for_their_role():
    run_in_fresh_process(forks_of_the_launcher)


@pytest.mark.parametrize("spawn", ["fork", "exec"])
def test_workers_run_their_tasks_under_sched_batch(monkeypatch, spawn):
    """A woken worker must not preempt the server or master that woke it (litz.process.batch_scheduling): the
    thread that runs the tasks is SCHED_BATCH, forked or exec'd; LITZ_WORKER_BATCH=0 leaves it as it was."""
    monkeypatch.setenv("LITZ_SPAWN", spawn)
    launcher = os.sched_getscheduler(0)
    assert launcher != os.SCHED_BATCH
    facts = litz.run(app_path("whoami"), workers=2, servers=1, executors=2)
    assert len({f["pid"] for f in facts}) == 2 and {f["sched_policy"] for f in facts} == {os.SCHED_BATCH}
    assert os.sched_getscheduler(0) == launcher, "the launcher keeps its own policy"
    monkeypatch.setenv("LITZ_WORKER_BATCH", "0")
    facts = litz.run(app_path("whoami"), workers=1, servers=1, executors=1)
    assert {f["sched_policy"] for f in facts} == {launcher}


@pytest.mark.parametrize("spawn", ["fork", "exec"])
def test_children_do_not_hold_the_launchers_files_and_sockets(tmp_path, monkeypatch, spawn):
    """A launcher's open file and listening socket stay its own: a worker holding them would keep the port
    bound (or a lock held, a pipe open) for as long as the job runs."""
    import socket

    monkeypatch.setenv("LITZ_SPAWN", spawn)
    path = tmp_path / "launcher-file"
    with open(path, "w") as mine, socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        sock_target = os.readlink(f"/proc/self/fd/{listening.fileno()}")
        assert os.readlink(f"/proc/self/fd/{mine.fileno()}") == str(path)
        facts = litz.run(app_path("whoami"), workers=2, servers=1, executors=2, name=f"fds-{spawn}")
    held = [target for f in facts for target in f["open_files"]]
    assert held, "the workers' own sockets show, so the check looks at the right descriptors"
    assert str(path) not in held and sock_target not in held, held


def test_a_launcher_that_runs_threads_gets_a_fork_server_that_is_a_fresh_interpreter(launcher_blas_threads):
    """Forking a launcher whose threads may hold locks, or whose libraries' fork handlers write to descriptors
    the fork server closes (gRPC's: it aborted the fork server of a launcher that had used an etcd client),
    is unsafe. Its children are still forks of one fork server, but that one is a fresh interpreter."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert thread.name in threads_unsafe_to_fork()  # with whatever earlier tests left (gRPC's)
        facts = litz.run(app_path("whoami"), workers=2, servers=1, executors=4, name="threaded-launcher")
    finally:
        stop.set()
        thread.join()
    fork_servers = {f["ppid"] for f in facts}
    assert len({f["pid"] for f in facts}) == 2 and len(fork_servers) == 1 and os.getpid() not in fork_servers
    assert {f["grandparent"] for f in facts} == {os.getpid()}, "the fork server is the launcher's child"
    assert not any(f["launcher_class"] for f in facts), "a fresh fork server's children unpickle the app's blob"
    assert all(f["cmdline"] == "litz worker --name threaded-launcher" for f in facts), facts
    assert all(set(f["blas_threads"]) == {1} for f in facts), facts
    by_process = {f["pid"]: f["global_random"] for f in facts}
    assert len(set(by_process.values())) == 2, "each worker has its own numpy global random stream"


def a_threaded_launcher_runs_job_after_job() -> None:
    """Run in a fresh interpreter (run_in_fresh_process): a launcher with a thread of its own runs three jobs."""
    import tempfile

    import psutil

    from litz import forkserver

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    whoami = os.path.abspath(app_path("whoami"))
    try:
        runs = []
        for i in range(3):
            os.environ["WHOAMI_MARKER"] = f"job {i}"  # set after the shared server started: spawns carry it
            with tempfile.TemporaryDirectory() as cwd:
                os.chdir(cwd)
                runs.append((cwd, litz.run(whoami, workers=2, servers=1, executors=2, name=f"threaded-{i}")))
            shared = forkserver._shared
            assert shared is not None and shared.shared and not shared.closed
            left = [p for p in psutil.Process(shared.pid).children() if p.status() != psutil.STATUS_ZOMBIE]
            assert left == [], f"job {i} left children in the shared fork server: {left}"
    finally:
        stop.set()
        thread.join()
    fork_servers = {f["ppid"] for _, facts in runs for f in facts}
    assert fork_servers == {shared.pid}, "every job's workers are forks of the one shared fork server"
    for i, (cwd, facts) in enumerate(runs):
        assert {f["marker"] for f in facts} == {f"job {i}"}, "the launcher's environment at the job's start"
        assert {f["cwd"] for f in facts} == {os.path.realpath(cwd)}, "the launcher's directory at the job's start"
        assert all(f["cmdline"] == f"litz worker --name threaded-{i}" for f in facts), facts
    server = psutil.Process(shared.pid)
    forkserver.close_shared()
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    assert forkserver._shared is None


@pytest.mark.timeout(120)
def test_a_threaded_launcher_keeps_one_fresh_fork_server_for_its_jobs():
    """A threaded launcher (a notebook, a scikit-learn search) would pay a fresh interpreter's imports at each
    job; its fork server is kept instead, and each job's children still get the launcher's environment and
    directory of that moment, and end with their job."""
    run_in_fresh_process(a_threaded_launcher_runs_job_after_job)


@pytest.mark.timeout(120)
def test_a_launcher_with_an_open_etcd_client_runs_job_after_job(etcd):
    """gRPC's threads and fork handlers live in a launcher that holds an etcd client; its jobs start anyway."""
    script = f"""
import litz
from litz.membership.etcdkv import EtcdKV
kv = EtcdKV({etcd.endpoint!r}, timeout=2.0)
kv.get_prefix("litz/")
for steps in (40, 60):
    result = litz.run("examples/linreg.py", workers=2, servers=1, config={{"steps": steps}})
    print(result["loss"], flush=True)
kv.close()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    losses = [float(line) for line in done.stdout.split()]
    assert len(losses) == 2 and losses[1] < 0.1, done.stdout


def test_litz_spawn_exec_starts_fresh_interpreters(monkeypatch, launcher_blas_threads):
    monkeypatch.setenv("LITZ_SPAWN", "exec")
    facts = litz.run(app_path("whoami"), workers=2, servers=1, executors=2, name="exec-job")
    assert {f["ppid"] for f in facts} == {os.getpid()}
    assert all("-m litz.cli.litz worker --name exec-job" in f["cmdline"] for f in facts), facts
    assert all(set(f["blas_threads"]) == {1} for f in facts), "OPENBLAS_NUM_THREADS=1 in their environment"
    assert not any(f["launcher_class"] for f in facts), "a fresh interpreter unpickles the app's blob"


def test_the_fork_server_reports_how_each_child_ended_and_takes_the_rest_with_it(tmp_path):
    """Also as under ``nohup litz run``: the launcher's SIGHUP ignored, which its forks inherit; the children's
    parent-death signal is SIGHUP, so each must set it back to its default (a CI run under nohup found it)."""
    import psutil

    hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        forks = ForkServer.start("litz forkserver --name nobody")
    finally:
        signal.signal(signal.SIGHUP, hup)
    try:
        role = ["worker", "--name", "nobody", "--home", str(tmp_path)]
        waiting = forks.spawn(role + ["--start-timeout", "60"], {}, "litz worker --name nobody")
        killed = forks.spawn(role + ["--start-timeout", "60"], {}, "litz worker --name nobody")
        failing = forks.spawn(role + ["--start-timeout", "0.2"], {}, "litz worker --name nobody")
        assert failing.wait(30) == 2, "no master came: `litz: error: ...`, exit code 2"
        os.kill(killed.pid, signal.SIGKILL)
        assert killed.wait(10) == -signal.SIGKILL
        assert waiting.poll() is None
        child = psutil.Process(waiting.pid)
        assert child.ppid() == forks.pid
    finally:
        forks.close()
    assert wait_for(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, 10,
                    "the fork server's last child to end with it")


def running_mlr_job(procs: Processes, name: str, spawn: str, epochs: int = 500):
    """`litz run apps.mlr` with LITZ_SPAWN=``spawn``, once it runs on its two workers."""
    job = procs.start(["litz", "run", "apps.mlr", "--name", name, "--config", "synthetic=1", "tol=0",
                       f"epochs={epochs}", "--no-progress"], env={**os.environ, "LITZ_SPAWN": spawn})
    wait_for(lambda: (s := status(name)) and s["state"] == "running" and len(s["workers"]) == 2, 30,
             "the job to run")
    return job


def all_ended(processes: list) -> bool:
    """Every one of these psutil processes has exited (reparented ones may stay zombies)."""
    import psutil

    return all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in processes)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("spawn", ["fork", "exec"])
def test_ctrl_c_stops_every_process_and_says_so_once(spawn):
    """Ctrl-C reaches the whole process group: the launcher stops the job; its children do not also report."""
    import psutil

    with Processes() as procs:
        job = running_mlr_job(procs, f"ctrl-c-{spawn}", spawn)
        everyone = psutil.Process(job.pid).children(recursive=True)
        os.killpg(job.pid, signal.SIGINT)
        _, stderr = job.communicate(timeout=30)
    assert job.returncode == 130, stderr
    assert stderr.count("interrupted") == 1, stderr
    assert len(everyone) == (4 if spawn == "fork" else 3), "a fork server (fork), a server and two workers"
    assert wait_for(lambda: all_ended(everyone), 10, "every process of the job to end")



@pytest.mark.timeout(60)
@pytest.mark.parametrize("spawn", ["fork", "exec"])
def test_a_killed_launcher_takes_its_workers_and_servers_with_it_at_once(spawn):
    """The master ran in the launcher, so its workers and servers have nothing left to do. They end at once,
    not after the drain that SIGTERM asks for, whose check for a gone master comes every 5 s (4.8 s here
    before)."""
    import psutil

    with Processes() as procs:
        job = running_mlr_job(procs, f"killed-launcher-{spawn}", spawn, epochs=5000)
        children = psutil.Process(job.pid).children(recursive=True)
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
        assert wait_for(lambda: all_ended(children), 3.0, "every worker and server to end with the launcher")


@pytest.mark.timeout(60)
def test_ctrl_c_while_executors_load_does_not_wait_for_them(tmp_path):
    """Children deep in load_input do not read the master's stop; an interrupted job's launcher ends them at
    once (a short grace, SIGTERM, SIGKILL) instead of the finished job's grace of seconds (7 s here before)."""
    import psutil

    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("slowload"), "--name", "ctrl-c-loading", "--no-progress",
                           "--config", f"marker_dir={tmp_path}"])
        wait_for(lambda: len(psutil.Process(job.pid).children(recursive=True)) == 4, 30, "the job's processes")
        wait_for(lambda: len(list(tmp_path.glob("loading-*"))) == 2, 30, "both workers in load_input")
        everyone = psutil.Process(job.pid).children(recursive=True)
        os.killpg(job.pid, signal.SIGINT)
        _, stderr = job.communicate(timeout=30)
    assert job.returncode == 130, stderr
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in everyone)

def test_a_fork_finds_the_executor_class_by_token_without_unpickling_the_blob():
    from litz.appload import load_app, load_executor_class

    app = load_app(app_path("whoami"))
    assert load_executor_class(b"not a pickle", app.token) is app.executor_cls
    with pytest.raises(pickle.UnpicklingError):  # another launcher's token: the blob is what counts
        load_executor_class(b"not a pickle", "a token from another launcher")
    assert load_executor_class(app.executor_blob(), "a token from another launcher").__name__ == "WhoAmIExecutor"


@pytest.mark.timeout(60)
def a_class_loaded_again() -> None:
    """Run in a fresh interpreter (run_in_fresh_process), whose launcher loads the class for the first time."""
    from litz import appload

    first = appload.load_app("tests.apps.whoami")
    again = appload.load_app("tests.apps.whoami")
    assert again.executor_cls is first.executor_cls and first._blob is not None and again._blob is None
    assert again.token in appload.loaded_tokens() and first.token != again.token
    sent = []
    real = appload.App.executor_blob
    appload.App.executor_blob = lambda self: sent.append(self.name) or real(self)
    facts = litz.run("tests.apps.whoami", workers=2, servers=1, executors=2, name="forked-again")
    assert sent == [] and all(f["launcher_class"] for f in facts), "forks have the class: nothing pickled or sent"
    os.environ["LITZ_SPAWN"] = "exec"
    facts = litz.run("tests.apps.whoami", workers=2, servers=1, executors=2, name="exec-again")
    assert len(sent) == 2 and not any(f["launcher_class"] for f in facts), "each fresh worker got the blob"


@pytest.mark.timeout(120)
def test_a_class_loaded_again_is_pickled_only_for_workers_that_lack_it():
    """A launcher running job after job loads the same class each time. The first load pickles it (before any
    fork: cloudpickle's tracking ids); later loads pickle it only when a worker needs it. Forked workers name
    the app's token in their HELLO and get no blob; fresh interpreters still get it and unpickle it."""
    run_in_fresh_process(a_class_loaded_again)


def close_fds_in_a_fork(proc: bool) -> None:
    """Fork, close the inherited descriptors in the child, and check which are left. Run in a fresh interpreter: a
    fork of the pytest process inherits what earlier tests left there (an etcd client's gRPC, whose fork handler
    re-arms its poller in the child, aborts once that poller's descriptor is closed under it)."""
    from litz.forkserver import close_inherited_fds

    read_end, write_end = os.pipe()
    kept_read, kept_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child closes; its exit code says which descriptors it still had
        try:
            if not proc:
                os.listdir = lambda path: (_ for _ in ()).throw(OSError("no /proc"))
            close_inherited_fds(keep=(1, kept_write))
            alive = []
            for fd in (0, 1, 2, read_end, write_end, kept_write):
                try:
                    os.fstat(fd)
                    alive.append(fd)
                except OSError:
                    pass
            os.write(kept_write, repr(alive).encode())
            os._exit(0)
        finally:
            os._exit(1)
    os.close(kept_write)
    _, status = os.waitpid(pid, 0)
    report = os.read(kept_read, 100).decode()
    for fd in (read_end, write_end, kept_read):
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report == repr([0, 1, 2, kept_write]), report


def close_fds_in_a_fork_with_proc() -> None:
    close_fds_in_a_fork(True)


def close_fds_in_a_fork_without_proc() -> None:
    close_fds_in_a_fork(False)


@pytest.mark.parametrize("body", [close_fds_in_a_fork_with_proc, close_fds_in_a_fork_without_proc],
                         ids=["proc", "no-proc"])
def test_close_inherited_fds_keeps_only_the_standard_streams_and_what_it_is_told(body):
    run_in_fresh_process(body)
