-- task_create(KEYS=queue keys of the DLQ, ARGV=[prefix, name, now, task_id, spec_json, dest, source_queue,
--                                              reason, after_ms, before_ms, limit, owner, lease_ms])
--   ('' = not given)
--   -> the DLQ's last marker, where the task will stop.
-- Records a redrive task (status 'running', held by `owner` for lease_ms) over the DLQ's messages up to its last marker now:
-- messages dead-lettered later are not its business, so it ends however busy the DLQ is.
local prefix, name, now, task_id = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local K = keys_from(KEYS, ARGV[2])
local last = tonumber(redis.call('HGET', K.queue, 'seq') or '0')
local tk = prefix .. 't:' .. task_id
redis.call('HSET', tk, 'q', name, 'status', 'running', 'cr', now, 'up', now, 'end', last, 'cursor', 0,
           'scanned', 0, 'moved', 0, 'skipped', 0, 'spec', ARGV[5], 'dest', ARGV[6], 'fsrc', ARGV[7],
           'frsn', ARGV[8], 'fafter', ARGV[9], 'fbefore', ARGV[10], 'limit', ARGV[11], 'owner', ARGV[12], 'lease', now + tonumber(ARGV[13]))
redis.call('ZADD', prefix .. 'tasks:' .. name, now, task_id)
return last
