"""A malformed message from a peer that holds the job's key is dropped with one warning, and the process goes on
serving; a handler's failure on one is never the application's error; a flood is cut off; a frame over the
limit is refused before it is buffered; a process of another protocol version is refused on both sides."""
from __future__ import annotations

import json
import os
import pickle
import socket
import struct
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from litz import clock, guard, wire
from litz import protocol as P
from litz.api import Executor
from litz.appload import load_app
from litz.errors import AppError, LitzError
from litz.master import Master, Member
from litz.membership import Membership, connect_kv
from litz.security import curve_keypair
from litz.server import Server
from litz.transport import ZmqEndpoint
from litz.worker import Worker
from tests.support.processes import ROOT, Processes, app_path, wait_for

SECRET = "job-secret"
BIG = 200 << 20  # the 200 MB frame


class Rogue:
    """A peer that holds the job's key (over unix://: may enter the socket directory) and sends raw frames."""

    def __init__(self, address: str, ident: bytes, ctx: zmq.Context | None = None):
        self.sock: zmq.Socket | socket.socket
        if address.startswith("tcp://"):
            self.sock = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
            self.sock.linger = 2000
            self.sock.routing_id = ident
            pub, sec = curve_keypair(SECRET)
            self.sock.curve_serverkey, self.sock.curve_publickey, self.sock.curve_secretkey = pub, pub, sec
            self.sock.connect(address)
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(address.removeprefix("ipc://"))
            self.sock.sendall(struct.pack("<H", len(ident)) + ident)

    def send(self, frames: list, lengths: list[int] | None = None) -> None:
        """``lengths``: announce these instead of the frames' own (unix://: a header that lies)."""
        if isinstance(self.sock, zmq.Socket):
            self.sock.send_multipart(frames)
            return
        lens = lengths or [memoryview(f).nbytes for f in frames]
        try:
            self.sock.sendall(struct.pack(f"<I{len(lens)}Q", len(lens), *lens) + b"".join(bytes(f) for f in frames))
        except (BrokenPipeError, ConnectionResetError):  # the receiver closed a stream it cannot frame
            pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def membership(litz_home):
    m = Membership(connect_kv(home=str(litz_home)), "job")
    m.kv.put(m.prefix + "master", {"address": "nowhere"})  # the job runs: its registry has not been cleared
    m.kv.put(m.prefix + "settled", 0.0)  # and has not come back empty: a missing id is a stranger
    m.kv.put(m.prefix + "ids/w9", 1.0)  # a process of this job, for the messages that must still get through
    return m


def start(role: str, carrier: str, tmp_path, membership):
    listen = "tcp://127.0.0.1:0" if carrier == "tcp" else f"unix://{tmp_path}"
    if role == "master":
        proc = Master(load_app(app_path("noop")), membership, SECRET, config={}, num_executors=1, listen=listen,
                      wake=False)
        proc.addresses["w9"] = "nowhere"  # it said HELLO
        proc.workers["w9"] = Member("w9", "worker", {})
    else:
        proc = (Worker if role == "worker" else Server)("w0" if role == "worker" else "s0", membership, SECRET, listen)
    return proc


def pump(proc, seconds: float) -> list:
    """What ``proc`` received within ``seconds`` (and let through)."""
    got, deadline = [], time.time() + seconds
    while time.time() < deadline:
        if proc.endpoint.poll(20):
            got += list(proc.receive())
    return got


def pump_until_said(proc, capsys, texts: list[str], timeout: float = 10.0) -> tuple[list, str]:
    """Receive until ``proc`` has said every one of ``texts`` on stderr: (what it let through, what it said)."""
    got, err, deadline = [], "", time.time() + timeout
    while not all(t in err for t in texts):
        assert time.time() < deadline, f"never said {[t for t in texts if t not in err]}; said:\n{err}"
        got += pump(proc, 0.05)
        err += capsys.readouterr().err
    return got + pump(proc, 0.2), err + capsys.readouterr().err


def frames_of(msg) -> list:
    return [bytes(memoryview(f).cast("B")) for f in wire.encode((0, msg))]


OOB = frames_of((P.STATS, {"a": np.arange(1000.0)}))
assert len(OOB) == 2  # the array travels as its own frame
CASES = {  # case -> (frames, the reason the warning gives: for the master, for a worker or server)
    "garbage": ([bytes(range(256)) * 4], "not a pickled message"),
    "empty-frame": ([b""], "not a pickled message"),
    "not-a-tuple": ([pickle.dumps(42)], "not an (epoch, message) pair"),
    "truncated": ([frames_of((P.STATS, {"rss": 1, "cache_keys": 2}))[0][:20]], "not a pickled message"),
    "ring-header": ([b"LZR\x00"], "truncated ring header"),
    "oob-missing": ([OOB[0]], "not a pickled message"),
    "unknown-tag": (frames_of(("no-such-tag", 1)), "unknown tag"),
    "done-none": (frames_of((P.DONE, None)), ("done with the wrong number of fields", "unexpected tag")),
    "control": ([b"LZC" + pickle.dumps(("offer", 1))], "malformed control message"),
    "no-epoch": ([pickle.dumps((P.STATS, {}))], "not an (epoch, message) pair"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("carrier", ["tcp", "unix"])
@pytest.mark.parametrize("role", ["master", "worker", "server"])
def test_each_malformed_message_is_dropped_with_one_warning_and_the_process_goes_on(role, carrier, tmp_path,
                                                                                   membership, capsys):
    proc = start(role, carrier, tmp_path, membership)
    ctx = zmq.Context()
    rogues = []
    try:
        for case, (frames, _) in CASES.items():
            rogue = Rogue(proc.endpoint.address, f"rogue-{case}".encode(), ctx)
            rogues.append(rogue)
            for _ in range(3):  # the same case thrice: still one warning
                rogue.send(frames)
        bad = Rogue(proc.endpoint.address, b"\xff\xfe-not-utf8", ctx)
        rogues.append(bad)
        bad.send(frames_of((P.STATS, {})))
        got, err = pump_until_said(proc, capsys, [f"from rogue-{case}:" for case in CASES] + ["not UTF-8"])
        assert got == [], got
        for case, (_, reason) in CASES.items():
            if isinstance(reason, tuple):
                reason = reason[0] if role == "master" else reason[1]
            lines = [ln for ln in err.splitlines() if f"from rogue-{case}:" in ln]
            assert len(lines) == 1 and f": {reason}" in lines[0], (case, lines, err)
        assert len([ln for ln in err.splitlines() if "sender id is not UTF-8" in ln]) == 1, err
        assert "Traceback" not in err
        # it keeps serving: a message from a process of the job still gets through
        friend = Rogue(proc.endpoint.address, b"w9" if role == "master" else b"master", ctx)
        rogues.append(friend)
        msg = (P.STATS, {"rss": 1}) if role == "master" else (P.STOP,)
        friend.send(frames_of(msg))
        assert wait_for(lambda: pump(proc, 0.1), 10, "the good message") == [(friend_id(role), msg)]
    finally:
        for rogue in rogues:
            rogue.close()
        ctx.destroy(linger=0)
        proc.close()


def assert_still_hears_the_master(proc) -> None:
    """It keeps serving: a message from the master still gets through."""
    friend = Rogue(proc.endpoint.address, b"master")
    try:
        friend.send(frames_of((P.STOP,)))
        assert wait_for(lambda: pump(proc, 0.1), 10, "the good message") == [("master", (P.STOP,))]
    finally:
        friend.close()


def friend_id(role: str) -> str:
    return "w9" if role == "master" else "master"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("role", ["worker", "server"])
def test_only_the_master_gives_orders_and_only_processes_of_the_job_are_heard(role, tmp_path, membership, capsys):
    proc = start(role, "unix", tmp_path, membership)
    peers = {name: Rogue(proc.endpoint.address, name.encode()) for name in ("w9", "stranger", "master")}
    try:
        peers["w9"].send(frames_of((P.STOP,)))  # a process of the job, but not the master
        peers["w9"].send(frames_of((P.DIE, 9)))
        peers["stranger"].send(frames_of((P.FENCE, 3) if role == "server" else (P.VALUES, [(1, 2.0)])))
        got, err = pump_until_said(proc, capsys, ["from w9: stop not from the master",
                                                  "from w9: die not from the master",
                                                  "from stranger: not a process of this job"])
        assert got == []
        peers["master"].send(frames_of((P.STOP,)))
        ok = (P.FENCE, 3) if role == "server" else (P.VALUES, [(1, 2.0)])
        peers["w9"].send(frames_of(ok))  # w9 holds an id in the job's registry
        got = []
        wait_for(lambda: got.extend(pump(proc, 0.1)) or len(got) >= 2, 10, "the good messages")
        assert sorted(got) == [("master", (P.STOP,)), ("w9", ok)]
    finally:
        for peer in peers.values():
            peer.close()
        proc.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("carrier", ["tcp", "unix"])
def test_a_200_mb_frame_of_garbage_is_dropped_too(carrier, tmp_path, membership, capsys):
    proc = start("server", carrier, tmp_path, membership)
    rogue = Rogue(proc.endpoint.address, b"rogue-big")
    sending = threading.Thread(target=rogue.send, args=([b"\x00" * BIG],))  # a socket takes it as it is read
    sending.start()
    try:
        got, err = pump_until_said(proc, capsys, ["from rogue-big: not a pickled message"], timeout=30)
        sending.join()
        assert got == [] and err.count("rogue-big") == 1
        assert_still_hears_the_master(proc)
    finally:
        rogue.close()
        proc.close()


@pytest.mark.timeout(60)
def test_a_frame_over_the_limit_is_refused_at_its_header_over_unix_sockets(tmp_path, membership, capsys,
                                                                           monkeypatch):
    """The length alone refuses it: the warning comes although the 200 MB never follow, so nothing was buffered;
    the stream cannot be framed after it, so its connection is closed."""
    monkeypatch.setenv("LITZ_MAX_FRAME_BYTES", "64M")
    proc = start("worker", "unix", tmp_path, membership)
    rogue = Rogue(proc.endpoint.address, b"rogue-big")
    try:
        rogue.send([b"\x80\x05"], lengths=[BIG])
        _, err = pump_until_said(proc, capsys, ["from rogue-big: frame over the size limit: 209,715,200 bytes, "
                                                "LITZ_MAX_FRAME_BYTES is 67,108,864"])
        rogue.send(frames_of((P.STOP,)))  # the connection is gone
        assert pump(proc, 0.5) == []
        counted = Rogue(proc.endpoint.address, b"rogue-count")
        counted.sock.sendall(struct.pack("<I", 2**32 - 1))  # a frame count no message has: refused at once
        pump_until_said(proc, capsys, ["from rogue-count: frame count over the limit: 4,294,967,295 frames"])
        counted.close()
        assert_still_hears_the_master(proc)
    finally:
        rogue.close()
        proc.close()


@pytest.mark.timeout(60)
def test_a_frame_over_the_limit_is_refused_by_zeromq_and_the_sender_goes_on(tmp_path, membership, monkeypatch):
    """ZeroMQ closes the connection of a frame over ZMQ_MAXMSGSIZE as it reads its size; the peer reconnects."""
    monkeypatch.setenv("LITZ_MAX_FRAME_BYTES", "64M")
    proc = start("worker", "tcp", tmp_path, membership)
    rogue = Rogue(proc.endpoint.address, b"master")
    try:
        rogue.send([b"\x00" * BIG])
        rogue.send(frames_of((P.STOP,)))
        assert wait_for(lambda: pump(proc, 0.1), 30, "the message after it") == [("master", (P.STOP,))]
    finally:
        rogue.close()
        proc.close()


def test_a_sender_refuses_a_frame_over_the_limit_with_a_clear_error(monkeypatch):
    monkeypatch.setenv("LITZ_MAX_FRAME_BYTES", "1M")
    a, b = ZmqEndpoint("a", SECRET), ZmqEndpoint("b", SECRET)
    try:
        a.connect("b", b.address)
        with pytest.raises(LitzError, match=r"a message to b \(values\) has a frame of 2,000,000 bytes, over "
                                            r"LITZ_MAX_FRAME_BYTES \(1,048,576\)"):
            a.send("b", (0, (P.VALUES, [(1, np.zeros(250_000))])))
        a.send("b", (0, (P.VALUES, [(1, np.zeros(1000))])))  # under it: fine
    finally:
        a.close()
        b.close()
    monkeypatch.setenv("LITZ_MAX_FRAME_BYTES", "lots")
    with pytest.raises(LitzError, match="LITZ_MAX_FRAME_BYTES: bad memory size 'lots'"):
        ZmqEndpoint("c", SECRET)


# -- handlers: a message that fits its shape but not the receiver ------------------------------------------
def test_a_handler_failure_drops_the_message_and_is_never_an_application_error(tmp_path, membership, capsys):
    for sub in "wsm":
        (tmp_path / sub).mkdir()
    worker, server, master = (start(role, "unix", tmp_path / role[0], membership)
                              for role in ("worker", "server", "master"))
    sent = []
    for proc in (worker, server, master):
        proc.send = lambda peer, msg, pickler=None: sent.append((peer, msg))
    try:
        worker.handle_message("master", (P.TASKS, [(1, 2)], None))  # a task that is not (tid, eid, version, args)
        worker.executor_cls, worker.config, worker.num_executors = Executor, {}, 1
        worker.install(0, {})
        worker.handle_message("w9", (P.TASKS, [(1, 99, 0, None), (2, 0, 0, None)]))  # forwarded; 99 never here
        assert [t.tid for t in worker.runnable] == [2]  # the rest of the batch runs
        worker.handle_message("w9", (P.HANDOFF, [(3, ["k"]), ("x", None)]))  # a hand-off: (task id, keys)
        worker.handle_message("w9", (P.HANDOFF, [(4, "k")]))  # keys that are not a list (said once a while: above)
        assert worker.held.handed == {3: ["k"]}  # the good item before the bad one counted, as in any batch
        worker.handle_message("master", (P.MOVE_EXECUTOR, 5, "w1", False, False))
        worker.handle_message("master", (P.COPY_INPUT, 5, "w1"))
        server.handle_message("w9", (P.GETS, [("no shard",)]))
        server.handle_message("w9", (P.UPDATES, 1, [(0, "k")]))
        master.handle_message("w9", (P.DONE, [(1,)], ()))  # the driver never sees it: not the app's error
        master.handle_message("w8", (P.DONE, [], (), (1, 0.1, 0.1, {12345: (1, 0.1, 0.1)})))  # no such executor
        master.handle_message("w9", (P.MOVED, 12345, 10))  # an executor the job does not have
        err = capsys.readouterr().err
        assert sent == []  # no FAIL: none of it is the application's error
        for text in ("from master: tasks that could not be handled: ValueError: not enough values to unpack",
                     "from w9: tasks that could not be handled: BadMessage: tasks for executors that were never "
                     "here: executors [99]", "from master: move_executor that could not be handled",
                     "from master: copy_input that could not be handled",
                     "from w9: gets that could not be handled", "from w9: updates that could not be handled",
                     "from w9: done that could not be handled: BadMessage: DONE with a result that is not a",
                     "from w8: done that could not be handled: BadMessage: DONE with a timing that is not",
                     "from w9: moved that could not be handled: IndexError",
                     "from w9: handoff that could not be handled: BadMessage: a hand-off that is not (task id, keys)"):
            assert text in err, (text, err)
        assert " at worker.py:" in err  # where it failed: a handler's failure may also be a bug in Litz
        # an application error still stops the job as one: the master raises it, a worker reports it to the master
        with pytest.raises(AppError, match="application error in executor 0 run_task: ValueError: x"):
            master.handle_message("w9", (P.FAIL, "executor 0 run_task", "Traceback ...\nValueError: x"))

        class Picky(Executor):
            def __setstate__(self, state):
                raise KeyError("w")

        worker.executor_cls, worker.config, worker.num_executors = Picky, {}, 1
        worker.handle_message("w9", (P.EXECUTOR, 0, {"x": 1}, [], True, False))  # arrives by a move
        [(to, (tag, where, text))] = sent
        assert (to, tag, where) == ("master", P.FAIL, "executor 0 __setstate__") and "KeyError: 'w'" in text
        assert "raise KeyError" in text  # the app's own traceback
        sent.clear()
        worker.executor_cls = Executor  # executor 1 spills; asked to move, the worker loads it with __setstate__
        worker.install(1, {"x": 1})
        worker.residency.evict(1, worker.executors.pop(1))
        worker.executor_cls = Picky
        worker.handle_message("master", (P.MOVE_EXECUTOR, 1, "w1", False, False))
        [(to, (tag, where, text))] = sent
        assert (to, tag, where) == ("master", P.FAIL, "executor 1 __setstate__") and "KeyError: 'w'" in text
    finally:
        for proc in (worker, server, master):
            proc.close()


# -- the guard: rate-limited warnings, cutting off a flood -------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    monotonic = perf_counter = thread_time = time

    def sleep(self, s: float) -> None:
        self.now += s


@pytest.fixture
def fake_clock():
    fake = FakeClock()
    clock.install(fake)
    yield fake
    clock.restore()


def test_warnings_are_one_line_per_peer_and_reason_now_and_then(fake_clock, capsys):
    g = guard.MessageGuard("w0", lambda peer: True)
    for _ in range(5):
        g.refuse("p", "not a pickled message", "EOFError")
    g.refuse("p", "unknown tag", "'x'")
    g.refuse("q\n", "unknown tag", "'x'")  # an id off the wire cannot break the log line
    fake_clock.now += guard.WARN_EVERY_S
    g.refuse("p", "not a pickled message", "EOFError")
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["litz: w0: dropped a malformed message from p: not a pickled message: EOFError",
                     "litz: w0: dropped a malformed message from p: unknown tag: 'x'",
                     "litz: w0: dropped a malformed message from 'q\\n': unknown tag: 'x'",
                     "litz: w0: dropped a malformed message from p: not a pickled message: EOFError "
                     "(4 more like it since the last warning)"]
    assert g.dropped == 8


def test_a_peer_that_keeps_sending_them_is_cut_off_for_a_while(fake_clock, capsys):
    offenders = []
    g = guard.MessageGuard("s0", lambda peer: offenders.append(peer) or peer != "master")
    for _ in range(guard.CUT_OFF_AFTER + 5):
        g.refuse("fuzz", "unknown tag")
        g.refuse("master", "unknown tag")
    assert offenders == ["fuzz", "master"]  # asked once each
    assert g.is_cut("fuzz") and not g.is_cut("master")
    assert "litz: s0: cut off fuzz for 60 s: more than 100 malformed messages within 10 s" in capsys.readouterr().err
    fake_clock.now += guard.CUT_OFF_S
    assert not g.is_cut("fuzz")  # heard again (and cut off again if it goes on)
    fake_clock.now += guard.WINDOW_S + 1
    for _ in range(guard.CUT_OFF_AFTER):  # as many within a window is fine
        g.refuse("slow", "unknown tag")
    fake_clock.now += guard.WINDOW_S + 1
    g.refuse("slow", "unknown tag")
    assert not g.is_cut("slow")


def test_a_worker_never_cuts_off_its_master_and_takes_a_flooding_member_out_of_the_job(tmp_path, membership,
                                                                                        capsys):
    worker = start("worker", "unix", tmp_path, membership)
    try:
        membership.kv.put(membership.prefix + "members/w9", {"role": "worker", "address": "nowhere"})
        worker.peers_ok.add("w9")
        assert worker.offender("master") is False
        assert worker.offender("w9") is True and membership.member("w9") is None
        assert worker.offender("stranger") is True
        assert "litz: w0: taking w9 out of the job: it sends malformed messages" in capsys.readouterr().err
    finally:
        worker.close()


def test_the_master_takes_a_member_whose_message_it_cannot_handle_out_of_the_job(tmp_path, membership, capsys):
    """A DONE the master drops loses its tasks' completions, and the job would wait for them forever (it did, when a
    benchmark's wrapper of Master.on_done broke): the sender is taken out of the job at once, and the master
    recovers from a checkpoint or ends the job saying there is none. A stranger's message is only dropped."""
    master = start("master", "unix", tmp_path, membership)
    try:
        membership.kv.put(membership.prefix + "members/w9", {"role": "worker", "address": "nowhere"})
        master.handle_message("stranger", (P.DONE, [(1,)], ()))
        assert membership.member("w9") is not None and "taking" not in capsys.readouterr().err
        master.peers_ok.add("w9")  # admitted: a process of this job
        master.handle_message("w9", (P.DONE, [(1,)], ()))
        err = capsys.readouterr().err
        assert "litz: master: dropped a malformed message from w9: done that could not be handled" in err
        assert "litz: master: taking w9 out of the job: its done could not be handled (BadMessage: DONE " \
               "with a result that is not a (task id, result) pair" in err, err
        assert membership.member("w9") is None
        membership.kv.put(membership.prefix + "members/w8", {"role": "worker", "address": "nowhere"})
        master.peers_ok.add("w8")
        master.handle_message("w8", (P.HELLO, P.VERSION, "worker", {}))  # no address: refused, nothing lost
        err = capsys.readouterr().err
        assert "from w8: hello that could not be handled" in err and "taking" not in err, err
        assert membership.member("w8") is not None
    finally:
        master.close()


def test_shapes_cover_every_tag_and_never_look_inside_a_batch():
    """The check costs a few comparisons a message whatever its batch holds (a batch carries many keys; looking at
    each would cost per key): shown with batches that fail the test if any item is touched, not with a timer."""
    tags = {v for k, v in vars(P).items() if k.isupper() and isinstance(v, str)}
    assert tags == set().union(*P.SHAPES.values())  # a tag added without a shape would be dropped everywhere

    class Untouchable(list):
        def _touched(self, *args):
            raise AssertionError("the shape check looked inside a batch")

        __iter__ = __getitem__ = __len__ = __contains__ = _touched

    for role, sender, msg in (("worker", "master", (P.TASKS, Untouchable(), Untouchable())),
                              ("master", "w0", (P.DONE, Untouchable(), Untouchable())),
                              ("server", "w0", (P.UPDATES, 1, Untouchable()))):
        assert P.check(P.SHAPES[role], sender, msg) is None, (role, msg[0])
    assert P.check(P.SHAPES["worker"], "master", (P.TASKS, "not a list", None)) is not None  # the check does check


# -- the protocol version --------------------------------------------------------------------------------
OTHER_VERSION = "import sys, litz.protocol as P; P.VERSION = 99; from litz.cli.litz import main; sys.exit(main())"


@pytest.mark.timeout(90)
def test_a_process_of_another_protocol_version_is_refused_on_both_sides(tmp_path, litz_home):
    out = tmp_path / "out.json"
    name = "versions"
    env = {**os.environ, "LITZ_SECRET": SECRET}
    with Processes() as procs:
        master = procs.start(["litz", "master", app_path("noop"), "--name", name, "--config", "tasks=200",
                              "--output", str(out), "--no-progress"], env=env)
        procs.start(["litz", "server", "--name", name], env=env)
        import subprocess

        other = subprocess.Popen([sys.executable, "-c", OTHER_VERSION, "worker", "--name", name], cwd=ROOT, env=env,
                                 text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        procs.procs.append(other)
        _, other_err = other.communicate(timeout=60)
        assert other.returncode == 2
        assert other_err.strip().splitlines() == [
            f"litz: error: the master of job '{name}' refused worker w0: this process speaks Litz protocol "
            f"version 99, the master version {P.VERSION}; run the same Litz version on every machine"]
        procs.start(["litz", "worker", "--name", name], env=env)  # one of the master's version: the job runs
        stdout, stderr = master.communicate(timeout=60)
        assert master.returncode == 0, stderr
        assert json.loads(stdout) == {"done": 200}
        refusals = [ln for ln in stderr.splitlines() if "refused" in ln]
        assert len(refusals) == 1 and refusals[0].startswith("litz: master: refused worker w0 (pid ")
        assert refusals[0].endswith(f"it speaks Litz protocol version 99, this master version {P.VERSION}")
