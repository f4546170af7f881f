"""Per-job authentication: CURVE keys derived from the job secret.

Every process of a job derives the same CURVE key pair from the job's secret. Servers accept a client
only if it proves it holds that key pair (a ZAP handler checks the client's public key), so a peer
without the secret never gets a message delivered: payloads are pickles and must not come from strangers.
"""
from __future__ import annotations

import hashlib
import secrets
import threading

import zmq
from zmq.utils import z85


def new_secret() -> str:
    return secrets.token_hex(32)


def curve_keypair(secret: str) -> tuple[bytes, bytes]:
    """(public, secret) z85 CURVE keys, the same in every process that knows ``secret``."""
    raw = hashlib.sha256(b"litz-curve-v1:" + secret.encode()).digest()
    secret_key = z85.encode(raw)
    return zmq.curve_public(secret_key), secret_key


class Authenticator:
    """ZAP handler (RFC 27) admitting only clients whose CURVE public key is the job's."""

    def __init__(self, context: zmq.Context, public_key: bytes):
        self._allowed = z85.decode(public_key)
        self._socket = context.socket(zmq.REP)
        self._socket.linger = 0
        self._socket.bind("inproc://zeromq.zap.01")
        self._thread = threading.Thread(target=self._serve, name="litz-zap", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        sock = self._socket
        while True:
            try:
                msg = sock.recv_multipart()
            except zmq.ZMQError:
                sock.close(linger=0)  # context terminating: let term() finish
                return
            version, request_id = msg[0], msg[1]
            mechanism = msg[5] if len(msg) > 5 else b""
            key = msg[6] if len(msg) > 6 else b""
            ok = mechanism == b"CURVE" and key == self._allowed
            code, text = (b"200", b"OK") if ok else (b"400", b"unknown job key")
            try:
                sock.send_multipart([version, request_id, code, text, b"", b""])
            except zmq.ZMQError:
                sock.close(linger=0)
                return
