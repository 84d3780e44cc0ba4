-- Remove a pool unless a queue is placed in it.
-- KEYS: pools, in:<pool>    ARGV: pool name, how many members to show
-- Returns {0} when removed, else {count, member, ...}.
local count = redis.call('SCARD', KEYS[2])
if count > 0 then
  local shown = redis.call('SRANDMEMBER', KEYS[2], tonumber(ARGV[2]))
  table.insert(shown, 1, count)
  return shown
end
redis.call('HDEL', KEYS[1], ARGV[1])
return {0}
