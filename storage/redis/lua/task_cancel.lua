-- task_cancel(KEYS=[task key], ARGV=[queue name, now]) -> the task's hash as it is then (HGETALL's reply),
--   or error CHARON_NO_TASK.
-- A running task stops before its next batch; a finished one stays as it ended.
local t = redis.call('HMGET', KEYS[1], 'q', 'status')
if t[1] ~= ARGV[1] then return redis.error_reply('CHARON_NO_TASK No such redrive task on queue ' .. ARGV[1] .. '.') end
if t[2] == 'running' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'up', ARGV[2], 'lease', 0)
  redis.call('PEXPIRE', KEYS[1], TASK_KEEP_MS)
end
return redis.call('HGETALL', KEYS[1])
