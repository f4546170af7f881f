"""``litzctl plot``: a job's metrics, speed, processes and memory over time, with every event marked and named.

The data is the same for a running job (its master answers the request) and an ended one (its history in
``$LITZ_HOME/history/<job name>/``: ``metrics.jsonl``, the ``--metrics`` rows; ``samples.jsonl``, the status
once a second; ``events.json``): ``{"name", "metrics": rows, "history": samples, "events": events}``.
"""
from __future__ import annotations

import json
import os

from ..errors import LitzError

EVENT_COLOURS = {"scale_out": "tab:green", "scale_in": "tab:orange", "recovery": "tab:red",
                 "partial_recovery": "tab:red", "partial_recovery_failed": "tab:red", "checkpoint": "tab:gray",
                 "checkpoint_failed": "tab:brown", "priority_checkpoint": "tab:olive", "resume": "tab:cyan",
                 "stop": "black", "memory_limit": "tab:purple", "registry_outage": "tab:pink",
                 "evict_failed": "tab:purple"}
MAX_LABELS = 40  # event lines named on the plot; the rest are drawn, and counted in the legend
# the --metrics fields that are not the app's own metrics
ROW_FIELDS = {"t", "time", "workers", "servers", "workers_rss", "servers_rss", "executor_state_bytes",
              "evicted_executors"}


def _kind(key: str) -> str:
    k = key.lower()
    if "acc" in k or "recall" in k or "precision" in k:
        return "accuracy"
    if "loss" in k or "objective" in k or "likelihood" in k or "error" in k or "sse" in k:
        return "loss"
    return "other"


def load_history(home: str, name: str) -> dict | None:
    """The plot's data for an ended job from its history directory, or None if it kept none."""
    from ..joblog import history_dir

    try:
        path = history_dir(home, name)
    except ValueError:
        return None
    if not os.path.isfile(os.path.join(path, "events.json")):
        return None

    def rows(file: str) -> list[dict]:
        try:
            with open(os.path.join(path, file)) as f:
                return [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError):
            return []

    try:
        with open(os.path.join(path, "events.json")) as f:
            events = json.load(f)
    except (OSError, ValueError):
        events = []
    return {"name": name, "metrics": rows("metrics.jsonl"), "history": rows("samples.jsonl"), "events": events}


def metric_panels(rows: list[dict], skip: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """The app's numeric metrics by panel: "loss" (loss, objective, likelihood), "accuracy", and up to three
    others when neither is there; counters such as ``epoch`` (``skip``) are the x axis's business."""
    keys: list[str] = []
    for r in rows:
        for k, v in r.items():
            if k not in ROW_FIELDS and k not in skip and k not in keys and isinstance(v, (int, float)) \
                    and not isinstance(v, bool):
                keys.append(k)
    panels: dict[str, list[str]] = {"loss": [], "accuracy": [], "other": []}
    for k in keys:
        panels[_kind(k)].append(k)
    if panels["loss"] or panels["accuracy"]:
        panels["other"] = []
    panels["other"] = panels["other"][:3]
    return {k: v for k, v in panels.items() if v}


def plot_history(doc: dict, out: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        matplotlib.rcParams["svg.fonttype"] = "none"  # an SVG keeps its labels as text
        import matplotlib.pyplot as plt
    except ImportError:
        raise LitzError("litzctl plot needs matplotlib: pip install 'litz[plot]'") from None
    hist = doc.get("history") or []
    rows = doc.get("metrics") or []
    if len(hist) < 2 and len(rows) < 2:
        raise LitzError("the job has not run long enough to plot (a sample a second)")
    skip = ("epoch", "iteration", "round", "stage")
    panels = metric_panels(rows, skip)
    titles = {"loss": "loss", "accuracy": "accuracy", "other": "metrics"}
    n = len(panels) + (3 if len(hist) >= 2 else 0)
    fig, axes = plt.subplots(n, 1, figsize=(9, 2.3 * n + 0.8), sharex=True, squeeze=False)
    axes = list(axes[:, 0])
    i = 0
    for panel, keys in panels.items():
        ax = axes[i]
        i += 1
        for key in keys:
            pts = [(r["t"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 50 else None, label=key)
        ax.set_ylabel(titles[panel])
        ax.legend(loc="best", fontsize=8)
    if len(hist) >= 2:
        t = [h["t"] for h in hist]
        ax = axes[i]
        ax.plot(t, [h["tasks_per_s"] for h in hist], color="tab:blue", label="tasks/s")
        ax.set_ylabel("tasks/s")
        ax = axes[i + 1]
        ax.step(t, [h["workers"] for h in hist], where="post", label="workers")
        ax.step(t, [h["servers"] for h in hist], where="post", label="servers")
        ax.set_ylabel("processes")
        ax.legend(loc="upper left", fontsize=8)
        ax = axes[i + 2]
        ax.plot(t, [h["workers_memory"] / 2**20 for h in hist], label="workers")
        ax.plot(t, [h["servers_memory"] / 2**20 for h in hist], label="servers")
        ax.set_ylabel("resident MiB")
        ax.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("seconds since start")
    axes[0].set_title(f"job {doc.get('name')}")
    _mark_events(axes, doc.get("events") or [])
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def _mark_events(axes: list, events: list[dict]) -> None:
    """A vertical line per event on every panel, its kind written beside it on the top one."""
    labelled = 0
    for ev in events:
        colour = EVENT_COLOURS.get(ev.get("kind"))
        if colour is None or not isinstance(ev.get("t"), (int, float)):
            continue  # evictions, loads and compiles are too many to draw
        for a in axes:
            a.axvline(ev["t"], color=colour, alpha=0.5, linewidth=1)
        if labelled < MAX_LABELS:
            labelled += 1
            top = axes[0]
            top.text(ev["t"], 1.0, f" {ev['kind']}", transform=top.get_xaxis_transform(),
                     rotation=90, va="top", ha="right", fontsize=7, color=colour)
