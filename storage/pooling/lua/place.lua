-- Place a queue in a pool unless it is placed already; record a referrer (a queue whose DLQ it is).
-- KEYS: pools (HASH name -> pool), placements (HASH member -> pool), in:<pool> (SET of members),
--       refs:<member> (HASH referrer -> generation), generation counter
-- ARGV: member, pool, referrer ('' for none)
-- Returns the pool the queue is placed in now, or false when the pool does not exist.
local current = redis.call('HGET', KEYS[2], ARGV[1])
if not current then
  if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 0 then
    return false
  end
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('SADD', KEYS[3], ARGV[1])
  current = ARGV[2]
end
if ARGV[3] ~= '' and current == ARGV[2] then
  redis.call('HSET', KEYS[4], ARGV[3], redis.call('INCR', KEYS[5]))
end
return current
