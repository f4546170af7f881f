"""A chain of dependent rounds: each task reads a counter, adds 1, and the next task (on another executor) must
read the new value. Nothing runs in parallel, so each round's time is the runtime's latency from one task's end
to the next task's start with the predecessor's update in hand (``bench/round_latency.py``).

Config: ``rounds`` per pair, ``pairs`` (list of [executor, executor] that alternate: [0, 1] on one worker and
[0, 2] across two with 4 executors on 2 workers), ``ahead`` (k > 0: keep k successors dispatched before their
predecessors complete, each naming the one before in ``after=``; 0: dispatch each task on its predecessor's
completion). Every task checks that it read exactly the count of the tasks before it.
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
        self.ahead = int(self.config.get("ahead", 0))  # successors dispatched before their predecessor completes
        self.records: list[dict] = []
        self.phase = 0
        self._start_phase()

    def _start_phase(self) -> None:
        self.n = self.sent = 0
        self.last = None
        self._send()

    def _send(self) -> None:
        """Keep ``ahead`` tasks dispatched beyond the one the chain waits for, each after the one before."""
        while self.sent < self.rounds and self.sent <= self.n + self.ahead:
            e, args = self.pairs[self.phase][self.sent % 2], (f"count{self.phase}", self.sent)
            if self.ahead and self.last is not None:
                self.last = self.dispatch_task(e, args, after=self.last)
            else:
                self.last = self.dispatch_task(e, args)
            self.sent += 1

    def handle_task_completion(self, result: dict) -> None:
        result["phase"] = self.phase
        self.records.append(result)
        self.n += 1
        if self.n < self.rounds:
            self._send()
            return
        self.phase += 1
        if self.phase < len(self.pairs):
            self._start_phase()
        else:
            self.finish({"records": self.records, "rounds": self.rounds, "pairs": self.pairs, "ahead": self.ahead})


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
