"""Deterministic simulation of a whole Litz job in one process.

The real :class:`~litz.master.Master`, :class:`~litz.worker.Worker` and :class:`~litz.server.Server` and the
real app API run as greenlets over a simulated carrier (``sim://``, :mod:`litz.sim.world`) on simulated time
(:mod:`litz.clock`), driven by a seeded scheduler. A seed fixes the job, its elasticity and faults (scale out
and in, drains, kill -9, checkpoints, memory limits) and the order of every message across connections, so a
failing seed replays exactly: ``python -m litz.sim --seed S --seeds 1``. See :mod:`litz.sim.schedule` for
what runs and what is checked.
"""
from __future__ import annotations

from .schedule import EVENTS, Outcome, Plan, plan, run_schedule

__all__ = ["EVENTS", "Outcome", "Plan", "plan", "run_schedule"]
