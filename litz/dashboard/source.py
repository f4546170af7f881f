"""What the dashboard shows, read from what the master already publishes: no work for the job.

A running job's master writes its status to the registry once a second, and within 0.2 s of a new event (with
the latest events and their count, :data:`litz.master.STATUS_EVENTS`). :class:`JobFeed` reads that status a few
times a second and keeps the job's history from it: one sample per status (the master's own
:func:`litz.master.status_sample`), the app's ``report()`` values, every event. When it first sees a master it
asks for the history so far with litzctl's signed ``plot`` request (so only where the job secret is at hand;
without it the charts start when the dashboard does), and again when more events came than a status carries.
An ended job's history comes from ``$LITZ_HOME/history/<job name>/`` (:func:`litz.cli.plot.load_history`).

Nothing here imports aiohttp: the server (:mod:`litz.dashboard.server`) runs :meth:`JobFeed.poll` in a thread
and sends what it returns to the browsers.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from ..errors import LitzError
from ..finished import recent, registry_name
from ..master import status_sample
from ..membership import Membership
from ..membership.membership import litz_home

MAX_SAMPLES = 3600  # as the master keeps (litz.master.HISTORY_SAMPLES)
MAX_ROWS = 5000
MAX_EVENTS = 2000
REFETCH_S = 5.0  # at most this often the whole history again, after a gap in the events
MASTER_FIELDS = ("app", "started", "host", "pid", "config")  # what the page may see of the master's registry entry


def history_summary(home: str, name: str) -> dict | None:
    """The ended job's ``summary.json`` (litz.finished), or None."""
    from ..joblog import history_dir

    try:
        with open(os.path.join(history_dir(home, name), "summary.json")) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


class JobFeed:
    """One job as the page sees it. :meth:`poll` (blocking, from one thread at a time) reads the registry and
    returns the messages for the browsers; :meth:`snapshot` is what a newly opened page starts from. Each message
    has a sequence number, so a page that took a snapshot skips the messages already in it."""

    def __init__(self, kv: Any, name: str, secret_file: str | None = None, home: str | None = None):
        self.job = Membership(kv, name)
        self.name, self.secret_file, self.home = name, secret_file, home or litz_home()
        self.lock = threading.Lock()  # the state, between the polling thread and the pages' snapshots
        self.poll_lock = threading.Lock()
        self.seq = 0
        self.instance: str | None = None  # the master we follow; a new one (the job run again) starts over
        self.info: dict = {"name": name}
        self.state = "unknown"  # waiting for a master, running (with a status), ended, or unknown (no such job)
        self.status: dict | None = None
        self.history: list[dict] = []
        self.metrics: list[dict] = []
        self.events: list[dict] = []
        self.events_n = 0  # events the master has logged that this feed has taken in
        self.complete = False  # the history goes back to the job's start (not only to the dashboard's)
        self.members: dict[str, dict] = {}
        self._refetched = 0.0

    # -- what pages get ----------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        with self.lock:
            return {"seq": self.seq, "state": self.state, "info": self.info, "status": self.status,
                    "history": self.history, "metrics": self.metrics, "events": self.events,
                    "complete": self.complete, "joining": self._joining()}

    def _message(self, kind: str, data: dict) -> tuple[int, str, dict]:
        self.seq += 1
        return self.seq, kind, data

    def _joining(self) -> list[str]:
        """Processes registered in the job that the master has not taken in yet."""
        if not self.status:
            return []
        known = {p["id"] for p in self.status.get("workers", []) + self.status.get("servers", [])}
        return sorted(i for i in self.members if i not in known)

    # -- reading the registry ----------------------------------------------------------------------------
    def poll(self) -> list[tuple[int, str, dict]]:
        """Read the job's status; return what changed, as messages: ``snapshot`` (start over: a new master, a
        gap filled, the job ended) or ``status`` (a new status with its sample, new events and report row).
        One caller at a time (a page opened while the feed was idle polls it before taking its snapshot)."""
        with self.poll_lock:
            return self._poll()

    def _poll(self) -> list[tuple[int, str, dict]]:
        st = self.job.get("status")
        if st is None or self.instance is None:
            master = self.job.master()
            if master is None:
                return self._ended()
            if st is None:
                return self._waiting(master)
            return self._start(master, st)
        with self.lock:
            last = self.status
        if last is not None and st.get("elapsed_s", 0) < last.get("elapsed_s", 0):
            self.instance = None  # a new master under the job's name: start over
            return self._poll()
        if last is not None and st.get("elapsed_s") == last.get("elapsed_s"):
            return []
        return self._take(st, self.job.members())

    def _waiting(self, master: dict) -> list[tuple[int, str, dict]]:
        with self.lock:
            if self.state == "waiting":
                return []
            self.state = "waiting"
            self.info = {"name": self.name, **{k: master.get(k) for k in MASTER_FIELDS}}
            return [self._message("snapshot", self._snapshot_locked())]

    def _snapshot_locked(self) -> dict:
        return {"state": self.state, "info": self.info, "status": self.status, "history": self.history,
                "metrics": self.metrics, "events": self.events, "complete": self.complete,
                "joining": self._joining()}

    def _fetch(self) -> dict | None:
        """The job's history so far from its master (litzctl's signed ``plot`` request), or None without the
        job secret or an answer."""
        from ..cli.litzctl import build_parser, send_request

        master = self.job.master()
        if master is None:
            return None
        args = build_parser().parse_args(["plot", "-"])
        args.secret_file = self.secret_file
        try:
            return send_request(self.job, master, args)
        except LitzError:
            return None

    def _start(self, master: dict, st: dict) -> list[tuple[int, str, dict]]:
        """A master seen for the first time: its history so far, then its status from here on."""
        doc = self._fetch()
        self._refetched = time.time()
        members = self.job.members()
        with self.lock:
            self.instance = master.get("instance")
            self.info = {"name": self.name, **{k: master.get(k) for k in MASTER_FIELDS}}
            self.state = "running"
            self.complete = doc is not None
            if doc is not None:
                self.history = list(doc.get("history") or [])[-MAX_SAMPLES:]
                self.metrics = list(doc.get("metrics") or [])[-MAX_ROWS:]
                self.events = list(doc.get("events") or [])[-MAX_EVENTS:]
                self.events_n = int(doc.get("events_n") or len(self.events))
            else:
                self.history, self.metrics = [], []
                self.events = list(st.get("events") or [])
                self.events_n = int(st.get("events_n") or 0)
            self.status = None
        self._take(st, members, announce=False)
        with self.lock:
            return [self._message("snapshot", self._snapshot_locked())]

    def _take(self, st: dict, members: dict, announce: bool = True) -> list[tuple[int, str, dict]]:
        """A new status: its sample, the events not seen yet, a report row if the report changed."""
        n, tail = int(st.get("events_n") or 0), list(st.get("events") or [])
        if n - self.events_n > len(tail) and time.time() - self._refetched > REFETCH_S:
            # more events since the last status than it carries: fetch them all (rare: a burst of steals)
            self.instance = None
            return self._poll()
        with self.lock:
            fresh = min(max(n - self.events_n, 0), len(tail))
            new_events = tail[len(tail) - fresh:] if fresh else []
            self.events_n = max(n, self.events_n)
            self.events = (self.events + new_events)[-MAX_EVENTS:]
            sample = status_sample(st)
            if not self.history or sample["t"] > self.history[-1]["t"]:
                self.history = (self.history + [sample])[-MAX_SAMPLES:]
            else:
                sample = None
            row = None
            report = st.get("report") or {}
            last = self.status.get("report") if self.status else None
            if report and report != last and (not self.metrics or st["elapsed_s"] > self.metrics[-1].get("t", 0)):
                row = {"t": st["elapsed_s"], **report, "workers": len(st.get("workers", [])),
                       "servers": len(st.get("servers", []))}
                self.metrics = (self.metrics + [row])[-MAX_ROWS:]
            self.status, self.members, self.state = st, members, "running"
            if not announce:
                return []
            return [self._message("status", {"status": st, "sample": sample, "events": new_events, "row": row,
                                             "joining": self._joining()})]

    def _ended(self) -> list[tuple[int, str, dict]]:
        """No master: the job ended (or never ran here). Its history in $LITZ_HOME, if this machine kept one."""
        with self.lock:
            if self.state in ("ended", "unknown") and self.seq:
                return []
        from ..cli.plot import load_history

        doc = load_history(self.home, self.name)
        summary = history_summary(self.home, self.name) or {}
        with self.lock:
            was_running = self.state in ("running", "waiting")
            if doc is None and not was_running:
                self.state = "unknown"
                return [self._message("snapshot", self._snapshot_locked())]
            self.state = "ended"
            self.instance = None
            if doc is not None:
                self.history, self.metrics = doc["history"][-MAX_SAMPLES:], doc["metrics"][-MAX_ROWS:]
                self.events = doc["events"][-MAX_EVENTS:]
                self.complete = True
            self.info = {**self.info, **{k: summary.get(k) for k in ("app", "started", "ended", "config", "state",
                                                                     "tasks_completed") if k in summary}}
            if self.status is not None:
                self.status = {**self.status, "state": summary.get("state", "ended"), "workers": [],
                               "servers": [], "checkpointing": None}
            return [self._message("snapshot", self._snapshot_locked())]


def job_list(kv: Any, now: float | None = None) -> dict:
    """Every job of the registry, running and ended lately (as ``litzctl list``), for the dashboard's front page."""
    now = time.time() if now is None else now
    jobs: dict[str, dict] = {}
    for key, value in kv.get_prefix("litz/jobs/").items():
        parts = key.split("/")
        if len(parts) == 4 and parts[3] in ("master", "status") and isinstance(value, dict):
            jobs.setdefault(parts[2], {})[parts[3]] = value
    running = []
    for name in sorted(n for n, j in jobs.items() if "master" in j):
        master, st = jobs[name]["master"], jobs[name].get("status") or {}
        running.append({"name": name, "app": master.get("app"), "started": master.get("started"),
                        "state": st.get("state", "starting"), "elapsed_s": st.get("elapsed_s"),
                        "tasks_completed": st.get("tasks_completed"), "tasks_per_s": st.get("tasks_per_s"),
                        "workers": len(st.get("workers", [])), "servers": len(st.get("servers", [])),
                        "progress": st.get("progress"), "report": st.get("report")})
    ended = [{k: d.get(k) for k in ("name", "app", "state", "started", "ended", "tasks_completed")}
             for d in recent(registry_name(kv), now=now)]
    return {"running": running, "ended": ended, "now": now}
