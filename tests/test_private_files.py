"""Files that hold job state are their user's alone: checkpoints, the registry and the status in it are created
0600 in 0700 directories, whatever the umask (another local user could read the model or plant a pickle)."""
import os
import stat

import pytest

from litz.membership.filekv import FileKV
from litz.private import open_private, private_dir, write_private
from tests.support.chains import CHAINS
from tests.support.processes import Processes, app_path, ctl, wait_for


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def modes_under(root) -> dict[str, int]:
    """Every directory and file below ``root`` (not ``root`` itself) -> its permission bits."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            try:
                out[os.path.relpath(path, root)] = mode(path)
            except FileNotFoundError:  # a temporary name renamed meanwhile (a running job's registry)
                pass
    return out


def assert_private(root) -> None:
    found = modes_under(root)
    assert found, f"nothing under {root}"
    wrong = {p: oct(m) for p, m in found.items()
             if m != (0o700 if os.path.isdir(os.path.join(root, p)) else 0o600)}
    assert not wrong, wrong


@pytest.fixture
def open_umask():
    old = os.umask(0o002)  # the widest umask in common use: group-writable files
    yield
    os.umask(old)


def test_helpers_make_private_dirs_and_files_whatever_the_umask(tmp_path, open_umask):
    deep = tmp_path / "a" / "b" / "c"
    private_dir(str(deep))
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o700] * 3  # parents too
    write_private(str(deep / "f"), b"x")
    assert mode(deep / "f") == 0o600 and (deep / "f").read_bytes() == b"x"
    loose = tmp_path / "loose"
    loose.write_bytes(b"old")
    loose.chmod(0o644)
    with open_private(str(loose)) as f:  # an existing file is narrowed too
        f.write(b"new")
    assert mode(loose) == 0o600 and loose.read_bytes() == b"new"
    assert not [p for p in os.listdir(deep) if p.endswith(".tmp")]
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    private_dir(str(mine))
    assert mode(mine) == 0o755  # a directory the user made keeps its mode ...
    private_dir(str(mine), tighten=True)
    assert mode(mine) == 0o700  # ... unless it is Litz's own


def test_directory_registry_is_private_and_tightens_an_older_one(tmp_path, open_umask):
    root = tmp_path / "registry"
    root.mkdir(mode=0o755)  # as an older version left it
    kv = FileKV(str(root))
    kv.put("litz/jobs/j/status", {"state": "running"})
    kv.put("litz/jobs/j/secret", "s")
    assert kv.create("litz/jobs/j/master", {"pid": 1}, kv.lease(3.0))
    assert mode(root) == 0o700
    assert_private(root)


@pytest.mark.timeout(120)
def test_a_running_jobs_checkpoints_registry_and_status_are_private(tmp_path, litz_home):
    """Checkpoint directories and parts (full and SCAR's running checkpoint), the registry and the status
    document in it, while a real job runs under a umask that would make them group-readable."""
    name, ckpt = "private-files", tmp_path / "ckpt"
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("chains"), "--name", name, "--executors", "4",
                           "--checkpoint-dir", str(ckpt), "--checkpoint-every", "0.3", "--partial-recovery",
                           "--priority-checkpoint", "0.5", "--config", f"chains={CHAINS}", "steps=2000",
                           "sleep=0.002", "--no-progress"], preexec_fn=lambda: os.umask(0o002))

        def two_checkpoints_and_a_running_one():
            done = sorted(d for d in os.listdir(ckpt) if d.startswith("ckpt-")) if ckpt.exists() else []
            return len(done) >= 2 and (ckpt / "running" / "shards").is_dir()

        wait_for(two_checkpoints_and_a_running_one, 60, "two checkpoints and a running checkpoint")
        registry = litz_home / "registry"
        wait_for(lambda: (registry / "kv" / "litz" / "jobs" / name / "status.json").exists(), 30, "the status")
        assert mode(ckpt) == 0o700 and mode(litz_home) == 0o700 and mode(registry) == 0o700
        assert_private(registry)
        assert ctl(name, "stop").returncode == 0
        job.communicate(timeout=60)
    assert_private(ckpt)
    parts = modes_under(ckpt)
    assert any(p.endswith("manifest.json") for p in parts) and any(p.startswith("running/shards/") for p in parts)
