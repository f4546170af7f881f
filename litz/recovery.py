"""Consistent checkpoints and automatic recovery, as the master runs them (thesis §4.4).

Checkpoint: hold new dispatches, wait until no dispatched task is unfinished and nothing is moving.
Then every completed task's updates are acknowledged on the servers, executors and the driver reflect
exactly those tasks, and the held tasks are the buffered ones. Each worker and server writes its own parts,
the master writes the driver and the manifest last and renames the checkpoint into place.

Recovery: the epoch goes up (older messages are dropped everywhere), servers load the shards, then
workers load the executors and re-load their input, then the driver is restored and its buffered tasks are
dispatched again. A corrupted checkpoint is skipped for the previous one; a failure during recovery
starts it over. SCAR's partial recovery (lost servers only) changes no epoch and resets nothing: see
:meth:`Recovery.recover_partially`.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from . import clock
from . import protocol as P
from .checkpoint import Checkpoint, CheckpointStore, executor_part, shard_part
from .errors import LitzError
from .scar import clear_running, global_top_counts

if TYPE_CHECKING:
    from .master import Master, Member

DRIVER_PART = "driver.pkl"
REPLACEMENT_WAIT_S = 15.0
CHECKPOINT_WARNING_EVERY_S = 60.0  # checkpoint failures after the first: counted, told at most this often


class RestartRecovery(Exception):
    """Another process was lost while recovering: start over with the processes left."""

    def __init__(self, lost: list[str], message: str, noticed: dict[str, str] | None = None):
        super().__init__(message)
        self.lost = lost  # their ids, for the recovery event
        self.noticed = noticed or {}  # id -> how the master noticed the loss


def warn(text: str) -> None:
    sys.stderr.write(f"litz: warning: {text}\n")
    sys.stderr.flush()


class RepeatedWarning:
    """A warning that can recur every second (checkpoints failing on a full disk, a flood of forged litzctl
    requests) and would then bury everything else on stderr. At most ``burst`` lines every ``every`` seconds;
    the rest are counted, and the count is told in one line when the period is over (at the next occurrence)
    or in :meth:`settle`, when the condition has passed or the job ends."""

    def __init__(self, what: str, every: float, burst: int = 1):
        """``what``: the repeated thing, as the count line starts: "checkpoint failed" -> "checkpoint failed
        7 more times in the last 60 s (latest: ...)"."""
        self.what, self.every, self.burst = what, every, burst
        self.since: float | None = None  # start of the period; None: nothing warned since the last settle
        self.shown = 0  # lines written in this period
        self.counted = 0  # occurrences not written, not yet told
        self.latest = ""  # the detail of the latest of them

    def warn(self, text: str, detail: str) -> None:
        """``text``: the whole line, written if the rate allows; ``detail``: this occurrence in the count line."""
        now = clock.time()
        if self.since is not None and now - self.since >= self.every:
            if self.counted:  # the period is over: this occurrence goes into its count line
                self.counted += 1
                self.latest = detail
                self._tell(f"in the last {now - self.since:.0f} s")
                self.since, self.shown = now, self.burst
                return
            self.since, self.shown = now, 0
        if self.since is None:
            self.since, self.shown = now, 0
        if self.shown < self.burst:
            warn(text)
            self.shown += 1
        else:
            self.counted += 1
            self.latest = detail

    def settle(self, after: str = "") -> None:
        """The condition has passed (or the job ends): tell what was counted, and warn afresh next time."""
        if self.counted:
            self._tell(f"in the last {clock.time() - self.since:.0f} s{after}")
        self.since, self.shown = None, 0

    def _tell(self, span: str) -> None:
        n, self.counted = self.counted, 0
        warn(f"{self.what} {n} more time{'s' if n > 1 else ''} {span} (latest: {self.latest})")


class Recovery:
    def __init__(self, master: Master, store: CheckpointStore | None, every: float | None = None,
                 partial: bool = False, priority: float | None = None):
        self.master = master
        self.store = store
        self.every = every
        self.partial = partial
        self.priority = priority
        if (partial or priority) and store is None:
            raise LitzError("--partial-recovery and --priority-checkpoint need --checkpoint-dir")
        if priority is not None and not (0 < priority <= 1 and every):
            raise LitzError("--priority-checkpoint R needs 0 < R <= 1 and --checkpoint-every (saved every R x it)")
        # full checkpoints keep their period with priority checkpoints too: a lost worker (its executors) needs
        # one; the running checkpoint gets the top R of the parameters every R x period in between
        self.next_due = clock.time() + every if every else None
        self.next_priority = clock.time() + every * priority if priority else None
        self.priority_round: dict | None = None
        self.requested = False
        self.in_progress: dict | None = None  # seq, tmp, parts, waiting, pause_t0
        self.pause_t0: float | None = None
        self.restoring: dict | None = None  # waiting set, failure
        self.failures = RepeatedWarning("checkpoint failed", CHECKPOINT_WARNING_EVERY_S)

    def start_fresh(self) -> None:
        """A new job, not --resume: an earlier run's running checkpoint in the directory is not its own (this
        run's full checkpoints are told apart by the store's run id)."""
        if self.store is not None and self.priority is not None:
            clear_running(self.store.root)

    # -- checkpoints ---------------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        return self.pause_t0 is not None

    def request(self) -> str:
        if self.store is None:
            raise LitzError("this job has no --checkpoint-dir")
        self.requested = True
        return "checkpoint requested"

    def tick(self) -> None:
        """Called after every batch of messages: start, advance or finish a checkpoint."""
        m = self.master
        if self.store is None or not m.started or m.finished:
            return
        if self.next_due is not None and clock.time() >= self.next_due and not self.paused:
            self.requested = True
        if self.next_priority is not None and clock.time() >= self.next_priority and self.priority_round is None:
            self.priority_checkpoint()
        if self.requested and not self.paused:
            self.requested = False
            self.pause_t0 = clock.time()  # from here on, dispatches are held
        if self.paused and self.in_progress is None and m.quiet():
            self.snapshot()

    def snapshot(self) -> None:
        m = self.master
        try:
            seq, tmp = self.store.begin()
        except OSError as exc:
            self.failed(f"cannot create a checkpoint directory: {exc}")
            return
        # one told to retire holds nothing (and moves wait for the checkpoint); it may exit before it answers
        members = [i for i, x in [*m.workers.items(), *m.servers.items()] if not x.retire_sent]
        self.in_progress = {"seq": seq, "tmp": tmp, "parts": {}, "waiting": set(members), "error": None}
        for ident in members:
            m.send(ident, (P.CHECKPOINT, tmp))

    def on_part(self, sender: str, parts: dict | None, error: str | None) -> None:
        cp = self.in_progress
        if cp is None or sender not in cp["waiting"]:
            return
        cp["waiting"].discard(sender)
        if error:
            cp["error"] = error
        else:
            cp["parts"].update(parts)
        if not cp["waiting"]:
            self.finish_snapshot()

    def finish_snapshot(self) -> None:
        m, cp = self.master, self.in_progress
        self.in_progress = None
        if cp["error"]:
            self.store.abort(cp["tmp"])
            self.failed(cp["error"])
            return
        from .checkpoint import write_part

        try:
            parts = dict(cp["parts"])
            parts[DRIVER_PART] = write_part(cp["tmp"], DRIVER_PART, {
                "driver": m.driver, "held": m.held_for_checkpoint(), "next_tid": m.next_tid,
                "version": m.version, "tasks_completed": m.tasks_completed})
            manifest = {"app": m.app.name, "job": m.membership.job, "num_executors": m.num_executors,
                        "num_shards": len(m.shard_owner), "version": m.version,
                        "tasks_completed": m.tasks_completed, "files": parts}
            path = self.store.commit(cp["seq"], cp["tmp"], manifest)
        except Exception as exc:
            self.store.abort(cp["tmp"])
            self.failed(f"writing the checkpoint failed: {exc}")
            return
        self.failures.settle(f", before {os.path.basename(path)} was written")
        pause = clock.time() - self.pause_t0
        m.joblog.event("checkpoint", path=path, seq=cp["seq"], pause_s=round(pause, 4),
                       bytes=sum(p["bytes"] for p in parts.values()), tasks_completed=m.tasks_completed)
        self.resume()

    def priority_checkpoint(self) -> None:
        """SCAR: save the fraction R of all parameter values that changed most; training does not pause. As the
        thesis' checkpoint coordinator (§5.4.3): every server sends a histogram of its values' distances from
        their saved copies, the master finds the global top R and tells each server how many of its farthest
        values to save (litz.scar)."""
        m = self.master
        servers = [i for i, s in m.servers.items() if s.state == "active"]
        if not servers:
            self.schedule_priority()
            return
        self.priority_round = {"t0": clock.time(), "phase": "measure", "waiting": set(servers), "distances": {},
                               "values_saved": 0, "values": 0, "keys_saved": 0, "keys": 0}
        for ident in servers:
            m.send(ident, (P.PRIORITY_CHECKPOINT, self.store.root, self.priority))

    def _round_answer(self, sender: str, phase: str, error: str | None) -> dict | None:
        """The round under way if ``sender``'s answer belongs to its ``phase`` (now counted), else None."""
        r = self.priority_round
        if r is None or r["phase"] != phase or sender not in r["waiting"]:
            return None
        if error:
            warn(error)
        r["waiting"].discard(sender)
        return r

    def on_priority_distances(self, sender: str, distances: Any, error: str | None) -> None:
        r = self._round_answer(sender, "measure", error)
        if r is None:
            return
        r["distances"][sender] = distances
        if not r["waiting"]:
            counts = global_top_counts(r.pop("distances"), self.priority)
            counts = {i: n for i, n in counts.items() if i in self.master.servers}  # not one that left meanwhile
            r["phase"], r["waiting"] = "save", set(counts)
            for ident, count in counts.items():
                self.master.send(ident, (P.PRIORITY_SAVE, self.store.root, count))
            if not counts:
                self.restart_priority_rounds()

    def on_priority_saved(self, sender: str, counts: tuple[int, int, int, int], error: str | None) -> None:
        r = self._round_answer(sender, "save", error)
        if r is None:
            return
        for name, n in zip(("values_saved", "values", "keys_saved", "keys"), counts, strict=True):
            r[name] += n
        if not r["waiting"]:
            self.master.joblog.event("priority_checkpoint", fraction=self.priority, values_saved=r["values_saved"],
                                     values=r["values"], keys_saved=r["keys_saved"], keys=r["keys"],
                                     duration_s=round(clock.time() - r["t0"], 4))
            self.priority_round = None
            self.schedule_priority()

    def schedule_priority(self) -> None:
        """The next priority round is due R x the checkpoint period from now."""
        self.next_priority = clock.time() + self.every * self.priority

    def restart_priority_rounds(self) -> None:
        """A recovery drops the round under way: a lost server never answers it, and the epoch it starts drops
        the survivors' answers. Left waiting, that round stopped every later one for the rest of the job."""
        if self.priority is not None:
            self.priority_round = None
            self.schedule_priority()

    def failed(self, reason: str) -> None:
        """One line for the first failure, which says what a loss would now recover from; repeats (a full
        disk fails every checkpoint) are counted (:class:`RepeatedWarning`). Every one is an event."""
        good = self.store.complete()
        fallback = (f"{os.path.basename(good[0].path)} stays the checkpoint to recover from" if good else
                    "the job has no good checkpoint yet, so a lost process cannot be recovered")
        self.failures.warn(f"checkpoint failed ({fallback}): {reason}", reason)
        self.master.joblog.event("checkpoint_failed", reason=reason)
        self.resume()

    def resume(self) -> None:
        self.pause_t0 = None
        if self.every:
            self.next_due = clock.time() + self.every
        self.master.release_paused()
        self.master.rebalance("scale_out", [])  # processes that joined while dispatch was held

    def abort_in_progress(self) -> None:
        if self.in_progress is not None:
            self.store.abort(self.in_progress["tmp"])
            self.in_progress = None
        self.pause_t0 = None

    # -- recovery ------------------------------------------------------------------------------------
    def usable(self, any_run: bool = False) -> list[Checkpoint]:
        """This job's complete checkpoints, newest first (``any_run``: an earlier run's too, for --resume)."""
        if self.store is None:
            return []
        for path, reason in self.store.skipped():
            warn(f"skipping checkpoint {path}: {reason}")
        return self.store.complete(any_run)

    def recover(self, lost: list[Member], why: str, full: bool = False) -> None:
        """Restore the latest good checkpoint onto the processes still alive (plus replacements). ``full``: never
        partially (the driver was left mid-callback by an interrupted read, docs/design.md D2)."""
        m = self.master
        t0 = clock.time()
        self.restart_priority_rounds()
        # the job's size before the loss: replacements (also for processes lost while recovering) bring it back
        # (a member that was leaving is not replaced)
        size = {role: len([x for x in members.values() if x.state != "draining"])
                for role, members in (("worker", m.workers), ("server", m.servers))} if m.spawn is not None else None
        lost_ids = [x.ident for x in lost]
        noticed = {x.ident: x.noticed for x in lost}
        if self.partial and not full and self.can_recover_partially(lost):
            try:
                self.recover_partially(lost)
                return
            except (CorruptCheckpoint, RestartRecovery, PartialRecoveryRefused) as exc:  # a full one can do it
                warn(f"partial recovery failed ({exc}); restoring the whole job from a full checkpoint")
                m.joblog.event("partial_recovery_failed", lost=lost_ids, reason=str(exc))
                if isinstance(exc, RestartRecovery):
                    lost_ids.extend(exc.lost)
                    noticed.update(exc.noticed)
        checkpoints = self.usable()
        if not checkpoints:
            raise LitzError(f"{why} and there is no checkpoint to recover from"
                            + ("" if self.store else " (run with --checkpoint-dir)"))
        self.abort_in_progress()
        # those a failed partial recovery has not already forgotten and replaced
        self.replace([x for x in lost if x.ident in m.workers or x.ident in m.servers])
        attempts = 0
        while True:
            attempts += 1
            if attempts > 20:
                raise LitzError("recovery keeps failing: giving up")
            ckpt = checkpoints[0]
            try:
                self.restore(ckpt, wait_for=size)
                break
            except RestartRecovery as exc:
                warn(f"{exc}; recovery starts over")
                lost_ids.extend(exc.lost)
                noticed.update(exc.noticed)
                checkpoints = self.usable() or checkpoints
            except CorruptCheckpoint as exc:
                warn(f"checkpoint {ckpt.path} cannot be restored ({exc}); trying the previous one")
                checkpoints = checkpoints[1:]
                if not checkpoints:
                    raise LitzError(f"{why}, and no checkpoint could be restored: {exc}") from None
        m.joblog.event("recovery", checkpoint=ckpt.path, seq=ckpt.seq, lost=lost_ids, noticed=noticed,
                       duration_s=round(clock.time() - t0, 4), tasks_completed=m.tasks_completed)
        m.rebalance("scale_out", [])  # processes that joined while the restore ran

    def restore(self, ckpt: Checkpoint, wait_for: dict[str, int] | None = None) -> None:
        m = self.master
        manifest = ckpt.manifest
        if manifest.get("app") != m.app.name:
            raise LitzError(f"checkpoint {ckpt.path} belongs to app {manifest.get('app')!r}, not {m.app.name!r}")
        if m.num_executors and manifest["num_executors"] != m.num_executors:
            raise LitzError(f"checkpoint {ckpt.path} has {manifest['num_executors']} executors, "
                            f"this job {m.num_executors}")
        m.epoch += 1
        m.reset_for_restore(manifest["num_executors"], manifest["num_shards"])
        self.await_members(wait_for)
        files = manifest["files"]
        servers = sorted(i for i, s in m.servers.items() if s.state == "active") or sorted(m.servers)
        workers = sorted(i for i, w in m.workers.items() if w.state == "active" and w.ready) or sorted(
            i for i, w in m.workers.items() if w.ready)
        if not servers or not workers:
            raise LitzError("no live worker or server left to recover onto")
        n_shards, n_exec = manifest["num_shards"], manifest["num_executors"]
        m.owners.place(workers, servers, n_exec, n_shards)
        m.map_version += 1
        for s in m.servers:  # a server left without shards was never an owner in this map: no fences
            m.last_owned[s] = m.map_version if s in m.shard_owner else -1
        self.restoring = {"waiting": set(m.servers), "error": None}
        for ident in m.servers:
            mine = {s: files[shard_part(s)] for s in range(n_shards) if m.shard_owner[s] == ident}
            m.send(ident, (P.RESTORE, ckpt.path, mine))
        self.await_restored()
        self.restoring = {"waiting": set(m.workers), "error": None}
        for ident in m.workers:
            m.workers[ident].first_map = m.map_version
            mine = {e: files[executor_part(e)] for e in range(n_exec) if m.executor_owner[e] == ident}
            m.send(ident, (P.RESTORE, ckpt.path, mine, m.map_message()))
        self.await_restored()
        self.restoring = None
        try:
            state = ckpt.part(DRIVER_PART)
        except LitzError as exc:
            raise CorruptCheckpoint(str(exc)) from None
        m.restore_driver(state)

    # -- SCAR partial recovery ---------------------------------------------------------------------
    def can_recover_partially(self, lost: list[Member]) -> bool:
        """Only lost servers (executors all alive), nothing moving, a live server left, something to restore."""
        m = self.master
        lost_ids = {x.ident for x in lost}
        return (all(x.role == "server" for x in lost) and not m.moving_executors and not m.copying_input
                and not m.moving_shards
                and any(i not in lost_ids and s.state == "active" for i, s in m.servers.items())
                and (self.priority is not None or bool(self.usable())))

    def recover_partially(self, lost: list[Member]) -> None:
        """Reload only the lost shards (running checkpoint, else the latest full one); keep all else as it is.

        Nothing else stops or starts over: no task is reset or dispatched again, and no message between the
        live processes is dropped (the epoch stays). The live servers load the lost shards; then each worker
        sends what the lost servers never answered (gets, and the parts of update flushes they never
        acknowledged) to the shards' new owners. So a task that has run is never run again on its stateful
        executor, and the live servers apply every update exactly once; only the lost shards go back to the
        checkpoint, as SCAR intends."""
        m = self.master
        t0 = clock.time()
        lost_ids = [x.ident for x in lost]
        if self.priority is not None:
            source, root, files = "running", self.store.root, None
        else:
            ckpt = self.usable()[0]
            source, root, files = "full", ckpt.path, ckpt.manifest["files"]
        # first: completions handled while the shards are reloaded may already have read restored values
        if m.on_partial_recovery({"lost": lost_ids, "source": source, "shards_restored": sum(
                owner in lost_ids for owner in m.shard_owner)}) is False:
            raise PartialRecoveryRefused("the app's driver cannot go on from partly restored parameters")
        held = self.paused
        self.abort_in_progress()
        if held:  # the aborted checkpoint held the driver's new dispatches; nothing else would ever send them
            m.release_paused()
        self.replace(lost)  # a replacement joins later; the balancer then gives it shards
        live = sorted(m.servers)  # all hear of the loss (their forwards to the lost servers change)
        active = [i for i in live if m.servers[i].state == "active"]  # a draining one would move them off again
        lost_shards = m.owners.rehome_shards(lost_ids, active)
        m.map_version += 1
        m.map_dirty = False
        for s in m.servers:
            m.last_owned[s] = m.map_version if s in m.shard_owner else -1
        self.restoring = {"waiting": set(live), "error": None}
        for ident in live:
            mine = {s: (files[shard_part(s)] if files else None) for s in lost_shards if m.shard_owner[s] == ident}
            m.send(ident, (P.RESTORE_SHARDS, source, root, mine, lost_ids, list(m.shard_owner)))
        self.await_restored()
        self.restoring = {"waiting": set(m.workers), "error": None}
        for ident in m.workers:  # after the restores: what a worker sends again must find the restored shards
            m.send(ident, (P.SERVERS_LOST, lost_ids, m.map_message(), live))
        self.await_restored()
        self.restoring = None
        m.joblog.event("partial_recovery", lost=lost_ids, noticed={x.ident: x.noticed for x in lost}, source=source,
                       shards_restored=len(lost_shards), duration_s=round(clock.time() - t0, 4))
        # a replacement that joined meanwhile gets its shards only now: moved mid-recovery, the live server
        # would forward requests the workers are about to send again
        m.rebalance("scale_out", [])

    def replace(self, lost: list[Member]) -> None:
        """Forget the lost processes; a local launcher starts a new one for each."""
        m = self.master
        for member in lost:
            m.forget(member.ident)
            if m.spawn is not None and member.state != "draining":  # it was leaving anyway
                m.spawn(member.role)

    def await_members(self, size: dict[str, int] | None) -> None:
        """Give replacement processes (local launcher, Kubernetes) a moment to join before placing: until the
        job has ``size`` workers and servers again (all workers ready), or a worker and a server at least
        once the wait is over."""
        m = self.master
        if not size:
            return
        deadline = clock.time() + REPLACEMENT_WAIT_S
        while (len(m.workers) < size["worker"] or len(m.servers) < size["server"]
               or any(not w.ready for w in m.workers.values())):
            late = clock.time() - deadline
            if late > 0 and m.servers and any(w.ready for w in m.workers.values()):
                break
            if late > m.start_timeout:
                break  # restore() says what is missing
            m.pump(0.05)
            self.check_lost()

    def await_restored(self) -> None:
        m = self.master
        while self.restoring["waiting"]:
            m.pump(0.1)
            self.check_lost()
            if self.restoring["error"]:
                raise CorruptCheckpoint(self.restoring["error"])

    def check_lost(self) -> None:
        lost = self.master.find_lost()
        if lost:
            self.replace(lost)
            what = ", ".join(f"{x.role} {x.ident}" for x in lost) + " was lost during recovery"
            raise RestartRecovery([x.ident for x in lost], what, {x.ident: x.noticed for x in lost})

    def member_left(self, ident: str) -> None:
        """A draining worker or server retired (exited cleanly): nothing waits for its answer any more. It
        retires only once it holds nothing, so a checkpoint lacks nothing without its part."""
        self.on_restored(ident, None)
        self.on_part(ident, {}, None)  # finishes the snapshot if it was the last one waited for
        r = self.priority_round
        if r is not None and (ident in r["waiting"] or ident in r.get("distances", {})):
            self.restart_priority_rounds()  # its share of the round is gone with it: start the next one afresh

    def on_restored(self, sender: str, error: str | None) -> None:
        if self.restoring is None:
            return
        self.restoring["waiting"].discard(sender)
        if error:
            self.restoring["error"] = error


class CorruptCheckpoint(Exception):
    pass


class PartialRecoveryRefused(Exception):
    """The app's ``handle_partial_recovery`` returned False: only a full recovery keeps its state consistent."""

