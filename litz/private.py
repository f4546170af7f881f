"""Files that hold a job's state (checkpoints, the directory registry, its status) are the job owner's alone.

Checkpoints hold the model, the driver and every executor (pickles: whoever can change one runs code when it
is restored); the registry holds the job secret of local jobs and takes litzctl's requests. So every such
file is created 0600 and every directory Litz creates for them 0700, whatever the umask: another local user
can neither read nor change them. Directories a user names that already exist keep their mode.
"""
from __future__ import annotations

import os
from typing import BinaryIO

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: str, tighten: bool = False) -> str:
    """Create ``path`` and its missing parents, each 0700 (``os.makedirs`` would give the parents the umask's
    mode). ``tighten``: an existing ``path`` of ours is made 0700 too (a directory Litz itself owns, such as the
    registry, made by an older version). Returns ``path``."""
    if os.path.isdir(path):
        if tighten:
            st = os.stat(path)
            if st.st_uid == os.getuid() and st.st_mode & 0o777 != DIR_MODE:
                os.chmod(path, DIR_MODE)
        return path
    missing, p = [], os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by another process of the job (two workers writing parts), 0700 too
        os.chmod(d, DIR_MODE)  # mkdir's mode passes through the umask
    return path


def open_private(path: str) -> BinaryIO:
    """``path`` opened for writing (created or truncated) with mode 0600, for binary data."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # the umask, or an older file's mode, must not widen it
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


def write_private(path: str, data: bytes, sync: bool = False) -> None:
    """Replace ``path`` with ``data`` atomically (a temporary name, then a rename): a reader sees the old
    value or the new one, never half of one. ``sync``: on disk before the rename."""
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        with open_private(tmp) as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
