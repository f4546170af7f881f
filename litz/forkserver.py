"""Starting a local job's workers and servers as forks of the launcher instead of fresh interpreters.

A fresh interpreter imports litz, numpy, ZeroMQ and then the app (numba alone: 0.3 s) before it can work:
about 0.45 s of CPU a process, most of a short job's start on a 2-core machine. The launcher has all of it
imported already (the app too: ``litz.run`` loads it first), so its forks start in milliseconds, and they
share the launcher's memory until they write to it.

Forking a process that runs threads is unsafe: a lock another thread holds stays locked in the child, and a
library's fork handlers (gRPC's, in an etcd client) run in it against descriptors the fork server closes
(gRPC aborts the process). Compute pools (OpenBLAS's) are safe: they park themselves for a fork. The
master starts threads (ZAP authentication, the lease keeper, ZeroMQ's I/O threads), so the launcher forks
one *fork server* before any of them exist. It has one thread and no sockets; it forks every worker and
server on request, and, being their parent, reaps them and reports how each one ended.

A launcher that runs such threads already (a program with threads of its own, an etcd client or a ZeroMQ
context open, or one that ran an etcd job before) gets a fork server that is a fresh interpreter instead.
It imports litz and the heavy libraries once; its forks start as fast, but they load the app from its pickled
blob, as fresh interpreters do. Such a launcher is a long-lived program (a notebook, a scikit-learn search
fitting one small job after another), so the fresh fork server is *shared*: started at its first job and kept
for the next ones, it saves each job the second or so of imports. It holds nothing of a job: each spawn
request carries the launcher's whole environment and working directory as they are at that moment, and a job
that ends takes only its own children with it (:meth:`ForkServer.release`).

``LITZ_SPAWN=exec`` starts fresh interpreters instead (``python -m litz.cli.litz worker ...``), for a
launcher whose state should not be inherited (one holding a GPU context, or a large heap it keeps
changing while the job runs: the fork server keeps the pages as they were). Without pidfds (Linux before
5.3) Litz starts fresh interpreters too.
"""
from __future__ import annotations

import atexit
import ctypes
import faulthandler
import gc
import importlib
import importlib.util
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection, Pipe

from .errors import LitzError
from .process import die_with_parent

# Exported symbols that set OpenBLAS's thread count: numpy's and scipy's wheels rename them.
_BLAS_THREAD_SETTERS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_",
                        "scipy_openblas_set_num_threads", "openblas_set_num_threads64_")


def _blas_libraries() -> list[ctypes.CDLL]:
    """The BLAS libraries loaded in this process (numpy's and scipy's OpenBLAS builds)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "blas" in line and ".so" in line}
    except OSError:
        return []
    libs = []
    for path in sorted(paths):
        try:
            libs.append(ctypes.CDLL(path))
        except OSError:
            pass
    return libs


def set_blas_threads(count: int) -> None:
    """``count`` BLAS threads in this process, for the libraries already loaded: they read their thread count
    from the environment when they were loaded, so setting ``OPENBLAS_NUM_THREADS`` in a fork changes nothing."""
    for lib in _blas_libraries():
        for name in _BLAS_THREAD_SETTERS:
            setter = getattr(lib, name, None)
            if setter is not None:
                setter(count)


def blas_threads() -> list[int]:
    """The thread count of each loaded BLAS library."""
    counts = []
    for lib in _blas_libraries():
        for name in _BLAS_THREAD_SETTERS:
            getter = getattr(lib, name.replace("_set_", "_get_"), None)
            if getter is not None:
                counts.append(int(getter()))
                break
    return counts


class ForkedProcess:
    """A child of the fork server, with the part of :class:`subprocess.Popen`'s interface a launcher uses."""

    def __init__(self, server: ForkServer, pid: int):
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.collect(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"process {self.pid}", timeout or 0)
            self.server.collect(0.05 if left is None else min(left, 0.05))
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The launcher's side: start one with :meth:`start` while the launcher has no thread of its own yet."""

    def __init__(self, conn: Connection, pid: int, fresh: subprocess.Popen | None = None):
        self.conn, self.pid = conn, pid
        self.fresh = fresh  # the fresh interpreter's Popen, which reaps it; None for a fork of the launcher
        self.children: dict[int, ForkedProcess] = {}
        self.lock = threading.Lock()
        self.closed = False

    @property
    def shared(self) -> bool:
        """A fresh interpreter is the launcher's shared fork server, kept for its next jobs: release(), not
        close(), after a job."""
        return self.fresh is not None

    @staticmethod
    def supported() -> bool:
        """Linux 5.3 or later (pidfds, which tell the fork server when a child ends)."""
        try:
            os.close(os.pidfd_open(os.getpid()))
            return True
        except (AttributeError, OSError):
            return False

    @classmethod
    def start(cls, title: str) -> ForkServer:
        """A fork of the launcher when the launcher has one thread (``title`` names it), else the launcher's shared
        fresh interpreter, started now if there is none running."""
        if threads_unsafe_to_fork():
            return cls._shared_fresh()
        ours, theirs = Pipe(duplex=True)
        sys.stdout.flush()  # or the fork writes what the launcher had buffered a second time
        sys.stderr.flush()
        launcher = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _own_signals()
                ours.close()
                _set_title(title)
                _serve(theirs, launcher)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        return cls(ours, pid)

    @classmethod
    def _shared_fresh(cls) -> ForkServer:
        global _shared
        with _shared_lock:
            if _shared is None or _shared.closed or _shared.fresh.poll() is not None:  # type: ignore[union-attr]
                _shared = cls._start_fresh(f"litz forkserver (shared, launcher {os.getpid()})")
            return _shared

    @classmethod
    def _start_fresh(cls, title: str) -> ForkServer:
        ours, theirs = Pipe(duplex=True)
        # all of them, not only those loaded now: the server outlives this job, and the next one's app may need them
        preload = [name for name in PRELOAD if name in sys.modules or importlib.util.find_spec(name) is not None]
        argv = [sys.executable, "-c", FRESH_ENTRY, str(theirs.fileno()), str(os.getpid()), title, *preload]
        proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        return cls(ours, proc.pid, proc)

    def spawn(self, argv: list[str], env: dict[str, str], title: str,
              app: tuple[list[str], str] | None = None) -> ForkedProcess:
        """Fork a child that runs ``litz`` with ``argv`` (as ``python -m litz.cli.litz`` would) in ``env``.
        ``app``: (search paths, module name) of the job's app, which the fork server imports first if it has not
        (a fresh one: then each child need not, with the app's numba kernels it loads from the cache)."""
        with self.lock:
            if self.closed:
                raise LitzError("the fork server has stopped")
            try:  # the launcher's environment and directory now: a shared server was started for an earlier job
                self.conn.send(("spawn", argv, {**os.environ, **env}, os.getcwd(), title, app))
            except OSError as exc:
                raise LitzError(f"the fork server is gone: {exc}") from None
            wait = 60.0 if self.fresh is not None else 10.0  # a fresh one imports numpy, numba... first
            while True:
                msg = self._receive(wait)
                if msg is None:
                    raise LitzError(f"the fork server did not answer within {wait:.0f} s")
                if msg[0] == "started":
                    child = self.children[msg[1]] = ForkedProcess(self, msg[1])
                    return child
                self._handle(msg)

    def collect(self, timeout: float) -> None:
        """Take the exit reports that arrived (waiting up to ``timeout`` seconds for the first)."""
        with self.lock:
            msg = self._receive(timeout)
            while msg is not None:
                self._handle(msg)
                msg = self._receive(0)

    def _receive(self, timeout: float) -> tuple | None:
        try:
            if self.conn.poll(timeout):
                return self.conn.recv()
        except (EOFError, OSError):
            self._server_gone()
        return None

    def _handle(self, msg: tuple) -> None:
        if msg[0] == "exited":
            child = self.children.get(msg[1])
            if child is not None:
                child.returncode = msg[2]

    def _server_gone(self) -> None:
        """The fork server died: its children died with it (their parent-death signal)."""
        for child in self.children.values():
            if child.returncode is None:
                child.returncode = -signal.SIGKILL
        self.closed = True

    def release(self, children: list[ForkedProcess]) -> None:
        """A job is done with this fork server: end it, or, when it is the shared one, end the job's ``children``
        still running (SIGKILL: the job has stopped them already) and forget them."""
        if not self.shared:
            self.close()
            return
        for child in children:
            child.kill()
        for child in children:
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                pass  # a child that outlives SIGKILL this long is in the kernel's hands; its exit report comes later
        with self.lock:
            for child in children:
                if child.returncode is not None:
                    self.children.pop(child.pid, None)

    def close(self) -> None:
        """End the fork server (its children end with it) and reap it."""
        with self.lock:
            if not self.closed:
                self.closed = True
                try:
                    self.conn.send(("stop",))
                except OSError:
                    pass
            self.conn.close()
        if self.fresh is not None:
            self.fresh.wait()
            return
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


_shared: ForkServer | None = None  # the launcher's shared fresh fork server, if it has started one
_shared_lock = threading.Lock()


def close_shared() -> None:
    """End the shared fresh fork server, if one runs (at exit; tests, which must leave no process behind)."""
    global _shared
    with _shared_lock:
        server, _shared = _shared, None
    if server is not None:
        server.close()


atexit.register(close_shared)


# -- the fork server's side -------------------------------------------------------------------------------
# What a fresh fork server imports before it forks, when the launcher has it loaded: each takes a fresh
# interpreter a tenth of a second or more (numba 0.3 s); litz's own roles come with litz.cli.litz.
PRELOAD = ("numpy", "zmq", "cloudpickle", "greenlet", "scipy", "scipy.sparse", "numba")


def threads_unsafe_to_fork() -> list[str]:
    """The threads of this process that make forking it unsafe, by name: the program's own (Python threads, which
    may hold its locks) and named native ones, the service threads of libraries such as gRPC (``event_engine``)
    or ZeroMQ (``ZMQbg/IO/0``), whose fork handlers and locks assume a process they own. Unnamed native threads
    (they carry the main thread's name) are compute pools such as OpenBLAS's, which park themselves for a fork."""
    unsafe = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    try:
        main = _thread_name(os.getpid())
        tids = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: the Python threads are all that can be seen
        return unsafe
    native = {t.native_id for t in threading.enumerate()}
    for tid in tids:
        if tid not in native:
            try:
                name = _thread_name(tid)
            except OSError:  # ended meanwhile
                continue
            if name != main:
                unsafe.append(name)
    return unsafe


def _thread_name(tid: int) -> str:
    with open(f"/proc/self/task/{tid}/comm") as f:
        return f.read().strip()


# Ctrl-C is the launcher's from the first line on (see _serve), not a KeyboardInterrupt amid the imports.
FRESH_ENTRY = ("import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
               "from litz.forkserver import serve_fresh; serve_fresh(sys.argv[1:])")


def _own_signals() -> None:
    """First thing in a fork server, before anything slow: the launcher's Python handlers must never run here (a
    SIGTERM that reached a fork while it set its title once ran a launcher's handler, which raised into it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle: it stops the job
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the launcher's handler: its end ends this process


def serve_fresh(argv: list[str]) -> None:
    """The fresh interpreter's side: ``python -c FRESH_ENTRY FD LAUNCHER TITLE MODULE...``."""
    fd, launcher, title, *modules = argv
    conn = Connection(int(fd))
    _own_signals()
    _set_title(title)
    for name in (*modules, "litz.cli.litz"):
        importlib.import_module(name)
    _serve(conn, int(launcher))


def _serve(conn: Connection, launcher: int) -> None:
    """Fork on request, report each child's pid and, when it ends, its exit code (as Popen's returncode)."""
    die_with_parent()
    if os.getppid() != launcher:
        return
    close_inherited_fds(keep=(conn.fileno(), *_stream_fds()))
    set_blas_threads(int(os.environ.get("OPENBLAS_NUM_THREADS") or 1))
    # The launcher's objects, inherited, are never garbage here or in the children: keep the collector off
    # them, or each child's first collections walk them all and copy every page they touch (50 ms for a
    # launcher that has loaded numba's compiler).
    gc.freeze()
    pidfds: dict[int, int] = {}  # pidfd -> pid
    while True:
        ready, _, _ = select.select([conn.fileno(), *pidfds], [], [])
        for fd in ready:
            if fd in pidfds:
                pid = pidfds.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                conn.send(("exited", pid, os.waitstatus_to_exitcode(status)))
        if conn.fileno() in ready:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return
            if msg[0] == "stop":
                return
            _, argv, env, cwd, title, app = msg
            if app is not None:
                from .appload import import_app

                import_app(*app)
            pid = os.fork()
            if pid == 0:
                _child(conn, pidfds, argv, env, cwd, title)
            pidfds[os.pidfd_open(pid)] = pid
            conn.send(("started", pid))


def _stream_fds() -> list[int]:
    """The descriptors behind ``sys.stdout`` and ``sys.stderr``: a launcher may have them on files of its own
    (pytest's capture does), and the children write their errors through them."""
    fds = []
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            fds.append(stream.fileno())
        except (AttributeError, OSError, ValueError):  # no descriptor (an in-memory stream), or closed
            pass
    return fds


def close_inherited_fds(keep: tuple[int, ...] = ()) -> None:
    """Close every descriptor but stdin, stdout, stderr and ``keep``, as ``subprocess`` does for a child.

    The launcher may be a user's program with files and sockets open (a listening port, a lock file, a pipe
    whose reader waits for its end); forks would hold them for the job's lifetime. Called while the fork
    server has one thread and has opened nothing of its own."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: close the whole range around the kept ones
        low = 3
        for fd in sorted({k for k in keep if k > 2}):
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, os.sysconf("SC_OPEN_MAX"))
        fds = []
    for fd in fds:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:  # the directory listing's own descriptor, closed already
                pass
    if faulthandler.is_enabled():  # its file may have been one of them: a crash report goes to stderr instead
        faulthandler.enable(file=2, all_threads=True)


def _child(conn: Connection, pidfds: dict[int, int], argv: list[str], env: dict[str, str], cwd: str,
           title: str) -> None:
    code = 1
    try:
        conn.close()
        for fd in pidfds:
            os.close(fd)
        # SIGINT stays ignored, as in the fork server: Ctrl-C is the launcher's (see roles.serve)
        os.environ.clear()  # the launcher's environment at the spawn, whatever it was when the server started
        os.environ.update(env)
        os.chdir(cwd)
        os.environ["LITZ_PARENT_PID"] = str(os.getppid())
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        _set_title(title)
        numpy = sys.modules.get("numpy")
        if numpy is not None:  # each fresh interpreter draws its own seed; numpy < 2 does not reseed forks
            numpy.random.seed()
        from .cli.litz import main

        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _set_title(title: str) -> None:
    """What ``ps`` shows for the child: its role and job, not the launcher's command line."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(title)

