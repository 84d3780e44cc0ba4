-- post_messages(KEYS=queue keys, ARGV=[prefix, name, now, client_id, default_ttl, default_delay, body_size,
--                                     id1, body1, ttl1, delay1, eligible1, id2, ...])
--   ttl/delay -1 = queue default; eligible 0 = not DLQ-eligible (discarded where it would be dead-lettered)
--   -> {project's due time lowered (0/1), number posted}, or error CHARON_TOO_LARGE when body_size
--   exceeds the queue's _max_messages_post_size.
-- Creates the queue lazily; all messages of one post get consecutive markers (FIFO for one client). A ttl
-- above the queue's _max_message_ttl is cut to it.
local prefix, name, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local K = keys_from(KEYS, ARGV[2])
local q = redis.call('HMGET', K.queue, 'maxpost', 'dttl', 'ddelay', 'maxttl')
local maxpost = tonumber(q[1])
if maxpost and tonumber(ARGV[7]) > maxpost then
  return redis.error_reply('CHARON_TOO_LARGE The body is ' .. ARGV[7] ..
    ' bytes; this queue takes at most ' .. maxpost .. ' bytes a post (_max_messages_post_size).')
end
ensure_queue(K, name, now)
local dttl = tonumber(q[2]) or tonumber(ARGV[5])
local ddelay = tonumber(q[3]) or tonumber(ARGV[6])
local maxttl = tonumber(q[4])
local n = 0
for i = 8, #ARGV, 5 do
  local id, ttl, delay = ARGV[i], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  if ttl < 0 then ttl = dttl end
  if maxttl and ttl > maxttl then ttl = maxttl end
  if delay < 0 then delay = ddelay end
  local k = redis.call('HINCRBY', K.queue, 'seq', 1)
  local mk = prefix .. 'm:' .. id
  local av = now + delay * 1000
  redis.call('HSET', mk, 'q', name, 'b', ARGV[i + 1], 't', ttl, 'cr', now, 'k', k, 'cl', ARGV[4],
             'c', '', 'ce', 0, 'cc', 0, 'av', av)
  if ARGV[i + 4] == '0' then redis.call('HSET', mk, 'ne', 1) end
  set_expiry(K, mk, id, now + ttl * 1000, now)
  redis.call('ZADD', K.msgs, k, id)
  if delay > 0 then redis.call('ZADD', K.delayed, av, id) else redis.call('ZADD', K.ready, k, id) end
  n = n + 1
end
return {SWEEP.lowered, n}
