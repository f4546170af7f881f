"""Import a script of bench/ (they import each other as top-level modules) without leaving bench/ on sys.path,
where its module names (``throughput``, ``_table``) would shadow or be shadowed by other tests' imports."""
from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module (its sibling imports resolved while it loads)."""
    sys.path.insert(0, BENCH)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(BENCH)
