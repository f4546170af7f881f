"""An app's Driver and Executors run in this process against a dict parameter server, with no runtime.

Tests of an app's logic use it to explore what the real runtime allows but rarely shows: tasks complete in
a random order, and a task may read the parameter server as of its dispatch (the stalest view the
consistency rule allows) or as of its start (the freshest). Executors can also be serialised and restored
between tasks, as eviction, migration and recovery do. Values are read-only numpy arrays (or numbers), as
the runtime hands them out: an app that writes into one fails here as it would there; updates follow the
servers' dtype rule (litz.cache.add_into).
"""
from __future__ import annotations

import pickle
import random

import numpy as np

from litz.cache import add_into, check_delta


class InProcess:
    """The runtime's driver and executor contexts in one object, completing one task at a time.

    ``view``: "dispatch" reads the parameter server as of the task's dispatch, "run" as of its start.
    ``roundtrip``: before each task, replace its executor by a copy made from its pickled state, either whole
    ("evict", as out-of-core eviction does) or without ``input_attrs`` followed by ``load_input()``
    ("reload", as a move on scale-in or a restore from a checkpoint does).
    ``speeds``: what ``Driver.executor_speed(e)`` returns, a dict executor -> tasks per second or a callable of
    (executor, this runtime), as the master's measure would; None (the default) for every executor, as before
    the first measurement. ``workers``: what ``Driver.num_workers()`` returns (None: not said).
    """

    def __init__(self, driver_cls: type, executor_cls: type, config: dict, num_executors: int, seed: int = 0,
                 view: str = "dispatch", roundtrip: str | None = None, speeds=None, after_task=None,
                 workers: int | None = None) -> None:
        self.rng = random.Random(seed)
        self.workers = workers
        self.view_mode, self.roundtrip, self.speeds, self.after_task = view, roundtrip, speeds, after_task
        self.executor_cls = executor_cls
        self.ps: dict = {}
        self.queue: list[tuple[int, object, dict]] = []
        self.reports: list[dict] = []
        self.result = None
        self.finished = False
        self.config, self.num_executors = config, num_executors
        self.driver = driver_cls.__new__(driver_cls)
        self.driver.config, self.driver.num_executors, self.driver._litz = config, num_executors, self
        self.driver.__init__()
        self.executors = [self._bind(executor_cls.__new__(executor_cls), e) for e in range(num_executors)]
        for ex in self.executors:
            ex.__init__()
            ex.load_input()

    def _bind(self, ex, e: int):
        ex.executor_id, ex.num_executors, ex.config, ex._litz = e, self.num_executors, self.config, self
        return ex

    def _roundtrip(self, ex):
        state = pickle.loads(pickle.dumps(ex.__getstate__()))
        if self.roundtrip == "reload":
            state = {k: v for k, v in state.items() if k not in ex.input_attrs}
        new = self._bind(self.executor_cls.__new__(self.executor_cls), ex.executor_id)
        new.__dict__.update(state)
        if self.roundtrip == "reload":
            new.load_input()
        return new

    # driver context
    def dispatch_task(self, executor: int, args: object) -> None:
        self.queue.append((executor, args, dict(self.ps)))  # values are replaced, never mutated: a snapshot

    def report(self, metrics: dict, t: float) -> None:
        self.reports.append(metrics)

    def finish(self, result: object) -> None:
        self.result, self.finished = result, True

    def executor_speed(self, executor: int) -> float | None:
        if callable(self.speeds):
            return self.speeds(executor, self)
        return None if self.speeds is None else self.speeds.get(executor)

    def num_workers(self) -> int | None:
        return self.workers

    # executor context
    def ps_get(self, key):
        return self.view.get(key)

    def ps_get_many(self, keys: list) -> list:
        return [self.view.get(k) for k in keys]

    def ps_update(self, key, delta) -> None:
        self.log.append((key, delta))

    def ps_update_many(self, items) -> None:
        self.log.extend(items)

    def run(self):
        self.driver.dispatch_initial_tasks()
        while not self.finished:
            executor, args, snapshot = self.queue.pop(self.rng.randrange(len(self.queue)))
            self.view = snapshot if self.view_mode == "dispatch" else self.ps
            self.log: list = []
            if self.roundtrip:  # the executor was evicted (or moved) since its last task
                self.executors[executor] = self._roundtrip(self.executors[executor])
            result = self.executors[executor].run_task(args)
            for key, delta in self.log:
                old = self.ps.get(key)
                if old is None:  # the first update fixes the value's dtype; a number stays a number
                    value = np.array(delta, copy=True) if isinstance(delta, np.ndarray) else delta
                else:  # the servers' rule: into the value's dtype under "same_kind" casting
                    value = add_into(key, old, check_delta(key, delta), in_place=False)
                if isinstance(value, np.ndarray):  # read-only, as the runtime hands values out
                    value.flags.writeable = False
                self.ps[key] = value
            if self.after_task:
                self.after_task(args, self.executors)
            self.driver.handle_task_completion(result)
        assert not self.queue
        return self.result
