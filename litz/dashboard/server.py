"""The dashboard's web server (aiohttp): the page, plotly.js from the installed plotly package, and one
server-sent-event stream per open page.

Safe by default: on a loopback address it answers only requests whose Host is that address (a web page elsewhere
cannot reach it through DNS rebinding); on any other address every request must carry the token printed at
start (``?token=``, then a cookie; compared in constant time). The controls are off unless ``allow_control``;
they are litzctl's own commands (:func:`litz.cli.litzctl.send_request`), signed with the job secret here, in
the server: nothing of the secret reaches the page. A control request must be a JSON POST from the page's own
origin, which a form on another site cannot send.
"""
from __future__ import annotations

import argparse
import asyncio
import hmac
import ipaddress
import json
import os
import secrets
import socket
import sys
from typing import Any

from aiohttp import web

from ..errors import LitzError
from .source import JobFeed, job_list

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
POLL_S = 0.25  # how often a watched job's status is read: a new status reaches the page within this
LIST_POLL_S = 2.0
KEEPALIVE_S = 15.0
COOKIE = "litz_dashboard_token"
CONTROLS = ("scale", "drain", "checkpoint", "memory-limit", "stop")


def plotly_js() -> str:
    """plotly.min.js as the plotly wheel ships it (no CDN: the machines may have no internet)."""
    import plotly

    path = os.path.join(os.path.dirname(plotly.__file__), "package_data", "plotly.min.js")
    if not os.path.isfile(path):
        raise LitzError(f"the installed plotly has no {path}: pip install 'litz[dashboard]'")
    return path


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Hub:
    """One watched job: its feed, polled while at least one page is open, and the pages' queues."""

    def __init__(self, feed: JobFeed | None, list_kv: Any = None):
        self.feed, self.list_kv = feed, list_kv
        self.queues: set[asyncio.Queue] = set()
        self.task: asyncio.Task | None = None
        self.last_list: dict | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while self.queues:
            try:
                if self.feed is not None:
                    messages = await loop.run_in_executor(None, self.feed.poll)
                else:
                    doc = await loop.run_in_executor(None, job_list, self.list_kv)
                    messages = [(0, "list", doc)]
                    self.last_list = doc
            except Exception as exc:  # the registry is unreachable for a moment: say so, try again
                messages = [(0, "problem", {"message": f"{type(exc).__name__}: {exc}"})]
            for message in messages:
                for q in list(self.queues):
                    q.put_nowait(message)
            await asyncio.sleep(POLL_S if self.feed is not None else LIST_POLL_S)
        self.task = None

    def join(self, q: asyncio.Queue) -> None:
        self.queues.add(q)
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self.run())


class Dashboard:
    def __init__(self, kv: Any, name: str | None, *, host: str, port: int, allow_control: bool,
                 secret_file: str | None, token: str | None):
        self.kv, self.name, self.host, self.port = kv, name, host, port
        self.allow_control, self.secret_file, self.token = allow_control, secret_file, token
        self.hubs: dict[str, Hub] = {}
        self.list_hub = Hub(None, kv)

    # -- access ------------------------------------------------------------------------------------------
    def authorised(self, request: web.Request) -> bool:
        if self.token is None:
            # loopback: only requests addressed to the loopback (DNS rebinding sends another Host)
            host = (request.host or "").rsplit(":", 1)[0] if not (request.host or "").startswith("[") \
                else (request.host or "").split("]")[0] + "]"
            return is_loopback(host)
        given = request.query.get("token") or request.headers.get("X-Litz-Token") or request.cookies.get(COOKIE) \
            or ""
        return hmac.compare_digest(given.encode("utf-8", "replace"), self.token.encode())

    @web.middleware
    async def guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not self.authorised(request):
            why = ("this dashboard needs the token it printed at start (?token=...)" if self.token else
                   "this dashboard answers only requests addressed to the loopback (Host)")
            return web.json_response({"ok": False, "message": f"refused: {why}"}, status=401)
        response = await handler(request)
        if self.token is not None and request.query.get("token"):
            # the page's later requests (scripts, the event stream) carry it as a cookie
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="Strict")
        response.headers.setdefault("Cache-Control", "no-store")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")  # the token in the URL stays here
        return response

    def job_name(self, request: web.Request) -> str:
        name = request.match_info["name"]
        if self.name is not None and name != self.name:
            raise web.HTTPNotFound(text=f"this dashboard serves job {self.name!r} only")
        if not name or "/" in name or name in (".", ".."):
            raise web.HTTPNotFound(text="no such job")
        return name

    # -- pages -------------------------------------------------------------------------------------------
    async def index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(os.path.join(STATIC, "index.html"))

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response({"name": self.name, "allow_control": self.allow_control})

    async def stream(self, request: web.Request, hub: Hub, first: Any) -> web.StreamResponse:
        """Server-sent events: what ``first()`` returns (the page's starting point), then every newer message of
        the hub, with a comment now and then to keep proxies from closing an idle stream. The page joins the
        hub before ``first()`` is taken, so nothing between the two is lost; what the start holds is skipped."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        q: asyncio.Queue = asyncio.Queue()
        hub.join(q)

        async def send(kind: str, data: Any) -> None:
            await resp.write(f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode())

        try:
            floor = 0
            for seq, kind, data in await first():
                floor = max(floor, seq)
                await send(kind, data)
            while True:
                try:
                    seq, kind, data = await asyncio.wait_for(q.get(), KEEPALIVE_S)
                except asyncio.TimeoutError:  # noqa: UP041 (not the builtin before Python 3.11)
                    await resp.write(b": keepalive\n\n")
                    continue
                if seq and seq <= floor:
                    continue
                await send(kind, data)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            hub.queues.discard(q)
        return resp

    async def job_stream(self, request: web.Request) -> web.StreamResponse:
        name = self.job_name(request)
        hub = self.hubs.get(name)
        if hub is None:
            hub = self.hubs[name] = Hub(JobFeed(self.kv, name, self.secret_file))
        feed = hub.feed
        assert feed is not None
        idle = hub.task is None  # no page had it open: what it holds may be old

        async def first() -> list[tuple[int, str, dict]]:
            if not feed.seq:  # nothing read yet: the hub's first poll sends the snapshot
                return []
            loop = asyncio.get_running_loop()
            if idle:
                await loop.run_in_executor(None, feed.poll)  # what changed goes into the snapshot
            snap = await loop.run_in_executor(None, feed.snapshot)
            return [(snap.pop("seq"), "snapshot", snap)]

        return await self.stream(request, hub, first)

    async def list_stream(self, request: web.Request) -> web.StreamResponse:
        if self.name is not None:
            raise web.HTTPNotFound(text=f"this dashboard serves job {self.name!r} only")

        async def first() -> list[tuple[int, str, dict]]:
            return [(0, "list", self.list_hub.last_list)] if self.list_hub.last_list else []

        return await self.stream(request, self.list_hub, first)

    async def control(self, request: web.Request) -> web.Response:
        """One of litzctl's commands on the job, through litzctl's own code (signed with the job secret)."""
        name = self.job_name(request)
        if not self.allow_control:
            return web.json_response({"ok": False, "message": "refused: this dashboard was started without "
                                      "--allow-control"}, status=403)
        origin = request.headers.get("Origin")
        if request.content_type != "application/json" or (origin and origin.split("://", 1)[-1] != request.host):
            return web.json_response({"ok": False, "message": "refused: not a request of this page"}, status=403)
        try:
            body = await request.json()
            argv = control_argv(body)
        except (ValueError, TypeError, KeyError) as exc:
            return web.json_response({"ok": False, "message": f"bad request: {exc}"}, status=400)
        loop = asyncio.get_running_loop()
        try:
            message = await loop.run_in_executor(None, run_control, self.kv, name, argv, self.secret_file)
        except LitzError as exc:
            return web.json_response({"ok": False, "message": str(exc)}, status=409)
        return web.json_response({"ok": True, "message": message})

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.guard])
        app.router.add_get("/", self.index)
        app.router.add_get("/job/{name}", self.index)
        app.router.add_get("/api/info", self.info)
        app.router.add_get("/api/list", self.list_stream)
        app.router.add_get("/api/job/{name}/stream", self.job_stream)
        app.router.add_post("/api/job/{name}/control", self.control)
        plotly_path = plotly_js()

        async def plotly(request: web.Request) -> web.StreamResponse:
            return web.FileResponse(plotly_path, headers={"Cache-Control": "max-age=86400"})

        app.router.add_get("/static/plotly.min.js", plotly)
        app.router.add_static("/static/", STATIC, show_index=False, follow_symlinks=False)
        return app


def control_argv(body: Any) -> list[str]:
    """The litzctl command line a page's control request stands for (litzctl's parser then checks it)."""
    if not isinstance(body, dict) or body.get("command") not in CONTROLS:
        raise ValueError(f"command must be one of {', '.join(CONTROLS)}")
    command = body["command"]
    if command == "scale":
        argv = ["scale", "--no-wait"]
        for role in ("workers", "servers"):
            if body.get(role) not in (None, ""):
                argv += [f"--{role}", str(int(body[role]))]
        return argv
    if command == "drain":
        ids = body.get("ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) and i for i in ids):
            raise ValueError("drain needs ids: a list of process ids")
        return ["drain", "--no-wait", "--", *ids]
    if command == "memory-limit":
        return ["memory-limit", str(body.get("bytes", ""))]
    return [command]


def run_control(kv: Any, name: str, argv: list[str], secret_file: str | None) -> str:
    """Carry out a litzctl command line on job ``name`` as litzctl does; its answer's message."""
    from ..cli.litzctl import build_parser, send_request
    from ..membership import Membership

    parser = build_parser()

    def refuse(message: str) -> None:
        raise LitzError(message)

    # a bad argument is an answer to the page, not an exit of the server
    for p in [parser, *(sub for a in parser._actions for sub in (getattr(a, "choices", None) or {}).values()
                        if isinstance(sub, argparse.ArgumentParser))]:
        p.error = refuse  # type: ignore[method-assign]
    args = parser.parse_args(argv)
    if args.command == "scale" and args.workers is None and args.servers is None:
        raise LitzError("scale needs workers, servers or both")
    args.secret_file = secret_file
    job = Membership(kv, name)
    master = job.master()
    if master is None:
        raise LitzError(f"no running job named {name!r}")
    return str(send_request(job, master, args).get("message", "ok"))


def serve_forever(kv: Any, name: str | None, *, host: str, port: int, allow_control: bool,
                  secret_file: str | None, sock: socket.socket | None = None) -> int:
    """Serve until interrupted (or, started by ``litz run --dashboard``, until the launcher is gone)."""
    token = None if is_loopback(host) else secrets.token_urlsafe(24)
    dash = Dashboard(kv, name, host=host, port=port, allow_control=allow_control, secret_file=secret_file,
                     token=token)
    parent = int(os.environ.get("LITZ_DASHBOARD_PARENT") or 0)

    async def main() -> None:
        runner = web.AppRunner(dash.app(), access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        if sock is not None:
            site: web.BaseSite = web.SockSite(runner, sock)
        else:
            site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise LitzError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        bound = runner.addresses[0][1] if runner.addresses else port
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{bound}/" + (f"job/{name}" if name else "")
        print(f"dashboard{' of job ' + name if name else ''}: {url}"
              + (f"?token={token}" if token else "")
              + (" (controls on)" if allow_control else ""), flush=True)
        if token:
            print(f"dashboard token: {token} (every request needs it)", flush=True)
        try:
            while True:
                await asyncio.sleep(1.0)
                if parent and os.getppid() != parent:
                    return  # the launcher is gone: so is its job
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.stderr.write("dashboard stopped\n")
    return 0
