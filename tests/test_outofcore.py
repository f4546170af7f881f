"""Out-of-core execution: a worker memory budget smaller than its executors' state (thesis §4.8)."""
import json
import os

import numpy as np
import pytest

import litz
from litz.outofcore import parse_bytes, state_bytes
from tests.apps.bigstate import expected_state
from tests.support.errors import assert_one_line
from tests.support.processes import Processes, app_path, ctl, resize, run_cli, status, wait_for

E, ROUNDS, MB = 8, 6, 4


def check_states(result: dict) -> None:
    for e in range(E):
        count, total = result["states"][str(e)]
        want_count, want_total = expected_state(e, ROUNDS)
        assert count == want_count and total == pytest.approx(want_total, rel=1e-12), e


def test_loading_one_executor_at_once_keeps_the_other_finished_loads(tmp_path):
    """A move or checkpoint loads executor 2 at once while executor 1's prefetch finished meanwhile: 1's
    state must stay for the worker to install (it was dropped, and its queued tasks waited for ever)."""

    from litz.outofcore import Residency

    class Ex:
        input_attrs = ("X",)

        def __init__(self, v):
            self.X, self.w = np.arange(4.0) * v, v

    res = Residency("w0", budget=1, spill_root=str(tmp_path))
    try:
        for eid in (1, 2):
            ex = Ex(eid)
            res.add(eid, ex)
            res.evict(eid, ex)
        res.start_load(1)
        wait_for(lambda: res.loading[1].done(), 10, "executor 1's load")
        state, _, _ = res.load_now(2)
        assert state["w"] == 2 and 2 not in res.spilled
        [(eid, state1, _, _)] = res.finished_loads()
        assert eid == 1 and state1["w"] == 1 and list(state1["X"]) == [0.0, 1.0, 2.0, 3.0]
    finally:
        res.close()


def test_input_data_survives_an_apps_own_getstate_that_leaves_it_out(tmp_path):
    """An app may write ``__getstate__`` to keep its input out of checkpoints; evicting the executor or moving
    it with its input must still bring the input back (it came back missing)."""
    from litz.api import Executor
    from litz.outofcore import Residency
    from litz.worker import executor_state

    class Ex(Executor):
        input_attrs = ("X",)

        def __getstate__(self):
            return {"w": self.w}

    ex = Ex()
    ex.X, ex.w = np.arange(3.0), 7
    assert executor_state(ex, with_input=False) == {"w": 7}
    moved = executor_state(ex, with_input=True)
    assert moved["w"] == 7 and moved["X"] is ex.X
    res = Residency("w0", budget=1, spill_root=str(tmp_path))
    try:
        res.add(0, ex)
        res.evict(0, ex)
        state, _, _ = res.load_now(0)
        assert state["w"] == 7 and list(state["X"]) == [0.0, 1.0, 2.0]
    finally:
        res.close()


def test_parse_bytes_and_state_bytes():
    assert parse_bytes("512M") == 512 << 20 and parse_bytes("2G") == 2 << 30 and parse_bytes("1000") == 1000
    assert parse_bytes("1.5k") == 1536 and parse_bytes(7) == 7
    with pytest.raises(litz.LitzError):
        parse_bytes("lots")

    class Obj:
        pass

    o = Obj()
    import numpy as np

    o.a, o.b = np.zeros(1000), [np.zeros(10), np.zeros(10)]
    assert 8160 <= state_bytes(o) < 9000


@pytest.mark.timeout(90)
def test_budget_smaller_than_the_data_evicts_and_keeps_state_exactly(tmp_path, monkeypatch):
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv("LITZ_SPILL_DIR", str(spill))
    out = tmp_path / "out.json"
    budget = 2 * MB << 20  # a quarter of each worker's 4 executors x 4 MiB
    result = litz.run(app_path("bigstate"), workers=2, servers=1, executors=E, output=str(out),
                      memory_limit=budget, config={"rounds": ROUNDS, "mb": MB, "inflight": 2})
    check_states(result)  # evicted and loaded executors kept exactly their state
    events = json.loads(out.read_text())["events"]
    evicts = [e for e in events if e["kind"] == "evict"]
    loads = [e for e in events if e["kind"] == "load"]
    assert len(evicts) >= E and len(loads) >= E // 2
    first = {}
    for e in evicts:
        first.setdefault((e["worker"], e["executor"]), e)
    # an executor's first eviction writes its input data too; later ones only its other state (8 kB here),
    # since the input file is kept; every load brings both back
    assert all(e["bytes"] >= MB << 20 for e in first.values())
    later = [e for e in evicts if e is not first[(e["worker"], e["executor"])]]
    assert later and all(e["bytes"] < 1 << 20 for e in later)
    assert all(e["bytes"] >= MB << 20 for e in loads)
    assert os.listdir(spill) == []  # spill directories removed when the workers ended


@pytest.mark.timeout(90)
def test_loads_wait_for_room_when_every_executor_has_a_task(tmp_path, monkeypatch):
    """Every executor always has a task queued (as in each BSP iteration): loads must still fit the budget,
    not all start at once. Replaying each worker's evict/load events in order, at most two of its four
    executors (4 MiB of input each, budget 2 x 4 MiB + 64 KiB) are ever in memory after the first load."""
    monkeypatch.setenv("LITZ_SPILL_DIR", str(tmp_path))
    out = tmp_path / "out.json"
    result = litz.run(app_path("bigstate"), workers=2, servers=1, executors=E, output=str(out),
                      memory_limit=(2 * MB << 20) + (64 << 10), config={"rounds": ROUNDS, "mb": MB, "inflight": E})
    check_states(result)
    events = [e for e in json.loads(out.read_text())["events"] if e["kind"] in ("evict", "load")]
    workers = {e["worker"] for e in events}
    assert len(workers) == 2
    for worker in workers:
        resident, peak, loaded = E // 2, 0, False  # each worker starts with its executors in memory
        for e in (e for e in events if e["worker"] == worker):
            resident += 1 if e["kind"] == "load" else -1
            loaded = loaded or e["kind"] == "load"
            if loaded:
                peak = max(peak, resident)
        assert loaded and peak <= 2, (worker, peak)


@pytest.mark.timeout(120)
def test_budget_changed_at_run_time_and_memory_falls(tmp_path, monkeypatch):
    monkeypatch.setenv("LITZ_SPILL_DIR", str(tmp_path))
    name, out = "ooc-runtime", tmp_path / "out.json"
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("bigstate"), "--name", name, "--executors", str(E),
                           "--config", "rounds=400", "mb=16", "inflight=1", "sleep=0.01", "--output", str(out),
                           "--no-progress"])
        st = wait_for(lambda: (s := status(name)) and s["tasks_completed"] > 10 and
                      all(w["memory"] for w in s["workers"]) and s, 60, "the job running")
        before = max(w["memory"] for w in st["workers"])
        assert not any(w["evicted"] for w in st["workers"])
        res = ctl(name, "memory-limit", "16M")
        assert res.returncode == 0 and "16,777,216" in res.stdout, res.stderr
        st = wait_for(lambda: (s := status(name)) and all(len(w["evicted"]) >= 2 for w in s["workers"]) and s,
                      30, "evictions under the new budget")
        after = wait_for(lambda: (s := status(name)) and max(w["memory"] for w in s["workers"]) < before - (24 << 20)
                         and max(w["memory"] for w in s["workers"]), 30, "resident memory to fall")
        assert after < before - (24 << 20)  # 4 x 16 MiB per worker before; at most ~2 resident after
        assert ctl(name, "stop").returncode == 0
        job.communicate(timeout=30)
    assert [e for e in json.loads(out.read_text())["events"] if e["kind"] == "memory_limit"]


@pytest.mark.timeout(60)
def test_bad_memory_limit_is_one_line():
    res = run_cli(["litz", "run", app_path("noop"), "--memory-limit", "lots", "--no-progress"])
    assert_one_line(res, "bad memory size 'lots'")


@pytest.mark.timeout(90)
def test_server_spills_shards_and_totals_stay_exact(tmp_path, monkeypatch):
    from tests.apps.wide import expected_sums

    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv("LITZ_SPILL_DIR", str(spill))
    out = tmp_path / "out.json"
    result = litz.run(app_path("wide"), workers=2, servers=1, executors=4, shards=16, output=str(out),
                      server_memory_limit=512 << 10, config={"tasks": 300})  # 4 MiB of parameters, 512 KiB budget
    assert result["sums"] == expected_sums(300)
    spills = [e for e in json.loads(out.read_text())["events"] if e["kind"] == "evict_shard"]
    assert len(spills) >= 8
    assert os.listdir(spill) == []  # the server's spill directory went with it


@pytest.mark.timeout(90)
def test_corrupted_spill_file_is_a_clear_error(tmp_path, monkeypatch):
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv("LITZ_SPILL_DIR", str(spill))
    name = "ooc-corrupt"
    with Processes() as procs:
        job = procs.start(["litz", "run", app_path("bigstate"), "--name", name, "--executors", str(E),
                           "--memory-limit", "4M", "--config", "rounds=400", "mb=4", "inflight=1", "sleep=0.05",
                           "--no-progress"])

        sizes: dict[str, int] = {}

        def a_written_spill_file():
            # the input data's file: kept across evictions and loads, so it must be checked at every load. It is
            # written once; wait until it has stopped growing, or the flip could land before the writer does
            files = [os.path.join(d, f) for d, _, fs in os.walk(spill) for f in fs if f.endswith("-input.pkl")]
            for path in files:
                try:
                    size, seen = os.path.getsize(path), sizes.get(path)
                except FileNotFoundError:
                    continue
                sizes[path] = size
                if size > 1 << 20 and size == seen:
                    return path
            return None

        victim = wait_for(a_written_spill_file, 60, "a whole spill file", interval=0.2)
        with open(victim, "r+b") as f:  # same size, one byte flipped: only the checksum can tell
            f.seek(1 << 20)
            byte = f.read(1)
            f.seek(1 << 20)
            f.write(bytes([byte[0] ^ 0xFF]))
        _, stderr = job.communicate(timeout=60)
    assert job.returncode == 1, stderr
    assert "is corrupted (checksum differs)" in stderr.strip().splitlines()[-1]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("disk", ["full", "not a directory"])
def test_spill_failure_keeps_executors_in_memory_and_says_so_once(small_disk, tmp_path, monkeypatch, capfd, disk):
    """A spill directory on a full disk (room for one executor's input file, not two) or one that cannot be
    made: evictions fail, the executors stay in memory, nothing is lost, and each worker says so in one line
    per episode (not once per attempt)."""
    if disk == "full":
        resize(small_disk, "6m")
        spill = small_disk
    else:
        (tmp_path / "file").write_text("")
        spill = tmp_path / "file" / "spill"
    monkeypatch.setenv("LITZ_SPILL_DIR", str(spill))
    out = tmp_path / "out.json"
    result = litz.run(app_path("bigstate"), workers=2, servers=1, executors=E, output=str(out),
                      memory_limit=2 * MB << 20, config={"rounds": ROUNDS, "mb": MB, "inflight": 2})
    check_states(result)
    events = json.loads(out.read_text())["events"]
    failed = [e for e in events if e["kind"] == "evict_failed"]
    assert failed
    lines = [ln for ln in capfd.readouterr().err.splitlines() if "cannot spill executor" in ln]
    assert lines and all("running over the memory budget" in ln for ln in lines)
    if disk == "not a directory":
        assert all("is not writable" in ln for ln in lines)
    for worker in {e["worker"] for e in failed}:
        evicted = sum(1 for e in events if e["kind"] == "evict" and e["worker"] == worker)
        said = sum(1 for ln in lines if f"worker {worker}:" in ln)
        assert 1 <= said <= evicted + 1, (worker, said, evicted)  # a new episode needs a success before it
    if disk == "full":
        assert os.listdir(small_disk) == []  # no partial file left behind, spill directories removed


@pytest.mark.timeout(60)
def test_memory_error_retries_the_task_once_and_its_updates_count_once(tmp_path):
    app = tmp_path / "oom.py"
    app.write_text('''import litz


class D(litz.Driver):
    def dispatch_initial_tasks(self):
        self.left = 2 * self.num_executors
        for e in range(self.num_executors):
            self.dispatch_task(e, "go")

    def handle_task_completion(self, r):
        self.left -= 1
        if self.left == self.num_executors:
            for e in range(self.num_executors):
                self.dispatch_task(e, "go")
        elif self.left == 0:
            self.dispatch_task(0, "read")

    def handle_task_completion(self, r, _first=handle_task_completion):
        if r is not None and r[0] == "total":
            self.finish({"total": r[1], "attempts": r[2]})
        else:
            _first(self, r)


class E(litz.Executor):
    def run_task(self, args):
        if args == "read":
            return ("total", self.ps_get("x"), self.ps_get("attempts"))
        self.ps_update("x", 1)
        self.attempts = getattr(self, "attempts", 0) + 1
        if self.attempts == 1:
            raise MemoryError  # the first attempt fails after its update
        self.ps_update("attempts", 1)
        return None
''')
    result = litz.run(str(app), workers=2, servers=1, executors=4, memory_limit="64M")
    assert result == {"total": 8, "attempts": 8}  # 8 tasks; the 4 failed attempts' updates were dropped


def test_input_reassigned_twice_onto_a_reused_address_is_written_again(tmp_path):
    """Kept input files were current when ``id(value)`` matched the id recorded at the last load. An app that
    reassigns its input twice while resident can land the new object at the freed address of the loaded one
    (CPython reuses it): the file was not rewritten and the next load brought back older data."""
    import gc

    from litz.outofcore import Residency

    class Ex:
        input_attrs = ("X",)

    res = Residency("w0", budget=1, spill_root=str(tmp_path))
    try:
        ex = Ex()
        ex.X, ex.w = np.full(4, 1.0), 0
        res.add(0, ex)
        res.evict(0, ex)
        state, _, _ = res.load_now(0)
        ex = Ex()
        ex.__dict__.update(state)
        del state
        loaded_id = id(ex.X)
        ex.X = np.full(4, 2.0)  # the loaded array is freed here
        gc.collect()
        held, latest = [], None
        for _ in range(100_000):  # allocate until one lands where the loaded array was
            candidate = np.full(4, 3.0)
            if id(candidate) == loaded_id:
                latest = candidate
                break
            held.append(candidate)
        if latest is None:
            pytest.skip("the allocator never reused the loaded array's address")
        del held, candidate
        ex.X = latest
        assert id(ex.X) == loaded_id
        res.add(0, ex)
        res.evict(0, ex)
        state, _, _ = res.load_now(0)
        assert list(state["X"]) == [3.0, 3.0, 3.0, 3.0]
    finally:
        res.close()


@pytest.mark.parametrize("value", [np.arange(1000.0), list(range(1000))])  # weak-referenceable or not
def test_unchanged_input_is_not_written_again_and_a_reassigned_one_is(tmp_path, value):
    from litz.outofcore import Residency

    class Ex:
        input_attrs = ("X",)

    res = Residency("w0", budget=1, spill_root=str(tmp_path))
    try:
        ex = Ex()
        ex.X, ex.w = value, 0
        res.add(0, ex)
        first, _ = res.evict(0, ex)
        ex = Ex()
        ex.__dict__.update(res.load_now(0)[0])
        res.add(0, ex)
        again, _ = res.evict(0, ex)
        assert again < first / 4  # the kept input file is still current: only the small state is written
        ex = Ex()
        ex.__dict__.update(res.load_now(0)[0])
        ex.X = type(value)(v + 1 for v in value) if isinstance(value, list) else value + 1
        res.add(0, ex)
        res.evict(0, ex)
        assert list(res.load_now(0)[0]["X"]) == [v + 1 for v in value]
    finally:
        res.close()


def test_memory_aware_choice_prefers_a_resident_executor_on_the_least_loaded_worker():
    """The master's rank (docs/design.md, O2) and its prefetch hint (O3)."""
    from litz.memsched import MemoryScheduler, rank

    owner = {0: "w0", 1: "w0", 2: "w0", 3: "w1", 4: "w1"}.__getitem__
    # balance first: w0 has two tasks outstanding, so w1's executors come first, its resident one ahead
    assert rank([0, 1, 2, 3, 4], owner, spilled={3}, outstanding={0: 2}) == [4, 3, 1, 2, 0]
    # by speed: w1 at a quarter of w0's speed finishes a task later with nothing queued (1/1) than w0 with two
    # queued (3/4): w0 first; w1 only once w0 has more than three ahead of it
    speeds = {"w0": 4.0, "w1": 1.0}
    assert rank([0, 3], owner, spilled=set(), outstanding={0: 2}, speeds=speeds) == [0, 3]
    assert rank([0, 3], owner, spilled=set(), outstanding={0: 4}, speeds=speeds) == [3, 0]
    assert rank([0, 3], owner, spilled=set(), outstanding={0: 2}, speeds={"w0": 4.0}) == [3, 0]  # w1 at the mean
    # on one worker: resident before spilled (a spilled one with a task counts as resident: it is being loaded)
    assert rank([0, 1, 2], owner, spilled={0, 1}, outstanding={1: 1})[:2] == [2, 1]
    sched = MemoryScheduler(5)
    for kind, eid in (("evict", 0), ("evict", 1), ("evict", 3), ("load", 3)):
        sched.memory_event(kind, eid)
    assert sched.spilled == {0, 1}
    # 2 is the only resident candidate on w0 and 0 is the next: prefetch it behind the task for 2
    assert sched.choose([0, 1, 2], owner) == (2, 0)
    sched.dispatched(10 * 5 + 2, 2)
    assert sched.choose([0, 1, 2], owner) == (2, 0)  # 2 is in memory and 0 still has to be loaded
    sched.memory_event("prefetch", 0)
    assert sched.choose([0, 1, 2], owner) == (0, None)  # loaded now, and idle: it goes first
    sched.done([(10 * 5 + 2, None), (99 * 5 + 1, None)])  # a task counted before the choice began is ignored
    assert sched.outstanding[2] == 0 and sched.outstanding[1] == 0


def test_worker_prefetch_fits_only_next_to_the_executors_with_tasks(tmp_path):
    """The worker's side of a hint (O4): a prefetch may spill idle executors, never one with a task, so it is
    taken only if it fits next to those and the loads under way."""
    from litz.outofcore import Residency

    class Ex:
        input_attrs = ("X",)

        def __init__(self, v):
            self.X = np.zeros(1000) + v  # 8000 bytes each

    res = Residency("w0", budget=20_000, spill_root=str(tmp_path))
    try:
        for eid in (1, 2, 3):
            ex = Ex(eid)
            res.add(eid, ex)
            if eid == 3:
                res.evict(eid, ex)
        assert res.prefetch_fits(3, pinned={1})  # 2 is idle: spilling it makes room
        assert not res.prefetch_fits(3, pinned={1, 2})  # both have tasks: no room without going over the budget
        assert not res.prefetch_fits(1, pinned=set())  # in memory already
        res.start_prefetch(3)
        assert res.load_kind(3) == "prefetch" and res.load_kind(3) == "load"
    finally:
        res.close()


@pytest.mark.timeout(240)
def test_kmeans_under_a_memory_limit_loads_each_executor_about_once_an_epoch(tmp_path, monkeypatch):
    """`litz run apps.kmeans` with a quarter of each worker's data in memory: with the runtime choosing the executors
    of each mini-batch (the default), the job loads about one executor per executor and epoch, not one per executor
    and mini-batch as when every mini-batch takes rows of every executor (`sampling=rows`), prefetches some of them,
    and ends within 1% of the unlimited run's objective, itself within 1% of scikit-learn's."""
    from tests.support.reference import rel, sklearn_objective

    monkeypatch.setenv("LITZ_SPILL_DIR", str(tmp_path))
    config = {"synthetic": 1, "n": 64_000, "d": 16, "k": 10, "spread": 2.0, "epochs": 3, "batch": 1000, "seed": 2}
    executors, workers, batches = 16, 2, 64
    budget = config["n"] * (4 * config["d"] + 4) // workers // 4  # X and the 4-byte shuffle index: data 4x budget

    def run(name: str, extra: list[str], **cfg) -> tuple[dict, list[dict]]:
        out = tmp_path / f"{name}.json"
        args = ["litz", "run", "apps.kmeans", "--workers", str(workers), "--servers", "1", "--executors",
                str(executors), "--output", str(out), "--name", name, "--config",
                *[f"{k}={v}" for k, v in {**config, **cfg}.items()], *extra]
        proc = run_cli(args, timeout=200)
        assert proc.returncode == 0, proc.stderr[-2000:]
        doc = json.loads(out.read_text())
        return doc["result"], doc["events"]

    unlimited, _ = run("unlimited", [])
    limited, events = run("limited", ["--memory-limit", str(budget)])
    kinds = [e["kind"] for e in events]
    loads = kinds.count("load") + kinds.count("prefetch")
    assert limited["sampling"] == "executors" and limited["batch_tasks"] == executors // 4
    assert kinds.count("evict") >= executors  # the budget did bite
    # each executor about once per epoch, plus the info, sample, init and evaluation rounds
    assert loads <= executors * (config["epochs"] + 4), (loads, kinds.count("prefetch"))
    assert kinds.count("prefetch") > 0
    assert rel(limited["objective"], unlimited["objective"]) < 0.01, (limited, unlimited)
    assert rel(unlimited["objective"], sklearn_objective(config)) < 0.01
    # the same budget with every mini-batch drawn from every executor: a load per executor and mini-batch
    rows, row_events = run("rows", ["--memory-limit", str(budget)], sampling="rows", epochs=1)
    row_loads = sum(e["kind"] == "load" for e in row_events)
    assert row_loads >= executors * batches // 2 and row_loads > 5 * loads, (row_loads, loads)  # 1 epoch against 3
