"""Checkpoint files: parts written atomically with checksums, a manifest that makes a checkpoint complete.

Layout of ``DIR/ckpt-000007/``: ``manifest.json`` (written last), ``driver.pkl`` (driver, counters,
buffered tasks), ``executors/e00012.pkl`` (one per executor, without input data), ``shards/s00040.pkl``
(one per logical shard). One file per executor and per shard lets a checkpoint be restored onto any
number of workers and servers. A checkpoint is built in ``DIR/.ckpt-000007.tmp`` and renamed into place
once every part is on disk, so a crash or a full disk while writing never damages an earlier one. Parts are
0600 in 0700 directories (:mod:`litz.private`): a checkpoint is the model and pickles that restoring runs.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from dataclasses import dataclass
from typing import Any

import cloudpickle

from . import clock
from .errors import LitzError
from .private import open_private, private_dir

MANIFEST = "manifest.json"
FORMAT = 1


def executor_part(eid: int) -> str:
    return f"executors/e{eid:05d}.pkl"


def shard_part(shard: int) -> str:
    return f"shards/s{shard:05d}.pkl"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_part(root: str, rel: str, obj: Any, sync: bool = True) -> dict:
    """Pickle ``obj`` to ``root/rel``; returns its size and checksum for the manifest.

    ``sync=False`` leaves durability to one :func:`sync_filesystem` after all of a process's parts: one
    flush of the filesystem instead of an fsync per file (dozens of shards made checkpoints slow)."""
    data = cloudpickle.dumps(obj, protocol=5)
    path = os.path.join(root, rel)
    private_dir(os.path.dirname(path))
    with open_private(path) as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def pause_for_test(ident: str, tmp: str) -> None:
    """``LITZ_TEST_CHECKPOINT_PAUSE=s0:2`` (tests only): process s0 stops itself (SIGSTOP) right after it wrote
    its first part of checkpoint 2 (in ``tmp``), so that a test can kill it in the middle of writing one."""
    who, _, seq = os.environ.get("LITZ_TEST_CHECKPOINT_PAUSE", "").partition(":")
    if who == ident and os.path.basename(tmp) == f".ckpt-{int(seq):06d}.tmp":
        import signal

        os.kill(os.getpid(), signal.SIGSTOP)


def sync_filesystem(path: str) -> None:
    """Make everything written under ``path`` durable with one syncfs(2) (Linux), else a global sync."""
    fd = os.open(path, os.O_RDONLY)
    try:
        import ctypes

        if ctypes.CDLL("libc.so.6", use_errno=True).syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), "syncfs failed")
    except (OSError, AttributeError):
        os.sync()
    finally:
        os.close(fd)


def read_part(root: str, rel: str, expected: dict) -> Any:
    """Load a part, refusing one whose size or checksum differs from the manifest's."""
    path = os.path.join(root, rel)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise LitzError(f"checkpoint part {path} is unreadable: {exc.strerror}") from None
    if len(data) != expected["bytes"] or hashlib.sha256(data).hexdigest() != expected["sha256"]:
        raise LitzError(f"checkpoint part {path} is corrupted (size or checksum differs from the manifest)")
    return cloudpickle.loads(data)


@dataclass
class Checkpoint:
    path: str
    seq: int
    manifest: dict

    def part(self, rel: str) -> Any:
        return read_part(self.path, rel, self.manifest["files"][rel])


class CheckpointStore:
    def __init__(self, root: str, keep: int = 3):
        self.root = os.path.abspath(root)
        self.keep = max(1, keep)
        try:
            private_dir(self.root)  # one the user made beforehand keeps its mode; what goes in it is private
        except OSError as exc:
            raise LitzError(f"checkpoint directory {self.root} cannot be created: {exc.strerror}") from None
        if not os.access(self.root, os.W_OK):
            raise LitzError(f"checkpoint directory {self.root} is not writable")
        # This job's checkpoints. The directory may hold an earlier run's (the same command run again without
        # --resume): recovering from one of those would put the job back into another run's state.
        self.run: str | None = secrets.token_hex(8)

    def adopt(self, ckpt: Checkpoint) -> None:
        """--resume: the resumed run's checkpoints are this job's too (None: written before runs had ids)."""
        self.run = ckpt.manifest.get("run")

    def _seqs(self) -> list[int]:
        seqs = []
        for name in os.listdir(self.root):
            if name.startswith("ckpt-") and name[5:].isdigit():
                seqs.append(int(name[5:]))
        return sorted(seqs)

    def begin(self) -> tuple[int, str]:
        """A fresh temporary directory for the next checkpoint."""
        seqs = self._seqs()
        seq = (seqs[-1] + 1) if seqs else 1
        tmp = os.path.join(self.root, f".ckpt-{seq:06d}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        private_dir(tmp)  # renamed into place as it is
        return seq, tmp

    def commit(self, seq: int, tmp: str, manifest: dict) -> str:
        """Write the manifest and rename the checkpoint into place; prune old ones."""
        manifest = {**manifest, "format": FORMAT, "seq": seq, "run": self.run, "written": clock.time()}
        path = os.path.join(tmp, MANIFEST)
        with open_private(path) as f:
            f.write(json.dumps(manifest).encode())
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        final = os.path.join(self.root, f"ckpt-{seq:06d}")
        os.rename(tmp, final)
        _fsync_dir(self.root)
        for old in self._seqs()[: -self.keep]:
            shutil.rmtree(os.path.join(self.root, f"ckpt-{old:06d}"), ignore_errors=True)
        return final

    def abort(self, tmp: str) -> None:
        shutil.rmtree(tmp, ignore_errors=True)

    def complete(self, any_run: bool = False) -> list[Checkpoint]:
        """This run's complete checkpoints (``any_run``: every run's), newest first: manifest readable and
        every part present at its size."""
        found = []
        for seq in reversed(self._seqs()):
            path = os.path.join(self.root, f"ckpt-{seq:06d}")
            problem = self.check(path)
            if problem:
                continue
            with open(os.path.join(path, MANIFEST)) as f:
                manifest = json.load(f)
            if any_run or manifest.get("run") == self.run:
                found.append(Checkpoint(path, seq, manifest))
        return found

    def check(self, path: str) -> str | None:
        """Why the checkpoint at ``path`` cannot be used (cheap checks), or None."""
        try:
            with open(os.path.join(path, MANIFEST)) as f:
                manifest = json.load(f)
        except (OSError, ValueError):
            return "no readable manifest"
        if manifest.get("format") != FORMAT:
            return f"unknown format {manifest.get('format')!r}"
        for rel, meta in manifest.get("files", {}).items():
            try:
                if os.path.getsize(os.path.join(path, rel)) != meta["bytes"]:
                    return f"{rel} is truncated"
            except OSError:
                return f"{rel} is missing"
        return None

    def skipped(self) -> list[tuple[str, str]]:
        """(path, reason) of checkpoint directories that are not usable, for warnings."""
        out = []
        for seq in self._seqs():
            path = os.path.join(self.root, f"ckpt-{seq:06d}")
            problem = self.check(path)
            if problem:
                out.append((path, problem))
        return out
