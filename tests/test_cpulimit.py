"""A worker's CPU limit from its cgroup (litz/cpulimit.py) and the bound it puts on the speed placement follows.

The cgroup trees here are directories under tmp_path laid out as the kernel shows them; the real cgroup is covered
end to end in test_straggler (a worker put under a real quota reports it in its status)."""
from litz.cpulimit import CpuLimit
from litz.placement import SpeedMeter


def tree(tmp_path, mount_line: str, cgroup_text: str, files: dict[str, str]) -> CpuLimit:
    """A CpuLimit reading a fake /proc/self/cgroup and mountinfo; ``files``: path under tmp_path -> content."""
    for rel, content in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    (tmp_path / "cgroup").write_text(cgroup_text)
    (tmp_path / "mountinfo").write_text(mount_line.replace("MNT", str(tmp_path / "fs")))
    return CpuLimit(str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))


V1_MOUNT = ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
            "32 31 0:29 {root} MNT rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
            "33 31 0:30 / /x rw,relatime - cgroup cgroup rw,cpuset\n")


def test_v1_the_smallest_quota_over_the_group_and_its_ancestors(tmp_path):
    limit = tree(tmp_path, V1_MOUNT.format(root="/"), "3:cpuset:/\n2:cpu,cpuacct:/job/w1\n0::/\n", {
        "fs/cpu.cfs_quota_us": "-1", "fs/cpu.cfs_period_us": "100000",
        "fs/job/cpu.cfs_quota_us": "50000", "fs/job/cpu.cfs_period_us": "100000",  # the job: half a core
        "fs/job/w1/cpu.cfs_quota_us": "150000", "fs/job/w1/cpu.cfs_period_us": "100000",  # the worker: 1.5
    })
    assert limit.cores() == 0.5  # the parent's half core binds, as the kernel applies both
    (tmp_path / "fs/job/w1/cpu.cfs_quota_us").write_text("25000")
    assert limit.cores() == 0.25  # read afresh: a quota set while the job runs is seen
    (tmp_path / "fs/job/w1/cpu.cfs_quota_us").write_text("-1")
    (tmp_path / "fs/job/cpu.cfs_quota_us").write_text("-1")
    assert limit.cores() is None  # released


def test_v1_inside_a_container_whose_mount_root_is_its_own_group(tmp_path):
    limit = tree(tmp_path, V1_MOUNT.format(root="/docker/abc"), "2:cpu,cpuacct:/docker/abc/w1\n", {
        "fs/cpu.cfs_quota_us": "200000", "fs/cpu.cfs_period_us": "100000",  # the container: 2 cores
        "fs/w1/cpu.cfs_quota_us": "-1", "fs/w1/cpu.cfs_period_us": "100000",
    })
    assert limit.cores() == 2.0


def test_v2_cpu_max(tmp_path):
    mount = "30 23 0:27 / MNT rw,nosuid - cgroup2 cgroup2 rw\n"
    limit = tree(tmp_path, mount, "0::/litz/w1\n", {
        "fs/cpu.max": "max 100000", "fs/litz/cpu.max": "max 100000", "fs/litz/w1/cpu.max": "30000 100000"})
    assert limit.cores() == 0.3
    (tmp_path / "fs/litz/w1/cpu.max").write_text("max 100000")
    assert limit.cores() is None


def test_no_cgroup_to_read_means_no_limit(tmp_path):
    assert CpuLimit(str(tmp_path / "absent"), str(tmp_path / "absent")).cores() is None
    garbled = tree(tmp_path, V1_MOUNT.format(root="/"), "2:cpu,cpuacct:/w1\n", {
        "fs/w1/cpu.cfs_quota_us": "lots", "fs/w1/cpu.cfs_period_us": "100000"})
    assert garbled.cores() is None  # unreadable: measured speed only, never an error


def fed(meter: SpeedMeter, seconds_per_task: float, cpu_per_task: float, reports: int = 8) -> SpeedMeter:
    for i in range(reports):
        meter.add(10, 10 * seconds_per_task, 10 * cpu_per_task, now=i * 1.0)
    return meter


def test_a_cpu_limit_bounds_the_speed_a_lightly_loaded_worker_measures():
    """A worker at a quarter of a core that gets little work runs it inside its quota and measures 10 ms a task, as
    fast as an unlimited one; the quota sustains only 0.25 / 10 ms = 25 tasks/s, and that is the speed."""
    meter = fed(SpeedMeter(window_s=0.0), 0.010, 0.010)
    assert abs(meter.speed - 100.0) < 1e-6
    meter.limit(0.25)
    assert abs(meter.speed - 25.0) < 1e-6
    loaded = fed(SpeedMeter(window_s=0.0), 0.040, 0.010)  # loaded past the quota: the measure agrees with the bound
    loaded.limit(0.25)
    assert abs(loaded.speed - 25.0) < 1e-6
    slower = fed(SpeedMeter(window_s=0.0), 0.080, 0.010)  # slower than its quota (a neighbour too): measured wins
    slower.limit(0.25)
    assert abs(slower.speed - 12.5) < 1e-6
    meter.limit(None)
    assert abs(meter.speed - 100.0) < 1e-6  # released: back to the measure at once
    for bad in (0, -1.0, float("nan"), float("inf"), "0.5", True):
        meter.limit(bad)
        assert meter.cores is None, bad  # a malformed STATS value is no limit


def rebalances_under_a_quota(limit: float | None, seconds: int = 120) -> list[dict[str, int]]:
    """The executor split a speed policy adopts, second by second, for two workers of equal CPU where w1 has a
    quarter of a core: a model of the quota's burst. w1 measures as fast as w0 while its share of a synchronous
    step's work fits in its quota (executors of w1 / executors of w0 <= 0.25), and four times slower when it does
    not. ``limit``: what w1 reports as its CPU limit (None: as before the bound)."""
    from litz.placement import SpeedPolicy, quotas

    quota, cpu = 0.25, 0.001
    counts = {"w0": 8, "w1": 8}
    meters = {w: SpeedMeter(window_s=0.0) for w in counts}
    meters["w1"].limit(limit)
    policy, splits = SpeedPolicy(), []
    for now in range(seconds):
        fits = counts["w1"] <= quota * counts["w0"]
        meters["w0"].add(100, 100 * cpu, 100 * cpu, now)
        meters["w1"].add(100, 100 * (cpu if fits else cpu / quota), 100 * cpu, now)
        owner = [w for w in counts for _ in range(counts[w])]
        speeds = {w: m.speed for w, m in meters.items()}
        if policy.offer(owner, sorted(counts), speeds, float(now)):
            counts = quotas(16, sorted(counts, key=lambda w: -counts[w]), policy.weights())
            splits.append(dict(counts))
    return splits


def test_with_its_cpu_limit_a_quota_worker_is_placed_once_and_stays():
    """The oscillation the bound removes: without it, each time w1 holds few executors it looks fast, wins them
    back, looks slow and loses them again; with it, one rebalance to 13 + 3 and none after."""
    flapping = rebalances_under_a_quota(None)
    assert len(flapping) >= 5 and len({tuple(s.values()) for s in flapping}) >= 2, flapping  # the control
    settled = rebalances_under_a_quota(0.25)
    assert settled == [{"w0": 13, "w1": 3}], settled
