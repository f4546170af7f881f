"""The dashboard (litz.dashboard) in a real headless Chromium against real jobs: the page follows a running job
live (processes, a scale by litzctl, charts, events), its buttons steer the job through litzctl's signed path,
an ended job's page comes from its history, and the server refuses what it must (no token on a non-loopback
bind, a foreign Host on the loopback, controls without --allow-control)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from litz.membership import Membership, connect_kv
from tests.support.processes import ROOT, Processes, app_path, free_port, run_cli, status, wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; "
                                    ".ci/run does this)")


def http(url: str, headers: dict | None = None, data: bytes | None = None) -> tuple[int, str, dict]:
    """(status, body, headers) of one request; an HTTP error status is an answer too."""
    req = urllib.request.Request(url, data=data, headers=headers or {}, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def serving(url: str) -> bool:
    try:
        return http(url + "api/info")[0] in (200, 401)
    except OSError:
        return False


def read_line(proc: subprocess.Popen, starts: str) -> str:
    """The first line of ``proc``'s stdout that starts with ``starts`` (the test's timeout bounds the wait)."""
    for line in proc.stdout:
        if line.startswith(starts):
            return line.strip()
    raise AssertionError(f"no line starting with {starts!r} from {proc.args}")


def browser(p):
    """The system's Chromium (no browser is downloaded: the machines have no internet)."""
    return p.chromium.launch(executable_path=CHROMIUM)


def worker_rows(page, live_only: bool = True) -> list[str]:
    sel = "#workers tbody tr:not(.gone)" if live_only else "#workers tbody tr"
    return page.eval_on_selector_all(sel, "rows => rows.map(r => r.dataset.id)")


@needs_chromium
@pytest.mark.timeout(120)
def test_live_page_follows_the_job_and_its_buttons_steer_it(litz_home, tmp_path):
    from playwright.sync_api import sync_playwright

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("training"), "--name", "live", "--workers", "2", "--no-progress",
                           "--config", "epochs=100000", "task_s=0.01", "--dashboard", str(port), "--allow-control",
                           "--checkpoint-dir", str(tmp_path / "checkpoints")])
        wait_for(lambda: serving(url), 30, "the dashboard to answer")
        with sync_playwright() as p:
            b = browser(p)
            page = b.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            # the job's workers and servers, each with its executors or shards
            page.wait_for_function("document.querySelectorAll('#workers tbody tr').length === 2", timeout=15000)
            assert page.eval_on_selector_all("#servers tbody tr", "rs => rs.map(r => r.dataset.id)") == ["s0"]
            executors = page.eval_on_selector_all("#workers tbody tr td:nth-child(4)",
                                                  "cells => cells.map(c => +c.textContent)")
            assert sum(executors) == 8, executors
            assert page.inner_text("#state") == "running"
            page.evaluate("window.__notReloaded = true")

            # litzctl scales out; the open page shows the third worker within 3 s, without a reload
            done = run_cli(["litzctl", "--name", "live", "scale", "--workers", "3"], timeout=30)
            assert done.returncode == 0, done.stderr
            t0 = time.time()
            page.wait_for_function("document.querySelectorAll('#workers tbody tr:not(.gone)').length === 3",
                                   timeout=3000)
            shown_after = time.time() - t0
            assert page.evaluate("window.__notReloaded === true")
            page.wait_for_selector("#events tr[data-kind=scale_out]", timeout=10000)

            # a button scales the job back in, through litzctl's signed path: the job itself has 2 workers again
            page.fill("#want-workers", "2")
            page.click("#scale-btn")
            page.wait_for_function("document.querySelector('#control-msg').textContent.includes('draining')",
                                   timeout=10000)
            wait_for(lambda: (status("live") or {}).get("workers") and len(status("live")["workers"]) == 2, 20,
                     "the job to have 2 workers after the page's scale")
            page.wait_for_function("document.querySelectorAll('#workers tbody tr:not(.gone)').length === 2",
                                   timeout=5000)
            page.wait_for_selector("#workers tbody tr.gone .state.left", timeout=5000)  # the drained one, shown
            page.wait_for_selector("#events tr[data-kind=scale_in]", timeout=10000)

            # the other buttons: a checkpoint, a memory limit, a drain of one worker, each an event on the page and
            # a change in the job itself
            page.click("#checkpoint-btn")
            page.wait_for_selector("#events tr[data-kind=checkpoint]", timeout=20000)
            page.fill("#memory-limit", "256M")
            page.click("#memory-btn")
            page.wait_for_selector("#events tr[data-kind=memory_limit]", timeout=10000)
            wait_for(lambda: all(w.get("budget") == 256 << 20 for w in (status("live") or {}).get("workers", [{}])),
                     10, "the workers' budget set by the page")
            drained = page.get_attribute("#workers tbody tr:not(.gone) button.drain", "data-id")
            left = [w["id"] for w in (status("live") or {}).get("workers", [])]
            assert drained in left and len(left) == 2, left
            page.click(f"#workers tbody tr:not(.gone) button.drain[data-id={drained}]")
            wait_for(lambda: [w["id"] for w in (status("live") or {}).get("workers", [])] == [
                w for w in left if w != drained], 20, f"the job to drain {drained} after the page's drain")
            page.wait_for_selector(f"#workers tbody tr.gone[data-id={drained}] .state.left", timeout=5000)

            # the charts hold the job's data: tasks/s over time, the app's loss and accuracy, 3 workers at the top
            page.wait_for_function("document.getElementById('chart-rate').data[0].x.length >= 3", timeout=10000)
            procs_chart = page.evaluate("document.getElementById('chart-procs').data.map(t => [t.name, t.y])")
            assert procs_chart[0][0] == "workers" and max(procs_chart[0][1]) == 3 and procs_chart[0][1][-1] in (1, 2)
            loss = page.evaluate("document.getElementById('chart-metrics').data.map(t => [t.name, t.y.length])")
            assert loss[0][0] == "loss" and loss[0][1] >= 2, loss
            acc = page.evaluate("document.getElementById('chart-accuracy').data.map(t => t.name)")
            assert acc == ["accuracy"]
            marks = page.evaluate("document.getElementById('chart-rate').layout.shapes.length")
            assert marks >= 2  # the scale-out and scale-in lines on the time axis
            assert "epoch" in page.inner_text("#progress") and "ETA" in page.inner_text("#progress")
            assert page.inner_text("#config").split() == ["epochs", "100000", "task_s", "0.01"]

            # nothing of the job secret reaches the page
            secret = Membership(connect_kv(None, str(litz_home)), "live").get("secret")
            assert isinstance(secret, str) and len(secret) >= 16
            assert secret not in page.content()

            # the stop button ends the job (its result: null)
            page.on("dialog", lambda d: d.accept())
            page.click("#stop-btn")
            out, err = job.communicate(timeout=30)
            assert job.returncode == 0 and out.strip() == "null", err
            assert not errors, errors
            b.close()
    print(f"scale shown on the page {shown_after:.2f} s after litzctl returned")


@needs_chromium
@pytest.mark.timeout(90)
def test_an_ended_job_page_renders_from_its_history_and_the_list_links_to_it():
    from playwright.sync_api import sync_playwright

    done = run_cli(["litz", "run", app_path("training"), "--name", "past", "--no-progress",
                    "--config", "epochs=200", "task_s=0.003"], timeout=60)
    assert done.returncode == 0, done.stderr
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with Processes() as procs:
        dash = procs.start(["litzctl", "dashboard", "--port", str(port)])  # no --name: the list of jobs
        wait_for(lambda: serving(url), 30, "the dashboard to answer")
        with sync_playwright() as p:
            b = browser(p)
            page = b.new_page()
            page.goto(url)
            page.wait_for_selector("#ended tbody tr[data-name=past]", timeout=10000)
            assert page.is_visible("#no-running")
            page.click("#ended tbody tr[data-name=past] a")
            page.wait_for_url(f"{url}job/past")
            page.wait_for_function("document.querySelector('#state').textContent === 'finished'", timeout=10000)
            page.wait_for_function("document.getElementById('chart-rate').data", timeout=10000)
            rate = page.evaluate("document.getElementById('chart-rate').data[0].y")
            assert len(rate) >= 2 and max(rate) > 0
            loss = page.evaluate("document.getElementById('chart-metrics').data[0]")
            assert loss["name"] == "loss" and len(loss["y"]) == 200 and loss["y"][-1] < loss["y"][0]
            assert page.inner_text("#tasks").replace(",", "") == str(200 * 8)
            assert page.inner_text("#config").split() == ["epochs", "200", "task_s", "0.003"]
            # a name nobody ran: said so, not an error
            page.goto(f"{url}job/nosuch")
            page.wait_for_function("document.querySelector('#note').textContent.includes('no running job')",
                                   timeout=10000)
            b.close()
        dash.terminate()
        dash.wait(10)


@pytest.mark.timeout(60)
def test_a_non_loopback_bind_needs_the_token_and_controls_need_allow_control():
    port = free_port()
    with Processes() as procs:
        dash = procs.start(["litzctl", "dashboard", "--host", "0.0.0.0", "--port", str(port)])
        token = read_line(dash, "dashboard token:").split()[2]
        base = f"http://127.0.0.1:{port}"
        for path in ("/", "/api/info", "/static/plotly.min.js", "/api/job/x/stream"):
            assert http(base + path)[0] == 401, path
            assert http(base + path, {"X-Litz-Token": token[:-1] + ("A" if token[-1] != "A" else "B")})[0] == 401
        code, body, headers = http(f"{base}/?token={token}")
        assert code == 200 and "<html" in body and token in headers.get("Set-Cookie", "")
        cookie = headers["Set-Cookie"].split(";")[0]
        assert http(base + "/static/plotly.min.js", {"Cookie": cookie})[0] == 200  # the page's later requests
        control = json.dumps({"command": "stop"}).encode()
        code, body, _ = http(f"{base}/api/job/x/control", {"X-Litz-Token": token,
                                                            "Content-Type": "application/json"}, control)
        assert code == 403 and "--allow-control" in body
        dash.terminate()
        dash.wait(10)

    # on the loopback: no token, but only requests addressed to the loopback (no DNS rebinding), and a control
    # request only as JSON from the page's own origin (no cross-site form)
    port = free_port()
    with Processes() as procs:
        dash = procs.start(["litzctl", "dashboard", "--port", str(port), "--allow-control"])
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: serving(base + "/"), 30, "the dashboard to answer")
        assert http(base + "/api/info")[0] == 200
        assert http(base + "/api/info", {"Host": f"attacker.example:{port}"})[0] == 401
        form = b"command=stop"
        code, _, _ = http(f"{base}/api/job/x/control", {"Content-Type": "application/x-www-form-urlencoded"}, form)
        assert code == 403
        code, _, _ = http(f"{base}/api/job/x/control", {"Content-Type": "application/json",
                                                         "Origin": "http://attacker.example"}, b'{"command":"stop"}')
        assert code == 403
        code, body, _ = http(f"{base}/api/job/x/control", {"Content-Type": "application/json"},
                             b'{"command":"stop"}')
        assert code == 409 and "no running job named 'x'" in body
        dash.terminate()
        dash.wait(10)


def _status(elapsed: float, events: list[dict], tasks: int = 0, report: dict | None = None) -> dict:
    """A status document as the master publishes it (litz.master.Master.status), reduced to what the feed reads."""
    from litz.master import STATUS_EVENTS

    return {"name": "j", "app": "a", "state": "running", "elapsed_s": elapsed, "tasks_completed": tasks,
            "tasks_per_s": 10.0, "report": report or {}, "events_n": len(events), "events": events[-STATUS_EVENTS:],
            "workers": [{"id": "w0", "memory": 1}], "servers": [{"id": "s0", "memory": 2}]}


def test_the_feed_takes_every_event_once_and_fetches_the_history_on_a_gap(tmp_path):
    """JobFeed follows the status: each event once, in order, from the tail the status carries; when more came
    than the tail holds, the whole history again (the master's plot answer); a new master starts over."""
    from litz.dashboard.source import JobFeed
    from litz.membership.filekv import FileKV

    kv = FileKV(str(tmp_path / "registry"))
    kv.put("litz/jobs/j/master", {"instance": "m1", "app": "a", "config": {"x": 1}, "wake": ["h", 1]})
    events = [{"t": i / 10, "kind": "steal", "n": i} for i in range(40)]
    feed = JobFeed(kv, "j", home=str(tmp_path))
    fetched = []

    def fetch() -> dict:  # the master's answer to the signed plot request: everything logged so far
        n = kv.get("litz/jobs/j/status")["events_n"]
        fetched.append(n)
        return {"history": [], "metrics": [{"t": 0.5, "loss": 2.0}], "events": events[:n], "events_n": n}

    feed._fetch = fetch
    kv.put("litz/jobs/j/status", _status(1.0, events[:2], report={"loss": 1.0}))
    (seq, kind, snap), = feed.poll()
    assert kind == "snapshot" and snap["events"] == events[:2] and fetched == [2]
    assert snap["info"] == {"name": "j", "app": "a", "started": None, "host": None, "pid": None, "config": {"x": 1}}
    assert feed.poll() == []  # the same status: nothing new
    kv.put("litz/jobs/j/status", _status(2.0, events[:5], tasks=20, report={"loss": 0.5}))
    (_, kind, msg), = feed.poll()
    assert kind == "status" and msg["events"] == events[2:5] and msg["row"]["loss"] == 0.5
    assert msg["sample"]["t"] == 2.0 and msg["sample"]["workers"] == 1
    feed._refetched = 0.0  # more events than the tail carries (25 > 20): the whole history again
    kv.put("litz/jobs/j/status", _status(3.0, events[:30], tasks=30))
    (_, kind, snap), = feed.poll()
    assert kind == "snapshot" and snap["events"] == events[:30] and fetched == [2, 30]
    kv.put("litz/jobs/j/status", _status(4.0, events[:40], tasks=40))  # 10 new: from the tail
    (_, kind, msg), = feed.poll()
    assert kind == "status" and msg["events"] == events[30:40] and feed.events == events
    # the job run again under its name: a new master's status (younger) starts the page over
    kv.put("litz/jobs/j/master", {"instance": "m2", "app": "b"})
    kv.put("litz/jobs/j/status", _status(0.5, events[:1]))
    (_, kind, snap), = feed.poll()
    assert kind == "snapshot" and snap["events"] == events[:1] and snap["info"]["app"] == "b"
    # it ends: no master, no status, and no history on this machine: the page keeps what it saw, as ended
    kv.delete_prefix("litz/jobs/j/")
    (_, kind, snap), = feed.poll()
    assert kind == "snapshot" and snap["state"] == "ended" and snap["events"] == events[:1]
    assert feed.poll() == []


def test_without_aiohttp_the_dashboard_says_how_to_install_it():
    code = ("import sys; sys.modules['aiohttp'] = None\n"
            "from litz.cli.litzctl import main; sys.exit(main(['dashboard']))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert res.returncode == 2
    assert res.stderr == "litzctl: error: the dashboard needs aiohttp and plotly: pip install 'litz[dashboard]'\n"


@needs_chromium
@pytest.mark.timeout(120)
def test_cluster_mode_dashboard_reads_the_job_from_etcd_and_follows_a_joining_worker(etcd):
    """Cluster mode through real etcd: `litzctl --etcd ... dashboard` serves a job whose master, server and workers
    were started apart; its list names the job, its page shows the roles, and a worker started later appears on
    the open page without a reload."""
    from playwright.sync_api import sync_playwright

    from tests.support.chains import role

    e, name, port = etcd.endpoint, "dash-cluster", free_port()
    url = f"http://127.0.0.1:{port}/"
    with Processes() as procs:
        procs.start(role("server", e, name))
        procs.start(role("worker", e, name))
        master = procs.start(["litz", "master", app_path("training"), "--etcd", e, "--name", name, "--min-workers",
                              "1", "--executors", "4", "--placement", "even", "--no-progress",
                              "--config", "epochs=100000", "task_s=0.01"])
        wait_for(lambda: (s := status(name, e)) and s["state"] == "running", 60, "the cluster job to run")
        dash = procs.start(["litzctl", "--etcd", e, "dashboard", "--port", str(port)])
        wait_for(lambda: serving(url), 30, "the dashboard to answer")
        with sync_playwright() as p:
            b = browser(p)
            page = b.new_page()
            page.goto(url)
            page.wait_for_selector(f"a[href$='job/{name}']", timeout=15000)
            page.click(f"a[href$='job/{name}']")
            page.wait_for_function("document.querySelectorAll('#workers tbody tr').length === 1", timeout=15000)
            assert page.eval_on_selector_all("#servers tbody tr", "rs => rs.length") == 1
            page.evaluate("window.__notReloaded = true")
            procs.start(role("worker", e, name))  # joins the running job: the balancer gives it executors
            page.wait_for_function("document.querySelectorAll('#workers tbody tr:not(.gone)').length === 2",
                                   timeout=30000)
            assert page.evaluate("window.__notReloaded === true")
            b.close()
        assert run_cli(["litzctl", "--etcd", e, "--name", name, "stop"]).returncode == 0
        master.communicate(timeout=60)
        dash.terminate()
        dash.wait(10)
