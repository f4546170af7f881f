"""Errors that end a job with one clear line instead of a traceback."""


class LitzError(Exception):
    """A user-facing problem (bad input, unreachable service, lost process): printed as one line."""


class AppError(LitzError):
    """An exception raised by application code; carries the app's own traceback text."""

    def __init__(self, where: str, traceback_text: str):
        super().__init__(f"application error in {where}")
        self.where = where
        self.traceback_text = traceback_text
