"""Shared plumbing of the benchmark scripts: result JSON files and the results table in bench/README.md.

Each script owns the table rows keyed by its benchmark names (first column). :func:`update_rows` replaces
exactly those rows (or appends them), under a file lock, with an atomic rename, so scripts run one after
another or side by side never clobber each other's rows.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterator, Sequence

BENCH = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(BENCH, "results")
README = os.path.join(BENCH, "README.md")
MAIN_README = os.path.join(os.path.dirname(BENCH), "README.md")  # carries the same table, kept in step
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
HEADER = ("| benchmark | Litz | baseline | ratio | target | met | measured |\n"
          "|---|---|---|---|---|---|---|")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "readme.lock.tmp"), "w") as lock:  # *.tmp there is git-ignored
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _row(name: str, cells: Sequence[object]) -> str:
    return "| " + " | ".join(_cell(c) for c in (name, *cells)) + " |"


def update_rows(rows: dict[str, Sequence[object]], readme: str = README) -> None:
    """Replace (or append) the table rows whose first cell is a key of ``rows``; other rows are kept.

    Updating bench/README.md updates the copy of the table in the top-level README too."""
    with _locked():
        _update(rows, readme)
        if readme == README and BEGIN in open(MAIN_README).read():
            _update(rows, MAIN_README)


def _update(rows: dict[str, Sequence[object]], readme: str) -> None:
    text = open(readme).read() if os.path.exists(readme) else ""
    if BEGIN not in text or END not in text:
        text = text.rstrip("\n") + f"\n\n{BEGIN}\n{HEADER}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    table, tail = rest.split(END, 1)
    lines = [ln for ln in table.strip("\n").splitlines() if ln.strip()]
    if not lines[:2] or not lines[0].startswith("| benchmark"):
        lines = HEADER.splitlines() + lines
    pending = dict(rows)
    out = lines[:2]
    for ln in lines[2:]:
        key = ln.strip().strip("|").split("|", 1)[0].strip()
        if key in pending:
            out.append(_row(key, pending.pop(key)))
        else:
            out.append(ln)
    out += [_row(k, v) for k, v in pending.items()]
    new = f"{head}{BEGIN}\n" + "\n".join(out) + f"\n{END}{tail}"
    tmp = readme + ".tmp"
    with open(tmp, "w") as f:
        f.write(new)
    os.replace(tmp, readme)


def machine() -> dict:
    """Where and when a result was measured (the machine is shared: numbers are only comparable within a run)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH, capture_output=True,
                                text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
            "cpus": os.cpu_count(), "python": sys.version.split()[0], "commit": commit, **litz_tree()}


def litz_tree() -> dict:
    """Which litz was measured: its directory and a digest of its sources (the tree may be uncommitted)."""
    import litz

    root = os.path.dirname(os.path.abspath(litz.__file__))
    digest = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(f.read())
    return {"litz_path": root, "litz_sources_sha256": digest.hexdigest()[:16]}


def write_result(name: str, doc: dict, quick: bool = False) -> str:
    """Write ``bench/results/<name>.json`` (``<name>.quick.json`` for --quick runs) atomically; return its path."""
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.quick.json" if quick else f"{name}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"benchmark": name, "quick": quick, **machine(), **doc}, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path


def today() -> str:
    return datetime.date.today().isoformat()


def yes_no(ok: bool) -> str:
    return "yes" if ok else "**no**"
