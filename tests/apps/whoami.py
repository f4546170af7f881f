"""Test app: every executor reports the facts of the process it runs in (one task each)."""
import os
import sys

import numpy as np

import litz
from litz.forkserver import blas_threads


class WhoAmI(litz.Driver):
    def dispatch_initial_tasks(self):
        self.results = []
        for e in range(self.num_executors):
            self.dispatch_task(e, e)

    def handle_task_completion(self, result):
        self.results.append(result)
        if len(self.results) == self.num_executors:
            self.finish(self.results)


def open_files() -> list[str]:
    """What this process's descriptors above stderr point at (files by path, sockets as socket:[inode])."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if int(fd) > 2:
                targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor
            pass
    return targets


class WhoAmIExecutor(litz.Executor):
    def run_task(self, args):
        with open("/proc/self/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode().strip()
        with open(f"/proc/{os.getppid()}/stat") as f:
            grandparent = int(f.read().rsplit(")", 1)[1].split()[1])
        return {"pid": os.getpid(), "ppid": os.getppid(), "grandparent": grandparent, "cmdline": cmdline,
                "blas_threads": blas_threads(), "secret_set": bool(os.environ.get("LITZ_SECRET")),
                "global_random": int(np.random.randint(2**62)), "open_files": open_files(), "cwd": os.getcwd(),
                "marker": os.environ.get("WHOAMI_MARKER"), "sched_policy": os.sched_getscheduler(0),
                # the class the launcher loaded (a fork), not a copy unpickled from the app's blob
                "launcher_class": type(self) is getattr(sys.modules.get(type(self).__module__), type(self).__name__,
                                                        None)}
