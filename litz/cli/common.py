"""Pieces both console scripts share: --config parsing and turning errors into one line."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from ..errors import AppError, LitzError

if TYPE_CHECKING:
    from ..membership.etcdkv import EtcdOptions

ETCD_ARGS = ("etcd", "etcd_timeout", "etcd_cacert", "etcd_cert", "etcd_key", "etcd_user", "etcd_password_file")


def add_etcd_options(p: argparse.ArgumentParser, etcd_help: str) -> None:
    """--etcd and how to reach it: one or more endpoints, TLS, user and password, how long to ride through an
    outage. Every command that talks to etcd takes the same ones."""
    p.add_argument("--etcd", metavar="HOST:PORT[,HOST:PORT...]", help=etcd_help + "; list every member of an "
                   "etcd cluster to fail over between them")
    g = p.add_argument_group("etcd connection (with --etcd)")
    g.add_argument("--etcd-timeout", type=float, metavar="SECONDS",
                   help="how long to keep going while etcd cannot be reached before giving up (default 300 for "
                   "jobs, 10 for litzctl); the job's data never goes through etcd, so training goes on meanwhile")
    g.add_argument("--etcd-cacert", metavar="FILE", help="CA certificate that signed etcd's (turns TLS on)")
    g.add_argument("--etcd-cert", metavar="FILE", help="client certificate, for etcd's --client-cert-auth")
    g.add_argument("--etcd-key", metavar="FILE", help="the client certificate's private key")
    g.add_argument("--etcd-user", metavar="USER", help="etcd user (etcd auth enabled); the password comes from "
                   "$LITZ_ETCD_PASSWORD or --etcd-password-file, never the command line")
    g.add_argument("--etcd-password-file", metavar="FILE", help="file holding the etcd user's password")


def etcd_options(args: argparse.Namespace, default_timeout: float | None = None) -> EtcdOptions | None:
    """The parsed etcd options (None without --etcd); one line for a bad combination."""
    from ..membership.etcdkv import DEFAULT_TIMEOUT_S, EtcdOptions

    if not args.etcd:
        extra = [f"--{a.replace('_', '-')}" for a in ETCD_ARGS[1:] if getattr(args, a, None) is not None]
        if extra:
            raise LitzError(f"{', '.join(extra)} need(s) --etcd")
        return None
    password = os.environ.get("LITZ_ETCD_PASSWORD")
    if args.etcd_password_file:
        try:
            with open(args.etcd_password_file) as f:
                password = f.read().strip()
        except OSError as exc:
            raise LitzError(f"cannot read {args.etcd_password_file}: {exc.strerror}") from None
    options = EtcdOptions(args.etcd, args.etcd_timeout or default_timeout or DEFAULT_TIMEOUT_S, args.etcd_cacert,
                          args.etcd_cert, args.etcd_key, args.etcd_user, password if args.etcd_user else None,
                          args.etcd_password_file, connect_wait=args.etcd_timeout)
    options.check()
    return options


def parse_config(items: list[str] | None) -> dict:
    """``KEY=VALUE`` pairs; values are JSON-decoded where possible (``3`` -> 3, ``[1,2]`` -> list)."""
    config: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise LitzError(f"bad --config value {item!r}: expected KEY=VALUE")
        try:
            config[key] = json.loads(value)
        except json.JSONDecodeError:
            config[key] = value
    return config


class Parser(argparse.ArgumentParser):
    """argparse that reports bad arguments in one line (plus where to look) instead of a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main_guard(prog: str, body: Callable[[], int | None]) -> int:
    """Run ``body``; bad input and lost processes end with one line on stderr and a non-zero exit."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return body() or 0
    except AppError as exc:
        text = exc.traceback_text.strip()
        traceback_above = "\n" in text  # a one-line reason (a result that cannot be sent) is said once, below
        if traceback_above:
            sys.stderr.write(text + "\n")
        sys.stderr.write(f"{prog}: {exc}{' (traceback above)' if traceback_above else ''}; the job was stopped\n")
        return 1
    except LitzError as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return 2
    except BrokenPipeError:  # output piped into `head` and friends
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        sys.stderr.write(f"\n{prog}: interrupted; all processes stopped\n")
        return 130
