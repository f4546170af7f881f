"""Cluster jobs: ``litz master`` on one machine, ``litz worker``/``litz server`` on any machines.

The master publishes the job secret in the registry (or uses --secret-file, which every role then needs)
so that joining processes can derive the job's CURVE keys.
"""
from __future__ import annotations

import os
from typing import Any

from .job import resolve_app, run_job
from .membership import Membership, connect_kv
from .roles import job_secret
from .security import new_secret


def run_master(app: Any, name: str, *, etcd: Any, home: str | None = None,
               secret_file: str | None = None, **job: Any) -> Any:
    app = resolve_app(app)
    membership = Membership(connect_kv(etcd, home), name)
    if secret_file or os.environ.get("LITZ_SECRET"):  # every role has it already: keep it out of etcd
        return run_job(app, membership, job_secret(membership, secret_file), **job)
    secret = new_secret()
    # published only once this master has won the job's name, so a refused second master changes nothing
    return run_job(app, membership, secret, on_registered=lambda: membership.put("secret", secret, keep=True),
                   **job)
