"""The endpoint registry (litz.endpoint): carriers chosen by scheme; Endpoint.wait over messages and extra fds."""
import os
import time

import pytest

from litz import endpoint
from litz.endpoint import Endpoint, open_endpoint, register_carrier
from litz.errors import LitzError
from litz.localtransport import LocalEndpoint
from litz.transport import ZmqEndpoint
from tests.support.processes import wait_for


def _open_pair(kind: str, tmp_path) -> tuple[Endpoint, Endpoint]:
    listen = "tcp://127.0.0.1:0" if kind == "tcp" else f"unix://{tmp_path}"
    a = open_endpoint("a", "secret", listen)
    try:
        b = open_endpoint("b", "secret", listen)
    except BaseException:
        a.close(discard=True)
        raise
    return a, b


def test_the_scheme_picks_the_carrier(tmp_path, monkeypatch):
    monkeypatch.delenv("LITZ_TRANSPORT", raising=False)
    tcp = open_endpoint("t", "secret", "tcp://127.0.0.1:0")
    unix = open_endpoint("u", "secret", f"unix://{tmp_path}")
    try:
        assert type(tcp) is ZmqEndpoint and tcp.address.startswith("tcp://127.0.0.1:")
        assert type(unix) is LocalEndpoint and unix.address.startswith(f"ipc://{tmp_path}/u-")
    finally:
        tcp.close(discard=True)
        unix.close(discard=True)


def test_litz_transport_zmq_keeps_zeromq_for_a_local_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("LITZ_TRANSPORT", "zmq")
    ep = open_endpoint("z", "secret", f"unix://{tmp_path}")
    try:
        assert type(ep) is ZmqEndpoint and ep.address.startswith(f"ipc://{tmp_path}/z-")
    finally:
        ep.close(discard=True)


@pytest.mark.parametrize("listen", ["carrier-pigeon://coop", "127.0.0.1:5555"])
def test_an_unknown_scheme_is_one_line_naming_the_known_ones(listen):
    with pytest.raises(LitzError) as err:
        open_endpoint("x", "secret", listen)
    text = str(err.value)
    assert "\n" not in text and listen in text and "tcp://" in text and "unix://" in text


def test_a_registered_scheme_is_used(monkeypatch):
    monkeypatch.setattr(endpoint, "_carriers", dict(endpoint._carriers))  # leave the real registry as it was
    made = []

    def factory(ident, secret, where, *, watch=False, **options):
        made.append((ident, secret, where, watch, options))
        return "an endpoint"

    register_carrier("sim", factory)
    assert open_endpoint("w0", "s", "sim://world-1", watch=True, latency=3) == "an endpoint"
    assert made == [("w0", "s", "world-1", True, {"latency": 3})]
    with pytest.raises(LitzError, match="sim://"):
        open_endpoint("w0", "s", "nope://")


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_wait_tells_an_extra_fd_from_a_message(kind, tmp_path, monkeypatch):
    monkeypatch.delenv("LITZ_TRANSPORT", raising=False)
    monkeypatch.setenv("LITZ_SHM", "0")  # no ring handshake: only the test's messages cross
    a, b = _open_pair(kind, tmp_path)
    r, w = os.pipe()
    try:
        assert b.wait(50, (r,)) == (False, set())  # nothing: the timeout
        os.write(w, b"x")
        assert b.wait(2000, (r,)) == (False, {r})
        os.read(r, 1)
        a.connect("b", b.address)
        a.send("b", ("hello", 1))
        deadline = time.monotonic() + 10
        got = []
        while not got and time.monotonic() < deadline:
            ready, fds = b.wait(1000, (r,))
            assert fds == set()
            if ready:
                got = list(b.drain())  # the connection's hello is a control message: drain skips it
        assert got == [("a", ("hello", 1))]
        os.write(w, b"x")
        a.send("b", ("again",))
        wait_for(lambda: b.wait(1000, (r,)) == (True, {r}), 10, "the message and the descriptor both ready")
        assert list(b.drain()) == [("a", ("again",))]
    finally:
        os.close(r)
        os.close(w)
        a.close(discard=True)
        b.close(discard=True)
