-- export_dead_letters(KEYS=[msgs], ARGV=[message key prefix, lo, hi, page size, now, expiry field, field...])
--   -> {last marker scanned (or -1), flat rows}
-- One page of a DLQ for storage/redis/export.py, in one round trip, read-only; run on its own (no lib.lua).
-- KEYS[1] is the queue's msgs ZSET (id -> marker). Each row is id, marker, then the message hash's values of
-- the fields asked for (a missing field is nil in the reply); a message whose hash is gone or whose expiry
-- field is not past `now` is skipped. Every name comes from keys.py in ARGV; the message keys built from the
-- prefix carry the project's hash tag, so they are in KEYS[1]'s cluster slot.
local page = redis.call('ZRANGE', KEYS[1], ARGV[2], ARGV[3], 'BYSCORE', 'LIMIT', 0, ARGV[4], 'WITHSCORES')
local prefix, now = ARGV[1], tonumber(ARGV[5])
local fields = {}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
local out, last = {}, -1
for i = 1, #page, 2 do
  last = page[i + 1]
  local f = redis.call('HMGET', prefix .. page[i], unpack(fields))
  if f[1] and tonumber(f[1]) > now then
    out[#out + 1] = page[i]
    out[#out + 1] = page[i + 1]
    for j = 2, #f do out[#out + 1] = f[j] end  -- a missing field is false: nil in the reply
  end
end
return {last, out}
