-- Drop stale referrers (generation unchanged), then the placement when no referrer is left.
-- KEYS: placements, refs:<member>
-- ARGV: member, prefix of the in:<pool> sets, then referrer, generation pairs
-- Returns 1 when the queue is no longer placed, 0 when live referrers keep its placement.
for i = 3, #ARGV, 2 do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[2], ARGV[i])
  end
end
if redis.call('HLEN', KEYS[2]) > 0 then
  return 0
end
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('SREM', ARGV[2] .. current, ARGV[1])
end
return 1
