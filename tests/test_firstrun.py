"""An app's first run: numba kernels compiled ahead of time (litz warmup), or said so while they compile.

Every test points numba's cache at its own empty directory ($NUMBA_CACHE_DIR), which is a cold cache: the first
run after an install, as a user meets it.
"""
from __future__ import annotations

import json
import os

import pytest

from tests.support.processes import Processes, app_path, run_cli, status, wait_for

LDA_SMALL = ["synthetic=1", "docs=300", "vocab=200", "topics=8", "epochs=3"]
FIRST_RUN = "compiling kernels (first run only)"


@pytest.fixture
def cold_cache(tmp_path, monkeypatch):
    path = tmp_path / "numba-cache"
    path.mkdir()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(path))
    return path


def compiles(out) -> list[tuple[str, str]]:
    events = json.loads(out.read_text())["events"]
    return [(e["process"], e["kernel"]) for e in events if e["kind"] == "compile"]


@pytest.mark.timeout(400)
def test_after_warmup_a_run_compiles_nothing(tmp_path, cold_cache):
    """`litz warmup` compiles the kernels for the very argument types the executors pass: a run after it
    compiles no kernel, neither in the master nor in a worker (a signature that differed, even as a string
    against the types a call passes, would compile again in each worker and show as a compile event)."""
    res = run_cli(["litz", "warmup", "apps.lda", "apps.mlr"], timeout=380)
    assert res.returncode == 0, res.stderr
    assert "[1/4] apps.lda.kernels.sample_task: compiled in" in res.stdout, res.stdout
    assert "apps.lda: 4 compiled, 0 in the cache already" in res.stdout, res.stdout
    assert f"cache in {cold_cache}" in res.stdout, res.stdout
    assert "apps.mlr: no numba kernels" in res.stdout
    assert any(cold_cache.rglob("*.nbi")), "nothing was written to the cache"

    out = tmp_path / "out.json"
    res = run_cli(["litz", "run", "apps.lda", "--config", *LDA_SMALL, "--output", str(out)], timeout=300)
    assert res.returncode == 0, res.stderr
    assert FIRST_RUN not in res.stderr, res.stderr
    assert compiles(out) == []
    assert json.loads(out.read_text())["result"]["epochs"] == 3

    res = run_cli(["litz", "warmup", "apps.lda"], timeout=120)
    assert "apps.lda: 0 compiled, 4 in the cache already" in res.stdout, res.stdout


@pytest.mark.timeout(600)
def test_hdbscan_workers_load_what_the_master_compiled(tmp_path, cold_cache):
    """A cold cache: the master compiles HDBSCAN's 17 declared kernels (whose signatures are strings in the
    app) before it starts the workers, which were forked before that and call the kernels with numba types.
    They find them in the cache only if the master filed them under those types, not under the strings:
    no worker compiles anything. The next run compiles nothing at all."""
    out = tmp_path / "out.json"
    args = ["litz", "run", "apps.hdbscan", "--config", "synthetic=1", "n=3000", "clusters=10", "--output", str(out)]
    res = run_cli(args, timeout=580)
    assert res.returncode == 0, res.stderr
    done = compiles(out)
    assert len(done) == 17 and {p for p, _ in done} == {"master"}, done
    res = run_cli(args, timeout=300)
    assert res.returncode == 0, res.stderr
    assert FIRST_RUN not in res.stderr and compiles(out) == [], res.stderr


@pytest.mark.timeout(400)
def test_a_cold_cache_says_it_compiles_on_the_terminal_and_in_status(tmp_path, cold_cache):
    """Without warmup the master compiles the app's declared kernels before it starts the workers: the
    progress line and `litzctl status` name the kernel, and the workers then load it from the cache."""
    name, out = "cold-lda", tmp_path / "out.json"
    with Processes() as procs:
        job = procs.start(["litz", "run", "apps.lda", "--name", name, "--config", *LDA_SMALL,
                           "--output", str(out)])
        st = wait_for(lambda: (s := status(name)) and s.get("compiling") and s, 120, "a compiling status")
        assert st["compiling"]["master"].startswith("apps.lda."), st["compiling"]
        text = run_cli(["litzctl", "--name", name, "status"], timeout=30).stdout
        assert f"{FIRST_RUN}: apps.lda." in text, text
        _, stderr = job.communicate(timeout=300)
    assert job.returncode == 0, stderr
    assert f"{FIRST_RUN}: apps.lda.kernels.sample_task (1/4) on master" in stderr, stderr
    done = compiles(out)
    assert ("master", "apps.lda.kernels.sample_task") in done
    assert all(process == "master" for process, _ in done), done  # the workers found it in the cache


@pytest.mark.timeout(300)
def test_a_worker_that_compiles_says_so(tmp_path, cold_cache):
    """A kernel no app declaration covers compiles in the worker at its first call: the worker tells the master
    as it starts (the progress line names it and the worker) and when it is done (a compile event)."""
    out = tmp_path / "out.json"
    res = run_cli(["litz", "run", app_path("jitted"), "--workers", "1", "--output", str(out)], timeout=280,
                  env={**os.environ, "LITZ_PROGRESS_EVERY": "0.1"})
    assert res.returncode == 0, res.stderr
    assert f"{FIRST_RUN}: " in res.stderr and "weighted_sum on w0" in res.stderr, res.stderr
    done = compiles(out)
    assert len(done) == 1 and done[0][0] == "w0" and done[0][1].endswith("weighted_sum"), done


@pytest.mark.timeout(120)
def test_numba_gets_a_private_cache_where_its_own_places_are_not_writable(tmp_path):
    """A user whose home cannot hold numba's per-user cache (and a read-only site-packages): the app still
    imports, with $NUMBA_CACHE_DIR pointed at a private directory; where numba's own place is writable, it
    is left alone."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = ("import os; from litz.kernels import ensure_cache_dir; print(ensure_cache_dir()); "
              "print(os.environ.get('NUMBA_CACHE_DIR'))")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    import subprocess
    import sys

    def run(**extra):
        res = subprocess.run([sys.executable, "-c", script], env={**env, **extra}, capture_output=True, text=True,
                             timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert res.returncode == 0, res.stderr
        return res.stdout.split()

    chosen, set_to = run(XDG_CACHE_HOME=str(blocker / "cache"), TMPDIR=str(tmp))
    assert chosen == set_to == str(tmp / f"litz-numba-{os.getuid()}")
    assert (os.stat(chosen).st_mode & 0o777) == 0o700
    os.chmod(chosen, 0o755)  # not private: never used, a fresh private directory instead
    chosen, _ = run(XDG_CACHE_HOME=str(blocker / "cache"), TMPDIR=str(tmp))
    assert chosen.startswith(str(tmp / "litz-numba-")) and chosen != str(tmp / f"litz-numba-{os.getuid()}")
    assert run(XDG_CACHE_HOME=str(tmp_path / "cache")) == ["None", "None"]
