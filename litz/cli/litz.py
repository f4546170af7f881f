"""``litz``: run a job on this machine, or one role of a cluster job."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from ..appoutput import result_only_stdout
from ..errors import LitzError
from ..outofcore import parse_bytes
from ..placement import POLICIES
from .common import Parser, add_etcd_options, etcd_options, main_guard, parse_config

if TYPE_CHECKING:
    from ..appload import App

DESCRIPTION = """Litz runs elastic machine-learning jobs: a driver dispatches micro-tasks to executors that
read and update a sharded parameter server; the runtime maps executors onto worker processes and shards
onto server processes.

  litz run APP         the whole job on this machine (no setup needed)
  litz master APP      cluster mode: the job's master (one per job)
  litz worker          cluster mode: a worker process (any number, join any time)
  litz server          cluster mode: a parameter-server process (any number)
  litz warmup [APP]    compile the apps' numba kernels ahead of the first run (default: the bundled apps)

APP is a module name resolved from the current directory (e.g. apps.mlr), a path to a .py file (.py may be
left out) or to a package directory (apps/mlr)."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _job_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("app", help="module name (resolved from the current directory), path to a .py file (.py may be "
                   "left out) or to a package directory")
    p.add_argument("--executors", type=_positive, help="logical executors (default: 4 per initial worker)")
    p.add_argument("--shards", type=_positive, help="logical parameter-server shards (default: max(64, 8 per server))")
    p.add_argument("--driver", metavar="NAME", help="the Driver class to run, where the app holds more than one")
    p.add_argument("--executor", metavar="NAME", help="the Executor class to run, where the app holds more than one")
    p.add_argument("--config", action="extend", nargs="+", metavar="KEY=VALUE",
                   help="app settings, JSON-decoded where possible (--config a=1 b=x, or repeat --config)")
    p.add_argument("--output", metavar="RESULT.json", help="write result, timings and events as JSON")
    p.add_argument("--metrics", metavar="METRICS.jsonl", help="append one JSON line per driver report()")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    p.add_argument("--checkpoint-dir", metavar="DIR", help="where consistent checkpoints go (shared storage in a "
                   "cluster); with it, a lost worker or server is recovered from the latest one")
    p.add_argument("--checkpoint-every", type=float, metavar="SECONDS", help="take a checkpoint this often")
    p.add_argument("--checkpoint-keep", type=_positive, default=3, metavar="K", help="keep the last K (default 3)")
    p.add_argument("--resume", metavar="DIR", help="continue the job from the latest complete checkpoint in DIR")
    p.add_argument("--memory-limit", metavar="BYTES", help="memory budget per worker for executor state, input "
                   "data included (e.g. 2G); idle executors beyond it are spilled to local disk and reloaded")
    p.add_argument("--partial-recovery", action="store_true", help="SCAR: when servers are lost, reload only their "
                   "shards and keep every other parameter and executor as it is (less rework, not exact)")
    p.add_argument("--placement", choices=list(POLICIES), default="speed", help="how executors are spread over "
                   "workers: in proportion to each worker's measured speed (default), or evenly by count")
    p.add_argument("--steal", action=argparse.BooleanOptionalAction, help="with --placement speed: between "
                   "rebalances an idle worker takes an executor with queued tasks from one behind (default: on)")
    p.add_argument("--priority-checkpoint", type=float, metavar="R", help="SCAR: every R x --checkpoint-every, "
                   "save the fraction R of parameters that changed most into a running checkpoint")


def _role_options(p: argparse.ArgumentParser, local_home: bool = False) -> None:
    p.add_argument("--name", required=True, help="the job's name")
    add_etcd_options(p, "etcd of the cluster's registry")
    p.add_argument("--secret-file", help="file holding the job secret (default: from the registry)")
    p.add_argument("--host", default="127.0.0.1", help="address other processes reach this one at")
    p.add_argument("--bind", help="address to bind (default: --host)")
    p.add_argument("--port", type=int, default=0, help="TCP port to listen on (default: any free port)")
    p.add_argument("--home", help=argparse.SUPPRESS)  # the local registry directory of `litz run`


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="litz", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    run = sub.add_parser("run", help="run a job on this machine", description="Run a job on this machine.")
    _job_options(run)
    run.add_argument("--workers", type=_positive, default=2, help="worker processes (default 2)")
    run.add_argument("--servers", type=_positive, default=1, help="server processes (default 1)")
    run.add_argument("--name", help="job name for litzctl (default: APP-PID-TIME)")
    run.add_argument("--server-memory-limit", metavar="BYTES", help="memory budget per server for its shards")
    run.add_argument("--dashboard", metavar="[HOST:]PORT", help="serve the job's live web page while it runs "
                     "(default host 127.0.0.1; another needs the token it prints); needs litz[dashboard]")
    run.add_argument("--allow-control", action="store_true", help="with --dashboard: let the page scale, drain, "
                     "checkpoint, set the memory limit and stop")
    add_etcd_options(run, "register every process in this etcd (default: a local registry directory, "
                     "$LITZ_HOME or ~/.litz)")
    master = sub.add_parser("master", help="cluster mode: the job's master",
                            description="Start job NAME's master: workers and servers join it through etcd.")
    _job_options(master)
    _role_options(master)
    master.add_argument("--min-workers", type=_positive, default=1, help="workers to wait for before starting")
    master.add_argument("--min-servers", type=_positive, default=1, help="servers to wait for before starting")
    master.add_argument("--start-timeout", type=float, default=600.0,
                        help="seconds to wait for the first workers and servers (default 600)")
    for role in ("worker", "server"):
        p = sub.add_parser(role, help=f"cluster mode: a {role} process",
                           description=f"Join job NAME as a {role} process.")
        _role_options(p)
        p.add_argument("--id", help="this process's id in the job (default: allocated, e.g. w3); must be unique, "
                       "such as a Kubernetes pod name")
        p.add_argument("--start-timeout", type=float, default=600.0,
                       help="seconds to wait for the job's master (default 600)")
        if role == "server":
            p.add_argument("--memory-limit", metavar="BYTES", help="memory budget for this server's shards (e.g. "
                           "1G); the least recently used shards beyond it are spilled to local disk")
    warm = sub.add_parser("warmup", help="compile apps' numba kernels into numba's cache ahead of the first run",
                          description="Compile the numba kernels of each APP (default: the bundled apps) into "
                          "numba's on-disk cache, so that their first run starts at once instead of compiling.")
    warm.add_argument("apps", nargs="*", metavar="APP", help="module name or .py path (default: the bundled apps)")
    return parser


def job_options(args: argparse.Namespace) -> dict:
    """Job options shared by run and master. --resume DIR continues from DIR and keeps checkpointing there."""
    return {"checkpoint_dir": args.checkpoint_dir or args.resume, "checkpoint_every": args.checkpoint_every,
            "checkpoint_keep": args.checkpoint_keep, "resume": bool(args.resume),
            "partial_recovery": args.partial_recovery, "priority_checkpoint": args.priority_checkpoint,
            "memory_limit": args.memory_limit, "placement": args.placement, "steal": args.steal}


def print_result(app: App, result: Any, output: str | None) -> None:
    """The result on stdout, alone: the app's short form of it (the whole one is in --output), as JSON, indented
    for a person at a terminal."""
    shown = app.summary(result)
    if shown != result and not output:
        sys.stderr.write("litz: the result below is a summary; --output FILE keeps all of it\n")
    print(json.dumps(shown, indent=1 if sys.stdout.isatty() else None))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        if args.command == "warmup":
            from ..kernels import warmup

            warmup(args.apps)
            return 0
        if args.command in ("run", "master"):
            from ..job import resolve_app
        if args.command == "run":
            import litz

            opts = {"output": args.output, "metrics": args.metrics, "progress": not args.no_progress,
                    "shards": args.shards, **job_options(args)}
            if args.name:
                opts["name"] = args.name
            if args.etcd:
                opts["etcd"] = etcd_options(args)
            if args.server_memory_limit:
                opts["server_memory_limit"] = parse_bytes(args.server_memory_limit)
            if args.dashboard:
                opts["dashboard"], opts["allow_control"] = args.dashboard, args.allow_control
            elif args.allow_control:
                raise LitzError("--allow-control needs --dashboard")
            with result_only_stdout():
                app = resolve_app(args.app, args.driver, args.executor)
                result = litz.run(app, workers=args.workers, servers=args.servers, executors=args.executors,
                                  config=parse_config(args.config), **opts)
            print_result(app, result, args.output)
            return 0
        if args.command == "master":
            from ..cluster import run_master

            with result_only_stdout():
                app = resolve_app(args.app, args.driver, args.executor)
                result = run_master(app, args.name, etcd=etcd_options(args), home=args.home,
                                    secret_file=args.secret_file,
                                    host=args.host, bind_host=args.bind, port=args.port, executors=args.executors,
                                    config=parse_config(args.config), shards=args.shards or 0, output=args.output,
                                    metrics=args.metrics, progress=not args.no_progress,
                                    min_workers=args.min_workers, min_servers=args.min_servers,
                                    start_timeout=args.start_timeout, **job_options(args))
            print_result(app, result, args.output)
            return 0
        from ..roles import serve

        serve(args.command, args.name, etcd=etcd_options(args), home=args.home, secret_file=args.secret_file,
              host=args.host, bind_host=args.bind, ident=args.id, start_timeout=args.start_timeout, port=args.port,
              memory_limit=parse_bytes(args.memory_limit) if getattr(args, "memory_limit", None) else None)
        return 0

    code = main_guard("litz", body)
    if args.command in ("worker", "server"):
        # Its work is handed over (or the job is over), its registration revoked and its sockets closed, which
        # sends what was queued (linger). Interpreter teardown would only free memory and modules, and took
        # 0.2 s: that is most of a released process's time to exit, which is what a scheduler waits for.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
