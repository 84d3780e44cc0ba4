-- take_tokens(KEYS=[a project's token bucket (ProjectKeys.bucket)], ARGV=[now, want, rate, capacity])
--   -> {granted, wait_ms}: up to `want` tokens of the bucket, refilled at `rate` a second since its last
--   take up to `capacity` (a new bucket starts full); when none is left, wait_ms is how long until one is.
--   The last take's time only moves forward, whichever process's clock says it.
-- The bucket expires once it would be full again: an idle project costs no memory.
local now, want, rate, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local b = redis.call('HMGET', KEYS[1], 'tk', 'at')
local tokens, at = tonumber(b[1]), tonumber(b[2])
if tokens == nil or at == nil then
  tokens = cap
else
  tokens = math.min(cap, tokens + math.max(0, now - at) * rate / 1000)
  -- a process whose clock is behind another's never moves `at` back: the time between would be refilled
  -- twice (a handover between clocks skewed by s would grant s * rate more)
  now = math.max(now, at)
end
local granted = math.min(want, math.floor(tokens))
tokens = tokens - granted
local wait = 0
if granted == 0 then wait = math.ceil((1 - tokens) * 1000 / rate) end
redis.call('HSET', KEYS[1], 'tk', string.format('%.17g', tokens), 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil((cap - tokens) * 1000 / rate) + 1000)
return {granted, wait}
