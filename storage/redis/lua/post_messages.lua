-- post_messages(KEYS=queue keys [, idempotency record], message1, message2, ...; ARGV=[queue script args,
--               client_id, default_ttl, default_delay, body_size, sealed, packed [, fingerprint, window_ms]])
--   packed: id1 US ttl1 US delay1 US eligible1 US body1 US id2 ... (US = "\31", which JSON text never holds
--   unescaped): one argument instead of five a message, since each argument costs the client a conversion.
--   ttl/delay -1 = queue default; eligible 0 = not DLQ-eligible (discarded where it would be dead-lettered)
--   -> {lib.lua marks(), number posted}; every live confirmed subscription of the queue is owed a
--   notification of each message (lib.lua notify_post), in this script; or error CHARON_TOO_LARGE when body_size
--   exceeds the queue's _max_messages_post_size; or error CHARON_SEAL when the queue encrypts its messages
--   (_enable_encrypt_messages, policy field enc) and `sealed` is 0: the bodies are clear, and the driver seals
--   them (core/sealing.py) and posts again; or error CHARON_QUOTA when the queue is new and the project holds
--   its `queues` quota, or the messages would take the queue past its `messages_per_queue` or the project
--   past its `message_bytes` (lib.lua counted quotas). Nothing is stored then.
--   With an Idempotency-Key's record key (KEYS[9]; the fingerprint given): a record there of the same fingerprint means the post
--   was made already: nothing is stored and the answer is {0, -1, "id1,id2,..."} (its ids); a record of
--   another fingerprint is error CHARON_IDEMPOTENCY; else the post is made and the record written with it,
--   in force until now + window_ms.
-- Creates the queue lazily; all messages of one post get consecutive markers (FIFO for one client). A ttl
-- above the queue's _max_message_ttl is cut to it.
local prefix, name, now, K = queue_script()
local fingerprint, window_ms = ARGV[13], tonumber(ARGV[14])
local idem, first_key = nil, 9
if fingerprint then idem, first_key = KEYS[9], 10 end
if idem then
  local rec = redis.call('HMGET', idem, 'fp', 'ids', 'until')
  if rec[1] and tonumber(rec[3]) > now then
    if rec[1] ~= fingerprint then
      return redis.error_reply('CHARON_IDEMPOTENCY This Idempotency-Key was used for a post of other ' ..
        'messages on this queue; use a new key for a new post.')
    end
    return {0, -1, rec[2]}
  end
end
local q = redis.call('HMGET', K.queue, 'maxpost', 'dttl', 'ddelay', 'maxttl', 'enc')
local maxpost = tonumber(q[1])
if maxpost and tonumber(ARGV[10]) > maxpost then
  return redis.error_reply('CHARON_TOO_LARGE The body is ' .. ARGV[10] ..
    ' bytes; this queue takes at most ' .. maxpost .. ' bytes a post (_max_messages_post_size).')
end
if q[5] == '1' and ARGV[11] == '0' then
  return redis.error_reply('CHARON_SEAL This queue encrypts its messages; seal them.')
end
local dttl = tonumber(q[2]) or tonumber(ARGV[8])
local ddelay = tonumber(q[3]) or tonumber(ARGV[9])
local maxttl = tonumber(q[4])
local packed, pos = ARGV[12], 1
local function field()
  local stop = string.find(packed, '\31', pos, true) or (#packed + 1)
  local value = string.sub(packed, pos, stop - 1)
  pos = stop + 1
  return value
end
local posted = {}
while pos <= #packed do
  table.insert(posted, {field(), tonumber(field()), tonumber(field()), field(), field()})
end
local n = #posted
local refused = queue_refused(prefix, K, name)
if refused then return refused end
local room, limit, held = message_room(prefix, K, now)
if room and n > room then
  return over_quota('messages_per_queue', held, n, limit, "Queue '" .. name .. "'")
end
local bytes = 0
for _, m in ipairs(posted) do bytes = bytes + #m[5] end
refused = bytes_refused(prefix, K, bytes, now)
if refused then return refused end
ensure_queue(K, name, now)
if n == 0 then return {marks(), 0} end
-- One call per message (its hash and that hash's expiry); the sets are written once for the whole post.
local last = redis.call('HINCRBY', K.queue, 'seq', n)
local msgs, ready, delayed, expiry, sizes = {}, {}, {}, {}, {}
local earliest
local subs = subscribers(K, now)
local owed = {}  -- id, ttl, eligible, body of each message, when the queue has subscribers (notify_post)
for i, m in ipairs(posted) do
  local id, ttl, delay, eligible, body = m[1], m[2], m[3], m[4], m[5]
  if ttl < 0 then ttl = dttl end
  if maxttl and ttl > maxttl then ttl = maxttl end
  if delay < 0 then delay = ddelay end
  local k = last - n + i
  local mk = KEYS[first_key + i - 1]
  local av = now + delay * 1000
  local e = now + ttl * 1000
  redis.call('HSET', mk, 'q', name, 'b', body, 't', ttl, 'cr', now, 'k', k, 'cl', ARGV[7],
             'c', '', 'ce', 0, 'cc', 0, 'av', av, 'e', e)
  if eligible == '0' then redis.call('HSET', mk, 'ne', 1) end
  if #subs > 0 then
    table.insert(owed, id); table.insert(owed, ttl); table.insert(owed, eligible == '0' and '0' or '1')
    table.insert(owed, body)
  end
  redis.call('PEXPIRE', mk, math.max(e - now, 0) + GC_SLACK_MS)  -- as set_expiry()
  if earliest == nil or e < earliest then earliest = e end
  table.insert(expiry, e); table.insert(expiry, id)
  table.insert(sizes, id); table.insert(sizes, #body)
  table.insert(msgs, k); table.insert(msgs, id)
  if delay > 0 then
    table.insert(delayed, av); table.insert(delayed, id)
  else
    table.insert(ready, k); table.insert(ready, id)
  end
end
-- The indexes: one ZADD each, 1,000 pairs a call (lib.lua zadd_all; a post of small messages may hold
-- thousands).
notify_post(prefix, K, subs, owed, now)
zadd_all(K.expiry, expiry)
count_bytes(K, expiry, sizes, bytes)
schedule(K, earliest)
zadd_all(K.msgs, msgs)
zadd_all(K.ready, ready)
zadd_all(K.delayed, delayed)
woke(K.queue, n)
if idem then
  local ids = {}
  for i, m in ipairs(posted) do ids[i] = m[1] end
  redis.call('HSET', idem, 'fp', fingerprint, 'ids', table.concat(ids, ','), 'until', now + window_ms)
  redis.call('PEXPIRE', idem, window_ms)  -- memory only: `until` (the clock's) decides
end
return {marks(), n}
