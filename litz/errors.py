"""Errors that end a job with one clear line instead of a traceback."""
import contextlib
import time
import traceback
from collections.abc import Iterator

from . import clock


class LitzError(Exception):
    """A user-facing problem (bad input, unreachable service, lost process): printed as one line."""


class RegistryUnavailable(LitzError):
    """The registry (etcd) cannot be reached now; ``since``: when calls began to fail (docs/design.md, R1)."""

    def __init__(self, where: str, since: float, why: str = ""):
        self.since = since
        when = time.strftime("%H:%M:%S", time.localtime(since))
        super().__init__(f"etcd at {where} unreachable since {when} ({clock.time() - since:.0f} s)"
                         + (f": {why}" if why else ""))

    @property
    def down_for(self) -> float:
        return clock.time() - self.since

    def gave_up(self, who: str = "") -> LitzError:
        """The error a process ends with once it has waited ``--etcd-timeout`` for the registry."""
        return LitzError(f"{who}{self}; gave up (--etcd-timeout)")


class InputError(LitzError):
    """Raised by apps for bad input (missing file, malformed line, bad config value): one line, no traceback."""


class AppError(LitzError):
    """An exception raised by application code; carries the app's own traceback text."""

    def __init__(self, where: str, traceback_text: str):
        lines = [ln for ln in traceback_text.strip().splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else "error"
        super().__init__(f"application error in {where}: {last}")
        self.where = where
        self.traceback_text = traceback_text


@contextlib.contextmanager
def app_code(where: str) -> Iterator[None]:
    """Around a call into the app: its InputError passes as it is, any other exception becomes an AppError."""
    try:
        yield
    except InputError:
        raise
    except Exception:
        raise AppError(where, traceback.format_exc()) from None


def describe_app_exception(where: str, exc: BaseException) -> tuple[str, str]:
    """(where, text) for a FAIL message: an InputError travels as its message alone, others with a traceback (an
    AppError with the app's own, and where it said)."""
    if isinstance(exc, AppError):
        return exc.where, exc.traceback_text
    if isinstance(exc, InputError):
        return where, f"{INPUT_ERROR_MARK}{exc}"
    return where, traceback.format_exc()


INPUT_ERROR_MARK = "litz-input-error: "


def app_error(where: str, text: str) -> LitzError:
    """The exception the master raises for a FAIL message."""
    if text.startswith(INPUT_ERROR_MARK):
        return InputError(text[len(INPUT_ERROR_MARK):])
    return AppError(where, text)
