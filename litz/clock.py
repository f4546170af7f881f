"""The clocks the core reads: the machine's, or a simulation's.

Master, worker, server, recovery, membership and out-of-core code call ``clock.time()``,
``clock.monotonic()``, ``clock.perf_counter()`` and ``clock.sleep()`` instead of the ``time`` module, so
that :mod:`litz.sim` can run them on simulated time: every heartbeat, lease, grace period and checkpoint
period then follows the simulation's scheduler, a 60 s schedule runs in milliseconds, and a seed replays
exactly. Outside a simulation these names are the ``time`` module's own functions (no extra call).
"""
from __future__ import annotations

import time as _real
from typing import Any

time = _real.time
monotonic = _real.monotonic
perf_counter = _real.perf_counter
thread_time = _real.thread_time
sleep = _real.sleep

_NAMES = ("time", "monotonic", "perf_counter", "thread_time", "sleep")


def install(source: Any) -> None:
    """Read every clock from ``source`` (an object with the five functions) until :func:`restore`."""
    globals().update({name: getattr(source, name) for name in _NAMES})


def restore() -> None:
    """Back to the machine's clocks."""
    install(_real)
