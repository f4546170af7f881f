"""Worker, Server and Master objects built without their constructors (no sockets, no registry), for unit tests
of one handler: each has only the fields its handlers touch, and records what it sends."""
from __future__ import annotations

from types import SimpleNamespace


def bare_server(ident: str = "s0", record=None):
    """A Server with only what request handling, retirement and partial recovery touch; ``record(to, msg)``
    gets what it sends (by default it is appended to ``server.sent``)."""
    from litz.outofcore import ShardTables
    from litz.scar import RunningCheckpoint
    from litz.server import Server

    server = Server.__new__(Server)
    server.ident, server.shards, server.forward, server.last_forward = ident, ShardTables(ident), {}, {}
    server.exported, server.running_ckpt, server.running = set(), RunningCheckpoint(), True
    server.forwarded_to, server.retire_waiting, server.retire_since, server.fences = set(), None, -1, {}
    server.forwarded = 0
    server._held, server.leaving = {}, False
    server.sent = []
    record = record or (lambda to, msg: server.sent.append((to, msg)))
    server.send = lambda to, msg, pickler=None: record(to, msg)
    return server


def bare_worker(ident: str = "w0", spill_root: str | None = None):
    """A Worker with what fetching, flushing, task handling and executor moves touch, no executors yet; what it
    sends is appended to ``w.sent`` as (peer, message), what it reports as failed as ("fail", where, text).
    ``spill_root``: where its residency may spill executors (none without it)."""
    from collections import defaultdict, deque

    from litz.api import Executor
    from litz.cache import ParamCache
    from litz.held import HeldTasks
    from litz.outofcore import Residency
    from litz.worker import SpeedMeasure, Worker

    w = Worker.__new__(Worker)
    w.ident, w.sent, w.executor_cls, w.config, w.num_executors = ident, [], Executor, {}, 1
    w.send = lambda peer, msg, pickler=None: w.sent.append((peer, msg))
    w.fail = lambda where, text: w.sent.append(("fail", where, text))
    w.cache, w.flushing, w.fetches, w.fetch_by_key, w.runnable = ParamCache(), {}, {}, {}, deque()
    w.resent_fids, w.unsettled = {}, {}
    w.held, w.done_out, w.handoffs_out = HeldTasks(), [], defaultdict(list)  # no task sent ahead (after=)
    w.early_tasks, w.awaiting_acks, w.parked = set(), set(), {}
    w.measure = SpeedMeasure(schedstat=False)  # the speed measure DONE carries: no schedstat, nothing held yet
    w.executors, w.lost_servers, w.gen = {}, set(), 0
    w.moving, w.copied, w.moved_to, w.started = {}, {}, {}, defaultdict(int)
    w.pending, w.waiting_load = defaultdict(int), defaultdict(list)
    if spill_root is not None:
        w.residency = Residency(ident, spill_root=spill_root)
    on_ack = w.on_ack

    def on_ack_read(*args, **kwargs) -> None:  # each ack as one read of the loop: what it made ready is sent
        on_ack(*args, **kwargs)
        w.send_done_out()

    w.on_ack = on_ack_read
    return w


def bare_master(bound: tuple[str, ...] = (), **fields) -> SimpleNamespace:
    """A stand-in for a Master with only ``fields``, on which the Master methods and properties named in
    ``bound`` work as on the real one (each reads and writes only these fields, or fails on one it lacks)."""
    from litz.master import Master

    cls = type("BareMaster", (SimpleNamespace,), {name: getattr(Master, name) for name in bound})
    return cls(**fields)
