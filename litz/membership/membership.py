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
import sys
import threading
from typing import Any

from .. import clock
from ..control import sign_request
from ..errors import LitzError, RegistryUnavailable
from .kv import KV, Lease

DEFAULT_TTL = 3.0
# After an outage or a reset of the registry, how long the master waits before a missing member key counts as
# a loss: every member's keeper (period ttl / 4) has found and rewritten its registration by then (R3).
REREGISTER_GRACE_S = 2 * DEFAULT_TTL
SETTLED = "settled"  # the master's key: from when a missing member key means a lost process (R3)


def litz_home() -> str:
    return os.environ.get("LITZ_HOME") or os.path.join(os.path.expanduser("~"), ".litz")


def connect_kv(etcd: Any = None, home: str | None = None) -> KV:
    """The registry a job lives in: etcd when ``etcd`` is given ('HOST:PORT[,...]' or an
    :class:`~.etcdkv.EtcdOptions`), else the local directory registry."""
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
        self.lost = threading.Event()  # set once we are out of the job: evicted, or another master took it
        self._registered: str | None = None  # our member id, once registered
        self._owned: dict[str, tuple[Any, bool]] = {}  # key -> (value, leased): rewritten after a lapse (R2)
        self._evictions: set[str] = set()  # eviction markers not yet written (the registry was down)
        self.reregistrations = 0

    # -- own registration ----------------------------------------------------------------------------
    def _start_keepalive(self) -> Lease:
        if self._lease is None:
            self._lease = self.kv.lease(self.ttl)
            self.kv.fail_fast_while_down()  # the keeper probes the registry from now on (R1)
            if getattr(self._lease, "renews_itself", False):  # litz.sim keeps it, and calls tend() itself
                return self._lease
            self._keeper = threading.Thread(target=self._keepalive, name="litz-lease", daemon=True)
            self._keeper.start()
        return self._lease

    def _keepalive(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                self.tend()
            except Exception:  # registry unreachable (or failing oddly): try again next period
                pass

    def tend(self) -> None:
        """One keeper step: refresh our lease; if the registry no longer knows it, take a new one and write our
        keys again, unless we were evicted (R2); write eviction markers the master could not write before."""
        lease = self._lease
        if lease is None or self.lost.is_set():
            return
        if lease.refresh():
            self._write_evictions()
            return
        if self._registered is not None and self._marked_evicted(self._registered):
            self.lost.set()
            return
        fresh = self.kv.lease(self.ttl)
        settled = self.prefix + SETTLED
        if settled in self._owned:  # first: while members write their keys again, none counts as missing (R3)
            self._owned[settled] = (clock.time() + REREGISTER_GRACE_S, False)
        for key, (value, leased) in sorted(self._owned.items(), key=lambda kv: kv[0] != settled):
            if key == self.prefix + "master":
                if not self.kv.create(key, value, fresh):
                    other = self.kv.get(key) or {}
                    if other.get("pid") != self.pid or other.get("host") != value.get("host"):
                        self.lost.set()  # another master holds the job now: this one is out
                        return
                    self.kv.put(key, value, fresh)
            else:
                self.kv.put(key, value, fresh if leased else None)
        self._lease = fresh
        self.reregistrations += 1

    def registry_settled(self) -> bool:
        """Whether a key missing from the registry means its process is gone: not within the grace the master
        gives members to write their keys again after the registry lost them (it came back empty), and not
        before the master itself has written them again (R3). Raises if the registry cannot be read."""
        since = self.kv.get(self.prefix + SETTLED)
        return since is not None and clock.time() >= since

    def registry_down_since(self) -> float | None:
        """When the registry stopped answering (None while it answers)."""
        return getattr(self.kv, "down_since", None)

    def registry_outages(self) -> list[tuple[float, float]]:
        """Every (since, until) the registry did not answer this process, oldest first."""
        return list(getattr(self.kv, "outages", ()))

    @property
    def give_up_after(self) -> float:
        """How long a process rides through a registry it cannot reach (--etcd-timeout)."""
        return getattr(self.kv, "give_up_after", float("inf"))

    def _own(self, key: str, value: Any, leased: bool) -> None:
        self._owned[key] = (value, leased)

    def register_master(self, info: dict) -> None:
        lease = self._start_keepalive()
        info = {**info, "pid": self.pid, "host": os.uname().nodename, "started": clock.time()}
        if not self.kv.create(self.prefix + "master", info, lease):
            other = self.kv.get(self.prefix + "master") or {}
            raise LitzError(f"job {self.job!r} already has a master (pid {other.get('pid')} on "
                            f"{other.get('host')})")
        self._own(self.prefix + "master", info, True)
        self.put(SETTLED, clock.time(), keep=True)  # the registry is as it is: every member's key counts

    def allocate_id(self, role: str) -> str:
        letter = {"worker": "w", "server": "s"}[role]
        taken = self.kv.get_prefix(self.prefix + "ids/")
        n = len([k for k in taken if k.rsplit("/", 1)[1].startswith(letter)])
        while not self.kv.create(f"{self.prefix}ids/{letter}{n}", clock.time()):
            n += 1
        return f"{letter}{n}"

    def claim_id(self, ident: str) -> None:
        """Take ``ident`` as given (a restarted pod keeps its id): an eviction marker of the process that had
        it before is about that process, not this one (R2)."""
        self.kv.put(f"{self.prefix}ids/{ident}", clock.time())
        self.kv.delete(f"{self.prefix}evicted/{ident}")

    def note_ids(self, idents: list[str]) -> None:
        """The master keeps every id it has seen in the registry, so a reset registry reuses none (R2)."""
        for ident in idents:
            key = f"{self.prefix}ids/{ident}"
            if key not in self._owned:
                self._own(key, clock.time(), False)

    def register(self, role: str, ident: str, info: dict) -> None:
        lease = self._start_keepalive()
        info = {**info, "role": role, "id": ident, "pid": self.pid, "host": os.uname().nodename}
        self.kv.put(self.prefix + "members/" + ident, info, lease)
        self._own(self.prefix + "members/" + ident, info, True)
        self._own(f"{self.prefix}ids/{ident}", clock.time(), False)
        self._registered = ident

    def evict(self, ident: str) -> None:
        """Take a member the master found dead out of the job: should it be alive after all (cut off, not dead),
        it finds its marker and stops, so no process works on after the job gave up on it (R2). Written later
        if the registry is down now."""
        self._evictions.add(ident)
        try:
            self._write_evictions()
        except RegistryUnavailable:
            pass

    def _write_evictions(self) -> None:
        for ident in sorted(self._evictions):
            self.kv.put(f"{self.prefix}evicted/{ident}", clock.time())
            self.kv.delete(self.prefix + "members/" + ident)
            self._evictions.discard(ident)

    def _marked_evicted(self, ident: str) -> bool:
        return self.kv.get(f"{self.prefix}evicted/{ident}") is not None

    def evicted(self) -> bool:
        """Whether the master took us out of the job (see :meth:`evict`), or another master took the job."""
        ident = self._registered
        return self.lost.is_set() or (ident is not None and self._marked_evicted(ident))

    def unregister(self) -> None:
        self._registered = None
        self._owned.clear()
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
    def put(self, name: str, value: Any, leased: bool = False, keep: bool = False) -> None:
        """``keep``: part of this process's registration, written again after a registry reset (R2)."""
        if keep:
            self._own(self.prefix + name, value, leased)
        self.kv.put(self.prefix + name, value, self._lease if leased else None)

    def get(self, name: str) -> Any | None:
        return self.kv.get(self.prefix + name)

    def clear(self) -> None:
        """Remove everything the job left in the registry (at the end of a job, finished, stopped or failed):
        waits for an unreachable registry up to --etcd-timeout, as nothing else waits on this process now, and
        says in one line what is left if it still cannot."""
        self.kv.fail_fast_while_down(False)
        try:
            self.kv.delete_prefix(self.prefix)
        except LitzError as exc:
            sys.stderr.write(f"litz: warning: could not remove job {self.job!r} from the registry ({exc}); "
                             f"remove it with `etcdctl del --prefix {self.prefix}`\n")

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
