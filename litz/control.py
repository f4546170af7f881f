"""litzctl's requests are signed with the job secret: access to the registry alone does not steer a job.

A request in the registry (stop, kill, scale, drain, checkpoint, memory-limit, plot) carries an HMAC-SHA256 over
a canonical encoding of (job name, the master it is addressed to, request id, command, arguments, timestamp,
nonce), keyed by a key derived from the job secret for this purpose alone (the raw secret also derives the
job's CURVE keys). The master (:class:`RequestVerifier`) checks the MAC in constant time, then that the
timestamp is within :data:`MAX_AGE_S` of its clock, then that the nonce is new: a request copied from the
registry and posted again, or kept and posted later, is refused. Binding the master's instance refuses a
request captured under an earlier master of the same job (``--resume``) whose nonces the new one never saw.
Reading the status document needs no signature: it is in the registry for whoever can read that.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any

from . import clock

MAX_AGE_S = 300.0  # a request signed longer ago than this (or this far ahead: clocks differ) is refused
_PURPOSE = b"litz-control-v1"
_RID = re.compile(r"[0-9A-Za-z_-]{1,64}")  # request ids: a response key the master writes must be one of its own


def control_key(secret: str) -> bytes:
    """The key requests are signed with, derived from the job secret and this purpose only."""
    return hmac.new(secret.encode(), _PURPOSE, hashlib.sha256).digest()


def _signed_bytes(job: str, master: str, rid: str, command: str, args: dict, t: float, nonce: str) -> bytes:
    """The canonical encoding the MAC covers: JSON with sorted keys and no spaces; NaN and infinities refused,
    so one request has one encoding on both sides (the registry stores JSON)."""
    return json.dumps([_PURPOSE.decode(), job, master, rid, command, args, t, nonce], sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def sign_request(secret: str, job: str, master: str, rid: str, command: str, args: dict,
                 t: float | None = None, nonce: str | None = None) -> dict:
    """The registry value of a request, signed. ``master``: the instance of the job's master it is for (its
    registry entry's ``instance``); ``t`` and ``nonce`` default to now and 16 random bytes."""
    t = clock.time() if t is None else t
    nonce = os.urandom(16).hex() if nonce is None else nonce
    mac = hmac.new(control_key(secret), _signed_bytes(job, master, rid, command, args, t, nonce),
                   hashlib.sha256).hexdigest()
    return {"command": command, "args": args, "t": t, "nonce": nonce, "master": master, "sig": mac}


@dataclass
class Refusal:
    """Why a request was not carried out. ``forged``: not signed with the job's key (or malformed), so its
    sender learns nothing but that; otherwise signed but stale, replayed or for another master. ``answer``:
    the response to write, or None to write none (a replay: its request id was answered already)."""

    reason: str
    forged: bool
    answer: str | None


NOT_SIGNED = ("refused: the request is not signed with this job's secret (litzctl needs the job's --secret-file "
              "or LITZ_SECRET)")


class RequestVerifier:
    """The master's side: authentic, fresh, first-seen requests only."""

    def __init__(self, secret: str, job: str, master: str, max_age: float = MAX_AGE_S):
        self._key = control_key(secret)
        self.job, self.master, self.max_age = job, master, max_age
        self._seen: dict[str, float] = {}  # nonce -> when it can be forgotten (its timestamp is stale by then)

    def check(self, rid: str, doc: Any) -> Refusal | None:
        """None if the request at ``requests/<rid>`` may be carried out, else why not."""
        if not _RID.fullmatch(rid):
            return Refusal("malformed request id", True, None)  # no response key made of a stranger's text
        if not isinstance(doc, dict) or "sig" not in doc:
            return Refusal("not signed", True, NOT_SIGNED)
        command, args, t, nonce, master, sig = (doc.get(k) for k in ("command", "args", "t", "nonce", "master",
                                                                     "sig"))
        if not (isinstance(command, str) and isinstance(args, dict) and isinstance(nonce, str)
                and isinstance(master, str) and isinstance(sig, str) and len(nonce) <= 128
                and isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)):
            return Refusal("malformed signed fields", True, NOT_SIGNED)
        try:
            expected = hmac.new(self._key, _signed_bytes(self.job, master, rid, command, args, t, nonce),
                                hashlib.sha256).hexdigest()
        except (TypeError, ValueError):  # arguments JSON cannot encode canonically (NaN)
            return Refusal("malformed arguments", True, NOT_SIGNED)
        if not hmac.compare_digest(expected.encode(), sig.encode("utf-8", "replace")):
            return Refusal("bad signature: not the job secret's", True, NOT_SIGNED)
        # signed with the job's key from here on: its sender may learn exactly what is wrong
        now = clock.time()
        for old in [n for n, until in self._seen.items() if until < now]:
            del self._seen[old]
        if abs(now - t) > self.max_age:
            when = f"{abs(now - t):.0f} s {'before' if t < now else 'ahead of'} the master's clock"
            return Refusal(f"stale: signed {when}", False,
                           f"refused: the request was signed {when}, more than {self.max_age:.0f} s apart (a "
                           "request kept and posted again, or is this machine's clock wrong?)")
        if master != self.master:
            return Refusal("addressed to an earlier master of this job", False,
                           "refused: the request was addressed to an earlier master of this job")
        if nonce in self._seen:
            return Refusal("replayed", False, None)
        self._seen[nonce] = t + self.max_age
        return None
