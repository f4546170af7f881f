"""Message tags. A message is a tuple whose first element is one of these."""

HELLO = "hello"        # worker/server -> master: (HELLO, role, info: address, a worker's app_tokens)
APP = "app"            # master -> worker: (APP, executor_blob | None: HELLO named the token, token, config, executors)
SHARDS = "shards"      # master -> worker/server: (SHARDS, num_shards, owners, map_version)
CREATE = "create"      # master -> worker: (CREATE, [eid, ...])
READY = "ready"        # worker -> master: (READY, [eid, ...])
TASKS = "tasks"        # master -> worker: (TASKS, [(task_id, eid, version, args), ...])
DONE = "done"          # worker -> master: (DONE, [(task_id, result), ...])
FAIL = "fail"          # any -> master: (FAIL, where, traceback_text)
GETS = "gets"          # worker -> server: (GETS, [(request_id, shard, key), ...])
VALUES = "values"      # server -> worker: (VALUES, [(request_id, value), ...][, True: answered after forwarding])
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
MEMORY_EVENT = "memory_event"  # worker -> master: (MEMORY_EVENT, kind "evict"|"load", eid, bytes, seconds)
