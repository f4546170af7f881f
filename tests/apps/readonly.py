"""Test app: what ``ps_get`` returns is read-only, on every path a value reaches a task.

One executor runs three steps in order on one worker. Each reads "small" (pickled in-band), "big" (an
out-of-band frame) and, at the last step only, "fresh" (written at step 0, fetched from the server then)
and probes each array: (writeable flag, did an in-place write raise ValueError). Step 0 reads the keys
before any update (None, stored live); step 1 reads what the worker's own acknowledged updates made of
them (write-through of a never-written key); step 2 what they made of those (write-through adding). With
``write`` set, step 2 instead does ``v += 1`` on a value and lets the error end the job.
"""
import numpy as np

import litz

KEYS = ("small", "big")


class ReadOnlyDriver(litz.Driver):
    def dispatch_initial_tasks(self):
        self.probes = []
        self.dispatch_task(0, 0)

    def handle_task_completion(self, result):
        step, probes = result
        self.probes += probes
        if step == 2:
            self.finish({"probes": self.probes})
        else:
            self.dispatch_task(0, step + 1)


class ReadOnlyExecutor(litz.Executor):
    def run_task(self, step):
        keys = KEYS + (("fresh",) if step == 2 else ())
        values = self.ps_get_many(keys)
        if step == 2 and self.config.get("write"):
            v = self.ps_get("small")
            v += 1  # must fail: the value is shared with every task on this worker
        probes = []
        for key, v in zip(keys, values, strict=True):
            if v is None:
                continue
            try:
                v += 1
                raised = False
            except ValueError:
                raised = True
            probes.append([step, key, bool(v.flags.writeable), raised])
        self.ps_update("small", np.ones(4))
        self.ps_update("big", np.ones(4096))
        if step == 0:
            self.ps_update("fresh", np.ones(4096))
        return step, probes
