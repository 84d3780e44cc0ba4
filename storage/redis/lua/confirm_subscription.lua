-- confirm_subscription(KEYS=queue keys; ARGV=[queue script args, id, confirmed 1/0]) -> {lib.lua marks()}
-- Confirmed, the subscription is told of every message from now on; unconfirmed (unsubscribing), it is told
-- nothing more but a delivery of kind 'unsubscribed' (how to subscribe again), owed in this script.
-- Error CHARON_NO_SUBSCRIPTION.
local prefix, name, now, K = queue_script()
local sid, confirmed = ARGV[7], ARGV[8]
local sk = live_subscription(prefix, K, sid, now)
if not sk then
  return redis.error_reply('CHARON_NO_SUBSCRIPTION Subscription ' .. sid .. ' does not exist on queue ' ..
    name .. '.')
end
redis.call('HSET', sk, 'c', confirmed)
if confirmed == '1' then
  redis.call('ZADD', K.notify, redis.call('HGET', sk, 'e'), sid)
else
  redis.call('ZREM', K.notify, sid)
  owe(prefix, sid, 'unsubscribed', name, now)
end
return {marks()}
