"""Errors that end a job with one clear line instead of a traceback."""


class LitzError(Exception):
    """A user-facing problem (bad input, unreachable service, lost process): printed as one line."""


class AppError(LitzError):
    """An exception raised by application code; carries the app's own traceback text."""

    def __init__(self, where: str, traceback_text: str):
        lines = [ln for ln in traceback_text.strip().splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else "error"
        super().__init__(f"application error in {where}: {last}")
        self.where = where
        self.traceback_text = traceback_text
