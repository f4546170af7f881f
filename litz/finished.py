"""Records of jobs that ended, so that ``litzctl list`` can show what ran lately after the registry forgot it.

Each master writes ``$LITZ_HOME/history/<job name>/summary.json`` as its job ends (finished, stopped or failed):
app, state, when it started and ended, where its result went (``--output``), which registry it was in. It sits
next to the job's history for ``litzctl plot`` (:meth:`litz.joblog.JobLog.save_history`, which also removes
the oldest jobs' directories). A job run again under the same name replaces its record.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from .joblog import history_dir
from .membership.membership import litz_home
from .private import private_dir, write_private

RECENT_S = 24 * 3600.0  # `litzctl list` shows the jobs that ended within this long
MAX_SHOWN = 10


def registry_name(kv: Any) -> str:
    """Which registry a job was in: its etcd endpoints, or 'local' (the directory registry)."""
    return str(getattr(kv, "endpoint", None) or "local")


def record_finished(home: str, job: str, summary: dict) -> None:
    """Write the job's ``summary.json`` in ``home``'s history. A record that cannot be written costs the user only
    a line in ``litzctl list``: never the job's result."""
    try:
        path = private_dir(history_dir(home, job))
        write_private(os.path.join(path, "summary.json"), json.dumps(summary, indent=1).encode())
    except (OSError, ValueError):
        pass


def recent(registry: str, home: str | None = None, now: float | None = None) -> list[dict]:
    """The jobs of ``registry`` that ended within ``RECENT_S``, newest first, at most ``MAX_SHOWN``."""
    root = os.path.join(home or litz_home(), "history")
    now = time.time() if now is None else now
    found = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        try:
            with open(os.path.join(root, name, "summary.json")) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue  # a job's directory without a summary (yet), or one a crash cut short
        if isinstance(doc, dict) and doc.get("registry") == registry and isinstance(doc.get("ended"), (int, float)) \
                and now - doc["ended"] <= RECENT_S:
            found.append(doc)
    return sorted(found, key=lambda d: -d["ended"])[:MAX_SHOWN]


def age(seconds: float) -> str:
    """'42 s', '5 min', '3 h', '2 d': how long ago, for a person."""
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"
