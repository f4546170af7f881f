"""Job membership over a KV with leases.

Layout under ``litz/jobs/<name>/``::

    master          the master's address, pid, host (leased: gone when the master is)
    members/<id>    one per worker/server: role, address, pid, host (leased)
    ids/<id>        allocated process ids, never reused within a job
    status          the master's latest status document (leased)
    secret          the job secret, when the master publishes it (not with --secret-file or LITZ_SECRET)
    requests/<rid>  litzctl requests, signed with the job secret (litz.control); the master answers under
                    responses/<rid> (leased)
"""
from __future__ import annotations

import os
import threading
from typing import Any

from .. import clock
from ..control import sign_request
from ..errors import LitzError
from .kv import KV, Lease

DEFAULT_TTL = 3.0


def litz_home() -> str:
    return os.environ.get("LITZ_HOME") or os.path.join(os.path.expanduser("~"), ".litz")


def connect_kv(etcd: str | None = None, home: str | None = None) -> KV:
    """The registry a job lives in: etcd when ``etcd`` is given, else the local directory registry."""
    if etcd:
        from .etcdkv import EtcdKV  # imported lazily: local jobs need no etcd client

        return EtcdKV(etcd)
    from .filekv import FileKV

    return FileKV(os.path.join(home or litz_home(), "registry"))


class Membership:
    def __init__(self, kv: KV, job: str, ttl: float = DEFAULT_TTL, pid: int | None = None):
        """``pid``: the process id to register under (default: this process's; a simulation runs many in one)."""
        if not job or "/" in job:
            raise LitzError(f"bad job name {job!r}")
        self.kv, self.job, self.ttl = kv, job, ttl
        self.pid = pid or os.getpid()
        self.prefix = f"litz/jobs/{job}/"
        self._lease: Lease | None = None
        self._keeper: threading.Thread | None = None
        self._stop = threading.Event()
        self.lost = threading.Event()  # set if our own lease lapsed (we are considered dead)
        self._registered: str | None = None  # our member id, once registered

    # -- own registration ----------------------------------------------------------------------------
    def _start_keepalive(self) -> Lease:
        if self._lease is None:
            self._lease = self.kv.lease(self.ttl)
            if getattr(self._lease, "renews_itself", False):  # a simulated registry keeps it while we live
                return self._lease
            self._keeper = threading.Thread(target=self._keepalive, name="litz-lease", daemon=True)
            self._keeper.start()
        return self._lease

    def _keepalive(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                if not self._lease.refresh():
                    self.lost.set()
                    return
            except Exception:  # registry unreachable: keep trying until the lease would lapse
                continue

    def register_master(self, info: dict) -> None:
        lease = self._start_keepalive()
        info = {**info, "pid": self.pid, "host": os.uname().nodename, "started": clock.time()}
        if not self.kv.create(self.prefix + "master", info, lease):
            other = self.kv.get(self.prefix + "master") or {}
            raise LitzError(f"job {self.job!r} already has a master (pid {other.get('pid')} on "
                            f"{other.get('host')})")

    def allocate_id(self, role: str) -> str:
        letter = {"worker": "w", "server": "s"}[role]
        taken = self.kv.get_prefix(self.prefix + "ids/")
        n = len([k for k in taken if k.rsplit("/", 1)[1].startswith(letter)])
        while not self.kv.create(f"{self.prefix}ids/{letter}{n}", clock.time()):
            n += 1
        return f"{letter}{n}"

    def register(self, role: str, ident: str, info: dict) -> None:
        lease = self._start_keepalive()
        info = {**info, "role": role, "id": ident, "pid": self.pid, "host": os.uname().nodename}
        self.kv.put(self.prefix + "members/" + ident, info, lease)
        self._registered = ident

    def evict(self, ident: str) -> None:
        """Take a member the master found dead out of the registry: should it be alive after all (cut off,
        not dead), it sees :meth:`evicted` and stops, so no process works on after the job gave up on it."""
        self.kv.delete(self.prefix + "members/" + ident)

    def evicted(self) -> bool:
        """Whether our own registration was taken away (see :meth:`evict`) or lapsed."""
        ident = self._registered
        return self.lost.is_set() or (ident is not None and self.member(ident) is None)

    def unregister(self) -> None:
        self._registered = None
        self._stop.set()
        if self._lease is not None:
            try:
                self._lease.revoke()
            except Exception:
                pass
            self._lease = None

    # -- reading -------------------------------------------------------------------------------------
    def master(self) -> dict | None:
        return self.kv.get(self.prefix + "master")

    def members(self) -> dict[str, dict]:
        n = len(self.prefix) + len("members/")
        return {k[n:]: v for k, v in self.kv.get_prefix(self.prefix + "members/").items()}

    def member(self, ident: str) -> dict | None:
        return self.kv.get(self.prefix + "members/" + ident)

    def wait_master(self, timeout: float) -> dict:
        deadline = clock.time() + timeout
        while True:
            info = self.master()
            if info:
                return info
            if clock.time() > deadline:
                raise LitzError(f"no master for job {self.job!r} appeared within {timeout:.0f} s")
            clock.sleep(0.1)

    # -- job-level values ----------------------------------------------------------------------------
    def put(self, name: str, value: Any, leased: bool = False) -> None:
        self.kv.put(self.prefix + name, value, self._lease if leased else None)

    def get(self, name: str) -> Any | None:
        return self.kv.get(self.prefix + name)

    def clear(self) -> None:
        """Remove everything the job left in the registry (at the end of a job)."""
        self.kv.delete_prefix(self.prefix)

    # -- requests from litzctl -----------------------------------------------------------------------
    def post_request(self, command: str, args: dict, secret: str, rid: str | None = None) -> str:
        """Post a request for the job's current master, signed with the job secret (:mod:`litz.control`);
        returns its id. ``rid``: a chosen id (the simulator's, for exact replays), else a random one."""
        rid = rid or os.urandom(6).hex()
        master = (self.master() or {}).get("instance", "")
        self.kv.put(f"{self.prefix}requests/{rid}", sign_request(secret, self.job, master, rid, command, args))
        return rid

    def take_requests(self) -> list[tuple[str, Any]]:
        """Every waiting request, oldest first, as (id, value), removed from the registry. Values are as found:
        anyone who can write the registry can post one, so the master checks them (:mod:`litz.control`)."""
        n = len(self.prefix) + len("requests/")

        def when(item: tuple[str, Any]) -> float:
            t = item[1].get("t") if isinstance(item[1], dict) else None
            return float(t) if isinstance(t, (int, float)) and t == t else 0.0

        out = []
        for key, value in sorted(self.kv.get_prefix(self.prefix + "requests/").items(), key=when):
            self.kv.delete(key)
            out.append((key[n:], value))
        return out

    def respond(self, rid: str, response: dict) -> None:
        """Answer request ``rid``. Leased: an answer nobody collects goes with the master."""
        self.put(f"responses/{rid}", response, leased=True)

    def wait_response(self, rid: str, timeout: float) -> dict | None:
        """The master's answer to a request; None on timeout. A job that ends meanwhile is an error."""
        t0 = clock.time()
        deadline = t0 + timeout
        next_alive_check = t0 + 1.0
        while clock.time() < deadline:
            resp = self.kv.get(f"{self.prefix}responses/{rid}")
            if resp is not None:
                self.kv.delete(f"{self.prefix}responses/{rid}")
                return resp
            if clock.time() > next_alive_check:
                next_alive_check = clock.time() + 1.0
                if self.master() is None:
                    raise LitzError(f"job {self.job!r} ended before answering")
            clock.sleep(0.01 if clock.time() - t0 < 2.0 else 0.05)  # a woken master answers within milliseconds
        return None
