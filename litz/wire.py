"""Message encoding: pickle protocol 5 with numpy buffers carried out-of-band as separate frames.

A message is ``[header, buf0, buf1, ...]``: the header is the pickle stream, each large contiguous buffer
(numpy array data) travels as its own ZeroMQ frame, so neither side copies array payloads.
"""
from __future__ import annotations

import pickle
from typing import Any

from .guard import BadMessage

# Buffers smaller than this are pickled in-band: a separate frame costs more than copying a few bytes.
OUT_OF_BAND_MIN_BYTES = 1024


def encode(obj: Any, pickler: Any = pickle) -> list:
    """Frames for ``obj``: the pickle header first, then out-of-band buffers.

    ``pickler=cloudpickle`` for app objects (executor state): classes defined by value travel with them."""
    frames: list = [None]

    def keep_out_of_band(buf: pickle.PickleBuffer) -> bool:
        raw = buf.raw()
        if raw.nbytes < OUT_OF_BAND_MIN_BYTES:
            return True  # pickle in-band
        frames.append(raw)
        return False

    frames[0] = pickler.dumps(obj, protocol=5, buffer_callback=keep_out_of_band)
    return frames


def decode(frames: list) -> Any:
    """Inverse of :func:`encode`; arrays reference the received frames (zero-copy). Frames that are no message
    (garbage, empty, truncated, out-of-band frames missing) raise :class:`BadMessage`, whatever pickle raised."""
    if not frames:
        raise BadMessage("no frames")
    head = frames[0]
    head = head.buffer if hasattr(head, "buffer") else head
    bufs = [f.buffer if hasattr(f, "buffer") else f for f in frames[1:]]
    try:
        return pickle.loads(head, buffers=bufs)
    except Exception as exc:  # a bad stream can raise nearly anything: EOFError, struct.error, AttributeError...
        raise BadMessage("not a pickled message", f"{type(exc).__name__}: {str(exc)[:120]}") from None


def size_of(obj: Any) -> int:
    """Bytes ``obj`` takes on the wire (pickle stream plus out-of-band buffers), without copying them."""
    sizes = [0]

    def count(buf: pickle.PickleBuffer) -> bool:
        sizes[0] += buf.raw().nbytes
        return False

    import cloudpickle  # app objects arrive by value (cloudpickle); plain pickle cannot name their classes

    return len(cloudpickle.dumps(obj, protocol=5, buffer_callback=count)) + sizes[0]
