-- update_subscription(KEYS=queue keys; ARGV=[queue script args, id, subscriber, ttl, options JSON])
--   ('' = unchanged) -> 1. A new ttl counts from now.
-- Errors CHARON_NO_SUBSCRIPTION (no live subscription `id` on the queue), CHARON_SUBSCRIPTION_EXISTS (another
-- live subscription of the queue has that subscriber).
local prefix, name, now, K = queue_script()
local sid, subscriber, ttl, options = ARGV[7], ARGV[8], tonumber(ARGV[9]), ARGV[10]
drop_subscriptions(prefix, K, now, false)
local sk = live_subscription(prefix, K, sid, now)
if not sk then
  return redis.error_reply('CHARON_NO_SUBSCRIPTION Subscription ' .. sid .. ' does not exist on queue ' ..
    name .. '.')
end
local old = redis.call('HGET', sk, 's')
if subscriber ~= '' and subscriber ~= old then
  local other = redis.call('HGET', K.subscribers, subscriber)
  if other and other ~= sid then
    return redis.error_reply('CHARON_SUBSCRIPTION_EXISTS Queue ' .. name .. ' has a subscription with this ' ..
      'subscriber already (' .. other .. '); subscriptions are unique by project, queue and subscriber.')
  end
  redis.call('HDEL', K.subscribers, old)
  redis.call('HSET', K.subscribers, subscriber, sid)
  redis.call('HSET', sk, 's', subscriber)
end
if ttl then
  local e = now + ttl * 1000
  redis.call('HSET', sk, 't', ttl, 'e', e)
  redis.call('ZADD', subscription_expiry_key(prefix), e, sid)
  if redis.call('HGET', sk, 'c') == '1' then redis.call('ZADD', K.notify, e, sid) end
end
if options ~= '' then redis.call('HSET', sk, 'o', options) end
return 1
