"""Where an app's own output goes: stdout holds only the job's result, so that ``litz run app > result.json`` and
``| jq`` work. What the app prints (the driver in the master, executors on workers) goes to stderr, each line
prefixed with where it came from: ``[driver]``, ``[w0 e3]`` (worker w0, executor 3), ``[w0]`` (worker code
outside any executor)."""
from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TextIO


class PrefixedLines(io.TextIOBase):
    """A text stream that writes whole lines to ``target``, each behind ``prefix()`` (asked as the line's text is
    written: the executor running then). Partial lines wait for their newline per prefix, so two executors that
    print pieces of lines in turn (tasks switch on parameter fetches) do not mix them; they are written out at
    close."""

    def __init__(self, target: TextIO, prefix: Callable[[], str]):
        super().__init__()
        self._target, self._prefix = target, prefix
        self._partial: dict[str, str] = {}
        self._lock = threading.Lock()  # an app may print from threads of its own

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self._target.isatty()

    def fileno(self) -> int:
        """The target's: what writes to it directly (a subprocess given sys.stdout) lands on stderr, unprefixed."""
        return self._target.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._target, "encoding", "utf-8")

    @property
    def buffer(self) -> object:
        return self._target.buffer

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            prefix = self._prefix()
            *lines, rest = (self._partial.pop(prefix, "") + text).split("\n")
            if rest:
                self._partial[prefix] = rest
            if lines:
                self._target.write("".join(f"{prefix}{line}\n" for line in lines))
                self._target.flush()
        return len(text)

    def flush(self) -> None:
        self._target.flush()

    def close(self) -> None:
        with self._lock:
            partial, self._partial = self._partial, {}
            if partial:
                self._target.write("".join(f"{prefix}{rest}\n" for prefix, rest in partial.items()))
                self._target.flush()
        super().close()


def send_prints_to_stderr(prefix: Callable[[], str]) -> None:
    """In a worker or server process: ``print`` goes to stderr behind ``prefix()``, and whatever writes to
    descriptor 1 itself (C code, a subprocess) goes to stderr too. For good: the process holds no result."""
    sys.stdout.flush()
    with contextlib.suppress(OSError):
        os.dup2(2, 1)
    sys.stdout = PrefixedLines(sys.stderr, prefix)


@contextlib.contextmanager
def result_only_stdout(prefix: str = "[driver] ") -> Iterator[None]:
    """While a job runs in this process (``litz run``, ``litz master``): ``print`` goes to stderr behind
    ``prefix``, and descriptor 1 is stderr's, which the processes started meanwhile inherit (the fork server,
    fresh interpreters). Afterwards stdout is what it was, for the result."""
    sys.stdout.flush()
    try:
        saved: int | None = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no descriptor 1 (closed): nothing of it to keep clean
        saved = None
    before = sys.stdout
    sys.stdout = PrefixedLines(sys.stderr, lambda: prefix)
    try:
        yield
    finally:
        sys.stdout.close()
        sys.stdout = before
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
