"""The KV-with-leases interface on etcd v3 (via ``etcd-sdk-python``, imported as ``pyetcd``).

Values are JSON. ``create`` is an etcd transaction (put if the key's create revision is 0), so two masters
for one job cannot both register. One or more endpoints (the members of an etcd cluster) are tried in turn,
over TLS and with a user and password when given (:class:`EtcdOptions`).

Two ways to wait for an etcd that does not answer (docs/design.md, R1): a call made before the process has a
lease keeper (start-up, ``litzctl``) retries with backoff for ``EtcdOptions.timeout`` seconds and then ends
in a clear :class:`LitzError`; once :meth:`EtcdKV.fail_fast_while_down` was called (a lease keeper now probes
etcd off the event loop), a call made while etcd is known to be down raises :class:`RegistryUnavailable` at
once, so that an event loop never waits on the registry.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import clock
from ..errors import LitzError, RegistryUnavailable

RPC_TIMEOUT_S = 2.0  # one call to one endpoint
ENDPOINT_RETRY_S = 1.0  # a member that failed is tried again after this long
DEFAULT_TIMEOUT_S = 300.0  # how long a job rides through an etcd outage (--etcd-timeout)
# A process that has never reached etcd waits at most this long at start (unless --etcd-timeout says how long):
# a wrong address is said at once, and a supervisor (Kubernetes, Slurm) starts the process again if etcd was
# only late. A running process rides out an outage for --etcd-timeout, as before.
CONNECT_WAIT_S = 2.0
# gRPC shares a subchannel per target across channels and backs off reconnecting up to 2 minutes: after a
# long outage the keeper's probes kept failing for seconds after etcd was back, longer than a lease's TTL.
# A channel of its own, retried at least every second.
GRPC_OPTIONS = [("grpc.use_local_subchannel_pool", 1), ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000)]


@dataclass(frozen=True)
class EtcdOptions:
    """How to reach etcd: ``endpoints`` ('HOST:PORT,HOST:PORT'), TLS files, user and password, and how
    long to keep trying while it is unreachable."""

    endpoints: str
    timeout: float = DEFAULT_TIMEOUT_S
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    password_file: str | None = None  # where the password came from, for child processes (never argv)
    connect_wait: float | None = None  # how long the first connection waits: --etcd-timeout if given, else short

    def argv(self) -> list[str]:
        """The command-line options that give a child process these options (the password through the file
        it came from, or $LITZ_ETCD_PASSWORD, which children inherit)."""
        out = ["--etcd", self.endpoints, "--etcd-timeout", f"{self.timeout:g}"]
        for flag, value in (("--etcd-cacert", self.cacert), ("--etcd-cert", self.cert), ("--etcd-key", self.key),
                            ("--etcd-user", self.user), ("--etcd-password-file", self.password_file)):
            if value:
                out += [flag, value]
        return out

    def hosts(self) -> list[tuple[str, int]]:
        out = []
        for part in self.endpoints.split(","):
            host, _, port = part.strip().rpartition(":")
            if "://" in host:
                host = host.split("://", 1)[1]
            if not host or not port.isdigit():
                raise LitzError(f"bad --etcd {self.endpoints!r}: expected HOST:PORT[,HOST:PORT...]")
            out.append((host.strip("[]"), int(port)))
        return out

    def check(self) -> None:
        """Refuse inconsistent options in one line, before anything connects."""
        self.hosts()
        if self.timeout <= 0:
            raise LitzError(f"--etcd-timeout must be > 0 seconds, got {self.timeout}")
        if bool(self.cert) != bool(self.key):
            raise LitzError("--etcd-cert and --etcd-key go together")
        if (self.cert or self.key) and not self.cacert:
            raise LitzError("--etcd-cert/--etcd-key need --etcd-cacert (the CA that signed etcd's certificate)")
        if bool(self.user) != bool(self.password):
            raise LitzError("--etcd-user needs a password ($LITZ_ETCD_PASSWORD or --etcd-password-file)")
        for path in (self.cacert, self.cert, self.key):
            if path:
                try:
                    with open(path, "rb"):
                        pass
                except OSError as exc:
                    raise LitzError(f"cannot read {path}: {exc.strerror}") from None


def _permanent(exc: Exception) -> str | None:
    """Why a failed call will fail again however often it is retried (bad credentials, no permission)."""
    import grpc

    if isinstance(exc, grpc.RpcError):
        details = str(exc.details() or "")
        if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
            return f"permission denied ({details})"
        if "authentication failed" in details or "user name not found" in details:
            return f"authentication failed ({details})"
    return None


class EtcdLease:
    renews_itself = False

    def __init__(self, kv: EtcdKV, ttl: float):
        self.kv, self.ttl = kv, ttl
        self.id = kv._call(lambda c: c.lease(max(1, round(ttl))), "create a lease").id

    def refresh(self) -> bool:
        """False if etcd no longer knows the lease; raises if etcd cannot be reached (the keeper retries)."""
        replies = self.kv._call(lambda c: list(c.refresh_lease(self.id)), "refresh a lease", probe=True)
        return bool(replies) and replies[0].TTL > 0

    def revoke(self) -> None:
        self.kv._call(lambda c: c.revoke_lease(self.id), "revoke a lease")


class EtcdKV:
    def __init__(self, options: EtcdOptions | str, timeout: float = RPC_TIMEOUT_S):
        """``options``: an :class:`EtcdOptions` or just 'HOST:PORT[,...]'; ``timeout``: per call and endpoint."""
        self.options = options if isinstance(options, EtcdOptions) else EtcdOptions(options)
        self.options.check()
        self.endpoint = self.options.endpoints
        self.rpc_timeout = timeout
        self.down_since: float | None = None  # when calls began to fail (None: the last call succeeded)
        self.last_error = ""
        self.outages: list[tuple[float, float]] = []  # (down since, up again), for the job's events
        self._fail_fast = False
        self._client: Any = None
        self._failed: dict[str, float] = {}  # member 'host:port' -> when a call to it last failed
        self._lock = threading.Lock()
        wait = self.options.connect_wait
        try:
            self._call(lambda c: c.status(), "connect", give_up=wait if wait else min(self.options.timeout,
                                                                                      CONNECT_WAIT_S))
        except RegistryUnavailable as exc:
            if wait:  # asked to wait this long (a script waiting for etcd to come up): said as a give-up
                raise exc.gave_up() from None
            raise LitzError(f"cannot reach etcd at {self.endpoint} ({self.last_error}; tried for {exc.down_for:.0f} s):"
                            " is it running there? (--etcd-timeout SECONDS waits for it)") from None

    @property
    def give_up_after(self) -> float:
        return self.options.timeout

    def fail_fast_while_down(self, on: bool = True) -> None:
        """From now on a call made while etcd is known to be down raises :class:`RegistryUnavailable` at once:
        a lease keeper probes it off the event loop (docs/design.md, R1). ``on=False``: calls wait again."""
        self._fail_fast = on

    def _connect(self) -> Any:
        from pyetcd.client import Endpoint, MultiEndpointEtcd3Client

        o = self.options
        creds = (MultiEndpointEtcd3Client.get_secure_creds(o.cacert, o.key, o.cert) if o.cacert else None)
        endpoints = [Endpoint(host, port, secure=creds is not None, creds=creds, time_retry=ENDPOINT_RETRY_S,
                              opts=GRPC_OPTIONS) for host, port in o.hosts()]
        client = MultiEndpointEtcd3Client(endpoints=endpoints, timeout=self.rpc_timeout, user=o.user,
                                          password=o.password, failover=True)
        # the first member in the order given that has not failed lately (else the one that failed longest ago)
        now = time.time()
        fresh = [ep.netloc for ep in endpoints if now - self._failed.get(ep.netloc, 0.0) > ENDPOINT_RETRY_S]
        client._current_endpoint_label = fresh[0] if fresh else min(self._failed, key=self._failed.__getitem__)
        return client

    def _current(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._connect()  # authenticates, so a fresh token after a restart
            return self._client

    def _call(self, fn: Callable[[Any], Any], what: str, probe: bool = False, give_up: float | None = None) -> Any:
        """Run ``fn(client)``. ``probe``: one attempt whatever the mode (the lease keeper's); ``give_up``: wait at
        most this long for an unreachable etcd (default: ``EtcdOptions.timeout``)."""
        if self._fail_fast and self.down_since is not None and not probe:
            raise RegistryUnavailable(self.endpoint, self.down_since, self.last_error)
        delay = 0.1
        started = clock.time()  # the wait counts from here: one attempt may take RPC_TIMEOUT_S
        while True:
            try:
                result = fn(self._current())
            except Exception as exc:
                why = _permanent(exc)
                if why:
                    raise LitzError(f"etcd at {self.endpoint} refused to {what}: {why}") from None
                with self._lock:
                    if self._client is not None and self._client.endpoint_in_use is not None:
                        self._failed[self._client.endpoint_in_use.netloc] = time.time()
                    self._client = None  # new channels (and a new auth token) on the next try, elsewhere
                now = clock.time()
                if self.down_since is None:
                    self.down_since = now
                self.last_error = f"{what}: {type(exc).__name__}"
                if probe or self._fail_fast:
                    raise RegistryUnavailable(self.endpoint, self.down_since, self.last_error) from None
                if now + delay - min(self.down_since, started) > (self.options.timeout if give_up is None else give_up):
                    unreachable = RegistryUnavailable(self.endpoint, min(self.down_since, started), self.last_error)
                    if what == "connect":
                        raise unreachable from None  # said by the caller, who knows how long it was asked to wait
                    raise unreachable.gave_up() from None
                clock.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if self.down_since is not None:
                self.outages.append((self.down_since, clock.time()))
                self.down_since = None
            return result

    def put(self, key: str, value: Any, lease: EtcdLease | None = None) -> None:
        data = json.dumps(value)
        self._call(lambda c: c.put(key, data, lease=lease.id if lease else None), f"put {key}")

    def create(self, key: str, value: Any, lease: EtcdLease | None = None) -> bool:
        data = json.dumps(value)

        def txn(c: Any) -> bool:
            ok, _ = c.transaction(compare=[c.transactions.create(key) == 0],
                                  success=[c.transactions.put(key, data, lease=lease.id if lease else None)],
                                  failure=[])
            return ok

        return self._call(txn, f"create {key}")

    def get(self, key: str) -> Any | None:
        value, _ = self._call(lambda c: c.get(key), f"get {key}")
        return None if value is None else json.loads(value)

    def get_prefix(self, prefix: str) -> dict[str, Any]:
        items = self._call(lambda c: list(c.get_prefix(prefix)), f"list {prefix}")
        return {meta.key.decode(): json.loads(value) for value, meta in items}

    def delete(self, key: str) -> None:
        self._call(lambda c: c.delete(key), f"delete {key}")

    def delete_prefix(self, prefix: str) -> None:
        self._call(lambda c: c.delete_prefix(prefix), f"delete {prefix}")

    def lease(self, ttl: float) -> EtcdLease:
        return EtcdLease(self, ttl)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                pass
