-- subscribe(KEYS=queue keys, the new subscription's hash; ARGV=[queue script args, id, subscriber, ttl,
--           options JSON, confirmed 1/0, max per queue])
--   -> {lib.lua marks(), 1 created / 0 existing, id, field, value, ...}: the subscription as it now is.
-- Subscriptions are unique by queue and subscriber: a live one of the same subscriber is answered as it is
-- (and owed its confirmation request again while unconfirmed). A new unconfirmed one is owed its request
-- in this script. Creates the queue lazily (error CHARON_QUOTA past the project's `queues` quota). Error
-- CHARON_TOO_MANY when the queue has `max` live ones, CHARON_QUOTA when the project has its `subscriptions`.
local prefix, name, now, K = queue_script()
local sk, sid, subscriber, ttl = KEYS[9], ARGV[7], ARGV[8], tonumber(ARGV[9])
local options, confirmed, max = ARGV[10], ARGV[11], tonumber(ARGV[12])
drop_subscriptions(prefix, K, now, false)
local existing = redis.call('HGET', K.subscribers, subscriber)
if existing then
  local ek = subscription_key(prefix, existing)
  if redis.call('HGET', ek, 'c') == '0' then owe(prefix, existing, 'confirmation', name, now) end
  return {marks(), 0, existing, unpack(redis.call('HGETALL', ek))}
end
if redis.call('ZCARD', K.subs) >= max then
  return redis.error_reply('CHARON_TOO_MANY Queue ' .. name .. ' has ' .. max .. ' subscriptions, the most a ' ..
    'queue may have (CHARON_LIMITS__MAX_SUBSCRIPTIONS_PER_QUEUE); delete one first.')
end
local refused = queue_refused(prefix, K, name)
if refused then return refused end
local limit = counted_quota(prefix, 'subscriptions')
if limit then
  local n = redis.call('ZCOUNT', subscription_expiry_key(prefix), '(' .. now, '+inf')
  if n >= limit then return over_quota('subscriptions', n, 1, limit, 'This project') end
end
ensure_queue(K, name, now)
local e = now + ttl * 1000
redis.call('ZADD', subscription_expiry_key(prefix), e, sid)
redis.call('HSET', sk, 'q', name, 's', subscriber, 't', ttl, 'o', options, 'cr', now, 'e', e, 'c', confirmed)
redis.call('ZADD', K.subs, 0, sid)
redis.call('HSET', K.subscribers, subscriber, sid)
if confirmed == '1' then
  redis.call('ZADD', K.notify, e, sid)
else
  owe(prefix, sid, 'confirmation', name, now)
end
return {marks(), 1, sid, unpack(redis.call('HGETALL', sk))}
