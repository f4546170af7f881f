"""Who is in a job: registration with leases, lost-process detection, the job registry, requests.

:class:`Membership` is written once over a small key-value-with-leases interface (:mod:`.kv`). Local jobs
use :class:`~.filekv.FileKV` (a directory, default ``$LITZ_HOME`` or ``~/.litz``); cluster jobs use etcd.
"""
from __future__ import annotations

from .kv import KV, Lease
from .membership import Membership, connect_kv

__all__ = ["KV", "Lease", "Membership", "connect_kv"]
