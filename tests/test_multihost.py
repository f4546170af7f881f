"""Several hosts on one machine: each role in its own Linux network namespace with its own address on a
bridge, real etcd, real TCP between hosts. A job starts on 2 hosts, a third joins, one is drained, another
is cut off (its processes killed): the job recovers from its checkpoint and finishes exactly right."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.support.chains import CHAINS, check_result
from tests.support.etcd import EtcdServer
from tests.support.processes import ROOT, app_path, run_cli, status, wait_for
from tests.support.scenario import Record, scenario

STEPS = 800
SUBNET = "10.233.{}.{}"


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check)


LOCK = "/run/lock/litz-test-multihost.lock"  # setup of one run's hosts at a time: stale ones, a free subnet
OURS = re.compile(r"^lzb?(\d+)(?:[hv]\d+)?$")  # lzb<pid>, lz<pid>h<i>, lz<pid>v<i>: every name Hosts makes


def remove_stale_hosts() -> None:
    """Remove the bridges, veths and namespaces that runs whose test process is gone left behind (a run killed
    before its cleanup), by their names: ours carry the pid of the process that made them."""
    import psutil

    def stale(name: str) -> bool:
        m = OURS.match(name)
        return bool(m) and not psutil.pid_exists(int(m.group(1)))

    for line in sh("ip", "netns", "list").stdout.splitlines():
        if line.split() and stale(line.split()[0]):
            sh("ip", "netns", "del", line.split()[0], check=False)
    for line in sh("ip", "-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if stale(name):
            sh("ip", "link", "del", name, check=False)


def free_subnet() -> int:
    """A third octet N for SUBNET that no interface address and no listening socket (an etcd of a crashed run
    keeps its address bound after the bridge is gone) uses."""
    import psutil

    used = set(re.findall(r"inet 10\.233\.(\d+)\.", sh("ip", "-o", "-4", "addr", "show").stdout))
    used |= {c.laddr.ip.split(".")[2] for c in psutil.net_connections("tcp")
             if c.status == psutil.CONN_LISTEN and c.laddr.ip.startswith("10.233.")}
    free = [n for n in range(20, 250) if str(n) not in used]
    assert free, "every 10.233.N.0/24 is in use"
    return free[0]


class Hosts:
    """A bridge in the root namespace and one namespace per host, each with a veth into the bridge. Names carry
    this process's pid, so they never collide with another live run's, and setup first removes what a run that
    died before its cleanup left (remove_stale_hosts); the subnet is one nothing else uses."""

    def __init__(self, count: int):
        tag = os.getpid()  # interface names stay within 15 characters: lz + 7 digits + v + 1
        self.bridge = f"lzb{tag}"
        self.names = [f"lz{tag}h{i}" for i in range(1, count + 1)]
        self.veths = [f"lz{tag}v{i}" for i in range(1, count + 1)]

    def __enter__(self) -> "Hosts":
        import fcntl

        with open(LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another run's setup must not pick the same subnet meanwhile
            remove_stale_hosts()
            self.net = free_subnet()
            self.gateway = SUBNET.format(self.net, 1)
            self.addresses = [SUBNET.format(self.net, 10 + i) for i in range(1, len(self.names) + 1)]
            try:
                self._create()
            except BaseException:
                self.__exit__()
                raise
        return self

    def _create(self) -> None:
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for ns, veth, addr in zip(self.names, self.veths, self.addresses, strict=True):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", veth, "master", self.bridge)
            sh("ip", "link", "set", veth, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", "eth0")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def __exit__(self, *exc) -> None:
        for ns, veth in zip(self.names, self.veths, strict=True):
            sh("ip", "link", "del", veth, check=False)
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", self.bridge, check=False)


class HostProcesses:
    """Litz roles started inside host namespaces, each in its own process group, all killed at the end."""

    def __init__(self) -> None:
        self.by_host: dict[int, list[subprocess.Popen]] = {}

    def start(self, hosts: Hosts, host: int, args: list[str]) -> subprocess.Popen:
        cmd = ["ip", "netns", "exec", hosts.names[host], sys.executable, "-m", "litz.cli.litz", *args,
               "--host", hosts.addresses[host]]
        proc = subprocess.Popen(cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        self.by_host.setdefault(host, []).append(proc)
        return proc

    def kill_host(self, host: int) -> None:
        for proc in self.by_host.get(host, []):
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            proc.wait()

    def __enter__(self) -> "HostProcesses":
        return self

    def __exit__(self, *exc) -> None:
        for host in list(self.by_host):
            self.kill_host(host)


def etcd_on(address: str, tmp_path) -> EtcdServer:
    """etcd on the bridge's address in the root namespace, where every host reaches it (a subnet of this run's
    own: its fixed ports are free there)."""
    server = EtcdServer("mh", str(tmp_path / "etcd"), 2379, 2380, f"mh=http://{address}:2380", host=address)
    server.start()
    return server


def start_chains_master(procs: HostProcesses, hosts: Hosts, etcd: str, name: str, tmp_path, out, steps: int,
                        *extra: str):
    """Once etcd answers: the chains test app's master on host 0, checkpointing every 0.5 s."""
    wait_for(lambda: run_cli(["litzctl", "--etcd", etcd, "list"], timeout=30).returncode == 0, 30, "etcd")
    return procs.start(hosts, 0, ["master", app_path("chains"), "--etcd", etcd, "--name", name, "--min-workers", "2",
                                  *extra, "--executors", "12", "--checkpoint-dir", str(tmp_path / "ckpt"),
                                  "--checkpoint-every", "0.5", "--output", str(out), "--no-progress", "--config",
                                  f"chains={CHAINS}", f"steps={steps}", "sleep=0.002"])


def hosts_of(st: dict) -> set[str]:
    return {p["address"].split("//")[1].rsplit(":", 1)[0] for p in st["workers"] + st["servers"]}


needs_root_and_ip = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("etcd"),
                                       reason="needs root, iproute2 and etcd (the CI installs them)")


@pytest.fixture(scope="module")
def across_hosts(tmp_path_factory) -> Record:
    """One job across hosts, run once for the tests below: it starts on 2 hosts, a third joins, one is drained,
    another is cut off (its processes killed). Each test asserts one point on what it recorded."""
    tmp = tmp_path_factory.mktemp("multihost")
    name, out = "multihost", tmp / "out.json"
    with scenario(str(tmp / "litz-home")) as rec, Hosts(3) as hosts:
        rec["addresses"] = hosts.addresses
        etcd_server = etcd_on(hosts.gateway, tmp)
        etcd = etcd_server.endpoint
        try:
            with HostProcesses() as procs:
                master = start_chains_master(procs, hosts, etcd, name, tmp, out, STEPS, "--min-servers", "2")
                role = ["--etcd", etcd, "--name", name]
                for host in (0, 1):
                    procs.start(hosts, host, ["worker", *role])
                    procs.start(hosts, host, ["server", *role])
                rec["two hosts"] = wait_for(lambda: (s := status(name, etcd)) and s["tasks_completed"] > 0 and s, 60,
                                            "the job running on 2 hosts")

                procs.start(hosts, 2, ["worker", *role])  # a third host joins
                procs.start(hosts, 2, ["server", *role])
                st = rec.step("three hosts", wait_for, lambda: (s := status(name, etcd)) and len(hosts_of(s)) == 3
                              and all(w["executors"] for w in s["workers"]) and s, 60, "the third host to get work")
                st = st or status(name, etcd)
                on_h1 = [p["id"] for p in st["workers"] + st["servers"] if hosts.addresses[1] in p["address"]]
                rec["drain"] = run_cli(["litzctl", "--etcd", etcd, "--name", name, "drain", *on_h1], timeout=120)

                wait_for(lambda: (s := status(name, etcd)) and s["checkpoints"] >= 1, 60, "a checkpoint")
                procs.kill_host(2)  # the third host is cut off
                stdout, stderr = master.communicate(timeout=150)
                rec["master"] = (master.returncode, stdout, stderr)
                rec["events"] = json.loads(out.read_text())["events"]
        finally:
            etcd_server.kill()
    return rec


ACROSS_HOSTS = pytest.mark.timeout(180)  # the first of these tests runs the scenario


@needs_root_and_ip
@ACROSS_HOSTS
def test_job_across_hosts_ran_to_its_end(across_hosts):
    assert across_hosts.ended_by is None, repr(across_hosts.ended_by)


@needs_root_and_ip
@ACROSS_HOSTS
def test_job_across_hosts_starts_on_the_first_two(across_hosts):
    addresses = across_hosts["addresses"]
    assert hosts_of(across_hosts["two hosts"]) == {addresses[0], addresses[1]}


@needs_root_and_ip
@ACROSS_HOSTS
def test_a_joining_host_gets_work(across_hosts):
    st = across_hosts["three hosts"]
    assert hosts_of(st) == set(across_hosts["addresses"]) and all(w["executors"] for w in st["workers"])


@needs_root_and_ip
@ACROSS_HOSTS
def test_a_host_is_drained_with_litzctl(across_hosts):
    res = across_hosts["drain"]
    assert res.returncode == 0 and "released" in res.stdout, res.stderr


@needs_root_and_ip
@ACROSS_HOSTS
def test_job_across_hosts_result_is_exact_after_a_lost_host(across_hosts):
    code, stdout, stderr = across_hosts["master"]
    assert code == 0, stderr
    check_result(json.loads(stdout), steps=STEPS)


@needs_root_and_ip
@ACROSS_HOSTS
def test_job_across_hosts_scaled_out_in_and_recovered(across_hosts):
    kinds = [e["kind"] for e in across_hosts["events"]]
    assert "scale_out" in kinds and "scale_in" in kinds and "recovery" in kinds, kinds


@needs_root_and_ip
@pytest.mark.timeout(240)
def test_a_worker_cut_off_from_the_master_but_not_from_etcd_is_evicted_and_stops(tmp_path):
    """Host 1 loses its route to host 0 (packets dropped, no connection reset) but still reaches etcd, so the
    worker's lease stays alive: only the master's heartbeats can tell. The master takes it for lost, recovers
    without it and evicts it; the worker, still running, sees the eviction and stops."""
    name, out, steps = "partition", tmp_path / "out.json", STEPS // 2
    with Hosts(2) as hosts:
        etcd_server = etcd_on(hosts.gateway, tmp_path)
        etcd = etcd_server.endpoint
        try:
            with HostProcesses() as procs:
                master = start_chains_master(procs, hosts, etcd, name, tmp_path, out, steps)
                role = ["--etcd", etcd, "--name", name]
                procs.start(hosts, 0, ["worker", *role])
                procs.start(hosts, 0, ["server", *role])
                cut = procs.start(hosts, 1, ["worker", *role])
                st = wait_for(lambda: (s := status(name, etcd)) and s["checkpoints"] >= 1 and len(s["workers"]) == 2
                              and all(w["executors"] for w in s["workers"]) and s, 60, "the job running on 2 hosts")
                victim = next(w["id"] for w in st["workers"] if hosts.addresses[1] in w["address"])
                for here, there in ((1, 0), (0, 1)):
                    sh("ip", "netns", "exec", hosts.names[here], "ip", "route", "add", "blackhole",
                       f"{hosts.addresses[there]}/32")
                stdout, stderr = master.communicate(timeout=180)
                assert master.returncode == 0, stderr
                _, cut_err = cut.communicate(timeout=30)
        finally:
            etcd_server.kill()
    # it stopped on its own, as a failure, and not because the job ended
    assert cut.returncode == 2 and f"worker {victim} was taken out of the job" in cut_err, cut_err
    check_result(json.loads(stdout), steps=steps)
    recoveries = [e for e in json.loads(out.read_text())["events"] if e["kind"] == "recovery"]
    assert len(recoveries) == 1 and recoveries[0]["noticed"] == {victim: "connection dropped"}, recoveries
