-- drop_messages(KEYS=queue keys, ARGV=[queue script args, batch, delete_queue])
--   -> messages left. Deletes up to `batch` messages per call (bounded work per script; the caller loops).
--   With delete_queue=1 the queue itself goes with its last message, and its subscriptions with it.
local prefix, name, now, K = queue_script()
for _, id in ipairs(redis.call('ZRANGE', K.msgs, 0, tonumber(ARGV[7]) - 1)) do
  remove_message(prefix, K, id)
end
local left = redis.call('ZCARD', K.msgs)
if left == 0 then
  -- ids in the other indexes without a msgs entry cannot exist by the invariant; clear them regardless
  redis.call('DEL', K.ready, K.delayed, K.claimed, K.expiry)
  redis.call('ZREM', K.due, name)
  if ARGV[8] == '1' then
    drop_subscriptions(prefix, K, now, true)
    redis.call('DEL', K.queue)
    redis.call('ZREM', K.queues, name)
  end
end
return left
