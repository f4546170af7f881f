"""The documentation stays true: no dead links to repository files, no issue numbers (a reader cannot see
the issues), the README's test command is what CI runs, every litz.run() option is documented, and the
benchmark scripts still find the results table they update."""
from __future__ import annotations

import glob
import os
import re
import shutil

import pytest

import litz
from litz.job import JOB_OPTIONS
from tests.support.bench import bench_module
from tests.support.processes import ROOT

DOCS = ["README.md", "docs/*.md", "apps/*/README.md", "bench/README.md", "bench/HISTORY.md", "deploy/README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target)
# a backquoted repository path: `litz/cache.py`, `bench/README.md`, `DESIGN.md`
PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)*\.(?:py|md|sh|yaml|yml|toml|cfg|sbatch))`")
MARKDOWN = re.compile(r"(?<![\w/.-])([\w.-]+(?:/[\w.-]+)*\.md)\b")  # any file.md named in the text, quoted or not
ISSUE = re.compile(r"(?i)\bissues?\s*#?\d+|(?<![\w&/])#\d+\b")


def doc_files() -> list[str]:
    files = sorted({f for pattern in DOCS for f in glob.glob(os.path.join(ROOT, pattern))})
    assert len(files) >= 8, files
    return files


def dead_references(path: str) -> list[str]:
    """Relative links and backquoted repository paths in ``path`` whose target does not exist."""
    text = open(path).read()
    here = os.path.dirname(path)
    dead = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or a heading in the same file
        if not os.path.exists(os.path.join(here, target.split("#", 1)[0])):
            dead.append(f"link {target}")
    for name in PATH.findall(text):
        if "/" not in name and not name.endswith(".md"):
            continue  # a bare module file name, said of the app or package at hand
        if not any(os.path.exists(os.path.join(base, name)) for base in (ROOT, here)):
            dead.append(f"path {name}")
    for name in MARKDOWN.findall(text):
        if not any(os.path.exists(os.path.join(base, name)) for base in (ROOT, here)) and f"path {name}" not in dead:
            dead.append(f"named {name}")
    return dead


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_no_dead_links_or_issue_numbers(path: str) -> None:
    assert dead_references(path) == []
    text = open(path).read()
    assert ISSUE.findall(text) == []


def test_the_checks_catch_what_they_look_for(tmp_path) -> None:
    page = tmp_path / "page.md"
    page.write_text("See [the notes](docs/x.md), `docs/missing.py`, DESIGN.md §1 and [ok](page.md#top); fixed in "
                    "issue 4 (#12).")
    assert dead_references(str(page)) == ["link docs/x.md", "path docs/missing.py", "named docs/x.md",
                                          "named DESIGN.md"]
    assert ISSUE.findall(page.read_text()) == ["issue 4", "#12"]


def test_ci_runs_the_readme_test_command() -> None:
    command = open(os.path.join(ROOT, ".ci", "run")).read().strip().splitlines()[-1]
    assert command.endswith("python -m pytest -q") and "python3 -m venv .venv" in command
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert f"\n    {command}\n" in readme  # the README's indented code line, character for character


def test_every_litz_run_option_is_documented() -> None:
    assert "run" in litz.__all__ and callable(litz.run)
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme.split("## Running a job from Python: `litz.run()`", 1)[1].split("\n## ", 1)[0]
    assert "litz.run(app, workers=2, servers=1, executors=None, config=None, **options)" in section
    rows = set(re.findall(r"^\| `(\w+)` \|", section, re.M))
    assert rows == JOB_OPTIONS


def test_the_bench_scripts_still_find_their_table(tmp_path) -> None:
    """bench/_table.py replaces a benchmark's row in place in bench/README.md; the top README carries the same
    rows. Done on a copy, so the real table is untouched."""
    _table = bench_module("_table")

    def rows(text: str) -> list[str]:
        return text.split(_table.BEGIN, 1)[1].split(_table.END, 1)[0].strip().splitlines()

    bench = open(_table.README).read()
    assert rows(bench) == rows(open(_table.MAIN_README).read())
    copy = tmp_path / "README.md"
    shutil.copy(_table.README, copy)
    _table.update_rows({"throughput": ["1 tasks/s", "Ray 1 tasks/s", "1.0x", "target", "no", "2000-01-01"]},
                       readme=str(copy))
    after = copy.read_text()
    new = [r for r in rows(after) if r.startswith("| throughput |")]
    assert new == ["| throughput | 1 tasks/s | Ray 1 tasks/s | 1.0x | target | no | 2000-01-01 |"]
    assert len(rows(after)) == len(rows(bench))  # replaced, not appended: the script found its row
    before_table, after_table = bench.split(_table.BEGIN)[0], bench.split(_table.END)[1]
    assert after.startswith(before_table) and after.endswith(after_table)
