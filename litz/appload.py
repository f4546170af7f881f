"""Finding an app: a dotted module name (resolved from the current directory, like ``python -m``), a ``.py``
path (``.py`` may be left out) or a package directory, and in it the :class:`litz.Driver` and
:class:`litz.Executor` subclasses to run: the most derived ones, or those named."""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import pickle
import pkgutil
import secrets
import sys
import traceback
import types
import weakref
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import cloudpickle

from .api import Driver, Executor
from .errors import AppError, LitzError, app_code
from .joblog import check_json

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
    paths: list[str] = field(default_factory=list)  # put on sys.path wherever the executor class is loaded
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

    def config_keys(self) -> list[str] | None:
        """The ``--config`` keys the app declares: ``config_keys`` on its driver class, else the keys of a ``CONFIG``
        dict in its module; None if it declares none (bundled apps check theirs themselves, litz.appconfig)."""
        keys = getattr(self.driver_cls, "config_keys", None)
        if keys is None and isinstance(getattr(self.module, "CONFIG", None), dict):
            keys = self.module.CONFIG
        return None if keys is None else [str(k) for k in keys]

    def config_warning(self, config: dict | None) -> str | None:
        """A warning naming the keys of ``config`` the app does not declare (a typo), with the ones it does."""
        known = self.config_keys()
        unknown = sorted(set(config or ()) - set(known or ()))
        if known is None or not unknown:
            return None
        return (f"unknown config key(s) {', '.join(map(repr, unknown))} for app {self.name!r} "
                f"(known: {', '.join(known) or 'none'})")

    def summary(self, result: Any) -> Any:
        """The driver's short form of a finished job's ``result`` for the terminal (:meth:`litz.Driver.summary`);
        a stopped job's null stays null."""
        if result is None:
            return None
        with app_code("driver summary"):
            return check_json(self.driver_cls.__new__(self.driver_cls).summary(result), "summary() result")

    def executor_blob(self) -> bytes:
        """The executor class with the app's code by value: workers need not have the app installed. The
        app's source file names travel with it, since cloudpickle (>= 3.1.3) ships code as ``<dynamic-code>``
        and an app's traceback on a worker must still name its file and line."""
        if self._blob is None:
            root = self.module.__name__
            files = {name: mod.__file__ for name, mod in list(sys.modules.items())
                     if (name == root or name.startswith(root + ".")) and getattr(mod, "__file__", None)}
            # the search paths first, in a pickle of their own: the class's imports need them as it unpickles
            self._blob = pickle.dumps((self.paths, cloudpickle.dumps((self.executor_cls, files))))
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
    paths, inner = pickle.loads(blob)
    for path in reversed(paths):
        _add_search_path(path)
    cls, files = cloudpickle.loads(inner)
    _restore_filenames(cls, files, set())
    return cls


def import_app(paths: list[str], module: str) -> None:
    """Import the app's ``module`` from its file into this process, as :func:`load_executor_class` prepares for it
    (its search paths first, numba's cache directory set): a fresh fork server does, so that its forks inherit the
    app and the kernels it preloads. A module that fails to import is left to the process that needs it, which
    imports it again and reports why."""
    if module in sys.modules:
        return
    from .kernels import ensure_cache_dir

    ensure_cache_dir()
    for path in reversed(paths):
        _add_search_path(path)
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - reported where the app is needed
        sys.modules.pop(module, None)


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


def _add_search_path(path: str) -> None:
    """Put ``path`` first on ``sys.path``, as ``python script.py`` does for the script's directory."""
    if path not in sys.path:
        sys.path.insert(0, path)


def _package_root(directory: str) -> tuple[str, str]:
    """(the directory to put on sys.path, the dotted name) for a package directory, whose parents may be
    packages too (``apps/mlr`` -> the directory holding ``apps``, ``apps.mlr``)."""
    parts = []
    while os.path.isfile(os.path.join(directory, "__init__.py")):
        directory, name = os.path.split(directory)
        parts.append(name)
    return directory, ".".join(reversed(parts))


def _close(name: str, candidates: list[str]) -> str:
    """' (did you mean X?)' for the candidate nearest a mistyped name, or nothing."""
    match = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return f" (did you mean {match[0]}?)" if match else ""


def _module_names(spec: str) -> list[str]:
    """Module names a mistyped ``spec`` may have meant: the bundled apps, what the current directory holds, and
    the modules of the package it names."""
    names = [m.name for m in pkgutil.iter_modules([os.getcwd()])]
    for package in {"apps", spec.rpartition(".")[0]} - {""}:
        try:
            path = importlib.import_module(package).__path__
        except Exception:  # not a package, or one that cannot be imported: nothing to suggest from it
            continue
        names += [f"{package}.{m.name}" for m in pkgutil.iter_modules(path)]
    return names


def _import(spec: str) -> tuple[ModuleType, list[str]]:
    """The app's module, and the directories its imports are found in (every process of the job gets them on
    ``sys.path``): a ``.py`` file's own directory, so it can import a module next to it; the current directory
    for a module name; the parent of a package directory's top package."""
    path = os.path.abspath(spec)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "__init__.py")):
            raise LitzError(f"unknown app {spec!r}: a directory, but not a package (no __init__.py)")
        root, dotted = _package_root(path)
        _add_search_path(root)
        return importlib.import_module(dotted), [root]
    if not spec.endswith(".py") and os.path.isfile(path + ".py"):
        path, spec = path + ".py", spec + ".py"
    if spec.endswith(".py") or "/" in spec or os.sep in spec:
        if not os.path.isfile(path):
            folder = os.path.dirname(path)
            files = os.listdir(folder) if os.path.isdir(folder) else []
            near = difflib.get_close_matches(os.path.basename(path), [f for f in files if f.endswith(".py")], 1, 0.6)
            guess = f" (did you mean {os.path.join(os.path.dirname(spec), near[0])}?)" if near else ""
            raise LitzError(f"unknown app {spec!r}: no such file{guess}")
        folder = os.path.dirname(path)
        _add_search_path(folder)
        name = "litz_app_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        mod_spec.loader.exec_module(module)
        return module, [folder]
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(spec), [cwd]
    except ModuleNotFoundError as exc:
        if exc.name and (spec == exc.name or spec.startswith(exc.name + ".")):
            raise LitzError(f"unknown app {spec!r}: no module named {exc.name!r}{_close(spec, _module_names(spec))}"
                            ) from None
        raise


# What an app's class must define to be the one the job runs (a base class of the app's own need not).
_REQUIRED = {Driver: ("dispatch_initial_tasks", "handle_task_completion"), Executor: ("run_task",)}


def _pick(module: ModuleType, spec: str, base: type, name: str | None, option: str) -> type:
    """The app's ``base`` subclass: the one named ``name``, else the most derived of the concrete ones defined or
    imported in the module (a class another one subclasses is its base, not a candidate)."""
    kind = f"litz.{base.__name__}"
    found = sorted({v for v in vars(module).values() if isinstance(v, type) and issubclass(v, base) and v is not base},
                   key=lambda c: c.__name__)
    if name is not None:
        named = [c for c in found if name in (c.__name__, c.__qualname__)]
        if not named:
            raise LitzError(f"app {spec!r} has no {kind} subclass named {name!r} "
                            f"(found: {', '.join(c.__name__ for c in found) or 'none'})")
        return named[0]
    concrete = [c for c in found if not inspect.isabstract(c)
                and all(getattr(c, m) is not getattr(base, m) for m in _REQUIRED[base])]
    leaves = [c for c in concrete if not any(o is not c and issubclass(o, c) for o in concrete)]
    if len(leaves) == 1:
        return leaves[0]
    if not leaves:
        missing = f"; {', '.join(c.__name__ for c in found)} define(s) no {' or '.join(_REQUIRED[base])}" \
            if found else ""
        raise LitzError(f"app {spec!r} must define or import a {kind} subclass (found: none{missing})")
    raise LitzError(f"app {spec!r} has more than one {kind} subclass ({', '.join(c.__name__ for c in leaves)}): "
                    f"choose one with {option} NAME")


def load_app(spec: str, driver: str | None = None, executor: str | None = None) -> App:
    """Import the app ``spec`` and find its classes; ``driver`` / ``executor``: the names of the classes to use
    where the module holds more than one (``--driver``, ``--executor``)."""
    from .kernels import ensure_cache_dir

    ensure_cache_dir()  # an app's numba kernels with cache=True fail to import where numba has no writable cache
    try:
        module, paths = _import(spec)
    except LitzError:
        raise
    except SyntaxError as exc:
        raise LitzError(f"syntax error in app {spec!r}: {exc.filename}:{exc.lineno}: {exc.msg}") from None
    except Exception:
        raise AppError(f"importing app {spec!r}", traceback.format_exc()) from None
    driver_cls = _pick(module, spec, Driver, driver, "--driver")
    executor_cls = _pick(module, spec, Executor, executor, "--executor")
    cloudpickle.register_pickle_by_value(module)  # before the App pickles its blob
    try:
        return App(spec, module, driver_cls, executor_cls, paths)
    except Exception:
        raise AppError(f"pickling the executor class of app {spec!r}", traceback.format_exc()) from None
