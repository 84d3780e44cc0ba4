-- task_create(KEYS=queue keys of the DLQ, task, the DLQ's task index; ARGV=[queue script args, task_id,
--             spec_json, dest, source_queue, reason, after_ms, before_ms, limit, owner, lease_ms])
--   ('' = not given)
--   -> the DLQ's last marker, where the task will stop.
-- Records a redrive task (status 'running', held by `owner` for lease_ms) over the DLQ's messages up to its last marker now:
-- messages dead-lettered later are not its business, so it ends however busy the DLQ is.
local _, name, now, K = queue_script()
local task_id = ARGV[7]
local last = tonumber(redis.call('HGET', K.queue, 'seq') or '0')
local tk = KEYS[9]
redis.call('HSET', tk, 'q', name, 'status', 'running', 'cr', now, 'up', now, 'end', last, 'cursor', 0,
           'scanned', 0, 'moved', 0, 'skipped', 0, 'spec', ARGV[8], 'dest', ARGV[9], 'fsrc', ARGV[10],
           'frsn', ARGV[11], 'fafter', ARGV[12], 'fbefore', ARGV[13], 'limit', ARGV[14], 'owner', ARGV[15],
           'lease', now + tonumber(ARGV[16]))
redis.call('ZADD', KEYS[10], now, task_id)
return last
