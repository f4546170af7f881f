"""Litz: elastic distributed machine learning (thesis ch. 4). See README.md."""
from typing import Any

from .api import Driver, Executor
from .errors import AppError, InputError, LitzError

__all__ = ["Driver", "Executor", "run", "LitzError", "InputError", "AppError"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``litz.run`` loads the runtime on first use, so tools like litzctl start without numpy and ZeroMQ."""
    if name == "run":
        from .local import run

        return run
    raise AttributeError(f"module 'litz' has no attribute {name!r}")


def __dir__() -> list[str]:
    """``dir(litz)`` and completion list ``run`` too, though it is loaded on first use."""
    return sorted(set(globals()) | set(__all__))
