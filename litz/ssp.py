"""Stale Synchronous Parallel (SSP) scheduling for a Driver (thesis §4.2.1, §4.4).

Litz has no consistency knob: an app gets SSP by *when* it dispatches. With staleness ``s``, all tasks of
iteration ``i`` are dispatched when the last task of iteration ``i - s - 1`` completes (iterations
``0..s`` at start). The runtime's consistency rule then guarantees that a task of iteration ``i`` observes
every update of iterations ``<= i - s - 1`` and possibly some of the later ones: the SSP bound. All tasks of
one iteration are dispatched at the same moment, so they share one version and hence cached parameter
values. ``s = 0`` is Bulk Synchronous Parallel.

Iterations may finish out of order (iteration 3 can end before iteration 2). We count an iteration as
*finished* only once it and every earlier iteration have completed, and dispatch iteration ``i`` once
iterations ``0..i-s-1`` are all finished: otherwise a fast iteration could pull the dispatch frontier more
than ``s`` iterations ahead of a slow one. Finished iterations are reported in order, which is what a
driver wants for per-epoch metrics.

The helper keeps only counters, so it pickles with the driver (checkpoints, migration).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol


class _Dispatcher(Protocol):
    num_executors: int

    def dispatch_task(self, executor: int, args: Any = None) -> None: ...


def iteration_only(iteration: int, executor: int) -> int:
    """Default task arguments: just the iteration number (module-level so it pickles by reference)."""
    return iteration


class SSP:
    """Dispatch ``iterations`` rounds of one task per executor with staleness bound ``staleness``.

    Call :meth:`start` from ``dispatch_initial_tasks`` and :meth:`complete` from ``handle_task_completion``
    with the iteration of the completed task. Tasks are dispatched through ``driver.dispatch_task`` only,
    with ``task_args(iteration, executor)`` as arguments.
    """

    def __init__(
        self,
        driver: _Dispatcher,
        staleness: int,
        iterations: int,
        executors: Sequence[int] | None = None,
        task_args: Callable[[int, int], Any] = iteration_only,
    ) -> None:
        if int(staleness) != staleness or staleness < 0:
            raise ValueError(f"SSP staleness must be a non-negative integer, got {staleness!r}")
        if int(iterations) != iterations or iterations < 0:
            raise ValueError(f"SSP iterations must be a non-negative integer, got {iterations!r}")
        self.driver = driver
        self.staleness = int(staleness)
        self.iterations = int(iterations)
        self.executors = list(range(driver.num_executors) if executors is None else executors)
        if not self.executors and self.iterations:
            raise ValueError("SSP needs at least one executor")
        self.task_args = task_args
        self._dispatched = 0  # iterations 0.._dispatched-1 have been dispatched
        self._finished = 0  # iterations 0.._finished-1 have fully completed
        self._pending: dict[int, int] = {}  # dispatched, unfinished iteration -> tasks still running

    def start(self) -> None:
        """Dispatch iterations ``0..staleness`` (call once, from ``dispatch_initial_tasks``)."""
        if self._dispatched:
            raise RuntimeError("SSP.start() called twice")
        self._advance()

    def complete(self, iteration: int) -> list[int]:
        """Record completion of one task of ``iteration``; return the iterations that just finished (in
        order), after dispatching the iterations this unblocks."""
        left = self._pending.get(iteration)
        if left is None or left == 0:
            raise ValueError(f"SSP: unexpected completion of iteration {iteration!r} "
                             f"(dispatched 0..{self._dispatched - 1}, finished 0..{self._finished - 1})")
        self._pending[iteration] = left - 1
        newly: list[int] = []
        while self._pending.get(self._finished) == 0:
            del self._pending[self._finished]
            newly.append(self._finished)
            self._finished += 1
        if newly:
            self._advance()
        return newly

    def stop(self) -> None:
        """Dispatch no further iterations (an early stop): :attr:`done` once those dispatched have finished.

        Their tasks are still running and their updates still land, so a driver that evaluates once
        ``done`` sees every one of them (the consistency rule)."""
        self.iterations = self._dispatched

    def _advance(self) -> None:
        limit = min(self.iterations, self._finished + self.staleness + 1)
        while self._dispatched < limit:
            it = self._dispatched
            self._dispatched += 1
            self._pending[it] = len(self.executors)
            for executor in self.executors:
                self.driver.dispatch_task(executor, self.task_args(it, executor))

    @property
    def finished_iterations(self) -> int:
        """How many iterations (a prefix 0..n-1) have fully completed."""
        return self._finished

    @property
    def dispatched_iterations(self) -> int:
        """How many iterations (a prefix 0..n-1) have been dispatched."""
        return self._dispatched

    @property
    def done(self) -> bool:
        """True once every task of every iteration has completed."""
        return self._finished == self.iterations
