"""Executor-granular sampling (``sampling=executors`` of apps.kmeans and apps.mlr): which executors' chunks each
mini-batch takes, chosen by the runtime.

App-side logic shared by the apps, not part of the runtime: the runtime only offers the choice
(``Driver.choose_executor``, docs/design.md O2); how a mini-batch is cut into chunks and how many chunks an epoch
has is the apps' business. Each app defines what a chunk is (rows of its partition for k-means, mini-batch steps
for MLR) and runs the task ``("chunk", iteration, epoch, chunk index, chunk size, *extra)``.
"""
from __future__ import annotations

import math

import litz


class ChunkPlan:
    """Which executors' chunks the mini-batches take with ``sampling=executors`` (counters only: it pickles with the
    driver). Each epoch every executor's units (rows, or mini-batches) are shuffled and cut into chunks of
    ``ceil(batch / T)`` units; a mini-batch is ``T`` chunks, each from an executor the runtime picks among those
    with chunks left this epoch (``Driver.choose_executor``: one in memory, on the least loaded worker), so an
    epoch still visits every unit once and, under a memory limit, an executor is loaded about once an epoch
    instead of once a mini-batch. Iteration ``i`` is dispatched once iterations ``<= i - staleness - 1`` have all
    completed, as :class:`litz.ssp.SSP` does. ``extra`` is appended to every task's arguments."""

    def __init__(self, rows: dict[int, int], batch: int, tasks: int, epochs: int, staleness: int,
                 extra: tuple = ()) -> None:
        self.chunk = max(1, math.ceil(batch / tasks))
        self.tasks, self.staleness, self.extra = tasks, staleness, tuple(extra)
        self.chunks = {e: math.ceil(n / self.chunk) for e, n in sorted(rows.items()) if n}
        self.per_epoch = math.ceil(sum(self.chunks.values()) / tasks) if self.chunks else 0
        self.epochs = epochs
        self.iterations = epochs * self.per_epoch
        self.dispatched = self.finished = 0
        self.pending: dict[int, int] = {}
        self.taken: dict[int, int] = {}  # executor -> chunks of the current epoch dispatched

    def start(self, driver: litz.Driver) -> bool:
        """Show the epochs on the driver's progress line and dispatch the first iterations; True when there is
        none to run (``epochs=0``), so the driver goes on to what follows training."""
        driver.set_total(self.epochs, unit="epoch")
        self.advance(driver)
        return self.done

    def advance(self, driver: litz.Driver) -> None:
        """Dispatch every iteration the staleness bound allows now."""
        limit = min(self.iterations, self.finished + self.staleness + 1)
        while self.dispatched < limit:
            it = self.dispatched
            epoch = it // self.per_epoch
            if it % self.per_epoch == 0:
                self.taken = dict.fromkeys(self.chunks, 0)
            self.dispatched += 1
            self.pending[it] = 0
            for _ in range(self.tasks):
                left = [e for e, n in self.chunks.items() if self.taken[e] < n]
                if not left:
                    break
                e = driver.choose_executor(left)
                driver.dispatch_task(e, ("chunk", it, epoch, self.taken[e], self.chunk, *self.extra))
                self.taken[e] += 1
                self.pending[it] += 1

    def complete(self, iteration: int) -> list[int]:
        """One task of ``iteration`` completed: the iterations that finished, in order."""
        self.pending[iteration] -= 1
        newly = []
        while self.pending.get(self.finished) == 0:
            del self.pending[self.finished]
            newly.append(self.finished)
            self.finished += 1
        return newly

    def stop(self) -> None:
        """Dispatch no further iterations (an early stop, as ``SSP.stop``): :attr:`done` once those dispatched
        have finished."""
        self.iterations = self.dispatched

    @property
    def done(self) -> bool:
        return self.finished == self.iterations
