"""Test app: causal chains of tasks hopping across executors, plus concurrent updates to shared keys.

Chain c runs ``steps`` tasks; step t runs on executor (c + t) % E, reads counter ("chain", c), which
must equal t if every earlier step's update is visible (the consistency rule), then adds 1. Every task
also adds 1 to "total" and a block of ones to arrays of several dtypes, so lost or doubled updates show.
"""
import numpy as np

import litz

DTYPES = ("float32", "float64", "int64", "int32")
SHAPE = (3, 5)


class Chains(litz.Driver):
    def dispatch_initial_tasks(self):
        self.chains = self.config.get("chains", 16)
        self.steps = self.config.get("steps", 40)
        self.violations = []
        self.left = self.chains
        for c in range(self.chains):
            self.dispatch_task(c % self.num_executors, ("step", c, 0))

    def handle_task_completion(self, result):
        if result[0] == "check":
            self.finish({"violations": self.violations, **result[1]})
            return
        _, c, t, seen = result
        if seen != t:
            self.violations.append([c, t, seen])
        if t + 1 < self.steps:
            self.dispatch_task((c + t + 1) % self.num_executors, ("step", c, t + 1))
        else:
            self.left -= 1
            if self.left == 0:
                self.dispatch_task(self.num_executors - 1, ("check",))


class ChainExecutor(litz.Executor):
    def run_task(self, args):
        if args[0] == "check":
            arrays = self.ps_get_many([("arr", d) for d in DTYPES])
            return ("check", {
                "total": self.ps_get("total"),
                "arrays": {d: [str(a.dtype), list(a.shape), float(a.sum())]
                           for d, a in zip(DTYPES, arrays, strict=True)},
                "missing": self.ps_get("never-updated"),
            })
        _, c, t = args
        value = self.ps_get(("chain", c))
        seen = 0 if value is None else int(value)
        self.ps_update(("chain", c), 1)
        self.ps_update("total", 1)
        self.ps_update_many((("arr", d), np.ones(SHAPE, dtype=d)) for d in DTYPES)
        return ("step", c, t, seen)
