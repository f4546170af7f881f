"""A chain of dependent rounds: each task reads a counter, adds 1, and the next task (on another executor) must
read the new value. Nothing runs in parallel, so each round's time is the runtime's latency from one task's end
to the next task's start with the predecessor's update in hand (``bench/round_latency.py``).

Config: ``rounds`` per pair, ``pairs`` (list of [executor, executor] that alternate: [0, 1] on one worker and
[0, 2] across two with 4 executors on 2 workers), ``ahead`` (1: dispatch each successor before its predecessor
completes, naming it in ``after=``). Every task checks that it read exactly the count of the tasks before it.
The result holds one record per task: executor, timestamps in the task (``time.perf_counter``, one clock for
every process of the machine) and any runtime trace records of its worker (:mod:`round_latency` installs them).
"""
from __future__ import annotations

import sys
import time

import litz

TRACE_MODULE = "litz_round_trace"  # set up by bench/round_latency.py in the launcher, inherited by forks


class ChainDriver(litz.Driver):
    def dispatch_initial_tasks(self) -> None:
        self.rounds = int(self.config.get("rounds", 500))
        self.pairs = [tuple(p) for p in self.config.get("pairs", [[0, 1], [0, 2]])]
        self.ahead = bool(self.config.get("ahead", 0))
        self.records: list[dict] = []
        self.phase, self.n = 0, 0
        self._start_phase()

    def _key(self) -> str:
        return f"count{self.phase}"

    def _args(self, n: int) -> tuple:
        return self._key(), n

    def _executor(self, n: int) -> int:
        return self.pairs[self.phase][n % 2]

    def _start_phase(self) -> None:
        self.n = 0
        self.last = self.dispatch_task(self._executor(0), self._args(0))
        if self.ahead:  # the successor goes out at once, waiting on the worker for its predecessor's flush
            self.last = self.dispatch_task(self._executor(1), self._args(1), after=self.last)

    def handle_task_completion(self, result: dict) -> None:
        result["phase"] = self.phase
        self.records.append(result)
        self.n += 1
        if self.n == self.rounds:
            self.phase += 1
            if self.phase == len(self.pairs):
                self.finish({"records": self.records, "rounds": self.rounds, "pairs": self.pairs,
                             "ahead": self.ahead})
                return
            self._start_phase()
            return
        nxt = self.n + 1 if self.ahead else self.n
        if nxt < self.rounds:
            if self.ahead:
                self.last = self.dispatch_task(self._executor(nxt), self._args(nxt), after=self.last)
            else:
                self.dispatch_task(self._executor(nxt), self._args(nxt))


class ChainExecutor(litz.Executor):
    def run_task(self, args: tuple) -> dict:
        t_start = time.perf_counter()
        key, n = args
        value = self.ps_get(key)
        t_fetched = time.perf_counter()
        seen = 0 if value is None else int(value)
        if seen != n:
            raise RuntimeError(f"round {n} of {key} read {seen}: an earlier round's update is missing")
        self.ps_update(key, 1)
        trace = sys.modules.get(TRACE_MODULE)
        records = trace.take() if trace is not None else []
        return {"executor": self.executor_id, "key": key, "n": n, "t_start": t_start, "t_fetched": t_fetched,
                "t_end": time.perf_counter(), "trace": records}
