"""The CPU a process may use by its cgroup's quota (a container's CPU limit, a throttled neighbour's share).

Why placement needs it: a quota stalls a process only once its demand passes the quota. A worker holding few
executors finishes each step inside its share of the period and looks as fast as an unthrottled one; given more
executors it stalls and looks slow again, and a policy that follows the measured speed moves executors back and
forth. The quota itself says what the worker can sustain, whatever its load (docs/design.md, "Placement policy").

cgroup v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``) and v2 (``cpu.max``); the limit is the smallest over the
process's group and its ancestors, as the kernel applies each of them.
"""
from __future__ import annotations

import os

PROC_CGROUP = "/proc/self/cgroup"
PROC_MOUNTS = "/proc/self/mountinfo"


def _mounts(mountinfo: str) -> tuple[tuple[str, str] | None, tuple[str, str] | None]:
    """(root, mount point) of the cgroup v1 hierarchy with the ``cpu`` controller, and of the v2 hierarchy."""
    v1 = v2 = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        post = line.split(" - ", 1)[1].split()
        if len(post) < 3:
            continue
        if post[0] == "cgroup" and "cpu" in post[2].split(","):
            v1 = (fields[3], fields[4])
        elif post[0] == "cgroup2":
            v2 = (fields[3], fields[4])
    return v1, v2


def _groups(proc_cgroup: str) -> tuple[str | None, str | None]:
    """This process's path in the v1 ``cpu`` hierarchy and in the v2 one."""
    v1 = v2 = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "cpu" in parts[1].split(","):
            v1 = parts[2]
    return v1, v2


def _within(mount: tuple[str, str], group: str) -> str | None:
    """The directory of ``group`` under the mount (whose root may itself be a group: a container's namespace)."""
    root, point = mount
    rel = os.path.relpath(group, root) if root != "/" else group.lstrip("/")
    if rel.startswith(".."):
        return None
    return os.path.normpath(os.path.join(point, rel))


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _v1_share(directory: str) -> float | None:
    quota = _read(os.path.join(directory, "cpu.cfs_quota_us"))
    period = _read(os.path.join(directory, "cpu.cfs_period_us"))
    try:
        q, p = int(quota or "-1"), int(period or "0")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _v2_share(directory: str) -> float | None:
    fields = (_read(os.path.join(directory, "cpu.max")) or "").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        q, p = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


class CpuLimit:
    """Reads this process's CPU limit, in cores, or None where there is none (or cgroups cannot be read).

    The mounts are read once; the process's group and its quota on every :meth:`cores` call (about once a second):
    an operator, or the straggler benchmark, moves a running worker into a group or changes the quota."""

    def __init__(self, proc_cgroup: str = PROC_CGROUP, mountinfo: str = PROC_MOUNTS) -> None:
        self.proc_cgroup = proc_cgroup
        mounts = _read(mountinfo)
        self.mounts = _mounts(mounts) if mounts is not None else (None, None)

    def levels(self) -> list[tuple[str, bool]]:
        """(directory, is v2) of the process's group, then of each ancestor up to the mount point."""
        text = _read(self.proc_cgroup)
        if text is None:
            return []
        levels: list[tuple[str, bool]] = []
        for group, mount, v2 in zip(_groups(text), self.mounts, (False, True), strict=True):
            directory = None if group is None or mount is None else _within(mount, group)
            if directory is None:
                continue
            top = os.path.normpath(mount[1])
            while True:
                levels.append((directory, v2))
                if directory == top or len(directory) <= len(top):
                    break
                directory = os.path.dirname(directory)
            break  # the v1 cpu controller found: a v2 tree beside it (hybrid mode) holds no cpu controller
        return levels

    def cores(self) -> float | None:
        """The smallest quota over the group and its ancestors, in cores; None when none is set."""
        shares = [s for d, v2 in self.levels() if (s := (_v2_share(d) if v2 else _v1_share(d))) is not None]
        return min(shares) if shares else None
