"""Finding an app: a dotted module name (resolved from the current directory, like ``python -m``) or a
``.py`` path, defining exactly one :class:`litz.Driver` and one :class:`litz.Executor` subclass."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from dataclasses import dataclass
from types import ModuleType

import cloudpickle

from .api import Driver, Executor
from .errors import AppError, LitzError


@dataclass
class App:
    name: str
    module: ModuleType
    driver_cls: type
    executor_cls: type

    def executor_blob(self) -> bytes:
        """The executor class with the app's code by value: workers need not have the app installed."""
        return cloudpickle.dumps(self.executor_cls)


def _import(spec: str) -> ModuleType:
    if spec.endswith(".py") or os.sep in spec:
        path = os.path.abspath(spec)
        if not os.path.isfile(path):
            raise LitzError(f"unknown app {spec!r}: no such file")
        name = "litz_app_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        mod_spec.loader.exec_module(module)
        return module
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        if exc.name and (spec == exc.name or spec.startswith(exc.name + ".")):
            raise LitzError(f"unknown app {spec!r}: no module named {exc.name!r}") from None
        raise


def load_app(spec: str) -> App:
    try:
        module = _import(spec)
    except LitzError:
        raise
    except SyntaxError as exc:
        raise LitzError(f"syntax error in app {spec!r}: {exc.filename}:{exc.lineno}: {exc.msg}") from None
    except Exception:
        raise AppError(f"importing app {spec!r}", traceback.format_exc()) from None
    classes = {v for v in vars(module).values() if isinstance(v, type)}
    drivers = sorted((c for c in classes if issubclass(c, Driver) and c is not Driver), key=lambda c: c.__name__)
    executors = sorted((c for c in classes if issubclass(c, Executor) and c is not Executor),
                       key=lambda c: c.__name__)
    for kind, found in (("Driver", drivers), ("Executor", executors)):
        if len(found) != 1:
            names = ", ".join(c.__name__ for c in found) or "none"
            raise LitzError(f"app {spec!r} must define exactly one litz.{kind} subclass (found: {names})")
    cloudpickle.register_pickle_by_value(module)
    return App(spec, module, drivers[0], executors[0])
