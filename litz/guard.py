"""What happens to a malformed message: it is dropped, the process says so now and then, and a peer that keeps
sending them is cut off for a while.

A message can be malformed at two layers. The carrier finds frames that are no message at all (a pickle that
does not load, an empty or truncated frame, a bad ring or control header, out-of-band frames missing, a routing
id that is not UTF-8, a frame over the size limit); :class:`litz.process.Process` finds messages that do not fit
the receiver's schema (:data:`litz.protocol.SHAPES`), come from a process that is not in the job, or make the
handler fail (:class:`BadMessage`: an executor that is not here, an item of the wrong shape). Either way the
message is dropped and the process goes on serving: a buggy peer, a version mismatch or a bit flip must not take
a job down, and none of it is ever the application's error.

Each drop goes through the endpoint's :class:`MessageGuard`, which prints one line per peer and reason every
``WARN_EVERY_S`` (with how many more it dropped meanwhile), at most ``WARN_LINES`` lines in all in that time, and
asks the process what to do with a peer that sent more than ``CUT_OFF_AFTER`` within ``WINDOW_S``: cut off, its
messages are dropped unread for ``CUT_OFF_S``. A process that dropped any says how many as it exits.
"""
from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

from . import clock

WARN_EVERY_S = 10.0  # one line per peer and reason this often; the ones in between are counted
# ...and this many lines in all within that time: a sender that changes its id at every message must not flood
# the log (nor stall the process on a stderr pipe nobody reads)
WARN_LINES = 20
CUT_OFF_AFTER, WINDOW_S = 100, 10.0  # more malformed messages than this from one peer within the window...
CUT_OFF_S = 60.0  # ...and it is not heard for this long (then heard again, and cut off again if it goes on)
_MAX_PEERS = 1024  # peers remembered for warnings and windows; beyond, the stale ones are forgotten


class BadMessage(Exception):
    """A message that cannot be taken: a handler raises it for a message that fits its schema but not the
    receiver's state (an executor that is not here), a carrier for frames that are no message. Never an
    application error. ``reason``: short and stable (warnings are counted per reason); ``detail``: what differs
    from one message to the next."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


def shown(peer: str, limit: int = 64) -> str:
    """A peer id fit for one log line: ids come off the wire, and may hold anything."""
    text = peer if peer.isprintable() else repr(peer)
    return text if len(text) <= limit else text[:limit] + "..."


def describe(exc: BaseException) -> str:
    """``exc`` in one short line, with where it was raised (a handler's failure may also be a bug in Litz: the
    line says where to look)."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
    text = f"{type(exc).__name__}: {exc}"
    return (text if len(text) <= 200 else text[:200] + "...") + where


class MessageGuard:
    """Drops of one endpoint's malformed messages: rate-limited warnings, and which peers are cut off.

    ``on_offender(peer)``: called when a peer passes the limit; True cuts it off (the carrier's default), False
    keeps hearing it (a worker never stops hearing its master); a process may also act on it (the master treats
    a member that floods it as lost)."""

    def __init__(self, ident: str, on_offender: Callable[[str], bool]):
        self.ident = ident
        self.on_offender = on_offender
        self.dropped = 0  # every malformed message, also those of cut-off peers
        self.unshown = 0  # drops not warned of because of WARN_LINES
        self.last = ""  # the latest warning, for whoever counts drops (the simulator)
        self._lines = [-WARN_EVERY_S, 0]  # [start of the current WARN_EVERY_S, warning lines printed in it]
        self._warned: dict[tuple[str, str], list] = {}  # (peer, reason) -> [last warning's time, dropped since]
        self._window: dict[str, list] = {}  # peer -> [window start, drops in it]
        self._cut: dict[str, float] = {}  # peer -> until when everything it sends is dropped unread

    def is_cut(self, peer: str) -> bool:
        """Whether ``peer``'s messages are dropped unread now (counted, not reported)."""
        if not self._cut:
            return False
        until = self._cut.get(peer)
        if until is None:
            return False
        if clock.monotonic() < until:
            self.dropped += 1
            return True
        del self._cut[peer]
        return False

    def refuse(self, peer: str, reason: str, detail: str = "") -> None:
        """Drop one message from ``peer``. ``reason`` is short and stable (warnings are counted per reason);
        ``detail`` is shown with it but may differ every time (an exception's text)."""
        self.dropped += 1
        now = clock.monotonic()
        if len(self._warned) > _MAX_PEERS or len(self._window) > _MAX_PEERS:
            self._forget_stale(now)
        warned = self._warned.get((peer, reason))
        if warned is not None and now - warned[0] < WARN_EVERY_S:
            warned[1] += 1
        elif self._room(now):
            more = f" ({warned[1]} more like it since the last warning)" if warned and warned[1] else ""
            self._say(f"dropped a malformed message from {shown(peer)}: {reason}"
                      f"{': ' + detail if detail else ''}{more}")
            self._warned[(peer, reason)] = [now, 0]
        else:
            self.unshown += 1
        window = self._window.get(peer)
        if window is None or now - window[0] > WINDOW_S:
            window = self._window[peer] = [now, 0]
        window[1] += 1
        if window[1] == CUT_OFF_AFTER + 1 and self.on_offender(peer):
            self._cut[peer] = now + CUT_OFF_S
            self._say(f"cut off {shown(peer)} for {CUT_OFF_S:.0f} s: more than {CUT_OFF_AFTER} malformed messages "
                      f"within {WINDOW_S:.0f} s")

    def _room(self, now: float) -> bool:
        """Whether one more warning line fits in this WARN_EVERY_S (the first that does not says so)."""
        lines = self._lines
        if now - lines[0] >= WARN_EVERY_S:
            lines[0], lines[1] = now, 0
        lines[1] += 1
        if lines[1] == WARN_LINES + 1:
            self._say(f"more than {WARN_LINES} warnings within {WARN_EVERY_S:.0f} s: the rest of them are only "
                      "counted")
        return lines[1] <= WARN_LINES

    def summary(self) -> None:
        """As the process exits: how many malformed messages it dropped in all, if any."""
        if self.dropped:
            unshown = f", {self.unshown:,} of them not shown" if self.unshown else ""
            self._say(f"dropped {self.dropped:,} malformed message(s) in all{unshown}")

    def _say(self, text: str) -> None:
        self.last = text
        sys.stderr.write(f"litz: {self.ident}: {text}\n")
        sys.stderr.flush()

    def _forget_stale(self, now: float) -> None:
        """A sender that changes its id at every message must not grow these without bound."""
        self._warned = {k: v for k, v in self._warned.items() if now - v[0] < WARN_EVERY_S}
        self._window = {k: v for k, v in self._window.items() if now - v[0] <= WINDOW_S}
        if len(self._warned) > _MAX_PEERS or len(self._window) > _MAX_PEERS:  # all fresh: start over
            self._warned, self._window = {}, {}
