"""Apps' numba kernels: compiled ahead of time into numba's on-disk cache, and said so while they compile.

A numba kernel compiles on its first call in a process unless numba's on-disk cache (``cache=True``) has it for
those argument types: tens of seconds of CPU for an app's kernels, in which a job shows nothing else. So:

* An app declares its kernels and the signatures it calls them with, as ``KERNELS`` in its package::

      KERNELS = {"apps.lda.kernels": {"sample_task": ["(i4[::1], ...)"]}}   # module -> kernel -> signature(s)

  and calls :func:`preload` with it at import: what the cache holds is loaded in the launcher, whose forked
  workers inherit it, and nothing is compiled there (the job is not registered yet, so nobody could see it).
* ``litz warmup`` (:func:`compile_all`) compiles every declared kernel into the cache, one line per kernel;
  a local job's master does the same before it starts its workers when the cache lacks some (the progress
  line and ``litzctl status`` say so), and the workers then load them from the cache.
* Any kernel compiled anyway (a signature not declared, a worker on a machine whose cache is cold) is seen by
  :func:`watch`: numba's ``numba:compile`` event fires only when it really compiles, not on a cache hit.

Where the cache lives is numba's choice: ``__pycache__`` next to the kernel's source when that directory is
writable, else numba's user-wide cache (``~/.cache/numba``), or ``$NUMBA_CACHE_DIR`` when set. An installed
package in a read-only site-packages therefore still gets a cache, per user; when neither is writable
:func:`ensure_cache_dir` points ``$NUMBA_CACHE_DIR`` at a private directory of ours. ``numba.pycc`` (ahead-of-time
compiled extension modules) is deprecated in numba and would need a C toolchain at install: the cache filled
by ``litz warmup`` gives the same first run.

numba is imported only by apps that use it: nothing here imports it until an app has.
"""
from __future__ import annotations

import importlib
import os
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .private import private_dir

FIRST_RUN = "compiling kernels (first run only)"

# sink(kind, kernel, seconds): kind "start" (seconds 0) or "end"; outermost compiles only
Sink = Callable[[str, str, float], None]
_sink: Sink | None = None
_watching = False
_local = threading.local()  # .cached_only: True inside preload (a compile would be a cache miss: skip it)


class ColdCache(Exception):
    """Raised inside numba's compile by :func:`preload`: the kernel is not in the cache, and is left for later."""


def ensure_cache_dir() -> str | None:
    """Give numba a writable cache when neither of its own places is: with ``cache=True`` and no writable place a
    kernel's module fails to import ("cannot cache function"), as for a package in a read-only site-packages run
    by a user whose home is not writable (a container's arbitrary user). Only when ``$NUMBA_CACHE_DIR`` is unset
    and numba's per-user cache (``$XDG_CACHE_HOME/numba``, ``~/.cache/numba``) cannot be made: then
    ``$TMPDIR/litz-numba-UID``, made 0700 and used only if this user owns it with that mode (another user's
    directory there could hand us compiled code), else a fresh private temporary directory. Call before an
    app imports numba; returns the directory it set, or None."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return None
    user = os.path.join(os.getenv("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "numba")  # numba's appdirs
    if _writable_dir(user):
        return None
    path = os.path.join(tempfile.gettempdir(), f"litz-numba-{os.getuid()}")
    try:
        private_dir(path)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o700:
            raise OSError("not this user's private directory")
    except OSError:
        path = tempfile.mkdtemp(prefix="litz-numba-")
    os.environ["NUMBA_CACHE_DIR"] = path
    if "numba" in sys.modules:  # read at numba's import: tell a numba already imported too
        sys.modules["numba"].config.CACHE_DIR = path
    return path


def _writable_dir(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()  # what numba's locator tries
        return True
    except OSError:
        return False


def kernel_name(dispatcher: Any) -> str:
    func = getattr(dispatcher, "py_func", None)
    if func is None:
        return str(dispatcher)
    return f"{func.__module__}.{func.__qualname__}"


def _install() -> bool:
    """Register the compile listener once numba is imported (by an app); False while it is not."""
    global _watching
    if _watching:
        return True
    if "numba" not in sys.modules:
        return False
    from numba.core import event

    class Listener(event.Listener):
        depth = 0
        name = ""
        t0 = 0.0

        def on_start(self, ev: Any) -> None:
            if getattr(_local, "cached_only", False):
                raise ColdCache(kernel_name(ev.data["dispatcher"]))
            self.depth += 1
            if self.depth == 1:  # the kernel asked for; its callees and numba's own overloads compile inside it
                self.name, self.t0 = kernel_name(ev.data["dispatcher"]), time.perf_counter()
                _notify("start", self.name, 0.0)

        def on_end(self, ev: Any) -> None:
            self.depth = max(self.depth - 1, 0)
            if self.depth == 0:
                _notify("end", self.name, time.perf_counter() - self.t0)

    event.register("numba:compile", Listener())
    _watching = True
    return True


def _notify(kind: str, name: str, seconds: float) -> None:
    sink = _sink
    if sink is not None:
        try:
            sink(kind, name, seconds)
        except Exception:  # a notice must never fail the compile it tells of
            pass


def watch(sink: Sink | None) -> Sink | None:
    """Send every compile in this process from now on to ``sink`` (None: to nobody); returns the previous
    sink. Call :func:`ensure_watching` again once an app has imported numba, if it had not yet."""
    global _sink
    previous, _sink = _sink, sink
    _install()
    return previous


def ensure_watching() -> None:
    """Register the listener if numba has been imported since :func:`watch` (a worker that just loaded the app)."""
    if _sink is not None:
        _install()


def declared(kernels: dict[str, dict[str, Any]]) -> Iterator[tuple[Any, tuple]]:
    """(dispatcher, argument types) for every kernel an app's ``KERNELS`` names, importing the modules.

    A signature given as a string (``"(f4[:, ::1], i8)"``) is turned into its tuple of numba types here: numba's
    cache files an overload under the signature as it was passed to ``compile``, and a call passes the tuple, so
    an overload compiled from the string is never found by a call in another process (it compiles again)."""
    from numba.core import sigutils

    for module_name, entries in kernels.items():
        module = importlib.import_module(module_name)
        for name, signatures in entries.items():
            for signature in [signatures] if isinstance(signatures, (str, tuple)) else signatures:
                args, _ = sigutils.normalize_signature(signature)
                yield getattr(module, name), tuple(args)


def preload(kernels: dict[str, dict[str, Any]]) -> list[str]:
    """Load the declared kernels numba's cache holds, compiling none; returns the names of those it lacks.

    Called at an app's import: a launcher forks its workers after it, and they inherit what is loaded."""
    _install()
    missing = []
    _local.cached_only = True
    try:
        for dispatcher, signature in declared(kernels):
            try:
                dispatcher.compile(signature)
            except ColdCache:
                missing.append(kernel_name(dispatcher))
    finally:
        _local.cached_only = False
    return missing


def from_disk(module: str) -> Any:
    """The module named ``module`` as imported from its file, or None when this process cannot import it.

    Litz ships an app's code to workers by value (cloudpickle), and numba's on-disk cache (``cache=True``) serves
    only functions imported from their file: a shipped copy of a kernel compiles again in every worker process
    (seconds of CPU), while the imported one loads from the cache, or is already loaded in a fork of a process
    that imported the app. An app calls its kernels through this, falling back to its shipped copy on a
    machine without the app."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def app_kernels(module: Any) -> dict[str, dict[str, Any]]:
    """The ``KERNELS`` an app's module or its package declares ({} for an app without numba kernels)."""
    found = getattr(module, "KERNELS", None)
    if found is None and "." in getattr(module, "__name__", ""):
        package = sys.modules.get(module.__name__.rsplit(".", 1)[0])
        found = getattr(package, "KERNELS", None)
    return dict(found or {})


def compile_all(kernels: dict[str, dict[str, Any]],
                progress: Callable[[int, int, str, float, bool], None] | None = None) -> tuple[int, int]:
    """Compile every declared kernel that is not loaded, into numba's cache; returns (compiled, loaded).

    ``progress(i, n, kernel, seconds, compiled)`` is called after each one: ``compiled`` False when the cache
    already had it."""
    _install()
    todo = list(declared(kernels))
    compiled = loaded = 0
    for i, (dispatcher, signature) in enumerate(todo, 1):
        misses = sum(dispatcher.stats.cache_misses.values())
        t0 = time.perf_counter()
        dispatcher.compile(signature)
        fresh = sum(dispatcher.stats.cache_misses.values()) > misses
        compiled += fresh
        loaded += not fresh
        if progress is not None:
            progress(i, len(todo), kernel_name(dispatcher), time.perf_counter() - t0, fresh)
    return compiled, loaded


def cache_dir(kernels: dict[str, dict[str, Any]]) -> str | None:
    """Where numba keeps the cache of the first declared kernel (in-tree ``__pycache__``, user-wide, or
    ``$NUMBA_CACHE_DIR``), as numba's cache locator chose it in this process."""
    for dispatcher, _ in declared(kernels):
        return getattr(dispatcher.stats, "cache_path", None)
    return None


BUNDLED_APPS = ("apps.mlr", "apps.lda", "apps.hdbscan", "apps.kmeans")


def warmup(apps: list[str], out: Any = None) -> int:
    """``litz warmup [APP ...]``: compile the numba kernels of each app (default: the bundled ones) into numba's
    on-disk cache, one line per kernel, so that the first ``litz run`` compiles nothing. Returns the number of
    kernels compiled."""
    from .appload import load_app

    out = out or sys.stdout
    total = 0
    for name in apps or BUNDLED_APPS:
        app = load_app(name)
        kernels = app_kernels(app.module)
        if not kernels:
            out.write(f"{app.name}: no numba kernels\n")
            out.flush()
            continue
        t0 = time.perf_counter()

        def line(i: int, n: int, kernel: str, seconds: float, fresh: bool) -> None:
            how = f"compiled in {seconds:.1f} s" if fresh else "in the cache already"
            out.write(f"  [{i}/{n}] {kernel}: {how}\n")
            out.flush()

        out.write(f"{app.name}: compiling its numba kernels into the cache\n")
        out.flush()
        compiled, loaded = compile_all(kernels, line)
        total += compiled
        out.write(f"{app.name}: {compiled} compiled, {loaded} in the cache already, {time.perf_counter() - t0:.1f} s;"
                  f" cache in {cache_dir(kernels)}\n")
        out.flush()
    return total
