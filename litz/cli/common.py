"""Pieces both console scripts share: --config parsing and turning errors into one line."""
from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from ..errors import AppError, LitzError


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
        sys.stderr.write(exc.traceback_text.rstrip() + "\n")
        sys.stderr.write(f"{prog}: {exc} (traceback above); the job was stopped\n")
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
