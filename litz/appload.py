"""Finding an app: a dotted module name (resolved from the current directory, like ``python -m``) or a
``.py`` path, defining exactly one :class:`litz.Driver` and one :class:`litz.Executor` subclass."""
from __future__ import annotations

import importlib
import importlib.util
import os
import secrets
import sys
import traceback
import types
import weakref
from dataclasses import dataclass, field
from types import ModuleType

import cloudpickle

from .api import Driver, Executor
from .errors import AppError, LitzError

# The executor class of every app this process loaded, by the app's token. A worker forked from the launcher
# finds the class here and uses it as it is, instead of unpickling its copy (50 ms for apps.hdbscan: numba
# dispatchers are rebuilt one by one); a fresh interpreter or another machine finds nothing and unpickles.
_LOADED: dict[str, type] = {}
# Executor classes pickled in this process at least once: their cloudpickle tracking ids exist (see App).
_PICKLED: weakref.WeakSet = weakref.WeakSet()


def loaded_tokens() -> list[str]:
    """The tokens of the apps this process (or the launcher it was forked from) loaded: a worker says them in
    its HELLO, and the master sends the pickled class only to a worker that lacks the job's."""
    return list(_LOADED)


@dataclass
class App:
    name: str
    module: ModuleType
    driver_cls: type
    executor_cls: type
    token: str = field(init=False)  # random, per load: names this very class object in this process and its forks
    _blob: bytes | None = field(init=False, repr=False)  # read through executor_blob()

    def __post_init__(self) -> None:
        """The first time a process loads a class, its blob is made here, before a launcher forks: pickling gives
        the app's classes cloudpickle's tracking ids, and a fork that inherits them pickles and unpickles
        executors (moves, checkpoints) as instances of the very classes it runs, like the workers that unpickle
        the blob. A launcher that loads the same class again (job after job) has the ids already, and its forked
        workers need no blob (they have the class): it is made only if a worker asks (8 ms for apps.hdbscan)."""
        self._blob = None
        if self.executor_cls not in _PICKLED:
            self.executor_blob()  # also fails here, at load, if the class cannot be pickled
            _PICKLED.add(self.executor_cls)
        self.token = secrets.token_hex(16)
        if len(_LOADED) >= 64:  # a long-lived launcher (a notebook running job after job) keeps the newest
            del _LOADED[next(iter(_LOADED))]
        _LOADED[self.token] = self.executor_cls

    def executor_blob(self) -> bytes:
        """The executor class with the app's code by value: workers need not have the app installed. The
        app's source file names travel with it, since cloudpickle (>= 3.1.3) ships code as ``<dynamic-code>``
        and an app's traceback on a worker must still name its file and line."""
        if self._blob is None:
            root = self.module.__name__
            files = {name: mod.__file__ for name, mod in list(sys.modules.items())
                     if (name == root or name.startswith(root + ".")) and getattr(mod, "__file__", None)}
            self._blob = cloudpickle.dumps((self.executor_cls, files))
        return self._blob


def load_executor_class(blob: bytes | None, token: str | None = None) -> type:
    """The executor class from :meth:`App.executor_blob`, its code objects named after their source files;
    or, in a fork of the process that loaded the app, that process's class itself."""
    cls = _LOADED.get(token) if token else None
    if cls is not None:
        return cls
    if blob is None:
        raise LitzError("the master sent no executor class, and this process has not loaded the app")
    from .kernels import ensure_cache_dir

    ensure_cache_dir()  # the class's module may import numba kernels with cache=True (see load_app)
    cls, files = cloudpickle.loads(blob)
    _restore_filenames(cls, files, set())
    return cls


def _restore_filenames(obj: object, files: dict[str, str], seen: set[int]) -> None:
    """Walk the classes, functions and app submodules reachable from ``obj`` (methods, and the module globals
    they use) and give each function of an app module its file name back."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, (staticmethod, classmethod)):
        _restore_filenames(obj.__func__, files, seen)
    elif isinstance(obj, property):
        for f in (obj.fget, obj.fset, obj.fdel):
            if f is not None:
                _restore_filenames(f, files, seen)
    elif isinstance(obj, type):
        if obj.__module__ in files:
            for value in list(vars(obj).values()):
                _restore_filenames(value, files, seen)
            for base in obj.__bases__:
                _restore_filenames(base, files, seen)
    elif isinstance(obj, types.ModuleType) and obj.__name__ in files:  # ``from . import model`` in the app
        for value in list(vars(obj).values()):
            _restore_filenames(value, files, seen)
    elif isinstance(obj, types.FunctionType) and obj.__module__ in files:
        obj.__code__ = _renamed(obj.__code__, files[obj.__module__])
        for value in list(obj.__globals__.values()):
            _restore_filenames(value, files, seen)


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(_renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    if code.co_filename == filename and consts == code.co_consts:
        return code
    return code.replace(co_filename=filename, co_consts=consts)


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
    from .kernels import ensure_cache_dir

    ensure_cache_dir()  # an app's numba kernels with cache=True fail to import where numba has no writable cache
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
    cloudpickle.register_pickle_by_value(module)  # before the App pickles its blob
    try:
        return App(spec, module, drivers[0], executors[0])
    except Exception:
        raise AppError(f"pickling the executor class of app {spec!r}", traceback.format_exc()) from None
