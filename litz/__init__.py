"""Litz: elastic distributed machine learning (thesis ch. 4). See README.md."""
from .api import Driver, Executor
from .errors import AppError, InputError, LitzError
from .local import run

__all__ = ["Driver", "Executor", "run", "LitzError", "InputError", "AppError"]
__version__ = "0.1.0"
