"""Cluster jobs: ``litz master`` on one machine, ``litz worker``/``litz server`` on any machines.

The master publishes the job secret in the registry (or uses --secret-file, which every role and litzctl then
need) so that joining processes can derive the job's CURVE keys, and litzctl can sign its requests.
"""
from __future__ import annotations

import os
from typing import Any

from .job import resolve_app, run_job
from .membership import Membership, connect_kv
from .roles import job_secret
from .security import new_secret


def run_master(app: Any, name: str, *, etcd: Any, home: str | None = None, secret_file: str | None = None,
               driver: str | None = None, executor: str | None = None, **job: Any) -> Any:
    """Run a cluster job's master. Given a secret (--secret-file or $LITZ_SECRET), every role and litzctl need
    it too and it stays out of the registry; else a new one is published there."""
    app = resolve_app(app, driver, executor)
    membership = Membership(connect_kv(etcd, home), name)
    if secret_file or os.environ.get("LITZ_SECRET"):  # every role has it already: keep it out of etcd
        return run_job(app, membership, job_secret(membership, secret_file), home=home, **job)
    return run_job(app, membership, new_secret(), publish_secret=True, home=home, **job)
