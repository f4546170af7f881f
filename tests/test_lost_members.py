"""How the master finds lost members: local children seen exiting between checks are not forgotten."""
from types import SimpleNamespace

from litz.master import Master, Member


class Launcher:
    """A local launcher's ``supervise``: reports each exited child once, as ``LocalProcesses.dead`` does."""

    def __init__(self) -> None:
        self.exited: list[tuple[str, int, str]] = []

    def __call__(self) -> list[tuple[str, int, str]]:
        out, self.exited = self.exited, []
        return out


def master_with(launcher: Launcher, alive: set[str]) -> SimpleNamespace:
    workers = {f"w{i}": Member(f"w{i}", "worker", {"pid": 100 + i}) for i in range(2)}
    servers = {"s0": Member("s0", "server", {"pid": 200})}
    m = SimpleNamespace(supervise=launcher, _dead_children=[], workers=workers, servers=servers, started=True,
                        executor_owner=["w0", "w1"], membership=SimpleNamespace(members=lambda: set(alive)))
    m.children_died = lambda: Master.children_died(m)
    return m


def test_a_child_seen_exiting_between_checks_is_reported_lost_once():
    launcher = Launcher()
    m = master_with(launcher, alive={"w0", "w1", "s0"})
    assert not Master.children_died(m)
    launcher.exited.append(("worker", 101, "was killed by signal 9"))
    assert Master.children_died(m)  # the frequent check sees it; the launcher will not report it again
    assert Master.children_died(m)  # still pending until find_lost takes it
    assert [x.ident for x in Master.find_lost(m)] == ["w1"]
    assert Master.find_lost(m) == []


def test_a_lapsed_registration_is_lost_even_without_a_launcher():
    m = master_with(Launcher(), alive={"w0", "s0"})
    m.supervise = None
    assert not Master.children_died(m)
    assert [x.ident for x in Master.find_lost(m)] == ["w1"]
