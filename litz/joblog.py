"""What a job tells its user: the progress line, the --metrics stream, events, the --output document."""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
from collections import Counter, deque
from typing import Any, TextIO

from . import clock
from .errors import LitzError
from .private import private_dir, write_private


def _jsonable(value: Any) -> Any:
    """Numpy scalars and arrays become plain numbers and lists; NaN/inf become null (valid JSON)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def check_json(value: Any, what: str) -> Any:
    value = _jsonable(value)
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON-serialisable: {exc}") from None
    return value


def config_shown(config: dict | None, limit: int = 1000) -> dict:
    """The job's config as people see it (the registry, the history, the dashboard): JSON values, each cut to a
    short repr where it is not JSON or longer than ``limit`` characters (an array passed to ``litz.run``)."""
    shown = {}
    for key, value in (config or {}).items():
        try:
            value = _jsonable(value)
            if len(json.dumps(value)) <= limit:
                shown[str(key)] = value
                continue
        except (TypeError, ValueError):
            pass
        text = repr(value)
        shown[str(key)] = text if len(text) <= 200 else text[:197] + "..."
    return shown


HISTORY_ROWS = 10_000  # --metrics rows a job keeps for its history ($LITZ_HOME/history) and litzctl plot
HISTORY_JOBS = 20  # finished jobs whose history $LITZ_HOME/history keeps ($LITZ_HISTORY_KEEP)


def make_parent(path: str, option: str) -> None:
    """Create the directory of a file the job writes (``--output``, ``--metrics``) before the job starts, the same
    for every app: a path that cannot be written fails now, in one line, not after the training."""
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise LitzError(f"{option} {path}: cannot create the directory {parent} ({exc.strerror or exc})") from None
    if not os.access(parent, os.W_OK):
        raise LitzError(f"{option} {path}: the directory {parent} is not writable")


class JobLog:
    def __init__(self, metrics_path: str | None = None, progress: bool = True, stream: TextIO | None = None):
        self.start = clock.time()
        self.events: list[dict] = []
        self.kinds: Counter[str] = Counter()  # events per kind: the status counts some at every publish
        self.last_report: dict = {}
        self.rows: deque[dict] = deque(maxlen=HISTORY_ROWS)  # the --metrics rows, kept for the job's history
        self.progress = progress
        self.stream = stream or sys.stderr  # looked up now: a default argument would pin the one at import
        self._tty = self.stream.isatty()
        self._last_line = 0.0
        self._every = _seconds(os.environ.get("LITZ_PROGRESS_EVERY"), 0.5 if self._tty else 5.0)
        self._metrics = open(metrics_path, "a", buffering=1) if metrics_path else None
        self.total: float | None = None  # Driver.set_total: the job's total work, in ``unit``s
        self.unit = ""
        self._total_from: tuple[float, float] = (0.0, 0.0)  # (time, units done) when the total was declared
        self.ended = False  # the job is over: no ETA
        self._seen: dict[str, tuple[float, float]] = {}  # numeric metric -> (its latest value, when reported)

    def elapsed(self) -> float:
        return clock.time() - self.start

    def event(self, kind: str, **fields: Any) -> dict:
        ev = {"t": round(self.elapsed(), 4), "kind": kind, **_jsonable(fields)}
        self.events.append(ev)
        self.kinds[kind] += 1
        return ev

    def set_total(self, total: float, unit: str) -> None:
        """The driver's declared total (:meth:`litz.Driver.set_total`); the ETA counts from now."""
        if isinstance(total, bool) or not isinstance(total, (int, float)) or not total >= 0:
            raise ValueError(f"set_total: total must be a number >= 0, got {total!r}")
        if not isinstance(unit, str) or not unit:
            raise ValueError(f"set_total: unit must be the name of a reported metric, got {unit!r}")
        if unit != self.unit or self.total is None:
            self._total_from = (clock.time(), self._seen.get(unit, (0, 0.0))[0])
        self.total, self.unit = total, unit

    def progress_now(self) -> dict | None:
        """``{"unit", "done", "total", "eta_s"}`` once the driver declared a total: ``done`` is the last value it
        reported under ``unit`` (in any report: one without it changes nothing); ``eta_s`` (None until some
        progress) extrapolates the pace since the declaration to the rest."""
        if self.total is None:
            return None
        t0, done0 = self._total_from
        done, t_done = self._seen.get(self.unit, (0, t0))
        eta = None
        if self.ended:
            pass
        elif done >= self.total:
            eta = 0.0
        elif done > done0 and t_done > t0:
            eta = max((self.total - done) * (t_done - t0) / (done - done0) - (clock.time() - t_done), 0.0)
        return {"unit": self.unit, "done": done, "total": self.total, "eta_s": None if eta is None else round(eta, 1)}

    def report(self, metrics: dict, t: float, workers: int, servers: int, memory: dict | None = None) -> None:
        metrics = check_json(metrics, "report() values")
        self.last_report = metrics
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._seen[key] = (value, t)
        row = {"t": round(t - self.start, 4), "time": t, **metrics, "workers": workers, "servers": servers,
               **(memory or {})}
        self.rows.append(row)
        if self._metrics:
            self._metrics.write(json.dumps(row) + "\n")

    def show(self, tasks: int, rate: float, workers: int, servers: int, force: bool = False,
             phase: str | None = None) -> None:
        """The progress line: on a terminal redrawn in place and cut to its width (never wrapping), else one line
        every 5 s (``$LITZ_PROGRESS_EVERY``). ``phase``: what the job is busy with before its first tasks."""
        now = clock.time()
        if not self.progress or (not force and now - self._last_line < self._every):
            return
        self._last_line = now
        parts = [f"[litz {self.elapsed():7.1f}s]"]
        if phase:
            parts.append(phase)
        prog = self.progress_now()
        report = self.last_report
        if prog is not None:
            eta = "" if prog["eta_s"] is None else f"  ETA {_duration(prog['eta_s'])}"
            parts.append(f"{prog['unit']} {_fmt(prog['done'])}/{_fmt(prog['total'])}{eta}")
            report = {k: v for k, v in report.items() if k != prog["unit"]}
        shown = "  ".join(f"{k} {_fmt(v)}" for k, v in list(report.items())[:6])
        if shown:
            parts.append(shown)
        if tasks or not phase:  # while it compiles before its first task, the counts say nothing
            parts.append(f"tasks {tasks}  {rate:,.0f} tasks/s  workers {workers}  servers {servers}")
        line = parts[0] + " " + "  ".join(parts[1:])
        columns = self._columns()
        if columns:
            line = line[:max(columns - 1, 10)]  # the last column would wrap on some terminals
        if self._tty:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def _columns(self) -> int | None:
        """The terminal's width, as ``shutil.get_terminal_size`` reads it ($COLUMNS first) but of the stream the
        line goes to (stdout may be a file while stderr is the terminal); None for a file or pipe, whose lines
        are kept whole ($COLUMNS is often set, or leaked, where no terminal is)."""
        if not self._tty:
            return None
        env = os.environ.get("COLUMNS", "")
        if env.isdigit() and int(env) > 0:
            return int(env)
        try:
            return os.get_terminal_size(self.stream.fileno()).columns or None
        except (OSError, ValueError, AttributeError):
            return None

    def end_progress(self, state: str = "finished") -> None:
        if not self.progress:
            return
        if self._tty:
            self.stream.write("\n")
        if state == "stopped":  # else a stopped job ends like a finished one, with its null result
            self.stream.write(f"[litz {self.elapsed():7.1f}s] stopped by litzctl: the result is null\n")
        self.stream.flush()

    def write_output(self, path: str, doc: dict) -> None:
        doc = {**doc, "events": self.events}
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(_jsonable(doc), f, indent=1)
        os.replace(tmp, path)

    def save_history(self, home: str, name: str, samples: list[dict]) -> str:
        """Keep the finished job's metrics rows, status samples and events in ``home/history/NAME/`` (0700,
        files 0600), for ``litzctl plot`` after the job: the last :data:`HISTORY_JOBS` finished jobs stay."""
        path = history_dir(home, name)
        private_dir(path)
        write_private(os.path.join(path, "metrics.jsonl"),
                      "".join(json.dumps(_jsonable(r)) + "\n" for r in self.rows).encode())
        write_private(os.path.join(path, "samples.jsonl"),
                      "".join(json.dumps(_jsonable(r)) + "\n" for r in samples).encode())
        write_private(os.path.join(path, "events.json"), json.dumps(_jsonable(self.events[-10_000:])).encode())
        prune_history(os.path.dirname(path))
        return path

    def close(self) -> None:
        if self._metrics:
            self._metrics.close()
            self._metrics = None


def history_dir(home: str, name: str) -> str:
    """Where a finished job's history is kept: ``$LITZ_HOME/history/<job name>``."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"not a job name: {name!r}")
    return os.path.join(home, "history", name)


def prune_history(root: str, keep: int | None = None) -> None:
    """Remove the oldest finished jobs' histories (those with ``events.json``, by its time) beyond ``keep``
    (``$LITZ_HISTORY_KEEP``, default :data:`HISTORY_JOBS`). A directory without it (a job still running, whose
    summary another part of Litz writes) is left alone."""
    keep = keep if keep is not None else int(os.environ.get("LITZ_HISTORY_KEEP") or HISTORY_JOBS)
    finished = []
    for entry in os.scandir(root):
        try:
            finished.append((os.stat(os.path.join(entry.path, "events.json")).st_mtime_ns, entry.path))
        except OSError:
            continue
    finished.sort()
    for _, path in finished[:max(len(finished) - keep, 0)]:
        shutil.rmtree(path, ignore_errors=True)


def _seconds(text: str | None, default: float) -> float:
    """``$LITZ_PROGRESS_EVERY``: seconds between progress lines; unset or not a number >= 0: ``default``."""
    try:
        value = float(text) if text else default
    except ValueError:
        return default
    return value if value >= 0 else default


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
