"""Shared plumbing of the elasticity and fault-tolerance benchmarks: real ``litz run`` jobs driven by ``litzctl``.

A :class:`Job` is one ``litz run APP ...`` subprocess with its own ``--name``, ``--output`` and ``--metrics``
files in a scratch directory, and its own registry directory (``$LITZ_HOME``), so jobs of other people on the
same machine are never seen or touched. Everything a benchmark does to the job goes through the ``litzctl``
command line, exactly as a user or a cluster scheduler would do it: ``scale``, ``drain``, ``kill``,
``checkpoint``, ``status --json``.

BLAS threads: every job runs with ``OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=MKL_NUM_THREADS=1`` unless
``blas_threads`` says otherwise. With OpenBLAS's default (one thread per core, busy-waiting) two MLR workers
with ``d=500`` on this 2-core machine ran 7-13x *slower* than one worker (2026-11-22, before commit c74970e).
Since c74970e ``litz run`` gives its local workers and servers one BLAS thread unless the environment sets
one (cluster-mode ``litz worker`` processes still get the library default); setting it here as well keeps
the benchmarks' setting explicit and independent of that. One BLAS thread per process is the paper's setting
(one worker per core), and it is what makes "more workers" mean "more cores".
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_LIVE: set[Job] = set()


def _end_live_jobs() -> None:
    for job in list(_LIVE):
        job.kill()


def _terminate(signum: int, frame: object) -> None:
    sys.exit(128 + signum)  # runs atexit: the jobs this script started end with it


_handlers_installed = False


def _install_handlers() -> None:
    """On the first job a script starts, not at import: a test that imports a bench module keeps its own signals."""
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_end_live_jobs)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background (SIG_IGN)


def job_env(home: str, blas_threads: str = "1") -> dict:
    """The job's environment: its own registry, and BLAS threads per process (``"default"``: the library's)."""
    env = {k: v for k, v in os.environ.items() if k not in BLAS_VARS}
    if blas_threads != "default":
        env.update({k: str(blas_threads) for k in BLAS_VARS})
    env["LITZ_HOME"] = home
    return env


def config_args(config: dict) -> list[str]:
    return [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in config.items()]


class CtlError(RuntimeError):
    """A litzctl command failed: the message holds the command line, its exit code and its output."""


class Job:
    """One ``litz run`` subprocess, its files, and ``litzctl`` against it."""

    def __init__(self, workdir: str, name: str, *, app: str = "apps.mlr", workers: int = 1, servers: int = 1,
                 executors: int | None = None, config: dict | None = None, extra: Sequence[str] = (),
                 blas_threads: str = "1"):
        self.workdir, self.name, self.app = workdir, name, app
        self.home = os.path.join(workdir, "litz-home")
        os.makedirs(self.home, exist_ok=True)
        self.env = job_env(self.home, blas_threads)
        self.output = os.path.join(workdir, f"{name}.out.json")
        self.metrics_path = os.path.join(workdir, f"{name}.metrics.jsonl")
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.cmd = [sys.executable, "-m", "litz.cli.litz", "run", app, "--workers", str(workers),
                    "--servers", str(servers), "--name", name, "--output", self.output,
                    "--metrics", self.metrics_path, "--no-progress"]
        if executors:
            self.cmd += ["--executors", str(executors)]
        if config:
            self.cmd += ["--config", *config_args(config)]
        self.cmd += list(extra)
        self.proc: subprocess.Popen | None = None
        self.t_submit = self.t_exit = None
        self.load: dict = {}
        self.ctl_log: list[dict] = []

    # -- the job process ---------------------------------------------------------------------------------
    def start(self) -> Job:
        for path in (self.output, self.metrics_path):
            if os.path.exists(path):
                os.remove(path)
        self._log = open(self.log_path, "w")
        self.t_submit = time.time()
        self.load = {"start": round(os.getloadavg()[0], 2)}  # 1-min load average: the machine is shared
        _install_handlers()
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        _LIVE.add(self)
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float) -> dict:
        """Wait for the job to end; return its ``--output`` document (raises with the log if it failed)."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"job {self.name} still running after {timeout:.0f} s; killed it. "
                               f"Log tail:\n{self.log_tail()}") from None
        self.t_exit = time.time()
        _LIVE.discard(self)
        self.load["end"] = round(os.getloadavg()[0], 2)
        self._log.close()
        if code != 0 or not os.path.exists(self.output):
            raise RuntimeError(f"job {self.name} ended with exit code {code}: {' '.join(self.cmd)}\n"
                               f"log tail:\n{self.log_tail()}")
        with open(self.output) as f:
            return json.load(f)

    def kill(self) -> None:
        """End the job's process group (the ``litz run`` process and its workers and servers)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        _LIVE.discard(self)
        self.t_exit = self.t_exit or time.time()
        if getattr(self, "_log", None) and not self._log.closed:
            self._log.close()

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- litzctl -------------------------------------------------------------------------------------------
    def ctl(self, *args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "litz.cli.litzctl", "--name", self.name, *args]
        t0 = time.time()
        cp = subprocess.run(cmd, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout)
        entry = {"t_wall": t0, "args": list(args), "seconds": round(time.time() - t0, 4), "rc": cp.returncode,
                 "stdout": cp.stdout.strip(), "stderr": cp.stderr.strip()}
        if args and args[0] != "status":
            self.ctl_log.append(entry)
        if check and cp.returncode != 0:
            raise CtlError(f"`litzctl --name {self.name} {' '.join(args)}` exited {cp.returncode}: "
                           f"{cp.stdout.strip()} {cp.stderr.strip()}".strip())
        return cp

    def status(self) -> dict | None:
        """``litzctl status --json``, or None while the job has not published one (or has ended)."""
        cp = self.ctl("status", "--json", check=False, timeout=30)
        if cp.returncode != 0:
            return None
        try:
            return json.loads(cp.stdout)
        except ValueError:
            return None

    def wait_status(self, ok, timeout: float = 120.0, every: float = 0.5) -> dict:
        """Poll ``status --json`` until ``ok(status)``; raise if the job ends or the time runs out."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            st = self.status()
            if st is not None and ok(st):
                return st
            if not self.running():
                raise RuntimeError(f"job {self.name} ended while waiting for its status; log tail:\n"
                                   f"{self.log_tail()}")
            time.sleep(every)
        raise RuntimeError(f"job {self.name}: status condition not reached within {timeout:.0f} s")

    # -- metrics -------------------------------------------------------------------------------------------
    def reports(self) -> list[dict]:
        try:
            with open(self.metrics_path) as f:
                return [json.loads(line) for line in f if line.strip().endswith("}")]
        except OSError:
            return []

    def wait_first_report(self, timeout: float = 120.0) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            rows = self.reports()
            if rows:
                return rows[0]
            if not self.running():
                raise RuntimeError(f"job {self.name} ended before its first report; log tail:\n{self.log_tail()}")
            time.sleep(0.02)
        raise RuntimeError(f"job {self.name}: no report within {timeout:.0f} s")

    def driver_start_wall(self) -> float:
        """Wall-clock time of the driver's start: job times (events, metrics ``t``) count from here."""
        row = self.wait_first_report()
        return row["time"] - row["t"]


# -- progress curves -----------------------------------------------------------------------------------------
def train_time(doc: dict, reports: list[dict]) -> float:
    """Job time of the last epoch's report: training only (start-up, loading, final evaluation excluded)."""
    ts = [r["t"] for r in reports if "epoch" in r]
    return ts[-1] if ts else doc["elapsed_s"]


def epoch_curve(reports: Iterable[dict]) -> list[tuple[float, float]]:
    """``(job time, epochs completed)`` points, starting at ``(0, 0)`` (the driver's start)."""
    return [(0.0, 0.0)] + [(r["t"], float(r["epoch"])) for r in reports if "epoch" in r]


def progress_at(curve: list[tuple[float, float]], t: float) -> float:
    """Epochs completed at job time ``t``, linear between reports."""
    for (t0, p0), (t1, p1) in zip(curve, curve[1:], strict=False):
        if t <= t1:
            return p0 + (p1 - p0) * max(0.0, t - t0) / max(t1 - t0, 1e-9)
    return curve[-1][1]


def time_at(curve: list[tuple[float, float]], p: float) -> float:
    """Job time when ``p`` epochs had completed, linear between reports."""
    for (t0, p0), (t1, p1) in zip(curve, curve[1:], strict=False):
        if p <= p1:
            return t0 + (t1 - t0) * max(0.0, p - p0) / max(p1 - p0, 1e-9)
    return curve[-1][0]


def ideal_after(elastic_curve: list[tuple[float, float]], t_trigger: float, static2_train_s: float,
                static2_curve: list[tuple[float, float]]) -> tuple[float, float, float]:
    """The thesis' ideal for a scale-out at job time ``t_trigger``: that time plus what the static run at the
    new size took for the rest of the work. Returns (epochs done at the trigger, that rest, the ideal)."""
    p = progress_at(elastic_curve, t_trigger)
    rest = static2_train_s - time_at(static2_curve, p)
    return p, rest, t_trigger + rest


def ctl_at(job: Job, t: float, *args: str) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run ``litzctl ARGS`` once the job's driver has run ``t`` s. Returns (the job time it was started at,
    the seconds it took, its result); the job is killed if this fails."""
    try:
        start = job.driver_start_wall()
        delay = start + t - time.time()
        if delay > 0:
            time.sleep(delay)
        t_started = time.time() - start
        cp = job.ctl(*args)
        return t_started, time.time() - start - t_started, cp
    except BaseException:
        job.kill()
        raise


# -- processes -----------------------------------------------------------------------------------------------
def pid_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie its parent has not reaped yet counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


class ExitWatcher:
    """Records, in a background thread, the wall-clock time at which each of ``pids`` exits (5 ms polls)."""

    def __init__(self, pids: Iterable[int], every: float = 0.005):
        self.t_start = time.time()
        self.exits: dict[int, float] = {}
        self.pids = [p for p in pids if p]
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            for pid in self.pids:
                if pid not in self.exits and pid_gone(pid):
                    self.exits[pid] = now
            if len(self.exits) == len(self.pids):
                return
            self._stop.wait(self.every)

    def wait(self, pids: Iterable[int], timeout: float) -> bool:
        """Block until every one of ``pids`` has exited (True) or ``timeout`` seconds have passed (False)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if all(p in self.exits for p in pids):
                return True
            time.sleep(self.every)
        return False

    def stop(self) -> dict[int, float]:
        self._stop.set()
        self._thread.join()
        return dict(self.exits)


def events(doc: dict, kind: str) -> list[dict]:
    return [e for e in doc.get("events", []) if e.get("kind") == kind]


def quantile(values: Sequence[float], q: float) -> float:
    xs = sorted(values)
    if not xs:
        return float("nan")
    i = q * (len(xs) - 1)
    lo = int(i)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)
