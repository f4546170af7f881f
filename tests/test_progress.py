"""What a job shows while it runs and keeps after it ends: the progress line (declared totals with an ETA, cut to
the terminal), the --metrics stream, the history in $LITZ_HOME and `litzctl plot` of an ended job."""
from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import stat
import struct
import subprocess
import sys
import termios
import time
import xml.etree.ElementTree as ET

import pytest

from litz.joblog import prune_history
from tests.support.processes import ROOT, metric_rows, run_cli

MLR = ["apps.mlr", "--config", "synthetic=1", "n=20000", "n_test=2000"]


def progress_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("[litz ")]


@pytest.mark.timeout(120)
def test_epochs_of_the_declared_total_and_an_eta():
    """apps.mlr declares its epochs (Driver.set_total): the line reads 'epoch 3/6  ETA ...' while it runs,
    and its last line the whole count without an ETA."""
    res = run_cli(["litz", "run", *MLR, "epochs=6"], timeout=110, env={**os.environ, "LITZ_PROGRESS_EVERY": "0.02"})
    assert res.returncode == 0, res.stderr
    lines = progress_lines(res.stderr)
    running = [m for line in lines if (m := re.search(r"\] epoch (\d)/6  ETA (\d+s|\d+m\d\ds)  loss ", line))]
    assert any(1 <= int(m.group(1)) < 6 for m in running), lines
    assert re.search(r"\] epoch 6/6  loss ", lines[-1]), lines[-1]


def test_history_is_bounded_to_the_last_finished_jobs(tmp_path):
    root = tmp_path / "history"
    for i in range(5):
        d = root / f"job{i}"
        d.mkdir(parents=True)
        (d / "events.json").write_text("[]")
        os.utime(d / "events.json", (1000 + i, 1000 + i))
    (root / "running").mkdir()  # no events.json yet: a job still running, left alone
    prune_history(str(root), keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["job3", "job4", "running"]


@pytest.mark.timeout(120)
def test_progress_line_is_cut_to_the_terminal_width():
    """On a terminal the line is redrawn in place and never wraps: every drawn line is narrower than the
    terminal (its size as the terminal reports it, 50 columns here), and a line as long as the job's
    is cut; through a pipe the same job's lines are whole."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 50, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen([sys.executable, "-m", "litz.cli.litz", "run", *MLR, "epochs=3"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, start_new_session=True)
    os.close(slave)
    drawn = b""
    try:
        deadline = time.time() + 100
        while time.time() < deadline:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the job's end closed the terminal's last writer
                break
            if not chunk:
                break
            drawn += chunk
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        os.close(master)
    assert proc.returncode == 0, drawn[-2000:]
    text = drawn.decode(errors="replace").replace("\r\n", "\n")
    frames = [f for part in text.split("\r") for f in part.split("\n") if f.startswith("\033[K[litz")]
    assert frames, text
    widths = [len(f) - len("\033[K") for f in frames]
    assert max(widths) == 49, (widths, frames)  # cut to one column less than the terminal's 50
    res = run_cli(["litz", "run", *MLR, "epochs=3"], timeout=100)
    assert max(map(len, progress_lines(res.stderr))) > 60, res.stderr


@pytest.mark.timeout(120)
def test_metrics_memory_fields_from_the_first_line(tmp_path):
    """The first --metrics row already has every process's memory (it had zeros until the first STATS a
    second after the start)."""
    path = tmp_path / "m.jsonl"
    res = run_cli(["litz", "run", *MLR, "epochs=2", "--metrics", str(path), "--no-progress"], timeout=110)
    assert res.returncode == 0, res.stderr
    first = json.loads(path.read_text().splitlines()[0])
    assert first["epoch"] == 1
    assert first["workers_rss"] > 2 * 20 * 2**20 and first["servers_rss"] > 20 * 2**20, first
    assert first["executor_state_bytes"] > 0, first


@pytest.mark.timeout(180)
def test_plot_after_the_job_ended(tmp_path, litz_home):
    """The job's history stays in $LITZ_HOME/history/NAME (private), and `litzctl plot` draws it once the job is
    gone: loss and accuracy on axes of their own, every checkpoint's line named."""
    name = "plot-after"
    res = run_cli(["litz", "run", "apps.mlr", "--config", "synthetic=1", "n=100000", "n_test=2000", "epochs=8",
                   "--name", name, "--no-progress", "--checkpoint-dir", str(tmp_path / "ckpt"),
                   "--checkpoint-every", "0.1"], timeout=170)
    assert res.returncode == 0, res.stderr
    hist = litz_home / "history" / name
    assert stat.S_IMODE(hist.stat().st_mode) == 0o700
    for f in ("metrics.jsonl", "samples.jsonl", "events.json"):
        assert stat.S_IMODE((hist / f).stat().st_mode) == 0o600, f
    rows = metric_rows(hist / "metrics.jsonl")
    assert [r["epoch"] for r in rows] == list(range(1, 9))
    checkpoints = [e for e in json.loads((hist / "events.json").read_text()) if e["kind"] == "checkpoint"]
    assert checkpoints, "the job took no checkpoint"

    svg = tmp_path / "job.svg"
    res = run_cli(["litzctl", "--name", name, "plot", str(svg)], timeout=60)
    assert res.returncode == 0, res.stderr
    texts = [t.text.strip() for t in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}text") if t.text]
    assert "loss" in texts and "accuracy" in texts, texts  # the two y axes' labels
    assert "train_accuracy" in texts, texts  # the accuracy axis's legend
    assert texts.count("checkpoint") == min(len(checkpoints), 40), texts
    png = tmp_path / "job.png"
    assert run_cli(["litzctl", "--name", name, "plot", str(png)], timeout=60).returncode == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    res = run_cli(["litzctl", "--name", "never-ran", "plot", str(tmp_path / "x.png")], timeout=30)
    assert res.returncode == 2 and "no history of an ended one" in res.stderr, res.stderr
