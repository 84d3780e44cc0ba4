-- task_lease(KEYS=[task key], ARGV=[owner, now, lease_ms]) -> {1 if `owner` holds the task now else 0, status}
-- A running task is taken when nobody's lease on it is current (its runner died, or none took it yet).
local owner, now, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('HMGET', KEYS[1], 'status', 'owner', 'lease')
if not t[1] then return {0, ''} end
if t[1] ~= 'running' then return {0, t[1]} end
if t[2] ~= owner and tonumber(t[3]) > now then return {0, t[1]} end
redis.call('HSET', KEYS[1], 'owner', owner, 'lease', now + lease_ms)
return {1, t[1]}
