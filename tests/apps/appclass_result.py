"""Test app: every task's result is an instance of a class the app defines, and the driver uses its method."""
import litz


class Point:
    def __init__(self, x: int):
        self.x = x

    def doubled(self) -> int:
        return 2 * self.x


class PointsDriver(litz.Driver):
    def dispatch_initial_tasks(self):
        self.got = []
        for e in range(self.num_executors):
            self.dispatch_task(e, e)

    def handle_task_completion(self, result):
        self.got.append(result.doubled() if isinstance(result, Point) else repr(result))
        if len(self.got) == self.num_executors:
            self.finish(sorted(self.got, key=str))


class PointsExecutor(litz.Executor):
    def run_task(self, args):
        return Point(args + 1)
