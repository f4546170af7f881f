"""What an open dashboard costs a job: no-op task throughput with and without a page watching it.

Each round runs ``bench/apps/noop.py`` (2 workers, 1 server, ``--inflight`` tasks in flight, no end) twice
with ``litz run``, in turn:

 1. **no dashboard** (the baseline);
 2. **page open**: ``litz run --dashboard PORT`` and a headless Chromium (the system's, driven by playwright)
    showing the job's page, connected to its server-sent-event stream, redrawing its tables and charts as the
    statuses come.

Once the job runs (and, in 2, the page shows its workers), the rate is measured over ``--window`` seconds from
two of the master's own status documents: their ``tasks_completed`` and ``elapsed_s``. Then the job is
stopped (``litzctl stop``). Rounds are interleaved ``--repeats`` times; the table shows medians. The ratio is
page / baseline. The CPU seconds the dashboard's server and Chromium took in the window are recorded too: on
this 2-core machine the browser runs beside the job, where a user's runs on their own machine.
Target: >= 0.99x (the dashboard adds no more than 1 %; the machine's noise is about 2 %, so read the rounds' spread).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import _table

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
APP = os.path.join(HERE, "apps", "noop.py")
sys.path.insert(0, ROOT)

from litz.membership import Membership, connect_kv  # noqa: E402


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system) of these processes and their children so far."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            continue
    return total


def run(home: str, name: str, inflight: int, window: float, settle: float, page: bool) -> dict:
    env = {**os.environ, "LITZ_HOME": home}
    port = free_port()
    argv = [sys.executable, "-m", "litz.cli.litz", "run", APP, "--name", name, "--no-progress",
            "--config", "tasks=1000000000000", f"inflight={inflight}"]
    if page:
        argv += ["--dashboard", str(port)]
    job = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    kv = connect_kv(None, home)
    member = Membership(kv, name)
    browser = pw = None
    try:
        wait(lambda: (member.get("status") or {}).get("state") == "running", 60, "the job to run")
        others: list[int] = []
        if page:
            from playwright.sync_api import sync_playwright

            pw = sync_playwright().start()
            browser = pw.chromium.launch(executable_path=shutil.which("chromium"))
            tab = browser.new_page(viewport={"width": 1400, "height": 1400})
            wait(lambda: _answers(f"http://127.0.0.1:{port}/api/info"), 30, "the dashboard")
            tab.goto(f"http://127.0.0.1:{port}/")
            tab.wait_for_function("document.querySelectorAll('#workers tbody tr').length === 2", timeout=30000)
            import psutil

            others = [c.pid for c in psutil.Process(job.pid).children() if "dashboard" in " ".join(c.cmdline())]
            others.append(browser_pid())
        time.sleep(settle)
        cpu0 = cpu_seconds([p for p in others if p])
        s1 = member.get("status")
        time.sleep(window)
        s2 = member.get("status")
        cpu1 = cpu_seconds([p for p in others if p])
        if page:  # the page still follows the job (its tasks counter moved on)
            shown = int(tab.inner_text("#tasks").replace(",", "") or 0)
            assert shown >= s1["tasks_completed"], "the page stopped following the job"
    finally:
        if browser is not None:
            browser.close()
        if pw is not None:
            pw.stop()
        subprocess.run([sys.executable, "-m", "litz.cli.litzctl", "--name", name, "stop"], cwd=ROOT, env=env,
                       capture_output=True, timeout=60)
        try:
            job.wait(60)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()
    rate = (s2["tasks_completed"] - s1["tasks_completed"]) / (s2["elapsed_s"] - s1["elapsed_s"])
    return {"rate": rate, "window_s": s2["elapsed_s"] - s1["elapsed_s"], "page": page,
            "dashboard_and_browser_cpu_s": round(cpu1 - cpu0, 3) if page else 0.0}


def browser_pid() -> int:
    """Chromium's main process: a child of this script's playwright driver, not of the job."""
    import psutil

    for p in psutil.Process().children(recursive=True):
        try:
            if "chrom" in p.name() and "--type=" not in " ".join(p.cmdline()):
                return p.pid
        except psutil.Error:
            continue
    return 0


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short smoke run (results/dashboard_cost.quick.json)")
    ap.add_argument("--repeats", type=int, help="rounds of the two runs (default 3, quick 1)")
    ap.add_argument("--window", type=float, help="seconds measured per run (default 10, quick 4)")
    ap.add_argument("--inflight", type=int, default=2000, help="tasks kept in flight (default 2000)")
    args = ap.parse_args()
    if shutil.which("chromium") is None:
        sys.exit("dashboard_cost needs chromium (apt-get install chromium)")
    repeats = args.repeats or (1 if args.quick else 3)
    window = args.window or (4.0 if args.quick else 10.0)
    settle = 2.0

    rounds = []
    with tempfile.TemporaryDirectory(prefix="litz-bench-dash-") as home:
        for i in range(repeats):
            tag = f"{os.getpid()}-{i}"
            none = run(home, f"dash-none-{tag}", args.inflight, window, settle, page=False)
            page = run(home, f"dash-page-{tag}", args.inflight, window, settle, page=True)
            r = {"round": i + 1, "none": none, "page": page, "ratio": page["rate"] / none["rate"]}
            rounds.append(r)
            print(f"round {i + 1}/{repeats}: no dashboard {none['rate']:,.0f} tasks/s, page open "
                  f"{page['rate']:,.0f} tasks/s ({r['ratio']:.3f}x); dashboard + browser CPU "
                  f"{page['dashboard_and_browser_cpu_s']:.2f} s in {page['window_s']:.1f} s", flush=True)

    none_rate = statistics.median(r["none"]["rate"] for r in rounds)
    page_rate = statistics.median(r["page"]["rate"] for r in rounds)
    ratio = statistics.median(r["ratio"] for r in rounds)
    cpu = statistics.median(r["page"]["dashboard_and_browser_cpu_s"] / r["page"]["window_s"] for r in rounds)
    met = ratio >= 0.99
    doc = {"target": "page open >= 0.99x no dashboard", "met": met, "none_tasks_per_s": none_rate,
           "page_tasks_per_s": page_rate, "ratio": ratio, "dashboard_and_browser_cpu_share": cpu,
           "window_s": window, "inflight": args.inflight, "workers": 2, "servers": 1, "rounds": rounds}
    path = _table.write_result("dashboard_cost", doc, quick=args.quick)
    print(f"median: no dashboard {none_rate:,.0f} tasks/s, page open {page_rate:,.0f} tasks/s, {ratio:.3f}x "
          f"(target >= 0.99x: {'met' if met else 'MISSED'}); dashboard + browser used {cpu:.2f} of a core -> {path}")
    if not args.quick:
        _table.update_rows({"dashboard_cost": [
            f"page open: {page_rate:,.0f} tasks/s (server + headless Chromium on the same 2 cores: "
            f"{cpu:.2f} of a core)", f"no dashboard: {none_rate:,.0f} tasks/s",
            f"{ratio:.3f}x (rounds {min(r['ratio'] for r in rounds):.2f}-{max(r['ratio'] for r in rounds):.2f}x)",
            ">= 0.99x",
            _table.yes_no(met), _table.today()]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
