"""How a test checks that a failure says one clear line (the project's rule for errors)."""
from __future__ import annotations

import subprocess


def error_lines(stderr: str) -> list[str]:
    """The non-blank lines of ``stderr``."""
    return [ln for ln in stderr.strip().splitlines() if ln.strip()]


def assert_one_line(res: subprocess.CompletedProcess, *parts: str, code: int | None = 2) -> str:
    """``res`` failed (with exit status ``code``, any non-zero one if None) saying exactly one line on stderr,
    no traceback, and that line holds every one of ``parts``; returns the line."""
    if code is None:
        assert res.returncode != 0, res.stderr
    else:
        assert res.returncode == code, (res.returncode, res.stderr)
    lines = error_lines(res.stderr)
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]
