"""Test app: every executor's load_input blocks for a minute, so the job is stopped while it loads."""
import os
import time

import litz


class SlowLoadDriver(litz.Driver):
    def dispatch_initial_tasks(self):
        self.finish(None)

    def handle_task_completion(self, result):
        pass


class SlowLoadExecutor(litz.Executor):
    def load_input(self):
        if self.config.get("marker_dir"):  # tell the test this worker is in load_input now
            open(os.path.join(self.config["marker_dir"], f"loading-{os.getpid()}"), "w").close()
        time.sleep(60)

    def run_task(self, args):
        return args
