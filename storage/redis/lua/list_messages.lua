-- list_messages(KEYS=queue keys, ARGV=[queue script args, marker, limit, echo, client_id,
--                                      include_claimed, include_delayed])
--   marker: a counter, or '@' and a message id: after that message (an empty page when it is not live here)
--   -> {last_marker, more, view1, ...}. Walks messages after `marker` in marker order, skipping the ones the
--   filters hide, and examines at most SCAN_CAP of them, so one call's work is bounded; `last_marker` is
--   where the next page starts and `more` is 1 when messages follow it.
local SCAN_CAP = 1000
local prefix, name, now, K = queue_script()
local marker, limit = tonumber(ARGV[7]), tonumber(ARGV[8])
if string.sub(ARGV[7], 1, 1) == '@' then  -- after a message: its marker, and no page when it is not here
  marker = tonumber(redis.call('ZSCORE', K.msgs, string.sub(ARGV[7], 2)))
  if not marker then return {0, 0} end
end
local echo, client_id = ARGV[9] == '1', ARGV[10]
local include_claimed, include_delayed = ARGV[11] == '1', ARGV[12] == '1'
local out = {marker, 0}
local got, scanned = 0, 0
while got < limit and scanned < SCAN_CAP do
  local batch = redis.call('ZRANGEBYSCORE', K.msgs, '(' .. marker, '+inf', 'WITHSCORES', 'LIMIT', 0,
                           math.min(limit * 2, SCAN_CAP - scanned))
  if #batch == 0 then break end
  for i = 1, #batch, 2 do
    local id = batch[i]
    marker = tonumber(batch[i + 1])
    scanned = scanned + 1
    local mk = message_key(prefix, id)
    local f = redis.call('HMGET', mk, 'e', 'c', 'ce', 'av', 'cl')
    local keep = f[1] ~= false and tonumber(f[1]) > now
    if keep and not include_claimed and f[2] ~= '' and tonumber(f[3]) > now then keep = false end
    if keep and not include_delayed and tonumber(f[4]) > now then keep = false end
    if keep and not echo and f[5] == client_id then keep = false end
    if keep then
      table.insert(out, view(mk, name, id, now))
      got = got + 1
      if got == limit then break end
    end
  end
end
out[1] = marker
if #redis.call('ZRANGEBYSCORE', K.msgs, '(' .. marker, '+inf', 'LIMIT', 0, 1) > 0 then out[2] = 1 end
return out
