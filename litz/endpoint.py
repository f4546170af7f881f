"""The endpoint interface every carrier implements, and the registry that picks a carrier by address scheme.

A process owns one :class:`Endpoint`. It sends Python objects (encoded by :mod:`litz.wire`) to peers it knows
by id, and receives from any peer on the same endpoint. Messages from one peer arrive in the order they were
sent (per-peer FIFO); nothing is promised across peers. A carrier is chosen by the scheme of the address the
process listens at (see :func:`open_endpoint`):

``tcp://HOST:PORT``  ZeroMQ with CURVE between hosts (:mod:`litz.transport`); PORT 0 takes a random port
``unix://DIR``       a one-machine job: Unix sockets in DIR (:mod:`litz.localtransport`)

A carrier module registers itself on import with :func:`register_carrier`; the built-in ones are imported
on first use, any other (a simulated ``sim://``) by whoever imports it before opening an endpoint.
"""
from __future__ import annotations

import abc
import importlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .errors import LitzError
from .guard import MessageGuard


class Endpoint(abc.ABC):
    """Where one process sends and receives messages. Frames that are no message never leave :meth:`drain`: the
    carrier drops them through :attr:`guard`, which the process uses for its own drops too (:mod:`litz.guard`)."""

    address: str  # where peers reach this endpoint (what the process registers)

    @property
    def guard(self) -> MessageGuard:
        """What this endpoint's process dropped as malformed, and whom it cut off (made on first use: a carrier
        needs nothing for it; :meth:`cut_off` is what it does with a flooding peer unless the process says)."""
        guard = self.__dict__.get("_guard")
        if guard is None:
            guard = self.__dict__["_guard"] = MessageGuard(getattr(self, "ident", "endpoint"), self.cut_off)
        return guard

    @abc.abstractmethod
    def connect(self, peer: str, address: str, watch: bool | None = None) -> None:
        """Know ``peer`` at ``address``, reconnecting if the address changed. ``watch``: follow the connection
        for :meth:`unreachable` (default: as the endpoint was opened)."""

    @abc.abstractmethod
    def disconnect(self, peer: str) -> None:
        """Forget ``peer``: close the connection; what was queued for it may be lost."""

    def cut_off(self, peer: str) -> bool:
        """Stop hearing ``peer``, which keeps sending malformed messages: close our connection to it (a carrier
        closes its connections to us too where it can; over ZeroMQ its frames still arrive, and the guard drops
        them unread). True: the guard then drops what it sends for a while."""
        self.disconnect(peer)
        return True

    @abc.abstractmethod
    def knows(self, peer: str) -> bool:
        """True if :meth:`connect` (or a peer's own hello) made ``peer`` reachable by :meth:`send`."""

    @abc.abstractmethod
    def address_of(self, peer: str) -> str | None:
        """The address ``peer`` is known at, or None."""

    @abc.abstractmethod
    def send(self, peer: str, msg: Any, pickler: Any = None) -> int:
        """Queue ``msg`` for ``peer`` (known) without blocking; returns the payload bytes. Messages to one peer
        arrive in the order sent; one to a peer that is gone is lost silently (see :meth:`unreachable`)."""

    @abc.abstractmethod
    def drain(self, limit: int = 10_000, borrow: bool = False) -> Iterator[tuple[str, Any]]:
        """Yield ``(sender, message)`` for everything received so far (up to ``limit``), without waiting.

        ``borrow=True``: a message's large arrays may be views into the carrier's buffers, valid only until the
        next message is taken; the caller handles each message before the next and copies what it keeps."""

    @abc.abstractmethod
    def poll(self, timeout_ms: float) -> bool:
        """Wait up to ``timeout_ms`` for a message; True if one may be ready (:meth:`drain` may still yield
        nothing: the carrier's own control messages count)."""

    @abc.abstractmethod
    def wait(self, timeout_ms: float, fds: Iterable[int] = ()) -> tuple[bool, set[int]]:
        """Wait up to ``timeout_ms`` until a message is ready (as :meth:`poll`) or one of ``fds`` is readable;
        return ``(messages_ready, readable fds)``. An event loop's one wait over the endpoint and its own fds."""

    @abc.abstractmethod
    def unreachable(self, grace_s: float) -> list[str]:
        """Watched peers whose connection dropped and did not come back within ``grace_s``, each reported once."""

    @abc.abstractmethod
    def close(self, discard: bool = False) -> None:
        """Close everything; queued messages get a moment to leave unless ``discard``."""


# scheme -> factory(ident, secret, where, *, watch, **options), where = the address after "scheme://"
Factory = Callable[..., Endpoint]
_carriers: dict[str, Factory] = {}
_BUILTIN = {"tcp": "litz.transport", "unix": "litz.localtransport"}  # imported when first asked for


def register_carrier(scheme: str, factory: Factory) -> None:
    """Make :func:`open_endpoint` open ``scheme://...`` addresses with ``factory`` (replacing any earlier one)."""
    _carriers[scheme] = factory


def open_endpoint(ident: str, secret: str, listen: str, *, watch: bool = False, **options: Any) -> Endpoint:
    """Process ``ident``'s endpoint of a job with ``secret``, listening at ``listen`` (``scheme://...``).
    ``watch``: follow every connection for :meth:`Endpoint.unreachable`. ``options`` go to the carrier
    (``bind_host`` for ``tcp://``)."""
    scheme, sep, where = listen.partition("://")
    if sep and scheme not in _carriers and scheme in _BUILTIN:
        importlib.import_module(_BUILTIN[scheme])
    factory = _carriers.get(scheme) if sep else None
    if factory is None:
        known = ", ".join(f"{s}://" for s in sorted(set(_carriers) | set(_BUILTIN)))
        raise LitzError(f"cannot listen at {listen!r}: the address must start with one of {known}")
    return factory(ident, secret, where, watch=watch, **options)


def listen_address(host: str = "127.0.0.1", port: int = 0, local_dir: str | None = None) -> str:
    """The listen address of the older arguments: a ``local_dir`` (one-machine job) or a TCP host and port."""
    return f"unix://{local_dir}" if local_dir else f"tcp://{host}:{port}"


def listen_host(listen: str) -> str:
    """The host part of a ``tcp://`` listen address; 127.0.0.1 for any other scheme (one machine)."""
    scheme, _, where = listen.partition("://")
    return where.rpartition(":")[0] if scheme == "tcp" else "127.0.0.1"
