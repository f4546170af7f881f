"""``litzctl``: look at and steer a running job, found through etcd or the local registry."""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

from ..errors import LitzError
from ..finished import age, recent, registry_name
from ..membership import Membership, connect_kv
from ..roles import job_secret
from .common import ETCD_ARGS, Parser, add_etcd_options, etcd_options, main_guard

DESCRIPTION = """Look at and steer a running Litz job. Local jobs (litz run) are found in the registry
directory ($LITZ_HOME, default ~/.litz); cluster jobs through --etcd. Every command but list and status is signed
with the job secret, found as a worker finds it: $LITZ_SECRET, --secret-file, or the registry, where the master
publishes it unless it was started with --secret-file."""

REQUEST_TIMEOUT_S = 30.0
SECRET_WAIT_S = 1.0  # a master publishes the secret just after it registers; one that keeps it private never does
LITZCTL_ETCD_TIMEOUT_S = 10.0  # a person waits at the prompt: say "unreachable since ..." soon


def _common_options(p: argparse.ArgumentParser) -> None:
    """Options every command takes, before or after the command's name (`litzctl status --name x`)."""
    add_etcd_options(p, "etcd of a cluster job (default: the local registry)")
    p.add_argument("--name", help="the job's name (see `litzctl list`)")
    p.add_argument("--secret-file", help="file holding the job secret, for a job started with --secret-file "
                   "(default: $LITZ_SECRET, else the secret the master published in the registry)")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="litzctl", description=DESCRIPTION)
    _common_options(p)
    # the same options after the command: absent there, they leave what was given before it alone
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    _common_options(common)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    # every command gets them, also one added below later (a partial, so that no command can be left out)
    sub.add_parser = functools.partial(sub.add_parser, parents=[common])  # type: ignore[method-assign]
    sub.add_parser("list", help="jobs in the registry, and those that ended lately")
    st = sub.add_parser("status", help="state, progress, and every worker and server")
    st.add_argument("--json", action="store_true", help="machine-readable status")
    sub.add_parser("stop", help="end the job now (result: null)")
    sc = sub.add_parser("scale", help="change the number of workers/servers")
    sc.add_argument("--workers", type=int)
    sc.add_argument("--servers", type=int)
    sc.add_argument("--no-wait", action="store_true", help="return at once instead of waiting for released "
                    "processes to exit")
    sc.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for released processes")
    dr = sub.add_parser("drain", help="move everything off these processes, then they exit")
    dr.add_argument("ids", nargs="+", metavar="ID")
    dr.add_argument("--no-wait", action="store_true", help="return at once instead of waiting for them to exit")
    dr.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for them to exit")
    sub.add_parser("checkpoint", help="take a consistent checkpoint now")
    kl = sub.add_parser("kill", help="fault injection: kill a worker or server process (tests, benchmarks)")
    kl.add_argument("id", metavar="ID")
    kl.add_argument("--after", type=float, default=0.0, metavar="SECONDS", help="delay before the kill")
    kl.add_argument("--signal", type=int, default=9, help="signal to send (default 9, SIGKILL)")
    ml = sub.add_parser("memory-limit", help="change the per-worker memory budget")
    ml.add_argument("bytes", help="bytes, or a number with K, M, G (e.g. 512M)")
    pl = sub.add_parser("plot", help="plot metrics, processes and events over time (also of an ended job)")
    pl.add_argument("out", metavar="OUT.png", help="the image to write (.png, .svg, .pdf)")
    db = sub.add_parser("dashboard", help="serve a live web page of the job (of every job without --name), also "
                        "of an ended one (needs litz[dashboard])")
    db.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other "
                    "needs the token printed at start on every request)")
    db.add_argument("--port", type=int, default=8265, help="port (default 8265; 0: any free one)")
    db.add_argument("--allow-control", action="store_true", help="let the page scale, drain, checkpoint, set the "
                    "memory limit and stop (signed as litzctl's commands are)")
    return p


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def format_list(keys: dict, ended: list[dict], now: float) -> str:
    """The running jobs (``keys``: the registry's ``litz/jobs/`` prefix), with app, state and age, then the jobs
    that ended lately (:mod:`litz.finished`)."""
    jobs: dict[str, dict] = {}
    for key, value in keys.items():
        parts = key.split("/")
        if len(parts) == 4 and parts[3] in ("master", "status"):
            jobs.setdefault(parts[2], {})[parts[3]] = value if isinstance(value, dict) else {}
    running = sorted(name for name, job in jobs.items() if "master" in job)
    lines = []
    if running:
        rows = [["NAME", "APP", "STATE", "AGE"]]
        for name in running:
            master, st = jobs[name]["master"], jobs[name].get("status") or {}
            started = master.get("started")
            rows.append([name, str(master.get("app", "?")), str(st.get("state", "starting")),
                         age(now - started) if isinstance(started, (int, float)) else "?"])
        lines += ["running:", *_table(rows)]
    else:
        lines.append("no running jobs")
    if ended:
        rows = [["NAME", "APP", "STATE", "ENDED", "RESULT"]]
        rows += [[str(d.get("name")), str(d.get("app")), str(d.get("state")), age(now - d["ended"]) + " ago",
                  str(d.get("result") or "-")] for d in ended]
        lines += ["ended lately:", *_table(rows)]
    return "\n".join(lines)


def format_status(st: dict) -> str:
    lines = [f"job {st['name']} ({st['app']}): {st['state']}, {st['elapsed_s']:.1f} s, version {st['version']}, "
             f"{st['tasks_completed']} tasks, {st['tasks_per_s']:,.0f} tasks/s",
             f"  {st['executors']} executors ({st.get('placement', 'even')} placement"
             + (f", {st['steals']} steal{'s' * (st['steals'] != 1)}" if st.get("stealing") else "")
             + f"), {st['shards']} shards; "
             "last report: "
             + (", ".join(f"{k}={v}" for k, v in st.get("report", {}).items()) or "none")]
    if st.get("compiling"):  # a cold numba cache (litz.kernels)
        lines.append("  compiling kernels (first run only): "
                     + ", ".join(f"{k} on {p}" for p, k in st["compiling"].items()))
    if st.get("progress"):  # Driver.set_total
        p = st["progress"]
        eta = "" if p.get("eta_s") is None else f", ETA {p['eta_s']:.0f} s"
        lines.append(f"  {p['unit']} {p['done']}/{p['total']}{eta}")
    if st.get("waiting"):  # not started: what it waits for, instead of executors it does not have yet
        lines[1] = f"  {st['waiting']}"
    if st.get("checkpointing"):
        held = st["checkpointing"]
        lines.append(f"  checkpoint under way: dispatch held for {held['held_s']:.1f} s, "
                     f"{held['held_tasks']} tasks waiting")
    width = max([5] + [len(p["id"]) for p in st["workers"] + st["servers"]])
    for role, procs, what in (("worker", st["workers"], "executors"), ("server", st["servers"], "shards")):
        for p in procs:
            mem = f"  memory {p['memory'] / 2**20:,.0f} MiB" if p.get("memory") else ""
            if p.get("budget"):
                mem += (f"  state {p.get('state_bytes') or 0:,} of budget {p['budget']:,} B"
                        f"  evicted {p.get('evicted') or []}")
            state = "" if p.get("state", "active") == "active" else f"  ({p['state']})"
            speed = ("" if p.get("speed") is None else  # measured: tasks per second of running time
                     f"  speed {p['speed']:,.1f} tasks/s ({p['task_ms']:.1f} ms a task, {p['task_cpu_ms']:.1f} on CPU)")
            if p.get("cpu_limit") is not None:  # its cgroup's quota: placement counts it (docs/design.md)
                speed += f"  cpu limit {p['cpu_limit']:.2f} cores"
            lines.append(f"  {role} {p['id']:>{width}}  pid {p['pid']:>7}  {p.get('address') or p['host']}  "
                         f"{what} {len(p[what])}{speed}{mem}{state}")
    return "\n".join(lines)


def _exited(info: dict) -> bool:
    """True once a process on this host is gone (or a zombie); processes elsewhere count once unregistered."""
    if info.get("host") != os.uname().nodename or not info.get("pid"):  # = socket.gethostname()
        return True
    try:
        with open(f"/proc/{info['pid']}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except OSError:
        return True


def wait_gone(job: Membership, idents: list[str], timeout: float, t0: float) -> None:
    """Block until the released processes have left the job and, on this host, exited: what a scheduler
    or a preStop hook waits for before reusing the resources."""
    deadline = time.time() + timeout
    infos = {i: job.member(i) or {} for i in idents}
    while True:
        members = job.members()
        left = [i for i in idents if i in members or not _exited(infos[i])]
        if not left:
            print(f"released {', '.join(idents)} in {time.time() - t0:.2f} s")
            return
        if job.master() is None:
            raise LitzError("the job ended before the released processes exited")
        if time.time() > deadline:
            raise LitzError(f"{', '.join(left)} still running after {timeout:.0f} s")
        time.sleep(0.02)


def wake(master: dict) -> None:
    """Tell the master a request is waiting (one UDP datagram); if it is lost, the master's polling finds it."""
    if not master.get("wake"):
        return
    import socket

    host, port = master["wake"]
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"!", addr)
    except OSError:
        pass


def send_request(job: Membership, master: dict, args: argparse.Namespace) -> dict:
    """Carry out a parsed signed command (``args``: this parser's namespace) on the job's master and return its
    answer: signed with the job secret, posted, the master woken. One line (LitzError) if it is refused or not
    answered. The one way any command steers a job: litzctl's own and the dashboard's buttons."""
    secret = job_secret(job, getattr(args, "secret_file", None), wait_s=SECRET_WAIT_S)
    request = {k: v for k, v in vars(args).items() if k not in ("name", "command", "secret_file", *ETCD_ARGS)}
    rid = job.post_request(args.command, request, secret)
    wake(master)
    try:
        resp = job.wait_response(rid, REQUEST_TIMEOUT_S)
    except LitzError:
        if args.command == "stop":  # the job ended (its registry entries, our answer too, went with it)
            return {"ok": True, "message": "job stopped"}
        raise
    if resp is None:
        raise LitzError(f"job {job.job!r} did not answer {args.command!r} within {REQUEST_TIMEOUT_S:.0f} s")
    if not resp.get("ok"):
        raise LitzError(resp.get("message", "refused"))
    return resp


def plot_ended(name: str, out: str) -> int:
    from ..membership.membership import litz_home
    from .plot import load_history, plot_history

    doc = load_history(litz_home(), name)
    if doc is None:
        raise LitzError(f"no running job named {name!r}, and no history of an ended one in {litz_home()}/history")
    plot_history(doc, out)
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        if args.command == "scale" and args.workers is None and args.servers is None:
            raise LitzError("scale needs --workers N, --servers M or both")
        kv = connect_kv(etcd_options(args, default_timeout=LITZCTL_ETCD_TIMEOUT_S))
        if args.command == "list":
            print(format_list(kv.get_prefix("litz/jobs/"), recent(registry_name(kv)), time.time()))
            return 0
        if args.command == "dashboard":
            from ..dashboard import serve

            return serve(kv, args.name, host=args.host, port=args.port, allow_control=args.allow_control,
                         secret_file=args.secret_file)
        if not args.name:
            raise LitzError("--name is required (see `litzctl list`)")
        job = Membership(kv, args.name)
        master = job.master()
        if master is None and args.command == "plot":  # an ended job: its history, if this machine kept it
            return plot_ended(args.name, args.out)
        if master is None:
            raise LitzError(f"no running job named {args.name!r}"
                            + (f" in etcd at {args.etcd}" if args.etcd else " in the local registry"))
        if args.command == "status":
            st = job.get("status")
            if st is None:
                raise LitzError(f"job {args.name!r} has not published its status yet; try again")
            print(json.dumps(st, indent=1) if args.json else format_status(st))
            return 0
        t0 = time.time()
        resp = send_request(job, master, args)
        if args.command == "plot":
            from .plot import plot_history

            plot_history(resp, args.out)
            print(f"wrote {args.out}")
            return 0
        print(resp.get("message", "ok"))
        leaving = resp.get("leaving") or []
        if args.command in ("drain", "scale") and leaving and not args.no_wait:
            wait_gone(job, leaving, args.timeout, t0)
        return 0

    return main_guard("litzctl", body)


if __name__ == "__main__":
    sys.exit(main())
