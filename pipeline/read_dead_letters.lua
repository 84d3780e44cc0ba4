-- One page of a DLQ for pipeline/sources.py, in one round trip, read-only.
-- KEYS[1]: the queue's msgs ZSET (id -> marker). ARGV: key prefix, lowest marker, highest marker, page size,
-- now (ms), then the message hash fields to return.
-- Returns {last marker scanned (or -1), flat rows}: each row is id, marker, then the fields; a message whose
-- hash is gone or whose expiry ("e") has passed is skipped. Message keys are derived from the prefix, which
-- carries the project's hash tag, so they are in KEYS[1]'s cluster slot.
local page = redis.call('ZRANGE', KEYS[1], ARGV[2], ARGV[3], 'BYSCORE', 'LIMIT', 0, ARGV[4], 'WITHSCORES')
local now = tonumber(ARGV[5])
local fields = {'e'}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
local out, last = {}, -1
for i = 1, #page, 2 do
  last = page[i + 1]
  local f = redis.call('HMGET', ARGV[1] .. 'm:' .. page[i], unpack(fields))
  if f[1] and tonumber(f[1]) > now then
    out[#out + 1] = page[i]
    out[#out + 1] = page[i + 1]
    for j = 2, #f do out[#out + 1] = f[j] end  -- a missing field is false: nil in the reply
  end
end
return {last, out}
