-- task_release(KEYS=[task key], ARGV=[owner]) -> 1 if `owner` held the task (its lease now ends), else 0.
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'lease', 0)
return 1
