"""litz.checkpoint on real files, without a job: what makes a checkpoint complete, which one recovery picks, and
that a damaged part is refused rather than loaded."""
from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from litz.checkpoint import (
    FORMAT,
    MANIFEST,
    Checkpoint,
    CheckpointStore,
    executor_part,
    read_part,
    shard_part,
    write_part,
)
from litz.errors import LitzError


def save(store: CheckpointStore, parts: dict, **extra) -> str:
    """One whole checkpoint as the master writes it: parts into the temporary directory, then the manifest."""
    seq, tmp = store.begin()
    files = {rel: write_part(tmp, rel, obj, sync=seq % 2 == 0) for rel, obj in parts.items()}
    return store.commit(seq, tmp, {"files": files, **extra})


def test_part_names_sort_by_number():
    assert executor_part(12) == "executors/e00012.pkl" and shard_part(40) == "shards/s00040.pkl"


def test_a_part_reads_back_and_a_damaged_one_is_refused(tmp_path):
    meta = write_part(str(tmp_path), "shards/s00001.pkl", {"w": np.arange(4.0)})
    path = tmp_path / "shards" / "s00001.pkl"
    assert meta["bytes"] == path.stat().st_size and len(meta["sha256"]) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # a checkpoint is the model
    assert read_part(str(tmp_path), "shards/s00001.pkl", meta)["w"].tolist() == [0, 1, 2, 3]
    data = bytearray(path.read_bytes())
    data[-2] ^= 0xFF  # same size, other bytes
    path.write_bytes(bytes(data))
    with pytest.raises(LitzError, match=r"s00001.pkl is corrupted \(size or checksum"):
        read_part(str(tmp_path), "shards/s00001.pkl", meta)
    with pytest.raises(LitzError, match="corrupted"):
        read_part(str(tmp_path), "shards/s00001.pkl", {**meta, "bytes": meta["bytes"] + 1})
    with pytest.raises(LitzError, match="s00002.pkl is unreadable: No such file"):
        read_part(str(tmp_path), "shards/s00002.pkl", meta)


def test_a_committed_checkpoint_is_complete_with_its_manifest(tmp_path):
    store = CheckpointStore(str(tmp_path / "ck"))
    path = save(store, {executor_part(0): {"ran": 3}, shard_part(1): [1, 2]}, driver="d")
    assert os.path.basename(path) == "ckpt-000001" and os.listdir(store.root) == ["ckpt-000001"]
    [ck] = store.complete()
    assert (ck.path, ck.seq) == (path, 1)
    assert ck.manifest["format"] == FORMAT and ck.manifest["seq"] == 1 and ck.manifest["run"] == store.run
    assert ck.manifest["driver"] == "d" and ck.manifest["written"] > 0
    assert ck.part(executor_part(0)) == {"ran": 3} and ck.part(shard_part(1)) == [1, 2]
    assert store.check(path) is None and store.skipped() == []


def test_an_unfinished_or_aborted_checkpoint_is_never_used_and_numbers_go_on(tmp_path):
    store = CheckpointStore(str(tmp_path))
    save(store, {shard_part(0): 1})
    seq, tmp = store.begin()
    write_part(tmp, shard_part(0), 2)  # a crash before the manifest: still the temporary directory
    assert seq == 2 and [c.seq for c in store.complete()] == [1] and store.skipped() == []
    store.abort(tmp)
    assert not os.path.exists(tmp)
    seq, tmp = store.begin()
    assert seq == 2 and stat.S_IMODE(os.stat(tmp).st_mode) == 0o700
    store.abort(tmp)
    assert [c.seq for c in store.complete()] == [1]


@pytest.mark.parametrize("damage,reason", [
    ("truncate", "shards/s00000.pkl is truncated"), ("remove", "shards/s00000.pkl is missing"),
    ("manifest", "no readable manifest"), ("format", "unknown format 99")])
def test_a_damaged_checkpoint_is_skipped_with_its_reason_and_the_one_before_is_used(tmp_path, damage, reason):
    store = CheckpointStore(str(tmp_path))
    save(store, {shard_part(0): list(range(100))})
    path = save(store, {shard_part(0): list(range(200))})
    part = os.path.join(path, shard_part(0))
    if damage == "truncate":
        os.truncate(part, os.path.getsize(part) - 1)
    elif damage == "remove":
        os.remove(part)
    elif damage == "manifest":
        with open(os.path.join(path, MANIFEST), "w") as f:
            f.write("{not json")
    else:
        manifest = json.load(open(os.path.join(path, MANIFEST)))
        json.dump({**manifest, "format": 99}, open(os.path.join(path, MANIFEST), "w"))
    assert store.check(path) == reason
    assert store.skipped() == [(path, reason)]
    [ck] = store.complete()
    assert ck.seq == 1 and ck.part(shard_part(0)) == list(range(100))


def test_another_runs_checkpoints_are_not_this_jobs_unless_it_resumes_them(tmp_path):
    first = CheckpointStore(str(tmp_path))
    save(first, {shard_part(0): "first"})
    again = CheckpointStore(str(tmp_path))  # the same command run again, without --resume
    assert again.run != first.run and again.complete() == []
    assert [c.seq for c in again.complete(any_run=True)] == [1]
    again.adopt(again.complete(any_run=True)[0])
    assert again.run == first.run
    save(again, {shard_part(0): "resumed"})
    assert [c.seq for c in again.complete()] == [2, 1]


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(keep=st.integers(-1, 4), commits=st.integers(0, 6))
def test_the_newest_keep_checkpoints_stay_newest_first(tmp_path_factory, keep, commits):
    store = CheckpointStore(str(tmp_path_factory.mktemp("ck")), keep=keep)
    for i in range(commits):
        save(store, {executor_part(i): i})
    kept = list(range(commits, max(0, commits - max(1, keep)), -1))
    found = store.complete()
    assert [c.seq for c in found] == kept
    assert [c.part(executor_part(c.seq - 1)) for c in found] == [s - 1 for s in kept]
    assert sorted(os.listdir(store.root)) == [f"ckpt-{s:06d}" for s in sorted(kept)]


def test_other_files_in_the_directory_are_ignored(tmp_path):
    store = CheckpointStore(str(tmp_path))
    for name in ("ckpt-", "ckpt-12a", "ckpt-x000009", "notes-000009", "ckpt-000005.old"):
        (tmp_path / name).mkdir()
    assert store.begin()[0] == 1
    assert store.skipped() == []


def test_numbers_go_on_past_six_digits(tmp_path):
    (tmp_path / "ckpt-100000").mkdir()
    store = CheckpointStore(str(tmp_path))
    assert store.begin()[0] == 100001


def test_a_checkpoint_begun_again_after_a_crash_starts_empty_and_an_abort_may_come_twice(tmp_path):
    store = CheckpointStore(str(tmp_path))
    seq, tmp = store.begin()
    write_part(tmp, shard_part(0), "half written")  # the master died here; the next one begins the same number
    assert store.begin() == (seq, tmp) and os.listdir(tmp) == []
    store.abort(tmp)
    store.abort(tmp)  # a failed checkpoint is aborted whether or not its directory is still there
    assert not os.path.exists(tmp)


def test_a_directory_that_cannot_be_used_is_one_clear_line(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    with pytest.raises(LitzError, match=r"checkpoint directory .*file/ck cannot be created: Not a directory"):
        CheckpointStore(str(tmp_path / "file" / "ck"))
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root writes anywhere: make this directory one root may not write either
        monkeypatch.setattr(os, "access", lambda path, mode: not (path == str(locked) and mode == os.W_OK))
    with pytest.raises(LitzError, match=f"checkpoint directory {locked} is not writable"):
        CheckpointStore(str(locked))


def test_a_checkpoint_part_is_looked_up_in_its_manifest(tmp_path):
    store = CheckpointStore(str(tmp_path))
    save(store, {shard_part(3): "three"})
    ck = Checkpoint(*[(c.path, c.seq, c.manifest) for c in store.complete()][0])
    with pytest.raises(KeyError):
        ck.part(shard_part(4))
