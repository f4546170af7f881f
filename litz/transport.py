"""Point-to-point messaging between the processes of one job, over ZeroMQ with CURVE.

Each process owns one :class:`Endpoint`: a ROUTER socket it binds and receives on, and one DEALER per
peer it sends to (routing id = its own process id). Receiving on one socket keeps every event loop a
single poll; sending on per-peer DEALERs keeps each peer's messages in order.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import zmq

from . import wire
from .security import Authenticator, curve_keypair

HIGH_WATER_MARK = 1_000_000


class Endpoint:
    def __init__(self, ident: str, secret: str, host: str = "127.0.0.1", port: int = 0,
                 bind_host: str | None = None):
        self.ident = ident
        self._public, self._secret = curve_keypair(secret)
        self.context = zmq.Context()
        self._auth = Authenticator(self.context, self._public)
        self.router = self.context.socket(zmq.ROUTER)
        self.router.curve_server = True
        self.router.curve_publickey = self._public
        self.router.curve_secretkey = self._secret
        self.router.router_handover = 1  # a restarted peer with the same id takes over its route
        self.router.rcvhwm = HIGH_WATER_MARK
        self.router.linger = 0
        bind = bind_host or host
        if port:
            self.router.bind(f"tcp://{bind}:{port}")
        else:
            port = self.router.bind_to_random_port(f"tcp://{bind}")
        self.address = f"tcp://{host}:{port}"
        self._peers: dict[str, zmq.Socket] = {}
        self._addresses: dict[str, str] = {}
        self.pid = os.getpid()

    # -- peers ---------------------------------------------------------------------------------------
    def connect(self, peer: str, address: str) -> None:
        """Know ``peer`` at ``address`` (reconnects if the address changed)."""
        if self._addresses.get(peer) == address:
            return
        self.disconnect(peer)
        sock = self.context.socket(zmq.DEALER)
        sock.routing_id = self.ident.encode()
        sock.curve_serverkey = self._public
        sock.curve_publickey = self._public
        sock.curve_secretkey = self._secret
        sock.sndhwm = HIGH_WATER_MARK
        sock.linger = 2000  # give queued messages (final acks, results) a moment at shutdown
        sock.connect(address)
        self._peers[peer] = sock
        self._addresses[peer] = address

    def disconnect(self, peer: str) -> None:
        sock = self._peers.pop(peer, None)
        self._addresses.pop(peer, None)
        if sock is not None:
            sock.close(linger=0)

    def knows(self, peer: str) -> bool:
        return peer in self._peers

    def address_of(self, peer: str) -> str | None:
        return self._addresses.get(peer)

    # -- messages ------------------------------------------------------------------------------------
    def send(self, peer: str, msg: Any, pickler: Any = None) -> int:
        """Send ``msg`` to ``peer``; returns the bytes handed to ZeroMQ."""
        frames = wire.encode(msg) if pickler is None else wire.encode(msg, pickler)
        self._peers[peer].send_multipart(frames, copy=False)
        return sum(memoryview(f).nbytes for f in frames)

    def poll(self, timeout_ms: float) -> bool:
        return bool(self.router.poll(timeout_ms))

    def drain(self, limit: int = 10_000) -> Iterator[tuple[str, Any]]:
        """Yield ``(sender, message)`` for everything already received (up to ``limit``)."""
        router = self.router
        for _ in range(limit):
            try:
                frames = router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            yield frames[0].bytes.decode(), wire.decode(frames[1:])

    def close(self) -> None:
        for sock in self._peers.values():
            sock.close()
        self._peers.clear()
        self.router.close(linger=0)
        self.context.term()
