"""The application-facing API (thesis Table 4.1; README.md, "An app in twenty lines").

An app subclasses :class:`Driver` (lives in the master) and :class:`Executor` (lives on some worker).
Everything elastic is invisible from here: the runtime binds each object to a context object that
implements the framework-provided methods, and swaps that context when the object moves.

**Progress with a total.** A driver that knows how much work the job is declares it once, naming the metric
it reports the work done under::

    self.set_total(epochs, unit="epoch")   # e.g. in dispatch_initial_tasks
    ...
    self.report(epoch=3, loss=0.41)         # epoch 3 of them done

The progress line then reads ``epoch 3/50  ETA 1m40s`` (the pace since ``set_total`` extrapolated to the rest),
and ``litzctl status --json`` carries ``progress: {unit, done, total, eta_s}``. Call it again to change the total
(a job that stops early on convergence may leave it as an upper bound).
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from . import clock


class Driver:
    """Dispatches micro-tasks to executors and reacts to their completion.

    One object, in the master; its handlers are called one at a time. Set by the runtime before
    :meth:`dispatch_initial_tasks`: ``config``, the job's configuration (``--config KEY=VALUE``, or
    ``litz.run(config=...)``), and ``num_executors``, how many executors the job has (``--executors``).
    """

    config: dict
    num_executors: int
    _litz = None  # bound by the master: litz.master.DriverContext

    # -- defined by the application ------------------------------------------------------------------
    def dispatch_initial_tasks(self) -> None:
        """Called once when the job starts (not again after a recovery): dispatch the first tasks."""
        raise NotImplementedError("the Driver must define dispatch_initial_tasks()")

    def handle_task_completion(self, result: Any) -> None:
        """Called once per completed task with what its ``run_task`` returned (or signalled): dispatch
        what follows, ``report`` progress, ``finish`` when done."""
        raise NotImplementedError("the Driver must define handle_task_completion(result)")

    def handle_partial_recovery(self, info: dict) -> bool | None:
        """Optional. SCAR partial recovery (``--partial-recovery``) is about to reload lost parameter-server
        shards from a checkpoint: their values go back in time while executors and the other shards keep
        theirs. An app whose parameters can be recomputed from executor state recounts them (LDA: the
        word-topic counts from the executors' topic assignments) with tasks it dispatches from here or later;
        they run once the shards are back. ``info``: ``lost`` (process ids), ``source`` ("running" or
        "full"), ``shards_restored``. Tasks already dispatched run on as usual. Return False when the app
        cannot go on from such a mix (HDBSCAN's messages and spanning forests): the job is then restored
        from a full checkpoint instead."""

    def summary(self, result: Any) -> Any:
        """Optional: a short form of ``result`` for the terminal. ``litz run`` and ``litz master`` print it on
        stdout; ``--output`` and ``litz.run()`` keep the whole result. Called after the job on a driver that was
        never set up: it may use ``result`` only. Default: the whole result."""
        return result

    # -- provided by the framework -------------------------------------------------------------------
    def dispatch_task(self, executor: int, args: Any = None, after: int | Iterable[int] | None = None) -> int:
        """Queue a micro-task for ``executor``; it observes every update of every task already completed. Returns
        the task's id. ``after``: ids of earlier tasks, complete or not: the task starts once they have completed and
        observes their updates too (and, transitively, those of the tasks they were dispatched after). Where those
        ran on the task's worker, it starts there as soon as their updates are acknowledged, without a round trip
        through the master (docs/design.md, "Dependent dispatch")."""
        if after is None:  # a stand-in runtime (a test's) may know no after=
            return self._litz.dispatch_task(executor, args)
        return self._litz.dispatch_task(executor, args, after)

    def choose_executor(self, executors: Iterable[int]) -> int:
        """The one of ``executors`` that a task would run on soonest now, for a driver that does not mind which of
        them runs it (a mini-batch from any partition with rows left). Why: under a memory limit a task for a
        spilled executor waits for its load, and a task named for each executor in turn loads every one of them;
        the runtime knows which are in memory and how busy their workers are, the driver does not. Prefers the
        least loaded worker, then an executor in memory, then the least loaded executor, then the lowest number
        (docs/design.md, O2); the worker that holds it may start loading the next candidate meanwhile. Dispatch to
        it with :meth:`dispatch_task` (the choice counts as dispatched only then). A stand-in runtime without
        the choice (a test's) gives the lowest number."""
        chooser = getattr(self._litz, "choose_executor", None)
        if chooser is None:
            return min(executors)
        return chooser(executors)

    def dispatch_task_any(self, executors: Iterable[int], args: Any = None) -> int:
        """Queue a micro-task with ``args`` for one of ``executors``, chosen as :meth:`choose_executor` does, and
        return that executor. The task is then an ordinary task of that executor: it sees every update of every
        task completed before this call."""
        executor = self.choose_executor(executors)
        self.dispatch_task(executor, args)
        return executor

    def ps_get(self, key: Hashable) -> Any:
        """The value of ``key`` (read-only numpy array or number), or None if never updated. It holds every update
        of every task whose completion the driver has seen; the driver only reads (docs/design.md, D1). A loss
        while it waits rolls the job back to its last checkpoint, whose driver reads again (D2)."""
        return self._litz.driver_get_many([key])[0]

    def ps_get_many(self, keys: Iterable[Hashable]) -> list:
        """:meth:`ps_get` of several keys, asked of their servers at once."""
        return self._litz.driver_get_many(list(keys))

    def report(self, **metrics: Any) -> None:
        """Record progress (objective, epoch, ...) with a timestamp; shown in the progress line and --metrics."""
        self._litz.report(metrics, clock.time())

    def set_total(self, total: float, unit: str) -> None:
        """Declare the job's total work: ``total`` units, counted by the metric ``unit`` that :meth:`report`
        gives as the units done so far (see the module's docstring). Shows ``unit done/total`` and an ETA. A
        stand-in runtime without a progress line (a test's, a benchmark's) may leave it out: then it does nothing."""
        setter = getattr(self._litz, "set_total", None)
        if setter is not None:
            setter(total, unit)

    def finish(self, result: Any = None) -> None:
        """End the job; ``result`` must be JSON-serialisable."""
        self._litz.finish(result)

    def executor_speed(self, executor: int) -> float | None:
        """How fast ``executor``'s tasks run now, in tasks per second, or None while that is not known.

        Why: an app that sizes work by speed, as LB-BSP does (``x_i = v_i / sum(v) * X``: executor ``i`` gets that
        share of the ``X`` units of an iteration), needs each executor's speed, and only the runtime sees where
        executors run and how fast those workers are. The value is the executor's share of its worker's measured
        throughput: the worker's speed (the one ``--placement speed`` follows and ``litzctl status`` shows: tasks
        per second of the worker's running time, a CPU quota's throttling and a neighbour's turns included,
        smoothed over a few seconds) divided by the executors the worker holds; an executor on its way to another
        worker counts there. None before that worker has reported enough tasks (at the start, for a worker that
        just joined or replaced a lost one) and in a runtime that does not measure (a test's stand-in).

        It counts tasks, not work: a worker whose tasks are twice as big shows half the speed. An app that sizes
        its tasks should multiply by the work per task of the executor's recent tasks (units per second), which
        stays put when the sizes change (``apps.mlr``'s ``size_by_speed``). Cheap, and safe to call at any time."""
        getter = getattr(self._litz, "executor_speed", None)
        return None if getter is None else getter(executor)

    def num_workers(self) -> int | None:
        """How many workers the job has now, draining ones not counted; None in a runtime that does not say.

        Why: an app whose parallelism is fixed by its own data layout (LDA's vocabulary blocks: at most one task
        per block runs at a time) needs at least as many such units as there are workers to keep them busy, and
        only the runtime knows how many there are. It changes as the job scales: read it when deciding, do not
        keep it. Cheap."""
        getter = getattr(self._litz, "num_workers", None)
        return None if getter is None else getter()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_litz", None)
        return state


class Executor:
    """A logical unit of input data and state; the runtime maps executors onto worker processes.

    Set by the runtime before :meth:`load_input`, and kept when the executor moves: ``executor_id``, its
    number ``0 .. num_executors - 1`` (what ``Driver.dispatch_task`` names), ``num_executors`` and
    ``config`` (as the driver's). Attributes named in ``input_attrs`` are input data, re-created by
    ``load_input`` and never checkpointed; every other attribute is state, checkpointed and moved.
    """

    input_attrs: tuple = ()
    executor_id: int
    num_executors: int
    config: dict
    _litz = None  # bound by the worker: litz.worker.ExecutorContext

    # -- defined by the application ------------------------------------------------------------------
    def load_input(self) -> None:
        """Load this executor's partition of the input (shared storage or a generator)."""

    def run_task(self, args: Any) -> Any:
        """Run one micro-task with the ``args`` it was dispatched with; the return value goes to the driver's
        ``handle_task_completion`` once the task's updates are on the servers."""
        raise NotImplementedError("the Executor must define run_task(args)")

    # -- provided by the framework -------------------------------------------------------------------
    def ps_get(self, key: Hashable) -> Any:
        """The value of ``key`` (read-only numpy array or number), or None if never updated. The array is
        shared with every task on the worker: writing into it raises ValueError (copy it to modify it)."""
        return self._litz.ps_get(key)

    def ps_get_many(self, keys: Iterable[Hashable]) -> list:
        """The values of ``keys``, in order, as :meth:`ps_get` gives them; fetched together, so one round trip
        per server instead of one per key."""
        return self._litz.ps_get_many(list(keys))

    def ps_update(self, key: Hashable, delta: Any) -> None:
        """Add ``delta`` (a number or numpy array) to the value of ``key`` (a missing key starts at zero).

        The first update of a key fixes its dtype and shape. Later deltas to an array value are added into
        its dtype under numpy's "same_kind" casting (NEP 50 for Python scalars): an int delta into a float
        value, or float64 into float32, is fine; a float delta into an int value is refused with an error
        naming the key and both dtypes, which fails the job. Numbers as values follow ordinary arithmetic."""
        self._litz.ps_update(key, delta)

    def ps_update_many(self, items: Iterable[tuple]) -> None:
        """:meth:`ps_update` for each ``(key, delta)`` pair of ``items``."""
        self._litz.ps_update_many(items)

    def signal_task_completion(self, result: Any = None) -> None:
        """Make ``result`` the running micro-task's result (sent when the task ends); its return value is then
        ignored."""
        self._litz.signal_task_completion(result)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_litz", None)
        return state


def held_input(executor: Any) -> dict[str, Any]:
    """The input data ``executor`` holds now, by attribute: from the object itself, since an app's own
    ``__getstate__`` may leave its input out (as for a checkpoint)."""
    held = getattr(executor, "__dict__", {})
    return {a: held[a] for a in getattr(executor, "input_attrs", ()) if a in held}
