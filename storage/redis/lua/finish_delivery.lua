-- finish_delivery(KEYS=[the project's outbox, the delivery's hash, the project's outbox:owed];
--                 ARGV=[delivery id, retry at ms or '', attempted 1/0, message index, ...])
--   -> the outbox's earliest due time now, or -1 when empty.
-- '' deletes the delivery (delivered, or given up); a time makes it due again then, one more failed
-- attempt counted when it was attempted. A delivery that is gone stays gone.
-- In a post's delivery hash (lib.lua notify_post) each message named by its index is finished on its own
-- (pack_next_due: `_x<i>` marks it done, `_d<i>` is its retry time, `_a<i>` counts its attempts), the hash
-- is due again at the earliest time of the messages it still owes, and deleted when it owes none. A message
-- finished twice (a lease that ran out) is finished once.
local outbox, dk, owed, did, retry_at = KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2]
if redis.call('EXISTS', dk) == 0 then
  redis.call('ZREM', outbox, did)
  return outbox_first_due(outbox)
end
if #ARGV <= 3 then  -- a delivery of one message, or none
  if retry_at == '' then
    redis.call('DEL', dk)
    redis.call('ZREM', outbox, did)
    redis.call('DECR', owed)
    forget_owed_if_empty(outbox, owed)
  else
    redis.call('ZADD', outbox, tonumber(retry_at), did)
    redis.call('HINCRBY', dk, '_a', tonumber(ARGV[3]))
  end
  return outbox_first_due(outbox)
end
local d = pack_state(dk)  -- not its packed messages: a retry of one must not copy them all
local done = 0
for i = 4, #ARGV do
  local x = ARGV[i]
  if not d['_x' .. x] then
    if retry_at == '' then
      redis.call('HSET', dk, '_x' .. x, 1)
      d['_x' .. x] = '1'
      done = done + 1
    else
      redis.call('HSET', dk, '_d' .. x, retry_at)
      d['_d' .. x] = retry_at
      redis.call('HINCRBY', dk, '_a' .. x, tonumber(ARGV[3]))
    end
  end
end
local left = tonumber(d._l)
if done > 0 then
  left = redis.call('HINCRBY', dk, '_l', -done)
  redis.call('DECRBY', owed, done)
end
if left <= 0 then
  redis.call('DEL', dk)
  redis.call('ZREM', outbox, did)
  forget_owed_if_empty(outbox, owed)
else
  redis.call('ZADD', outbox, pack_next_due(d), did)
end
return outbox_first_due(outbox)
