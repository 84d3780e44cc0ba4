-- take_tokens(KEYS=[a project's token bucket (ProjectKeys.bucket)], ARGV=[now, want, rate, capacity,
--             max_skew_ms])
--   -> {granted, wait_ms}: up to `want` tokens of the bucket, refilled at `rate` a second since its last
--   take up to `capacity` (a new bucket starts full); when none is left, wait_ms is how long until one is.
--   The API processes' clocks may disagree: a last take up to max_skew_ms ahead of `now` (another process's
--   clock) is kept, so the time between is never refilled twice; one further ahead is not believed (`now`
--   replaces it), so a clock far ahead cannot stop the bucket's refill for as long.
-- The bucket expires once it would be full again: an idle project costs no memory.
local now, want, rate, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local skew = tonumber(ARGV[5])
local b = redis.call('HMGET', KEYS[1], 'tk', 'at')
local tokens, at = tonumber(b[1]), tonumber(b[2])
local ahead = 0
if tokens == nil or at == nil then
  tokens = cap
  at = now
else
  if at > now + skew then at = now end
  tokens = math.min(cap, tokens + math.max(0, now - at) * rate / 1000)
  ahead = math.max(0, at - now)
  at = math.max(now, at)
end
local granted = math.min(want, math.floor(tokens))
tokens = tokens - granted
local wait = 0
if granted == 0 then wait = ahead + math.ceil((1 - tokens) * 1000 / rate) end
redis.call('HSET', KEYS[1], 'tk', string.format('%.17g', tokens), 'at', at)
redis.call('PEXPIRE', KEYS[1], ahead + math.ceil((cap - tokens) * 1000 / rate) + 1000)
return {granted, wait}
