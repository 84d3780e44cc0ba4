-- finish_delivery(KEYS=[the project's outbox, the delivery's hash, the project's outbox:owed];
--                 ARGV=[delivery id, retry at ms or '', attempted 1/0, message index, ...])
--   -> the outbox's earliest due time now, or -1 when empty.
-- '' deletes the delivery (delivered, or given up); a time makes it due again then, one more failed
-- attempt counted when it was attempted. A delivery that is gone stays gone.
-- A post's notifications to one subscription (lib.lua notify_post) are finished a message at a time, by
-- their indexes (1-based, in `_p`): a delivered one is marked `_x<i>` (the lease leaves it out), a retried
-- one counts its attempts in `_a<i>`, and `_r` keeps the earliest retry time asked. The hash stays due when
-- its lease ends until every message the lease took (`_f`) is finished; then it is due at `_r`, or deleted
-- when no message is owed any more (`_l`).
local outbox, dk, owed, did, retry_at = KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2]
local function first_due()
  local first = redis.call('ZRANGE', outbox, 0, 0, 'WITHSCORES')
  return #first == 2 and first[2] or -1
end
if redis.call('EXISTS', dk) == 0 then
  redis.call('ZREM', outbox, did)
  return first_due()
end
if #ARGV <= 3 then  -- a delivery of one message, or none
  if retry_at == '' then
    redis.call('DEL', dk)
    redis.call('ZREM', outbox, did)
    redis.call('DECR', owed)
  else
    redis.call('ZADD', outbox, tonumber(retry_at), did)
    redis.call('HINCRBY', dk, '_a', tonumber(ARGV[3]))
  end
  return first_due()
end
local finished = 0
for i = 4, #ARGV do
  if redis.call('HEXISTS', dk, '_x' .. ARGV[i]) == 0 then  -- finished twice (a lease ran out): once
    finished = finished + 1
    if retry_at == '' then
      redis.call('HSET', dk, '_x' .. ARGV[i], 1)
    else
      redis.call('HINCRBY', dk, '_a' .. ARGV[i], tonumber(ARGV[3]))
      local r = tonumber(redis.call('HGET', dk, '_r'))
      if r == nil or tonumber(retry_at) < r then redis.call('HSET', dk, '_r', retry_at) end
    end
  end
end
if finished == 0 then return first_due() end
local left
if retry_at == '' then
  left = redis.call('HINCRBY', dk, '_l', -finished)
  redis.call('DECRBY', owed, finished)
else
  left = tonumber(redis.call('HGET', dk, '_l'))
end
local flying = redis.call('HINCRBY', dk, '_f', -finished)
if left <= 0 then
  redis.call('DEL', dk)
  redis.call('ZREM', outbox, did)
elseif flying <= 0 then
  local r = redis.call('HGET', dk, '_r')
  if r then
    redis.call('ZADD', outbox, tonumber(r), did)
    redis.call('HDEL', dk, '_r')
  end
end
return first_due()
