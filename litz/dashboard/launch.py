"""``litz run --dashboard [HOST:]PORT``: the job's dashboard, served for the job's lifetime by a child of the
launcher (``litzctl dashboard``, so the page and its checks are the same, and the master's process does none of
the work). The launcher binds the port itself before the job starts, so a busy port fails the run in one line,
and hands the socket to the child."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

from ..errors import LitzError
from . import check_installed


def parse_address(text: str) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[V6]:PORT``; the host defaults to the loopback."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]") if sep else "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise LitzError(f"--dashboard {text}: expected [HOST:]PORT") from None
    if not 0 <= number < 65536:
        raise LitzError(f"--dashboard {text}: no such port")
    return host or "127.0.0.1", number


class LauncherDashboard:
    def __init__(self, address: str, allow_control: bool = False):
        check_installed()
        self.host, port = parse_address(address)
        self.allow_control = allow_control
        try:
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            self.sock = socket.create_server((self.host, port), family=family)
        except OSError as exc:
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            raise LitzError(f"--dashboard {address}: cannot listen there: {why}") from None
        self.port = self.sock.getsockname()[1]
        self.proc: subprocess.Popen | None = None

    def start(self, name: str, home: str, etcd: Any = None) -> None:
        """Serve job ``name``'s page from now on (the master has registered: the page finds it at once)."""
        argv = [sys.executable, "-m", "litz.cli.litzctl"]
        if etcd:
            argv += etcd.argv() if hasattr(etcd, "argv") else ["--etcd", str(etcd)]
        argv += ["--name", name, "dashboard", "--host", self.host, "--port", str(self.port)]
        if self.allow_control:
            argv.append("--allow-control")
        fd = self.sock.fileno()
        env = {**os.environ, "LITZ_HOME": home, "LITZ_DASHBOARD_FD": str(fd),
               "LITZ_DASHBOARD_PARENT": str(os.getpid())}
        # its lines (the address, the token) go to stderr: stdout holds only the job's result
        self.proc = subprocess.Popen(argv, env=env, pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(3.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.sock.close()
