"""Test app: the driver reads parameters itself (docs/design.md, D1 and D2).

Executor tasks add a block of ones to two of ``keys`` counters each. After every completion the driver reads
every counter with ``ps_get_many`` and checks it against what it knows: at least the writes of every task
completed so far (the consistency rule), at most those of every task dispatched. It notes how many servers
the master's map had at each read, so a test can tell that reads went on across shard moves. At the end it
reads every counter once more: each must equal the completed writes exactly.

``kill_marker=PATH``: once a checkpoint exists, the driver kills a server with SIGKILL right before a read and
creates PATH (so the replay after the recovery does not kill again): that read is interrupted (D2).
"""
import os
import signal
import time

import numpy as np

import litz

WIDTH = 3


class Reads(litz.Driver):
    def dispatch_initial_tasks(self):
        self.steps, self.keys = self.config.get("steps", 100), self.config.get("keys", 16)
        self.left = {e: self.steps for e in range(self.num_executors)}
        self.completed, self.dispatched = [0] * self.keys, [0] * self.keys
        self.reads, self.violations, self.servers_seen = 0, [], []
        for e in range(self.num_executors):
            self.send(e, 0)

    def keys_of(self, e, step):
        return sorted({(e * 3 + step) % self.keys, (e * 5 + step * 7 + 1) % self.keys})

    def send(self, e, step):
        ks = self.keys_of(e, step)
        for k in ks:
            self.dispatched[k] += 1
        self.dispatch_task(e, (step, ks))

    def read_all(self):
        values = self.ps_get_many([("c", k) for k in range(self.keys)])
        self.reads += 1
        servers = len(set(self._litz.shard_owner))  # a test app may look at its master: which map it read under
        if not self.servers_seen or self.servers_seen[-1] != servers:
            self.servers_seen.append(servers)
        out = []
        for k, v in enumerate(values):
            if v is not None and (v.flags.writeable or v.shape != (WIDTH,) or not np.all(v == v[0])):
                self.violations.append(f"key {k}: writable, misshapen or torn value {v!r}")
            out.append(0 if v is None else int(v[0]))
        return out

    def maybe_kill_a_server(self):
        marker = self.config.get("kill_marker")
        master = self._litz
        if not marker or os.path.exists(marker) or not any(e["kind"] == "checkpoint" for e in master.joblog.events):
            return
        open(marker, "w").close()
        victim = sorted(master.servers)[0]
        os.kill(master.servers[victim].info["pid"], signal.SIGKILL)

    def handle_task_completion(self, result):
        e, step, ks = result
        for k in ks:
            self.completed[k] += 1
        self.maybe_kill_a_server()
        for k, value in enumerate(self.read_all()):
            if value < self.completed[k]:
                self.violations.append(f"key {k} read {value} after {self.completed[k]} completed writes")
            if value > self.dispatched[k]:
                self.violations.append(f"key {k} read {value}, only {self.dispatched[k]} writes dispatched")
        self.left[e] -= 1
        if self.left[e]:
            self.send(e, step + 1)
        elif not any(self.left.values()):
            self.finish({"reads": self.reads, "violations": self.violations, "final": self.read_all(),
                         "expected": self.completed, "servers_seen": self.servers_seen})


class Counters(litz.Executor):
    def run_task(self, args):
        step, ks = args
        time.sleep(self.config.get("sleep", 0.0))
        self.ps_update_many((("c", k), np.ones(WIDTH, np.int64)) for k in ks)
        return self.executor_id, step, ks
