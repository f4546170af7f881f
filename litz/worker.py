"""Worker process: hosts executors and runs their micro-tasks as greenlets.

The event loop is the main greenlet. A task that misses the parameter cache registers what it needs and
switches back to the loop, which runs other tasks, sends every pending get in one message per server,
and resumes the task when its values arrive. Finished tasks' results are held until the update log
that holds their updates has been flushed to the servers and acknowledged (thesis §4.4).
"""
from __future__ import annotations

import os
import pickle
import sys
from collections import Counter, defaultdict, deque
from collections.abc import Hashable, Iterable
from typing import Any

import cloudpickle
import greenlet

from . import clock, kernels, process, wire
from . import protocol as P
from .api import Executor, held_input
from .appload import load_executor_class, loaded_tokens
from .cache import MISS, ParamCache, UpdateLog, read_only
from .checkpoint import executor_part, read_part, sync_filesystem, write_part
from .cpulimit import CpuLimit
from .errors import LitzError, app_code, describe_app_exception
from .guard import BadMessage
from .held import ALL, FRESH_VERSION, HeldTasks
from .keys import ShardMap
from .outofcore import Residency
from .process import Process

RUN_SLICE_S = 0.02  # longest stretch of task execution between two looks at the network
IDLE_GREENLETS = 64  # task greenlets kept for the next tasks (see Worker.task_loop); more finish and end
# while a handed-off task heads the queue, the socket is read at most this often (docs/design.md, A8): a chain of
# handoffs is not interrupted by each acknowledgement and dispatch, which come in batches instead
CHAIN_READ_GAP_S = 0.0005
# Update-log flushes awaiting acknowledgement at once. With one, the next flush waits a whole round trip
# (encrypt, send, decrypt, add, ack) and the worker's CPU and the link take turns; with two, one
# flush's payload is on the way while the next one is built, and updates still aggregate meanwhile.
# Each flush's results wait for its own acknowledgements, so the consistency rule is unchanged.
MAX_FLUSHES = 2  # bench/ps_bandwidth.py, 1 worker, update: ~900 MB/s with 1, ~1,150 with 2, no better with 4
# A flush that writes more keys than this reports "any key" to the master, which then invalidates every
# live cache entry of the other workers: the key lists travel and are merged once per flush and dispatch.
MAX_WRITTEN_KEYS = 1024


class Task:
    __slots__ = ("tid", "eid", "version", "args", "glet", "result", "signalled", "values", "missing", "gen",
                 "retried", "updates", "live_ok", "fresh", "deps", "release_rid", "closure", "early")

    def __init__(self, tid: int, eid: int, version: int, args: Any, gen: int = 0, live_ok: bool = False):
        self.tid, self.eid, self.version, self.args, self.gen = tid, eid, version, args, gen
        self.live_ok = live_ok  # dispatched here by the master, behind its invalidations: live entries serve it
        self.fresh: set | bool | None = None  # sent ahead (after=): keys read only live or fetched anew (A3)
        self.release_rid = 0  # sent ahead: the first fetch id asked after its release
        self.early: set | None = None  # sent ahead: its closure's flushes not yet reported done at its release (A7)
        self.retried = False
        self.updates: UpdateLog | None = None  # staged until the task succeeds: a failed attempt adds nothing
        self.glet = None
        self.result = None
        self.signalled = False
        self.values: list | None = None
        self.missing = 0


class Flush:
    """One update flush in flight: what it sent, what is not yet acknowledged, and what its DONE will carry."""

    __slots__ = ("unacked", "results", "parts", "written", "tasks", "deltas", "map_version", "after")

    def __init__(self, unacked: int, results: list, parts: dict, written: list | None, tasks: list,
                 deltas: dict | None = None, map_version: int = -1, after: list | tuple = ()):
        self.unacked = unacked  # items not yet acknowledged
        self.results = results  # the tasks' results, for the DONE
        # server -> its items (shard, key, delta) until it acknowledges them; parts sent again after a partial
        # recovery are keyed (server, their own flush id), and Worker.resent_fids maps that id back to the flush
        self.parts = parts
        self.written = written  # the keys written (None: too many to name)
        self.tasks = tasks
        self.deltas = deltas if deltas is not None else {}  # key -> delta: what the overlay adds (A3)
        self.map_version = map_version  # the shard map it was sent under
        self.after = after  # earlier flushes whose DONE must go first (A7)


class SlowHook:
    """``LITZ_TEST_SLOW_WORKER=w1:0.75`` (tests and benchmarks only): worker w1 sleeps after each slice of a task
    so that it runs at 25 % of its speed, as a CPU quota would make it. ``w1:/some/file``: the fraction is read
    from that file (at most every 0.2 s; no file: full speed), so a test can slow a worker down and release it."""

    def __init__(self, ident: str):
        self.active, self.path, self.ratio, self._read_at = False, None, 0.0, float("-inf")
        for item in os.environ.get("LITZ_TEST_SLOW_WORKER", "").split(","):
            who, _, frac = item.partition(":")
            if who == ident and frac:
                self.active = True
                try:
                    self.ratio = self._ratio(float(frac))
                except ValueError:
                    self.path = frac

    @staticmethod
    def _ratio(frac: float) -> float:
        frac = min(max(frac, 0.0), 0.95)
        return frac / (1.0 - frac)  # seconds slept per second a task runs

    def sleep_for(self, ran: float, now: float) -> float:
        """Seconds to sleep after a task ran ``ran`` seconds."""
        if self.path is not None and now - self._read_at > 0.2:
            self._read_at = now
            try:
                with open(self.path) as f:
                    self.ratio = self._ratio(float(f.read().strip() or 0))
            except (OSError, ValueError):
                self.ratio = 0.0
        return ran * self.ratio


def open_schedstat() -> int | None:
    """A descriptor of this thread's ``/proc/thread-self/schedstat`` (CPU time, then time spent runnable but not
    running, in ns), or None where there is none or time is simulated (``litz.sim``: it must not read real time)."""
    if clock.perf_counter is not clock._real.perf_counter:
        return None
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    except OSError:
        return None
    try:
        wanted(fd)
        return fd
    except (OSError, ValueError, IndexError):
        os.close(fd)
        return None


def wanted(fd: int) -> float:
    """Seconds this thread ran or wanted to run: CPU time plus run delay, which holds a CPU quota's throttled time
    and a busy neighbour's turns (the cost of a task on this machine now, whatever the task did meanwhile)."""
    fields = os.pread(fd, 128, 0).split()
    return (int(fields[0]) + int(fields[1])) / 1e9


class SpeedMeasure:
    """What tasks cost this worker since its previous DONE, which carries it (the master's measure of the worker's
    speed, :class:`litz.placement.SpeedMeter`): seconds it held unfinished tasks (running them, or waiting for their
    values or their flush) and CPU seconds. Holding, not running: a CPU quota's stalls land anywhere, also in the
    wake-up from a wait for a message, which running time misses. Where Linux tells it (``schedstat``), the seconds
    are CPU time plus run delay instead (see :func:`wanted`), plus the time tasks blocked inside run slices (sleep,
    I/O, the test hook), which costs too although it is neither."""

    def __init__(self, schedstat: bool = True):
        """``schedstat``: False measures held wall time even where /proc tells more (bare workers in tests)."""
        self.busy = 0.0  # held time before the current wait mark
        self._busy_mark = clock.perf_counter()
        self._cpu_mark = clock.thread_time()
        self._schedstat = open_schedstat() if schedstat else None
        self._wanted_mark = wanted(self._schedstat) if self._schedstat is not None else 0.0
        self.blocked = 0.0
        self._slice_start = self._slice_wanted = 0.0
        self.ran: dict[int, list[float]] = {}  # executor -> [seconds its tasks ran, CPU seconds] since the take

    def wait_begins(self) -> None:
        """The worker holds no task and waits for messages: busy until now, the wait is not."""
        self.busy += clock.perf_counter() - self._busy_mark

    def wait_ends(self) -> None:
        self._busy_mark = clock.perf_counter()

    def start_slice(self, now: float) -> None:
        """A run slice (tasks switched to one after another) starts at ``now`` (perf_counter)."""
        if self._schedstat is not None:
            self._slice_start, self._slice_wanted = now, wanted(self._schedstat)

    def stop_slice(self) -> None:
        """The run slice ended: the wall time in it that was neither CPU nor run delay was tasks blocking."""
        if self._schedstat is not None:
            ran = clock.perf_counter() - self._slice_start
            self.blocked += max(0.0, ran - (wanted(self._schedstat) - self._slice_wanted))

    def task_ran(self, eid: int, seconds: float, cpu: float) -> None:
        """A task of ``eid`` ran ``seconds`` (``cpu`` of them on a CPU) since it was switched to."""
        r = self.ran.get(eid)
        if r is None:
            self.ran[eid] = [seconds, cpu]
        else:
            r[0] += seconds
            r[1] += cpu

    def take(self, tasks: int, done: dict[int, int] | None = None) -> tuple:
        """``(tasks, seconds, CPU seconds, per executor)`` since the previous take, for ``tasks`` completions;
        starts afresh. Per executor: ``{eid: (tasks completed, seconds its tasks ran, CPU seconds)}`` for every
        executor that ran or completed a task (``done``: eid -> completions): what each executor's tasks cost
        inside the worker, which the worker's own seconds (its stalls, its waits) do not split."""
        now, cpu = clock.perf_counter(), clock.thread_time()
        spent = self.busy + now - self._busy_mark
        if self._schedstat is not None:
            w = wanted(self._schedstat)
            spent, self._wanted_mark = w - self._wanted_mark + self.blocked, w
        done = done or {}
        ran = self.ran
        per_executor = {e: (done.get(e, 0), *ran.get(e, (0.0, 0.0))) for e in ran.keys() | done.keys()}
        timing = (tasks, spent, cpu - self._cpu_mark, per_executor)
        self.busy, self._busy_mark, self._cpu_mark, self.blocked = 0.0, now, cpu, 0.0
        self.ran = {}
        return timing

    def close(self) -> None:
        if self._schedstat is not None:
            os.close(self._schedstat)
            self._schedstat = None


class Fetch:
    __slots__ = ("key", "version", "waiters", "server", "ticket", "rid")

    def __init__(self, key: Hashable, version: int, server: str, ticket: int, rid: int = 0):
        self.key, self.version, self.server, self.ticket, self.rid = key, version, server, ticket, rid
        self.waiters: list[tuple[Task, int]] = []


class Worker(Process):
    role = "worker"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.executor_cls: type | None = None
        self.config: dict = {}
        self.num_executors = 0
        self.executors: dict[int, Executor] = {}
        self.shardmap: ShardMap | None = None
        # LITZ_LIVE_CACHE=0: tasks read the cache by the version rule alone, so every newer read travels to
        # the server (bench/ps_bandwidth.py measures that path with it; users have no reason to set it)
        self.live_cache = os.environ.get("LITZ_LIVE_CACHE", "1") != "0"
        self.cache = ParamCache(self.live_cache)
        self.log = UpdateLog()
        self.runnable: deque[Task] = deque()
        self.current: Task | None = None
        self.speaker: int | None = None  # the executor whose code runs outside a task (load_input): named in prints
        self.main = greenlet.getcurrent()
        self.idle_greenlets: list[greenlet.greenlet] = []  # finished a task, wait for the next (task_loop)
        self.slow = SlowHook(self.ident)
        self.measure = SpeedMeasure()  # what tasks cost this worker: its speed, reported with each DONE
        self.fetches: dict[int, Fetch] = {}
        self.fetch_by_key: dict[Hashable, Fetch] = {}
        self.out_gets: dict[str, list] = defaultdict(list)
        self.completed: list[tuple[int, Any]] = []
        self.completed_tasks: list[Task] = []  # the tasks of ``completed``, in order: named if a result cannot be sent
        self.flushing: dict[int, Flush] = {}  # flush id -> the flush, until every server acknowledged it
        self.resent_fids: dict[int, int] = {}
        # flush_id -> keys of a flush a moving shard's server forwarded in part: unsettled until the flush
        # completes, they are invalidated at every later acknowledgement of it (docs/design.md, I2)
        self.unsettled: dict[int, list] = {}
        self.lost_servers: set[str] = set()  # lost, their requests sent elsewhere: late answers are ignored
        self.started: dict[int, int] = defaultdict(int)  # eid -> tasks started and not finished
        self.moving: dict[int, tuple[str, bool, bool, list]] = {}  # eid -> (dest, with_input, copied, buffered)
        self.copied: dict[int, dict] = {}  # eid -> input data sent ahead to its destination (scale-out)
        self.preloaded: dict[int, tuple[dict, int]] = {}  # eid -> (input data, bytes) received ahead of eid
        self.retiring = False
        self.map_version = -1
        self.gen = 0  # bumped by a restore: tasks of an older generation are gone
        self.moved_to: dict[int, str] = {}  # executors shipped from here -> where they went
        self.pending: dict[int, int] = defaultdict(int)  # eid -> tasks queued, waiting for a load, or running
        self.waiting_load: dict[int, list[Task]] = defaultdict(list)
        self.load_queue: dict[int, None] = {}  # spilled executors with a task, waiting for room to load
        self.residency = Residency(self.ident)
        self.baseline_rss = process.resident_bytes()
        self._next_enforce = 0.0
        self._next_read = 0.0  # perf_counter before which a chain of handoffs skips reading the socket (A8)
        self._spill_retry_at = 0.0  # after a failed eviction (disk full, not writable): when to try again
        self.next_rid = 0
        self.next_fid = 0
        self.running = True
        self.tasks_run = 0
        self.compiling: str | None = None  # the numba kernel a task is compiling now (compile_notice)
        self.cpu_limit = CpuLimit()  # its cgroup's CPU quota, in STATS: placement counts it (litz.cpulimit)
        self.held = HeldTasks()  # tasks sent ahead (after=), waiting for tasks to be reported done here (A2)
        # completions whose flushes are acknowledged, for the master: one DONE message per read (A4)
        self.done_out: list[tuple] = []
        self.handoffs_out: dict[str, list] = defaultdict(list)  # worker -> (task id, keys) it waits for (A9)
        # the local hand-off (docs/design.md, A2, A3, A7): tasks released while a flush of their closure is
        # unacknowledged, those of them waiting for the acknowledgements to read, and acknowledged flushes
        # whose DONE waits for an earlier flush's: flush id -> (those flushes, results, keys written, tasks)
        self.early_tasks: set[Task] = set()
        self.awaiting_acks: set[Task] = set()
        self.parked: dict[int, tuple] = {}

    # -- event loop ----------------------------------------------------------------------------------
    def run(self, start_timeout: float = 600.0) -> None:
        self.send("master", (P.HELLO, P.VERSION, "worker", {"address": self.endpoint.address,
                                                             "app_tokens": loaded_tokens(), "stats": self.stats()}))
        self.await_welcome(start_timeout)
        last_check = clock.time()
        while self.running:
            idle = not self.runnable and not self.holds_tasks()
            if idle:  # busy until now; the wait below is not
                self.measure.wait_begins()
            got = False
            if self.reads_now():
                got = self.wait_for_messages(0 if self.runnable else 100)
                self._next_read = clock.perf_counter() + CHAIN_READ_GAP_S
            if idle:
                self.measure.wait_ends()
            if got:
                for sender, msg in self.receive():
                    self.handle_message(sender, msg)
                    if not self.running:
                        if not self.stopped:  # leaving with the job still on: what is done goes first
                            self.send_done_out()
                        return
                self.send_done_out()  # what the read made ready: one message
            if self.runnable:
                self.run_slice()
            if self.out_gets:
                self.send_gets()
            if self.completed and (len(self.flushing) < MAX_FLUSHES or self.releases_held()):
                self.flush()
            self.send_done_out()  # what the pass made ready (a flush that wrote nothing)
            if self.moving:
                self.ship_ready_executors()
            if self.residency.loading:
                self.finish_loads()
            if self.load_queue:
                self.start_queued_loads()
            if self.residency.budget is not None and clock.time() >= self._next_enforce:
                self._next_enforce = clock.time() + 0.02
                self.enforce_budget()
            if self.drain_requested and not self.retiring and self.leave_on_request():
                return
            if self.retiring and self.can_retire():
                self.send("master", (P.RETIRED,))
                return
            now = clock.time()
            if now - last_check > 1.0:
                last_check = now
                if not self.job_goes_on():
                    return
                self.send("master", (P.STATS, self.stats()))

    def reads_now(self) -> bool:
        """Whether the loop reads the socket now: always, unless a task handed off here (sent ahead with
        ``after=``, released: a chain waits for it) is next to run and the last read was less than
        ``CHAIN_READ_GAP_S`` ago (A8)."""
        runnable = self.runnable
        return not runnable or runnable[0].fresh is None or clock.perf_counter() >= self._next_read

    def holds_tasks(self) -> bool:
        """Tasks here not yet reported done: queued, running, waiting for values, or in a flush."""
        return bool(self.completed or self.flushing or self.parked or any(self.pending.values()))

    def handle(self, sender: str, msg: tuple) -> None:
        tag = msg[0]
        if sender in self.lost_servers:
            return  # read after the partial recovery: what it answered was asked again elsewhere
        if tag == P.TASKS:
            gen = self.gen
            to_load, strays = [], []
            # Only the master's dispatches come behind the invalidations they need (a task another worker
            # forwards was dispatched behind that worker's): only they may read live cache entries.
            live_ok = sender == "master" and len(msg) > 2
            if live_ok:
                self.cache.invalidate(msg[2])
                if len(msg) > 3:
                    self.held.recording = True  # the master counts our DONEs: remember what they report (A4)
            for tid, eid, version, args in msg[1]:
                if eid in self.moving:  # it ships once its started tasks end: a task it has not begun goes with it
                    self.moving[eid][3].append((tid, eid, version, args))
                elif eid in self.executors:
                    self.runnable.append(Task(tid, eid, version, args, gen, live_ok))
                    self.pending[eid] += 1
                elif eid in self.residency.spilled:
                    self.waiting_load[eid].append(Task(tid, eid, version, args, gen, live_ok))
                    self.pending[eid] += 1
                    to_load.append(eid)
                elif eid in self.moved_to:  # it left: the task follows it, behind it on the same channel
                    self.send(self.moved_to[eid], (P.TASKS, [(tid, eid, version, args)]))
                else:
                    strays.append(eid)
            for eid in to_load:  # after every task of the message counts: a load must not evict their executors
                self.prefetch(eid)
            if len(msg) > 3 and live_ok:
                self.take_ahead(msg[4], msg[3], gen, *msg[5:7])
            if strays:  # the batch's other tasks run: only these are dropped
                raise BadMessage("tasks for executors that were never here", f"executors {strays[:5]!r:.60}")
        elif tag == P.HANDOFF:
            self.handed_off(msg[1], relayed=False)
        elif tag == P.VALUES:
            self.on_values(None if len(msg) > 2 else sender, msg[1])  # None: forwarded, never live
        elif tag == P.ACK:
            self.on_ack(sender, msg[1], msg[2], msg[3], len(msg) > 4)
        elif tag == P.APP:
            _, blob, token, self.config, self.num_executors = msg
            try:
                self.executor_cls = load_executor_class(blob, token)
                kernels.ensure_watching()  # the app may have imported numba just now
            except LitzError:
                raise
            except Exception as exc:  # the app's module cannot be imported here (a package missing on this machine)
                self.fail(*describe_app_exception("loading the app's executor class", exc))
        elif tag == P.SHARDS:
            self.on_shard_map(msg[1], list(msg[2]), msg[3])
        elif tag == P.CREATE:
            self.create_executors(msg[1])
        elif tag == P.MOVE_EXECUTOR:
            self.start_move(msg[1], msg[2], msg[3], msg[4])
        elif tag == P.EXECUTOR:
            self.receive_executor(msg[1], msg[2], msg[3], msg[4], msg[5])
        elif tag == P.COPY_INPUT:
            self.copy_input(msg[1], msg[2])
        elif tag == P.INPUT:
            self.preloaded[msg[1]] = (msg[2], wire.size_of(msg[2]))
            self.send("master", (P.INPUT_READY, msg[1]))
        elif tag == P.DROP_INPUT:  # the move was called off: sent to its source and its destination
            self.preloaded.pop(msg[1], None)
            self.copied.pop(msg[1], None)
        elif tag == P.RETIRE:
            self.retiring = True
        elif tag == P.CHECKPOINT:
            self.checkpoint(msg[1])
        elif tag == P.RESTORE:
            self.restore(msg[1], msg[2], msg[3])
        elif tag == P.MEMORY_LIMIT:
            self.residency.budget = msg[1]
            if msg[1] is not None:
                self.enforce_budget()
        elif tag == P.PREFETCH:
            self.prefetch_hint(msg[1], msg[2])
        elif tag == P.SERVERS_LOST:
            self.servers_lost(set(msg[1]), msg[2], set(msg[3]) if len(msg) > 3 else None)
        elif not self.handle_lifecycle(tag, msg):
            raise BadMessage("unexpected tag", repr(tag))  # the shapes let none through

    def fail(self, where: str, text: str) -> None:
        self.send("master", (P.FAIL, where, text))

    # -- tasks sent ahead (after=; docs/design.md, A2-A9; litz/held.py) ------------------------------------------
    def take_ahead(self, tasks: list, seen: int, gen: int, handoffs: list = (), relayed: list = ()) -> None:
        """Tasks the master sent ahead with their closures: held until those are reported done here or handed off
        (A9). Then the hand-offs this worker owes and the completions the master relays. Then forget the tasks the
        master has seen done (last: a task or a hand-off of this message may name one)."""
        for tid, eid, version, args, closure in tasks:
            if eid not in self.executors and eid not in self.residency.spilled:
                raise BadMessage("a task sent ahead for an executor that is not here", f"executor {eid!r:.20}")
            task = Task(tid, eid, version, args, gen, live_ok=True)
            if self.held.arrive(task, tuple(closure)):  # held, it pins nothing: its executor may be spilled
                self.release(task)
        if handoffs:
            self.owe_handoffs(handoffs)
        if relayed:
            self.handed_off(relayed, relayed=True)
        self.held.forget(seen)

    def owe_handoffs(self, items: list) -> None:
        """The master says a task sent ahead to ``dest`` waits for ``tid``, a task here: hand it off once it is
        reported done (with this read's completions, if it is). A task no longer here (its executor left) is the
        master's relay's (A9)."""
        held, n = self.held, self.num_executors
        for tid, dest in items:
            if type(tid) is not int or type(dest) is not str:
                raise BadMessage("TASKS with a hand-off that is not (task id, worker)", f"{tid!r:.20}")
            if tid in held.acked:
                self.handoffs_out[dest].append((tid, held.acked[tid]))
            else:
                eid = tid % n
                if (eid in self.executors or eid in self.residency.spilled) and eid not in self.moving:
                    held.handoff_to.setdefault(tid, []).append(dest)

    def handed_off(self, items: list, relayed: bool) -> None:
        """Tasks of other workers are reported done (A9): their keys are invalidated here before anything else
        (no entry fetched or asked for before is live after), then the held tasks they were the last for start."""
        held = self.held
        for item in items:
            if type(item) not in (tuple, list) or len(item) != 2 or type(item[0]) is not int:
                raise BadMessage("a hand-off that is not (task id, keys)", f"{item!r:.40}")
            tid, written = item
            if written is not None and type(written) not in (list, tuple):
                raise BadMessage("a hand-off whose keys are not a list", f"{type(written).__name__}")
            if not held.news(tid, relayed):
                continue
            self.cache.invalidate(written)
            for task in held.handed_off(tid, written, relayed):
                self.release(task)

    def release(self, task: Task) -> None:
        """A held task's closure is done here: it may run (its executor moving: the master's, A5)."""
        task.release_rid = self.next_rid
        eid = task.eid
        if eid in self.moving or (eid not in self.executors and eid not in self.residency.spilled):
            self.held.drop_handoffs((task.tid,))
            self.send("master", (P.HELD_BACK, [task.tid]))
            return
        if task.early:  # handed off before the closure's flushes were all acknowledged (A2, A3)
            flushing, parked = self.flushing, self.parked
            task.early = {fid for fid in task.early if fid in flushing or fid in parked}
            if any(fid in flushing for fid in task.early):
                self.early_tasks.add(task)
        self.pending[eid] += 1
        if eid in self.executors:
            self.runnable.appendleft(task)  # first: it is what the chain waits for
        else:
            self.waiting_load[eid].append(task)
            self.prefetch(eid)

    def give_back(self, eid: int, queued: list[Task]) -> list[Task]:
        """``eid`` starts moving: what was sent ahead and cannot go with it goes back to the master, which sends it
        once its closure has completed (A5): its released tasks not yet started, its held tasks, and every held
        task that waits for one of those or for a task that travels. Returns the tasks that travel."""
        travel = [t for t in queued if t.fresh is None]
        back = {t.tid for t in queued if t.fresh is not None}
        gone = back | {t.tid for t in travel}
        held, changed = self.held, True
        while changed:
            changed = False
            for task in list(held.held.values()):
                if task.eid == eid or any(c in gone for c in task.closure):
                    held.drop(task)
                    back.add(task.tid)
                    gone.add(task.tid)
                    changed = True
        if back:
            held.drop_handoffs(back)
            self.send("master", (P.HELD_BACK, sorted(back)))
        return travel

    def stats(self) -> dict:
        res = self.residency
        return {"rss": process.resident_bytes(), "executors": len(self.executors) + len(res.spilled),
                "cache_keys": len(self.cache), "tasks_run": self.tasks_run, "budget": res.budget,
                "state_bytes": res.resident(), "evicted": sorted(res.spilled), "compiling": self.compiling,
                "cpu_limit": self.cpu_limit.cores()}

    def compile_notice(self, kind: str, kernel: str, seconds: float) -> None:
        """A task's first call of a numba kernel compiles it (litz.kernels.watch: the cache lacks it): tell the
        master now, before the compile holds this process for seconds, and again when it is done."""
        self.compiling = kernel if kind == "start" else None
        stats = self.stats()
        if kind == "end":
            stats["compiled"] = [kernel, round(seconds, 3)]
        self.send("master", (P.STATS, stats))

    # -- out-of-core -----------------------------------------------------------------------------------
    def memory_event(self, kind: str, eid: int, nbytes: int, seconds: float) -> None:
        self.send("master", (P.MEMORY_EVENT, kind, eid, nbytes, round(seconds, 6)))

    def evict_idle(self, need: int = 0, everything: bool = False) -> None:
        """Spill idle executors, least recently used first, until ``need`` more bytes fit in the budget."""
        res = self.residency
        res.refresh(self.executors)
        budget = res.budget
        for eid in list(res.lru):
            if not everything and (budget is None or res.resident() + need <= budget):
                return
            if self.pending[eid] or eid in self.moving or eid not in self.executors:
                continue  # a task is queued, waiting or running for it: keep it (thesis §4.8.1)
            if clock.monotonic() < self._spill_retry_at:
                return
            try:
                nbytes, seconds = res.evict(eid, self.executors[eid])
            except (OSError, LitzError) as exc:  # disk full or not writable: keep it in memory, nothing lost
                if not self._spill_retry_at:  # one line and one event per episode, not one per attempt
                    self.memory_event("evict_failed", eid, 0, 0.0)
                    sys.stderr.write(f"litz: worker {self.ident}: cannot spill executor {eid} ({exc}); "
                                     "running over the memory budget, retrying every second\n")
                self._spill_retry_at = clock.monotonic() + 1.0
                return
            if self._spill_retry_at:
                self._spill_retry_at = 0.0
                sys.stderr.write(f"litz: worker {self.ident}: spilling executors again\n")
            del self.executors[eid]
            self.memory_event("evict", eid, nbytes, seconds)

    def enforce_budget(self) -> None:
        self.evict_idle()
        budget = self.residency.budget
        if budget is not None and process.resident_bytes() - self.baseline_rss > 1.5 * budget + (64 << 20):
            self.evict_idle(everything=True)  # the process grew beyond what the accounting sees

    def wait_for_messages(self, timeout_ms: float) -> bool:
        """Poll the endpoint; while a load is under way, also wake when it completes."""
        res = self.residency
        if not res.loading or not timeout_ms:
            return self.endpoint.poll(timeout_ms)
        fd = res.wake_fd()  # a restore makes a new Residency: asked each time
        res.clear_wake()
        if not any(f.done() for f in res.loading.values()):
            messages, _ = self.endpoint.wait(timeout_ms, (fd,))
            res.clear_wake()
            return messages
        return self.endpoint.poll(0)

    def prefetch(self, eid: int) -> None:
        if eid in self.residency.spilled and eid not in self.residency.loading:
            self.load_queue[eid] = None
            self.start_queued_loads()

    def prefetch_hint(self, eid: int, chosen: int) -> None:
        """The master's hint that ``eid`` runs here after ``chosen`` (docs/design.md, O3, O4): load it now, while
        ``chosen``'s tasks run, if it fits in the budget once idle executors are spilled; never by spilling an
        executor with a task, never ahead of a task's load waiting for room, never over the budget. A hint that
        arrives after ``chosen``'s tasks ended is stale (the master may have picked ``chosen`` again since, and
        this load would spill it): dropped, as one that does not fit."""
        res = self.residency
        if (res.budget is None or eid not in res.spilled or eid in res.loading or self.load_queue
                or self._spill_retry_at or not self.pending[chosen]):
            return
        pinned = {e for e in res.lru if self.pending[e] or e in self.moving or e not in self.executors}
        if not res.prefetch_fits(eid, pinned):
            return
        self.evict_idle(need=res.load_bytes(eid) + res.loading_bytes())
        if res.resident() + res.load_bytes(eid) + res.loading_bytes() <= res.budget:
            res.start_prefetch(eid)

    def start_queued_loads(self) -> None:
        """Start loads in task order while they fit in the budget next to what is resident or loading; the
        rest wait until an executor's task ends and it can be evicted. (Starting every load at once held
        all of a worker's executors in memory whenever all had a task, as in every BSP iteration.) With
        nothing resident or loading, or while spilling fails, a load starts even if it is over the budget."""
        res = self.residency
        while self.load_queue:
            eid = next(iter(self.load_queue))
            if eid not in res.spilled or eid in res.loading:
                del self.load_queue[eid]
                continue
            need = res.load_bytes(eid) + res.loading_bytes()
            self.evict_idle(need=need)
            spill_works = not self._spill_retry_at  # else waiting for room could wait forever: load over budget
            if (res.budget is not None and res.resident() + need > res.budget and (res.lru or res.loading)
                    and spill_works):
                return
            del self.load_queue[eid]
            res.start_load(eid)

    def finish_loads(self) -> None:
        try:
            loaded = self.residency.finished_loads()
        except LitzError as exc:
            self.fail(f"worker {self.ident}", str(exc))
            return
        for eid, state, nbytes, seconds in loaded:
            self.install(eid, state)
            self.memory_event(self.residency.load_kind(eid), eid, nbytes, seconds)
            self.runnable.extend(self.waiting_load.pop(eid, []))

    def install(self, eid: int, state: Any) -> Executor:
        ex = self._bind(eid)
        if hasattr(ex, "__setstate__"):
            with app_code(f"executor {eid} __setstate__"):  # an app's error, not the message's that brought the state
                ex.__setstate__(state)
            if isinstance(state, dict):  # the input data travels beside the state: an app's own may not take it
                ex.__dict__.update({a: state[a] for a in ex.input_attrs if a in state and a not in ex.__dict__})
        else:
            ex.__dict__.update(state)
        self.executors[eid] = ex
        self.residency.add(eid, ex)
        return ex

    def load_now(self, eid: int) -> None:
        """Bring a spilled executor back before moving or checkpointing it."""
        if eid in self.residency.spilled:
            state, nbytes, seconds = self.residency.load_now(eid)
            self.install(eid, state)
            self.memory_event(self.residency.load_kind(eid), eid, nbytes, seconds)
            self.runnable.extend(self.waiting_load.pop(eid, []))

    def on_shard_map(self, num_shards: int, owners: list[str], version: int) -> None:
        if version <= self.map_version:
            return
        self.map_version = version
        servers = dict.fromkeys(owners)  # in shard order, not a set's: what they are sent goes out in one order
        self.lost_servers.difference_update(servers)  # an ident given shards again is a live server: hear it
        for server in servers:  # now, so that the connections and their rings are up before the first get
            try:
                self.reach(server)
            except LitzError:  # gone from the registry already (the job is ending): a send would say so
                pass
        if self.shardmap is None:
            self.shardmap = ShardMap(num_shards, owners)
            return
        old = dict.fromkeys(self.shardmap.owners)
        self.shardmap.owners = owners
        self.cache.invalidate(None)  # answers and acknowledgements may now come from other servers, in any order
        # Flushes sent under the old map are acknowledged by their old owners, in no order with the answers of
        # the new owners that live entries now come from: none may add into a live entry (docs/design.md, I3).
        for fid, entry in self.flushing.items():
            self.unsettled.setdefault(fid, []).extend(key for items in entry.parts.values() for _, key, _ in items)
        for server in old:
            if server not in servers and server not in self.lost_servers:
                self.send(server, (P.FENCE, version))  # behind every request we ever sent it

    def peer_rejoined(self, ident: str) -> None:
        self.lost_servers.discard(ident)  # what it sends comes from the new process: not a late answer

    def servers_lost(self, lost: set[str], shard_map: tuple, live: set[str] | None = None) -> None:
        """SCAR partial recovery: the live servers hold the lost shards now (restored from a checkpoint).
        Ask their new owners what the lost servers never answered: outstanding gets, and the parts of update
        flushes they never acknowledged. Nothing else changes, so no task runs twice and the live servers see
        every update once. A flush whose acknowledgements cannot all be matched to the parts sent (a moving
        shard's server forwarded some of it) might have had updates at a lost server, or might not: sending
        them again could apply them twice, so the worker refuses, and the master restores the whole job
        from a full checkpoint instead. So it does for a part sent to a server no longer in the job (``live``:
        the servers that are): it retired after forwarding the part, maybe to a lost server. Gets change
        nothing, so every outstanding one is asked again, also those a server that has retired since passed
        on to a lost one (docs/design.md, S1); a late first answer wins, the other is ignored."""
        unmatched = [fid for fid, entry in self.flushing.items()
                     if entry.unacked > sum(len(items) for items in entry.parts.values())
                     or (live is not None and any((p if isinstance(p, str) else p[0]) not in live | lost
                                                  for p in entry.parts))]
        if unmatched:
            self.send("master", (P.RESTORE_FAILED, f"worker {self.ident}: update flushes {unmatched} were partly "
                                                   f"forwarded by a moving shard's server: not sure what was lost"))
            return
        self.lost_servers |= lost
        for server in lost:
            self.endpoint.disconnect(server)  # what is still queued for it goes nowhere
            self.out_gets.pop(server, None)
        self.on_shard_map(shard_map[1], list(shard_map[2]), shard_map[3])
        shard_of, owners = self.shardmap.shard, self.shardmap.owners
        for rid, fetch in self.fetches.items():  # its answer is not live: the map change invalidated every entry
            shard = shard_of(fetch.key)
            fetch.server = owners[shard]
            self.out_gets[fetch.server].append((rid, shard, fetch.key))
        for fid, entry in self.flushing.items():
            by_server = entry.parts
            for part in [p for p in by_server if (p if isinstance(p, str) else p[0]) in lost]:
                if not isinstance(part, str):
                    del self.resent_fids[part[1]]
                regrouped: dict[str, list] = defaultdict(list)
                for item in by_server.pop(part):
                    regrouped[owners[item[0]]].append(item)
                for server, items in regrouped.items():
                    rf = self.next_fid
                    self.next_fid += 1
                    self.resent_fids[rf] = fid
                    by_server[(server, rf)] = items
                    self.send(server, (P.UPDATES, rf, items))
        self.send("master", (P.RESTORED,))

    # -- executors -----------------------------------------------------------------------------------
    def _bind(self, eid: int) -> Executor:
        ex = self.executor_cls.__new__(self.executor_cls)
        ex.executor_id, ex.num_executors, ex.config, ex._litz = eid, self.num_executors, self.config, self
        return ex

    def load_input(self, eid: int, ex: Executor, init: bool = False) -> None:
        """Run the app's ``load_input`` (and its ``__init__`` first, for a new executor), its prints named."""
        self.speaker = eid
        try:
            if init:
                ex.__init__()
            ex.load_input()
        finally:
            self.speaker = None

    def output_prefix(self) -> str:
        """What the app's printed lines begin with here: this worker and the executor whose code prints."""
        eid = self.current.eid if self.current is not None else self.speaker
        return f"[{self.ident}] " if eid is None else f"[{self.ident} e{eid}] "

    def create_executors(self, eids: Iterable[int]) -> None:
        ready = []
        for eid in eids:
            ex = self._bind(eid)
            try:
                self.load_input(eid, ex, init=True)
            except Exception as exc:
                self.fail(*describe_app_exception(f"executor {eid} load_input", exc))
                return
            self.executors[eid] = ex
            self.residency.add(eid, ex)
            ready.append(eid)
        self.send("master", (P.STATS, self.stats()))  # the memory with the input loaded, before the job starts
        self.send("master", (P.READY, ready))
        if self.residency.budget is not None:
            self.enforce_budget()

    def copy_input(self, eid: int, dest: str) -> None:
        """Scale-out, first step: send ``eid``'s input data to ``dest`` while ``eid`` keeps running here.

        Input data is read-only by contract, so only the executor's (small) state moves later and the
        executor stops for that alone, not for the transfer of its input."""
        self.load_now(eid)
        ex = self.executors.get(eid)
        if ex is None:
            raise BadMessage("asked to copy the input of an executor that is not here", f"executor {eid!r:.20}")
        data = held_input(ex)
        self.copied[eid] = data
        self.send(dest, (P.INPUT, eid, data), pickler=cloudpickle)

    def start_move(self, eid: int, dest: str, with_input: bool, copied: bool = False) -> None:
        """Stop starting tasks of ``eid``; it ships once its started tasks have finished (thesis §4.4)."""
        if eid not in self.executors and eid not in self.residency.spilled:
            raise BadMessage("asked to move an executor that is not here", f"executor {eid!r:.20}")
        self.load_now(eid)
        queued = [t for t in self.runnable if t.eid == eid and t.glet is None]
        if queued:
            self.runnable = deque(t for t in self.runnable if not (t.eid == eid and t.glet is None))
        self.pending[eid] -= len(queued)
        if self.held.handoff_to:
            self.held.drop_handoffs(t.tid for t in queued)
        if self.held.held or any(t.fresh is not None for t in queued):
            queued = self.give_back(eid, queued)
        self.moving[eid] = (dest, with_input, copied, [(t.tid, t.eid, t.version, t.args) for t in queued])
        self.ship_ready_executors()

    def ship_ready_executors(self) -> None:
        for eid in [e for e in self.moving if self.started[e] == 0]:
            dest, with_input, copied, buffered = self.moving.pop(eid)
            ex = self.executors.pop(eid, None)
            sent_ahead = self.copied.pop(eid, None)
            if ex is None:
                self.fail(f"worker {self.ident}", f"asked to move executor {eid}, which is not here")
                continue
            state = executor_state(ex, with_input)
            if copied and isinstance(state, dict):  # input attributes re-assigned since the copy travel too
                state.update({a: v for a, v in ex.__dict__.items()
                              if a in ex.input_attrs and (sent_ahead is None or sent_ahead.get(a) is not v)})
            self.send(dest, (P.EXECUTOR, eid, state, buffered, with_input, copied), pickler=cloudpickle)
            self.moved_to[eid] = dest
            self.residency.remove(eid)

    def receive_executor(self, eid: int, state: Any, buffered: list, with_input: bool, copied: bool = False) -> None:
        data, nbytes = self.preloaded.pop(eid, (None, 0)) if copied else (None, 0)
        try:
            ex = self.install(eid, state)
            if data is not None:
                if isinstance(state, dict):
                    ex.__dict__.update({a: v for a, v in data.items() if a not in state})
                self.residency.add(eid, ex)  # account again, now with its input data
            elif not with_input:
                self.load_input(eid, ex)
                self.residency.add(eid, ex)
        except Exception as exc:
            self.fail(*describe_app_exception(f"executor {eid} load_input after moving", exc))
            return
        self.moved_to.pop(eid, None)
        for tid, _, version, args in buffered:
            self.runnable.append(Task(tid, eid, version, args, self.gen))
            self.pending[eid] += 1
        self.send("master", (P.MOVED, eid, wire.size_of(state) + nbytes))

    # -- checkpoints and recovery --------------------------------------------------------------------
    def checkpoint(self, root: str) -> None:
        """Write every executor (without input data); the master sends this only when no task is running."""
        try:
            for eid in list(self.residency.spilled):
                self.load_now(eid)  # the checkpoint needs every executor's state
            parts = {}
            for eid, ex in self.executors.items():
                rel = executor_part(eid)
                parts[rel] = write_part(root, rel, executor_state(ex, with_input=False), sync=False)
            sync_filesystem(root)
        except Exception as exc:
            self.send("master", (P.CHECKPOINT_FAILED, f"worker {self.ident}: {exc}"))
            return
        self.send("master", (P.CHECKPOINTED, parts))

    def reset(self) -> None:
        """Forget everything of the previous epoch: executors, tasks, cache, update log, moves."""
        self.gen += 1
        self.executors.clear()
        self.runnable.clear()
        self.cache = ParamCache(self.live_cache)
        self.log = UpdateLog()
        self.fetches.clear()
        self.fetch_by_key.clear()
        self.out_gets.clear()
        self.completed.clear()
        self.completed_tasks.clear()
        self.flushing = {}
        self.resent_fids.clear()
        self.unsettled.clear()
        self.started.clear()
        self.moving.clear()
        self.copied.clear()
        self.preloaded.clear()
        self.moved_to.clear()
        self.retiring = False
        self.pending.clear()
        self.waiting_load.clear()
        self.load_queue.clear()
        self.held = HeldTasks()
        self.done_out.clear()
        self.handoffs_out.clear()
        self.early_tasks.clear()
        self.awaiting_acks.clear()
        self.parked.clear()
        budget = self.residency.budget
        self.residency.close()
        self.residency = Residency(self.ident, budget)

    def restore(self, root: str, parts: dict[int, dict], shard_map: tuple) -> None:
        kept_input = {eid: held_input(ex) for eid, ex in self.executors.items() if eid in parts}
        self.reset()
        self.map_version = -1
        self.shardmap = None
        self.on_shard_map(shard_map[1], list(shard_map[2]), shard_map[3])
        try:
            for eid, meta in parts.items():
                self.install(eid, read_part(root, executor_part(eid), meta))
        except LitzError as exc:
            self.send("master", (P.RESTORE_FAILED, str(exc)))
            return
        for eid, ex in self.executors.items():
            if kept_input.get(eid) and len(kept_input[eid]) == len(ex.input_attrs):
                ex.__dict__.update(kept_input[eid])  # input data is read-only by contract: no reload needed
                self.residency.add(eid, ex)
                continue
            try:
                self.load_input(eid, ex)
            except Exception as exc:
                self.fail(*describe_app_exception(f"executor {eid} load_input", exc))
                return
        self.send("master", (P.RESTORED,))

    def close(self) -> None:
        self.residency.close()  # spill files go with the worker
        self.measure.close()
        super().close()

    def can_retire(self) -> bool:
        return (not self.executors and not self.moving and not self.runnable and not self.completed
                and not self.flushing and not self.residency.spilled and not self.waiting_load and not self._held
                and not self.held.held and not self.done_out and not self.parked)

    # -- micro-tasks ---------------------------------------------------------------------------------
    def run_slice(self, budget: float = RUN_SLICE_S) -> None:
        """Run tasks for ``budget`` seconds (at least one switch into a task)."""
        perf = clock.perf_counter
        start = perf()
        self.measure.start_slice(start)
        deadline = start + budget
        runnable = self.runnable
        slow = self.slow.active
        cpu_time, task_ran = clock.thread_time, self.measure.task_ran
        t0, c0 = start, cpu_time()
        while runnable:
            task = runnable.popleft()
            self.current = task
            if task.glet is None:
                idle = self.idle_greenlets
                task.glet = idle.pop() if idle else greenlet.greenlet(self.task_loop)
                task.glet.switch(task)
            else:
                task.glet.switch()
            now = perf()
            if slow:
                clock.sleep(self.slow.sleep_for(now - t0, now))
                now = perf()
            c = cpu_time()
            task_ran(task.eid, now - t0, c - c0)  # each executor's cost, reported per executor with DONE
            t0, c0 = now, c
            if now > deadline:
                break
        self.current = None
        self.measure.stop_slice()

    def task_loop(self, task: Task) -> None:
        """A task greenlet's life: run a task, then wait among the idle ones until it is given the next.

        Reused because a new greenlet per task cost about 8 us against 0.6 us (Python 3.11 maps a fresh 16 KB
        frame stack for it at its first call and unmaps it at its end: an mmap, a munmap and page faults a task). A
        task dropped by a restore ends its greenlet (GreenletExit, when it is collected), which never comes back."""
        me, idle = greenlet.getcurrent(), self.idle_greenlets
        while True:
            self._task_body(task)
            if len(idle) >= IDLE_GREENLETS:
                return
            idle.append(me)
            task = self.main.switch()

    def _task_body(self, task: Task) -> None:
        eid = task.eid
        self.started[eid] += 1
        try:
            result = self.executors[eid].run_task(task.args)
        except MemoryError:
            if task.retried:
                self.fail(f"executor {eid} run_task", "MemoryError, also after evicting every idle executor")
                return
            self.evict_idle(everything=True)  # make room, then run it once more (thesis §4.8.1)
            task.retried, task.glet, task.updates = True, None, None
            self.pending[eid] += 1
            self.runnable.append(task)
            return
        except Exception as exc:
            self.fail(*describe_app_exception(f"executor {eid} run_task", exc))
            return
        finally:
            if task.gen == self.gen:  # a task dropped by a restore ends (GreenletExit) after it
                self.started[eid] -= 1
                self.pending[eid] -= 1
                self.residency.touch(eid)
        self.tasks_run += 1
        if task.updates is not None:
            self.log.merge(task.updates)
            task.updates = None
        self.completed.append((task.tid, task.result if task.signalled else result))
        self.completed_tasks.append(task)

    def _task(self, what: str) -> Task:
        task = self.current
        if task is None or greenlet.getcurrent() is self.main:
            raise LitzError(f"{what} is only available inside run_task")
        return task

    # -- the API executors call (bound as Executor._litz) ----------------------------------------------
    def ps_get(self, key: Hashable) -> Any:
        task = self._task("ps_get")
        if task.fresh is not None:
            return self.ps_get_many([key])[0]
        value = self.cache.lookup(key, task.version, task.live_ok)
        if value is MISS:
            return self.ps_get_many([key])[0]
        return value

    def ps_get_many(self, keys: list) -> list:
        task = self._task("ps_get_many")
        values = [None] * len(keys)
        missing = 0
        lookup, version, live_ok, fresh = self.cache.lookup, task.version, task.live_ok, task.fresh
        early = None
        if fresh is not None and task in self.early_tasks:  # its closure's flushes are in flight (A3)
            early = self.overlays(keys, fresh)
            if early is None:  # one cannot be read so: wait for the acknowledgements, then read as below
                self.awaiting_acks.add(task)
                self.main.switch()
        for i, key in enumerate(keys):
            if early and i in early:
                value = early[i]
            elif fresh is not None and (fresh is ALL or key in fresh):  # after=: live, or fetched anew (A3)
                value = lookup(key, FRESH_VERSION, live_ok)
            else:
                value = lookup(key, version, live_ok)
            if value is MISS:
                self._want(key, task, i)
                missing += 1
            else:
                values[i] = value
        if missing:
            task.values, task.missing = values, missing
            self.main.switch()  # back to the loop until every value has arrived
            task.values = None
        return values

    def overlays(self, keys: list, fresh: set | bool) -> dict[int, Any] | None:
        """The fresh ones of ``keys`` as live entries plus this worker's in-flight deltas, by index; None if one
        cannot be read so (docs/design.md, A3)."""
        out = {}
        for i, key in enumerate(keys):
            if fresh is ALL or key in fresh:
                value = self.overlay(key)
                if value is MISS:
                    return None
                out[i] = value
        return out

    def overlay(self, key: Hashable) -> Any:
        """``key``'s live entry plus the deltas of every flush in flight that wrote it and whose part for it is not
        yet acknowledged (an acknowledged part is in the entry already); MISS where that is not the servers'
        value once they apply those flushes: no live entry, or a flush sent under another map or unsettled (A3)."""
        deltas, owner = [], None
        for fid, entry in self.flushing.items():
            delta = entry.deltas.get(key)
            if delta is None:
                continue
            if entry.map_version != self.map_version or fid in self.unsettled:
                return MISS
            if owner is None:
                owner = self.shardmap.owners[self.shardmap.shard(key)]
            if owner in entry.parts:
                deltas.append(delta)
        return self.cache.live_plus(key, deltas)

    def _want(self, key: Hashable, task: Task, index: int) -> None:
        fetch = self.fetch_by_key.get(key)
        if fetch is None or fetch.version < task.version or (task.fresh is not None and fetch.rid < task.release_rid):
            shard = self.shardmap.shard(key)
            server = self.shardmap.owners[shard]
            rid = self.next_rid
            fetch = Fetch(key, task.version, server, self.cache.ticket(), rid)
            self.next_rid += 1
            self.fetches[rid] = fetch
            self.fetch_by_key[key] = fetch
            self.out_gets[server].append((rid, shard, key))
        fetch.waiters.append((task, index))

    def ps_update(self, key: Hashable, delta: Any) -> None:
        self.ps_update_many(((key, delta),))

    def ps_update_many(self, items: Iterable[tuple]) -> None:
        task = self._task("ps_update")
        if task.updates is None:
            task.updates = UpdateLog()
        log, shard = task.updates, self.shardmap.shard
        for key, delta in items:
            shard(key)  # a bad key fails here, in the app's own call
            log.add(key, delta)

    def signal_task_completion(self, result: Any = None) -> None:
        task = self._task("signal_task_completion")
        task.result, task.signalled = result, True

    # -- parameter-server traffic --------------------------------------------------------------------
    def send_gets(self) -> None:
        out, self.out_gets = self.out_gets, defaultdict(list)
        for server, items in out.items():
            self.send(server, (P.GETS, items))

    def on_values(self, server: str | None, items: list) -> None:
        store = self.cache.store
        for rid, value in items:
            fetch = self.fetches.pop(rid, None)
            if fetch is None:  # answered already: a request asked again elsewhere after a partial recovery
                continue
            value = read_only(value)  # decoded arrays are writable, and this one object serves every task here
            # live only if answered by the server asked: then it comes in order with that server's acks
            store(fetch.key, fetch.version, value, fetch.ticket if server == fetch.server else None)
            if self.fetch_by_key.get(fetch.key) is fetch:
                del self.fetch_by_key[fetch.key]
            for task, index in fetch.waiters:
                task.values[index] = value
                task.missing -= 1
                if task.missing == 0:
                    self.runnable.append(task)

    def flush(self) -> None:
        """Send the update log; the completed tasks' results follow once every server acknowledged."""
        results, self.completed = self.completed, []
        tasks, self.completed_tasks = self.completed_tasks, []
        log = self.log.take()
        after = self.closure_unreported(tasks)
        if not log:
            fid = self.next_fid
            self.next_fid += 1
            self.report(fid, results, (), tasks, after)
            return
        by_server: dict[str, list] = defaultdict(list)
        shard_of, owners = self.shardmap.shard, self.shardmap.owners
        for key, delta in log.items():
            shard = shard_of(key)
            by_server[owners[shard]].append((shard, key, delta))
        fid = self.next_fid
        self.next_fid += 1
        for server, items in by_server.items():
            try:
                self.send(server, (P.UPDATES, fid, items))
            except Exception as exc:
                bad = unsendable([(key, f"ps_update key {key!r:.60}") for _, key, _ in items]
                                 + [(delta, f"ps_update delta of key {key!r:.60}") for _, key, delta in items])
                if bad is None:
                    raise
                self.fail("ps_update", f"TypeError: {bad}, which cannot be sent to the parameter servers ({exc}); "
                          "keys are str, int or tuples of them, deltas numbers or numpy arrays")
                return
        # the master tells the other workers which keys these tasks wrote (too many: any key)
        written = list(log) if len(log) <= MAX_WRITTEN_KEYS else None
        self.flushing[fid] = Flush(len(log), results, by_server, written, tasks, log, self.map_version, after)
        if self.held.recording:  # the local hand-off: tasks held for these start now (A2)
            for task in self.held.flushed([tid for tid, _ in results], written, fid):
                self.release(task)

    def releases_held(self) -> bool:
        """A completed task here is one a held task waits for: its flush goes now, past ``MAX_FLUSHES`` (which
        aggregates updates for bandwidth), so the hand-off (A2) does not wait for earlier flushes' acknowledgements."""
        waiting = self.held.waiting
        return bool(waiting) and any(tid in waiting for tid, _ in self.completed)

    def closure_unreported(self, tasks: list[Task]) -> list[int]:
        """The flushes of these tasks' closures not yet reported done: theirs go first (A7)."""
        flushing, parked = self.flushing, self.parked
        return [fid for task in tasks if task.early for fid in task.early if fid in flushing or fid in parked]

    def on_ack(self, server: str, fid: int, applied: int, errors: list, forwarded: bool = False) -> None:
        if errors:
            self.fail(f"ps_update on server {server}", "\n".join(errors))
        part: str | tuple[str, int] = server
        parent = self.resent_fids.get(fid)  # kept until the flush completes: a forwarded part acks more than once
        if parent is not None:  # a part sent again after a partial recovery
            part, fid = (server, fid), parent
        flushing = self.flushing.get(fid)
        if flushing is None:
            return
        by_server = flushing.parts
        sent = by_server.pop(part, None)
        unsettled = self.unsettled.get(fid)
        if sent is not None and applied == len(sent) and not forwarded and unsettled is None:
            # Gets answered by this server before this ack did not see these updates, later ones do: add
            # them into the live entries now, before any later answer can be stored.
            self.cache.write_through(sent)
        else:
            # Forwarded (a shard moved): the rest is acknowledged by other servers, in no order with their
            # answers. Until the last ack, a get to a new owner may be answered before the forwarded update
            # reaches it: invalidate the keys again at every ack of this flush, the last one included, so no
            # answer asked before it is stored live (docs/design.md, I2).
            if unsettled is None:
                unsettled = self.unsettled[fid] = [key for items in (sent or (), *by_server.values())
                                                   for _, key, _ in items]
            self.cache.invalidate(unsettled)
            by_server.clear()
        flushing.unacked -= applied
        if flushing.unacked == 0:
            del self.flushing[fid]
            self.unsettled.pop(fid, None)
            if self.resent_fids:
                for rf in [rf for rf, parent in self.resent_fids.items() if parent == fid]:
                    del self.resent_fids[rf]
            if self.early_tasks:
                self.closure_acknowledged()
            self.report(fid, flushing.results, flushing.written, flushing.tasks, flushing.after)

    def closure_acknowledged(self) -> None:
        """A flush was acknowledged: tasks handed off early whose closure's flushes now all are read as any
        released task from here on (A3): only live entries, or fetches asked from now."""
        flushing = self.flushing
        for task in [t for t in self.early_tasks if not any(fid in flushing for fid in t.early)]:
            self.early_tasks.discard(task)
            task.release_rid = self.next_rid
            if task in self.awaiting_acks:
                self.awaiting_acks.discard(task)
                self.runnable.append(task)

    def report(self, fid: int, results: list, written: Any, tasks: list[Task], after: list[int]) -> None:
        """Flush ``fid`` is acknowledged (or wrote nothing): its DONE goes, unless a flush of its tasks' closures
        has not been reported yet; then it is parked until that one is (A7)."""
        parked = self.parked
        if after and any(f in self.flushing or f in parked for f in after):
            parked[fid] = (after, results, written, tasks)
            return
        self.send_done(results, written, tasks)
        while parked:  # what waited for it, in flush order
            ready = next((pid for pid, waiting in parked.items()
                          if not any(f in self.flushing or f in parked for f in waiting[0])), None)
            if ready is None:
                return
            self.send_done(*parked.pop(ready)[1:])

    def send_done(self, results: list, written: Any, tasks: list[Task]) -> None:
        """Completed tasks' updates are acknowledged by every server: their results go to the master with the
        other completions of this read or pass of the loop (``send_done_out``); tasks held here for them (after=)
        are released."""
        held = self.held
        if held.recording:
            tids = [tid for tid, _ in results]
            for task in held.sent_done(tids, written):  # A2
                self.release(task)
            if held.handoff_to:  # tasks sent ahead to other workers wait for some of these (A9)
                held.hand_off(tids, written, self.handoffs_out)
        self.done_out.append((results, written, tasks))

    def send_done_out(self) -> None:
        """The completions queued since the last DONE leave as one message: acknowledgements come in batches
        (one read brings several), and one message wakes the master once and carries one timing."""
        if self.handoffs_out:  # first: what waits for them waits on no one else
            handoffs, self.handoffs_out = self.handoffs_out, defaultdict(list)
            for dest, done in handoffs.items():
                self.send(dest, (P.HANDOFF, done))
        if not self.done_out:
            return
        out, self.done_out = self.done_out, []
        if len(out) == 1:
            results, written, tasks = out[0]
        else:
            results = [r for part in out for r in part[0]]
            tasks = [t for part in out for t in part[2]]
            written = None if any(part[1] is None for part in out) else [k for part in out for k in part[1]]
        self.held.numbered(results)  # the master counts messages (A4)
        self.send_done_now(results, written, tasks)

    def send_done_now(self, results: list, written: Any, tasks: list[Task]) -> None:
        """A result that cannot be pickled is the app's error, told with the executor and task that returned it, as
        an exception raised in run_task is: never a lost worker."""
        # what these tasks cost (the master's measure of this worker's speed), on the message it sends anyway
        timing = self.measure.take(len(tasks), Counter(t.eid for t in tasks))
        try:
            self.send("master", (P.DONE, results, written, timing))
            return
        except Exception as exc:
            failure = exc
        # An instance of a class the app defines, on a worker that got the app by value (a fresh interpreter,
        # another machine): plain pickle finds another class of that name, or none. cloudpickle sends it by
        # value, and the master, which loaded the app, unpickles it as its own class (cloudpickle's tracking id).
        try:
            self.send("master", (P.DONE, results, written, timing), pickler=cloudpickle)
        except Exception:
            for (tid, result), task in zip(results, tasks, strict=True):
                what = "the result given to signal_task_completion" if task.signalled else "run_task's return value"
                bad = unsendable([(result, "result")], cloudpickle)
                if bad is not None:
                    self.fail(f"executor {task.eid} run_task (task {tid})",
                              f"TypeError: {what} cannot be sent to the driver: {bad} ({failure}); results are "
                              "numbers, strings, numpy arrays, and lists, tuples and dicts of them")
                    return
            raise


def unsendable(values: list[tuple[Any, str]], pickler: Any = pickle) -> str | None:
    """The first of ``values`` (value, name) that ``pickler`` cannot send, said as 'NAME is a TYPE' (the part of a
    list, tuple or dict that fails, if one does alone); None if every one pickles."""
    def fails(value: Any) -> bool:
        try:
            pickler.dumps(value, protocol=5, buffer_callback=lambda _: False)
            return False
        except Exception:
            return True

    def part(value: Any, name: str, depth: int) -> str:
        items: Iterable = ()
        if isinstance(value, (list, tuple)):
            items = ((v, f"[{i}]") for i, v in enumerate(value[:1000]))
        elif isinstance(value, dict):
            items = ((v, f"[{k!r:.40}]") for k, v in list(value.items())[:1000])
        for v, index in items if depth < 8 else ():
            if fails(v):
                return part(v, name + index, depth + 1)
        kind = type(value)
        return f"{name} is a {kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" \
            else f"{name} is a {kind.__qualname__}"

    for value, name in values:
        if fails(value):
            return part(value, name, 0)
    return None


def executor_state(ex: Executor, with_input: bool) -> Any:
    """The executor's state to move or checkpoint; input data only when asked (scale-out sends it)."""
    state = ex.__getstate__()
    if isinstance(state, dict):
        if with_input:
            state = {**held_input(ex), **state}
        else:
            state = {k: v for k, v in state.items() if k not in ex.input_attrs}
    return state
