-- lease_deliveries(KEYS=[the project's outbox]; ARGV=[prefix, now, lease_ms, limit])
--   -> {the outbox's earliest due time after the lease or -1 when empty,
--       {delivery id, {delivery field, value, ...}, {subscription field, value, ...}}, ...}
-- Takes up to `limit` due deliveries of one project, oldest due first, each until now + lease_ms: in one
-- script, so two notifiers never hold one at once while its lease runs, and a notifier that dies holding one
-- leaves it due again when the lease ends (at least once). A delivery whose subscription is gone, expired,
-- or (for a notification) no longer confirmed is deleted instead.
local outbox, prefix, now = KEYS[1], ARGV[1], tonumber(ARGV[2])
local lease, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {-1}
for _, did in ipairs(redis.call('ZRANGEBYSCORE', outbox, '-inf', now, 'LIMIT', 0, limit)) do
  local dk = delivery_key(prefix, did)
  local d = redis.call('HMGET', dk, '_k', '_s', '_q')
  local live = false
  if d[1] then
    local sk = subscription_key(prefix, d[2])
    local s = redis.call('HMGET', sk, 'q', 'e', 'c')
    live = s[1] == d[3] and tonumber(s[2]) > now and (d[1] ~= 'notification' or s[3] == '1')
    if live then
      redis.call('ZADD', outbox, now + lease, did)
      table.insert(out, {did, redis.call('HGETALL', dk), redis.call('HGETALL', sk)})
    end
  end
  if not live then
    redis.call('DEL', dk)
    redis.call('ZREM', outbox, did)
  end
end
local first = redis.call('ZRANGE', outbox, 0, 0, 'WITHSCORES')
if #first == 2 then out[1] = first[2] end
return out
