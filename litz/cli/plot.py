"""``litzctl plot``: progress, processes and memory of a running job over time, with its events marked."""
from __future__ import annotations

from ..errors import LitzError

EVENT_COLOURS = {"scale_out": "tab:green", "scale_in": "tab:orange", "recovery": "tab:red",
                 "partial_recovery": "tab:red", "checkpoint": "tab:gray", "evict": "tab:purple"}


def plot_history(doc: dict, out: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LitzError("litzctl plot needs matplotlib: pip install 'litz[plot]'") from None
    hist = doc.get("history") or []
    if len(hist) < 2:
        raise LitzError("the job has not run long enough to plot (a sample a second)")
    t = [h["t"] for h in hist]
    numeric = sorted({k for h in hist for k, v in h["report"].items() if isinstance(v, (int, float))})
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    ax = axes[0]
    ax.plot(t, [h["tasks_per_s"] for h in hist], label="tasks/s", color="tab:blue")
    ax.set_ylabel("tasks/s")
    if numeric:
        twin = ax.twinx()
        for key in numeric[:3]:
            twin.plot(t, [h["report"].get(key) for h in hist], label=key, linestyle="--")
        twin.legend(loc="upper right", fontsize=8)
    ax.set_title(f"job {doc.get('name')}")
    ax = axes[1]
    ax.step(t, [h["workers"] for h in hist], where="post", label="workers")
    ax.step(t, [h["servers"] for h in hist], where="post", label="servers")
    ax.set_ylabel("processes")
    ax.legend(loc="upper left", fontsize=8)
    ax = axes[2]
    ax.plot(t, [h["workers_memory"] / 2**20 for h in hist], label="workers")
    ax.plot(t, [h["servers_memory"] / 2**20 for h in hist], label="servers")
    ax.set_ylabel("resident MiB")
    ax.set_xlabel("seconds since start")
    ax.legend(loc="upper left", fontsize=8)
    for ev in doc.get("events", []):
        colour = EVENT_COLOURS.get(ev["kind"])
        if colour and ev["kind"] != "evict":
            for a in axes:
                a.axvline(ev["t"], color=colour, alpha=0.4, linewidth=1)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
