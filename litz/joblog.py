"""What a job tells its user: the progress line, the --metrics stream, events, the --output document."""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, TextIO

from . import clock


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


class JobLog:
    def __init__(self, metrics_path: str | None = None, progress: bool = True, stream: TextIO | None = None):
        self.start = clock.time()
        self.events: list[dict] = []
        self.last_report: dict = {}
        self.progress = progress
        self.stream = stream or sys.stderr  # looked up now: a default argument would pin the one at import
        self._tty = self.stream.isatty()
        self._last_line = 0.0
        self._metrics = open(metrics_path, "a", buffering=1) if metrics_path else None

    def elapsed(self) -> float:
        return clock.time() - self.start

    def event(self, kind: str, **fields: Any) -> dict:
        ev = {"t": round(self.elapsed(), 4), "kind": kind, **_jsonable(fields)}
        self.events.append(ev)
        return ev

    def report(self, metrics: dict, t: float, workers: int, servers: int, memory: dict | None = None) -> None:
        metrics = check_json(metrics, "report() values")
        self.last_report = metrics
        if self._metrics:
            row = {"t": round(t - self.start, 4), "time": t, **metrics, "workers": workers, "servers": servers,
                   **(memory or {})}
            self._metrics.write(json.dumps(row) + "\n")

    def show(self, tasks: int, rate: float, workers: int, servers: int, force: bool = False) -> None:
        now = clock.time()
        if not self.progress or (not force and now - self._last_line < (0.5 if self._tty else 5.0)):
            return
        self._last_line = now
        shown = "  ".join(f"{k} {_fmt(v)}" for k, v in list(self.last_report.items())[:6])
        line = (f"[litz {self.elapsed():7.1f}s] {shown}  tasks {tasks}  {rate:,.0f} tasks/s  "
                f"workers {workers}  servers {servers}")
        if self._tty:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

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

    def close(self) -> None:
        if self._metrics:
            self._metrics.close()
            self._metrics = None


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
