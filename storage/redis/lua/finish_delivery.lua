-- finish_delivery(KEYS=[the project's outbox, the delivery's hash]; ARGV=[delivery id, retry at ms or '',
--                 attempted 1/0]) -> the outbox's earliest due time now, or -1 when empty.
-- '' deletes the delivery (delivered, or given up); a time makes it due again then, one more failed
-- attempt counted when it was attempted. A delivery that is gone stays gone.
local outbox, dk, did, retry_at = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
if retry_at == '' then
  redis.call('DEL', dk)
  redis.call('ZREM', outbox, did)
elseif redis.call('EXISTS', dk) == 1 then
  redis.call('ZADD', outbox, tonumber(retry_at), did)
  redis.call('HINCRBY', dk, '_a', tonumber(ARGV[3]))
else
  redis.call('ZREM', outbox, did)
end
local first = redis.call('ZRANGE', outbox, 0, 0, 'WITHSCORES')
return #first == 2 and first[2] or -1
