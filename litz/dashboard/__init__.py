"""``litzctl dashboard`` and ``litz run --dashboard``: a live web page of a job, running or ended.

The server needs aiohttp and plotly (``pip install 'litz[dashboard]'``), imported only here, when a dashboard is
asked for: Litz itself runs without them.
"""
from __future__ import annotations

import os
import socket
from typing import Any

from ..errors import LitzError

MISSING = "the dashboard needs aiohttp and plotly: pip install 'litz[dashboard]'"


def check_installed() -> None:
    """One line (LitzError) if the dashboard's packages are missing."""
    import importlib.util

    for package in ("aiohttp", "plotly"):
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):  # a broken install, or one blocked in sys.modules
            found = False
        if not found:
            raise LitzError(MISSING)


def serve(kv: Any, name: str | None, *, host: str = "127.0.0.1", port: int = 8265, allow_control: bool = False,
          secret_file: str | None = None, sock: socket.socket | None = None) -> int:
    """Serve the dashboard of job ``name`` (every job's list without it) until interrupted."""
    check_installed()
    from .server import serve_forever

    fd = os.environ.pop("LITZ_DASHBOARD_FD", "")
    if sock is None and fd.isdigit():  # litz run --dashboard: the launcher bound it (a busy port fails the run)
        sock = socket.socket(fileno=int(fd))

    return serve_forever(kv, name, host=host, port=port, allow_control=allow_control, secret_file=secret_file,
                         sock=sock)
