"""How the master finds lost members: losses seen between checks (a local child's exit, a connection that
dropped for good) are not forgotten, each is reported once, and a member found dead is evicted; and how an
evicted process stops."""
from types import SimpleNamespace

import pytest

from litz import clock
from litz.errors import LitzError
from litz.master import Master, Member
from litz.process import MASTER_GONE_GRACE_S, Process
from tests.support.handbuilt import bare_master


class Launcher:
    """A local launcher's ``supervise``: reports each exited child once, as ``LocalProcesses.dead`` does."""

    def __init__(self) -> None:
        self.exited: list[tuple[str, int, str]] = []

    def __call__(self) -> list[tuple[str, int, str]]:
        out, self.exited = self.exited, []
        return out


class Connections:
    """The endpoint's ``unreachable``: reports each peer whose connection dropped for good once."""

    def __init__(self) -> None:
        self.dropped: list[str] = []

    def unreachable(self, grace_s: float) -> list[str]:
        out, self.dropped = self.dropped, []
        return out


class Registry:
    def __init__(self, alive: set[str]) -> None:
        self.alive, self.evicted = set(alive), []

    def members(self) -> set[str]:
        return set(self.alive)

    def evict(self, ident: str) -> None:
        self.evicted.append(ident)
        self.alive.discard(ident)

    def registry_settled(self) -> bool:
        return True  # the registry has held every registration all along

    @property
    def give_up_after(self) -> float:
        return 300.0


def master_with(launcher: Launcher, alive: set[str]) -> SimpleNamespace:
    workers = {f"w{i}": Member(f"w{i}", "worker", {"pid": 100 + i}) for i in range(2)}
    servers = {"s0": Member("s0", "server", {"pid": 200})}
    retired: list[str] = []
    return bare_master(("losses_noticed",), supervise=launcher, _dead_children=[], _unreachable=[], _misbehaving=[],
                       workers=workers, servers=servers, started=True, executor_owner=["w0", "w1"],
                       membership=Registry(alive), endpoint=Connections(), retired=retired,
                       on_retired=retired.append)


def test_a_child_seen_exiting_between_checks_is_reported_lost_once():
    launcher = Launcher()
    m = master_with(launcher, alive={"w0", "w1", "s0"})
    assert not Master.losses_noticed(m)
    launcher.exited.append(("worker", 101, "was killed by signal 9"))
    assert Master.losses_noticed(m)  # the frequent check sees it; the launcher will not report it again
    assert Master.losses_noticed(m)  # still pending until find_lost takes it
    lost = Master.find_lost(m)
    assert [x.ident for x in lost] == ["w1"] and lost[0].noticed == "process was killed by signal 9"
    assert Master.find_lost(m) == []


def test_a_member_that_floods_the_master_with_malformed_messages_is_lost_once_and_evicted():
    m = master_with(Launcher(), alive={"w0", "w1", "s0"})
    m.supervise = None
    m.endpoint.cut_off = lambda peer: True
    assert Master.offender(m, "w0") and Master.offender(m, "stranger")  # both cut off; only w0 is lost
    assert Master.losses_noticed(m)
    lost = Master.find_lost(m)
    assert [x.ident for x in lost] == ["w0"] and lost[0].noticed == "sent malformed messages"
    assert m.membership.evicted == ["w0"]  # were it alive after all, it would stop
    del m.workers["w0"]  # recovery forgets it
    assert Master.find_lost(m) == []


def test_a_lapsed_registration_is_lost_even_without_a_launcher(monkeypatch):
    """Lost once its key has stayed missing for LAPSE_GRACE_S; a key written again in time is no loss (R2)."""
    from litz.master import LAPSE_GRACE_S

    now = [1000.0]
    monkeypatch.setattr(clock, "time", lambda: now[0])
    m = master_with(Launcher(), alive={"w0", "s0"})
    m.supervise = None
    assert not Master.losses_noticed(m)
    assert Master.find_lost(m) == []  # missing since now
    now[0] += LAPSE_GRACE_S / 2
    m.membership.alive.add("w1")  # its keeper reached etcd late and wrote its key again
    assert Master.find_lost(m) == []
    m.membership.alive.discard("w1")
    now[0] += LAPSE_GRACE_S / 2
    assert Master.find_lost(m) == []  # missing again: the grace starts over
    now[0] += LAPSE_GRACE_S
    lost = Master.find_lost(m)
    assert [x.ident for x in lost] == ["w1"] and lost[0].noticed == "registration lapsed"


def test_a_dropped_connection_is_lost_once_and_its_member_evicted():
    m = master_with(Launcher(), alive={"w0", "w1", "s0"})
    m.supervise = None
    m.endpoint.dropped.append("s0")
    assert Master.losses_noticed(m) and Master.losses_noticed(m)  # pending until find_lost takes it
    lost = Master.find_lost(m)
    assert [x.ident for x in lost] == ["s0"] and lost[0].noticed == "connection dropped"
    assert m.membership.evicted == ["s0"]  # fenced: were it alive after all, it would stop
    del m.servers["s0"]  # recovery forgets it
    m.endpoint.dropped.append("s0")  # a late report for a forgotten member
    assert Master.find_lost(m) == [] and m.membership.evicted == ["s0"]


def test_a_retiring_members_dropped_connection_is_not_a_loss(monkeypatch):
    from litz import clock
    from litz.master import RETIRED_GRACE_S

    now = [1000.0]
    monkeypatch.setattr(clock, "time", lambda: now[0])
    m = master_with(Launcher(), alive={"w0", "w1", "s0"})
    m.workers["w0"].retire_sent = True  # scale-in: it exits once it has handed everything over
    m.endpoint.dropped.append("w0")
    assert Master.find_lost(m) == [] and m.membership.evicted == [] and m.retired == []
    m.membership.alive.discard("w0")  # then its registration goes; its RETIRED message may still be on the way
    assert Master.find_lost(m) == [] and m.retired == []
    now[0] += RETIRED_GRACE_S / 2
    assert Master.find_lost(m) == []


def test_a_member_gone_without_retiring_after_retire_was_sent_is_lost(monkeypatch):
    """Killed mid-drain, before it shipped what it held: no RETIRED comes, and after the grace it is a loss
    (docs/design.md, M1), not a retirement that would leave its executors behind."""
    from litz import clock
    from litz.master import RETIRED_GRACE_S

    now = [1000.0]
    monkeypatch.setattr(clock, "time", lambda: now[0])
    m = master_with(Launcher(), alive={"w1", "s0"})
    m.workers["w0"].retire_sent = True
    assert Master.find_lost(m) == []
    now[0] += RETIRED_GRACE_S + 0.1
    lost = Master.find_lost(m)
    assert [x.ident for x in lost] == ["w0"] and lost[0].noticed == "exited without retiring"
    assert m.retired == []


def bare_process(member, settled: bool = True) -> tuple[Process, list]:
    sent: list = []
    proc = Process.__new__(Process)
    proc.ident, proc.epoch, proc._held = "s2", 0, {}
    proc.membership = SimpleNamespace(member=member, master=lambda: {"address": "tcp://m:1"},
                                      registry_settled=lambda: settled)
    proc.endpoint = SimpleNamespace(knows=lambda peer: False, connect=lambda peer, address: None,
                                    send=lambda peer, msg, p=None: sent.append((peer, msg)) or 9)
    return proc, sent


def test_a_message_to_a_peer_gone_from_the_registry_is_dropped():
    """A server forwarding to a server that was just killed (gone from the registry) must not die of it: the
    master recovers from that loss (docs/design.md, M4; found by python -m litz.sim, seed 57788)."""
    proc, sent = bare_process(lambda ident: None)
    assert proc.send("s1", ("fwd_gets", "w0", [])) == 0 and sent == [] and proc._held == {}
    assert proc.send("master", ("stats", {})) == 9 and [p for p, _ in sent] == ["master"]


def test_a_message_the_registry_cannot_address_yet_waits_in_order():
    """Unknown is not absent (R1): while the registry is down, or just back empty and the peer has not written
    its key again (R3), messages to a peer never reached before wait, in order, and go once it is named."""
    from litz.errors import RegistryUnavailable

    registry = {"down": True}

    def member(ident):
        if registry["down"]:
            raise RegistryUnavailable("e:1", 0.0)
        return {"address": "tcp://s1:1"}

    proc, sent = bare_process(member)
    assert proc.send("s1", ("gets", 1)) == 0 and proc.send("s1", ("gets", 2)) == 0 and sent == []
    proc.send_held()
    assert sent == []  # still down
    registry["down"] = False
    assert proc.send("s1", ("gets", 3)) == 0  # behind the held ones, not before them
    proc.send_held()
    assert [msg for _, (_, msg) in sent] == [("gets", 1), ("gets", 2), ("gets", 3)] and proc._held == {}

    proc, sent = bare_process(lambda ident: None, settled=False)  # missing from a registry just back empty
    assert proc.send("s1", ("gets", 1)) == 0 and "s1" in proc._held


class OwnView:
    """A worker's view of the registry: the master's key, then whether its own registration is there."""

    def __init__(self, masters: list[bool], evicted: bool) -> None:
        self.masters, self._evicted = masters, evicted

    def master(self) -> dict | None:
        return {"pid": 1} if self.masters.pop(0) else None

    def evicted(self) -> bool:
        return self._evicted


def test_an_evicted_process_stops_with_an_error_but_not_when_the_job_ends(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(clock, "time", lambda: now[0])
    me = SimpleNamespace(role="worker", ident="w3", _held={}, _master_missing_since=None)
    me.master_gone = lambda: Process.master_gone(me)
    me.membership = OwnView([True], evicted=False)
    assert Process.job_goes_on(me)
    # the job ended (its registry is cleared): over once the master's key stays missing for the grace (R3)
    me.membership = OwnView([False, False], evicted=False)
    assert Process.job_goes_on(me)
    now[0] += MASTER_GONE_GRACE_S
    assert not Process.job_goes_on(me)
    me._master_missing_since = None
    me.membership = OwnView([True, True], evicted=True)  # the master took it out while the job goes on
    with pytest.raises(LitzError, match="worker w3 was taken out of the job"):
        Process.job_goes_on(me)
