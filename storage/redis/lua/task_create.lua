-- task_create(KEYS=queue keys of the DLQ, task, the DLQ's task index; ARGV=[queue script args, task_id,
--             spec_json, dest, source_queue, reason, after_ms, before_ms, limit, n_ids, owner, lease_ms,
--             signature])
--   ('' = not given)
--   -> where the task will stop: the DLQ's last marker, or the number of ids a task of listed ids looks up.
-- Records a redrive task (status 'running', held by `owner` for lease_ms) over the DLQ's messages up to its last marker now:
-- messages dead-lettered later are not its business, so it ends however busy the DLQ is. A task of listed
-- message ids (n_ids given; the ids are in spec_json) looks each one up instead, its cursor counting ids.
-- A task with a signature filter moves only the messages its driver read and found of that signature
-- (redrive_step's `only`): Lua cannot compute one. Its 'end' is 0 too, its last marker in 'sigend', so that
-- a process of an earlier version, which knows no signature, moves nothing of it.
local _, name, now, K = queue_script()
local task_id = ARGV[7]
-- a task of listed ids has 'end' 0 (a process of an earlier version, walking markers up to 'end', moves
-- nothing of it) and its number of ids in 'fids'
local n_ids = tonumber(ARGV[15])
local last = n_ids and 0 or tonumber(redis.call('HGET', K.queue, 'seq') or '0')
local signed = ARGV[18] ~= '' and not n_ids
local tk = KEYS[9]
redis.call('HSET', tk, 'q', name, 'status', 'running', 'cr', now, 'up', now, 'end', signed and 0 or last,
           'sigend', signed and last or '', 'cursor', 0,
           'scanned', 0, 'moved', 0, 'skipped', 0, 'spec', ARGV[8], 'dest', ARGV[9], 'fsrc', ARGV[10],
           'frsn', ARGV[11], 'fafter', ARGV[12], 'fbefore', ARGV[13], 'limit', ARGV[14], 'fids', ARGV[15],
           'owner', ARGV[16], 'lease', now + tonumber(ARGV[17]), 'fsig', ARGV[18])
redis.call('ZADD', KEYS[10], now, task_id)
return n_ids or last
