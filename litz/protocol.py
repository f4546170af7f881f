"""Message tags, and the shape of every message each role takes. A message is a tuple whose first element is
one of these tags; it travels in an envelope ``(epoch, message)`` (:class:`litz.process.Process`).

Every receive path checks a message against :data:`SHAPES` before it is handled (:func:`check`): the fields'
count and types, and which tags only the master may send. Items inside a batch (the tasks of TASKS, the results
of DONE) are not checked one by one here, which would cost per key: a handler that finds one wrong raises, and
the message is dropped as malformed (:mod:`litz.guard`). Change a message's layout here, in the comment and the
shape, and bump :data:`VERSION`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

# The messages' version. A worker or server says it first in its HELLO; the master refuses one of another version
# with REFUSED. HELLO's version field and REFUSED keep their place and layout in every version, so that any two
# versions understand the refusal.
# 2: the executor class travels with the app's search paths; DONE carries the worker's timing; the master reads
# parameters for the driver.
# 3: TASKS from the master carry the count of the worker's DONEs it handled and the tasks sent ahead (after=);
# DONE's timing also carries each executor's running time; PREFETCH (master -> worker).
# 4: TASKS may carry hand-offs to make and completions relayed; HANDOFF (worker -> worker) (after= across workers).
VERSION = 4

HELLO = "hello"        # worker/server -> master: (HELLO, VERSION, role, info: address, a worker's app_tokens)
REFUSED = "refused"    # master -> worker/server: (REFUSED, why) its HELLO was refused; it exits with that line
APP = "app"            # master -> worker: (APP, executor_blob | None: HELLO named the token, token, config, executors)
SHARDS = "shards"      # master -> worker/server: (SHARDS, num_shards, owners, map_version)
CREATE = "create"      # master -> worker: (CREATE, [eid, ...])
READY = "ready"        # worker -> master: (READY, [eid, ...])
TASKS = "tasks"        # master -> worker: (TASKS, [(task_id, eid, version, args), ...], written keys or None
                       #   [, DONEs of this worker handled, [(task_id, eid, version, args, closure), ...] sent ahead
                       #   [, [(task_id, worker), ...] hand these off to those workers once reported done,
                       #   [(task_id, written keys or None), ...] completed, which tasks sent ahead here wait for]])
HANDOFF = "handoff"    # worker -> worker: (HANDOFF, [(task_id, written keys or None), ...]) reported done here, and
                       #   the master said a task sent ahead to the receiver waits for it (docs/design.md, A9)
DONE = "done"          # worker -> master: (DONE, [(task_id, result), ...], written keys,
                       #   (tasks, wall s, cpu s, {eid: (tasks, ran s, cpu s)}))
HELD_BACK = "held_back"  # worker -> master: (HELD_BACK, [task_id, ...]) sent ahead, back: their executor moves
FAIL = "fail"          # any -> master: (FAIL, where, traceback_text)
GETS = "gets"          # worker or master -> server: (GETS, [(request_id, shard, key), ...])
VALUES = "values"      # server -> worker/master: (VALUES, [(request_id, value), ...][, True: after forwarding])
UPDATES = "updates"    # worker -> server: (UPDATES, flush_id, [(shard, key, delta), ...])
ACK = "ack"            # server -> worker: (ACK, flush_id, items_applied, [error, ...][, True: forwarded items])
STOP = "stop"          # master -> worker/server: (STOP,)
STATS = "stats"        # worker/server -> master: (STATS, {rss, ...}) about once a second
PEER = "peer"          # master -> worker/server: (PEER, ident, address) a new process joined under a known id

# elasticity
MOVE_EXECUTOR = "move_executor"  # master -> source worker: (MOVE_EXECUTOR, eid, dest, with_input, copied)
EXECUTOR = "executor"            # source -> dest worker: (EXECUTOR, eid, state, buffered_tasks, with_input, copied)
COPY_INPUT = "copy_input"        # master -> source worker: (COPY_INPUT, eid, dest) scale-out: send the input ahead
INPUT = "input"                  # source -> dest worker: (INPUT, eid, {attr: value}) while eid keeps running
INPUT_READY = "input_ready"      # dest worker -> master: (INPUT_READY, eid) now move eid itself (copied=True)
DROP_INPUT = "drop_input"        # master -> dest worker: (DROP_INPUT, eid) the move was called off
MOVED = "moved"                  # dest worker -> master: (MOVED, eid, bytes)
MOVE_SHARD = "move_shard"        # master -> source server: (MOVE_SHARD, shard, dest)
SHARD_DATA = "shard_data"        # source -> dest server: (SHARD_DATA, shard, table)
SHARD_MOVED = "shard_moved"      # dest server -> master: (SHARD_MOVED, shard, bytes)
FWD_GETS = "fwd_gets"            # server -> server: (FWD_GETS, origin_worker, [(request_id, shard, key), ...])
FWD_UPDATES = "fwd_updates"      # server -> server: (FWD_UPDATES, origin_worker, flush_id, [(shard, key, delta)])
FENCE = "fence"                  # worker -> server that lost all its shards: (FENCE, map_version); server: -1
RETIRE = "retire"                # master -> worker/server: (RETIRE, [ids whose fences to await][, server: last map
                                 #   version that gave it a shard: a worker's fence counts only from a later map])
RETIRED = "retired"              # worker -> master: (RETIRED,) just before it exits; server: (RETIRED, [fenced])
UNFORWARD = "unforward"          # master -> server: (UNFORWARD, retiring_server, shard_owners) redirect, then fence

# checkpoints and recovery
CHECKPOINT = "checkpoint"                # master -> worker/server: (CHECKPOINT, tmp_dir)
CHECKPOINTED = "checkpointed"            # -> master: (CHECKPOINTED, {part: {bytes, sha256}})
CHECKPOINT_FAILED = "checkpoint_failed"  # -> master: (CHECKPOINT_FAILED, reason)
RESTORE = "restore"                      # master -> server: (RESTORE, path, {shard: meta})
                                         # master -> worker: (RESTORE, path, {eid: meta}, shard_map_message)
RESTORED = "restored"                    # -> master: (RESTORED,)
RESTORE_FAILED = "restore_failed"        # -> master: (RESTORE_FAILED, reason) e.g. a corrupted part
DIE = "die"                              # master -> worker/server: (DIE, signal) fault injection for tests
DRAIN_ME = "drain_me"                    # worker/server -> master: (DRAIN_ME,) it got SIGTERM: move work off it
DRAIN_REFUSED = "drain_refused"          # master -> worker/server: (DRAIN_REFUSED, reason)

# SCAR (thesis ch. 5)
PRIORITY_CHECKPOINT = "priority_checkpoint"  # master -> server: (PRIORITY_CHECKPOINT, root, fraction) measure
PRIORITY_DISTANCES = "priority_distances"    # server -> master: (PRIORITY_DISTANCES, histogram, error)
PRIORITY_SAVE = "priority_save"              # master -> server: (PRIORITY_SAVE, root, count) save your count farthest
PRIORITY_SAVED = "priority_saved"  # server -> master: (PRIORITY_SAVED, values saved, held, keys saved, held, error)
RESTORE_SHARDS = "restore_shards"  # master -> live server: (RESTORE_SHARDS, source, root, {shard: meta}, lost, owners)
SERVERS_LOST = "servers_lost"      # master -> worker: (SERVERS_LOST, lost idents, shard_map_message, live servers)

# out-of-core (thesis §4.8)
MEMORY_LIMIT = "memory_limit"  # master -> worker: (MEMORY_LIMIT, bytes or None)
MEMORY_EVENT = "memory_event"  # worker -> master: (MEMORY_EVENT, kind "evict"|"load"|"prefetch", eid, bytes, s)
PREFETCH = "prefetch"  # master -> worker: (PREFETCH, eid, chosen eid) load eid while chosen's tasks run (O3)


# -- shapes ------------------------------------------------------------------------------------------------------
_INT = (int, np.integer)
_NUM = (int, float, np.integer, np.floating)
_SEQ = (list, tuple)
_STR_OR_NONE = (str, type(None))


def _shape(*fields: Any, optional: int = 0, master: bool = False) -> tuple:
    """A message's shape: (fewest fields, most fields, the fields' types after the tag, only from the master).
    The last ``optional`` fields may be left off."""
    return len(fields) - optional, len(fields), fields, master


_LIFECYCLE = {STOP: _shape(master=True), DRAIN_REFUSED: _shape(str, master=True), DIE: _shape(int, master=True),
              PEER: _shape(str, str, master=True), REFUSED: _shape(str, master=True)}
_TO_BOTH = {CHECKPOINT: _shape(str, master=True), SHARDS: _shape(_INT, _SEQ, _INT, master=True),
            RETIRE: _shape(_SEQ, _INT, optional=1, master=True)}

# receiving role -> tag -> shape
SHAPES: dict[str, dict[str, tuple]] = {
    "master": {
        HELLO: _shape(int, str, dict), READY: _shape(_SEQ),
        DONE: _shape(list, (list, tuple, type(None)), tuple, optional=1),
        FAIL: _shape(str, str), STATS: _shape(dict), MOVED: _shape(_INT, _INT), INPUT_READY: _shape(_INT),
        SHARD_MOVED: _shape(_INT, _INT), RETIRED: _shape(_SEQ, optional=1), DRAIN_ME: _shape(),
        CHECKPOINTED: _shape(dict), CHECKPOINT_FAILED: _shape(str), RESTORED: _shape(), RESTORE_FAILED: _shape(str),
        MEMORY_EVENT: _shape(str, _INT, _INT, _NUM), PRIORITY_DISTANCES: _shape(object, _STR_OR_NONE),
        PRIORITY_SAVED: _shape(_INT, _INT, _INT, _INT, _STR_OR_NONE),
        VALUES: _shape(list, bool, optional=1),  # answers to the driver's parameter reads (GETS from the master)
        HELD_BACK: _shape(list),
    },
    "worker": {
        **_LIFECYCLE, **_TO_BOTH,
        # from the master with its invalidations (and, once the driver used after=, A4's count and the tasks sent
        # ahead), or forwarded by a worker with the tasks alone
        TASKS: _shape(list, (list, type(None)), _INT, list, list, list, optional=5),
        HANDOFF: _shape(list),
        VALUES: _shape(list, bool, optional=1), ACK: _shape(_INT, _INT, list, bool, optional=1),
        APP: _shape((bytes, type(None)), str, dict, _INT, master=True), CREATE: _shape(_SEQ, master=True),
        MOVE_EXECUTOR: _shape(_INT, str, bool, bool, master=True), EXECUTOR: _shape(_INT, object, list, bool, bool),
        COPY_INPUT: _shape(_INT, str, master=True), INPUT: _shape(_INT, dict), DROP_INPUT: _shape(_INT, master=True),
        RESTORE: _shape(str, dict, tuple, master=True), MEMORY_LIMIT: _shape((int, type(None)), master=True),
        PREFETCH: _shape(_INT, _INT, master=True),
        SERVERS_LOST: _shape(_SEQ, tuple, _SEQ, optional=1, master=True),
    },
    "server": {
        **_LIFECYCLE, **_TO_BOTH,
        GETS: _shape(list), UPDATES: _shape(_INT, list), FWD_GETS: _shape(str, list),
        FWD_UPDATES: _shape(str, _INT, list), MOVE_SHARD: _shape(_INT, str, master=True),
        SHARD_DATA: _shape(_INT, dict),
        FENCE: _shape(_INT, str, optional=1),  # a worker's or a server's; the master's names the worker it stands for
        UNFORWARD: _shape(str, _SEQ, master=True), RESTORE: _shape(str, dict, master=True),
        PRIORITY_CHECKPOINT: _shape(str, _NUM, master=True), PRIORITY_SAVE: _shape(str, _INT, master=True),
        RESTORE_SHARDS: _shape(str, str, dict, _SEQ, _SEQ, master=True),
    },
}
_KNOWN = {tag for shapes in SHAPES.values() for tag in shapes}


def check(shapes: dict[str, tuple], sender: str, msg: Any) -> tuple[str, str] | None:
    """Why ``msg`` from ``sender`` does not fit ``shapes`` (one role's :data:`SHAPES`), as (reason, detail), or
    None: it may be handled. A few comparisons per message: no item of a batch is looked at."""
    if type(msg) is not tuple or not msg or type(msg[0]) is not str:
        return "not a tuple that starts with a tag", type(msg).__name__
    tag = msg[0]
    shape = shapes.get(tag)
    if shape is None:
        return ("unexpected tag" if tag in _KNOWN else "unknown tag"), repr(tag[:40])
    fewest, most, fields, master = shape
    if not fewest <= len(msg) - 1 <= most:
        return f"{tag} with the wrong number of fields", f"{len(msg) - 1}"
    if master and sender != "master":
        return f"{tag} not from the master", ""
    if not all(map(isinstance, msg[1:], fields)):
        i = next(i for i, t in enumerate(fields, 1) if not isinstance(msg[i], t))
        return f"{tag} with a field of the wrong type", f"field {i} is a {type(msg[i]).__name__}"
    return None
