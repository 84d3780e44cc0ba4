-- release_claim(KEYS=queue keys, ARGV=[prefix, name, now, claim_id, delay_ms or ''])
--   -> {lib.lua marks(), n_released, n_dead_lettered, n_discarded}. An unknown claim releases
--   nothing (Zaqar); a lapsed one whose messages housekeeping has not reached yet returns them just as
--   housekeeping would.
-- Each message becomes claimable again after `delay_ms` (Pulsar's reconsumeLater), or when it is '' after
-- the queue's redelivery backoff. A message that has used up its claims moves to the DLQ here and now
-- (promise 7).
local prefix, name, now, K = queue_script()
local claim_id, wait_ms = ARGV[7], tonumber(ARGV[8])
local ck, cmk = KEYS[9], KEYS[10]
local out = {0, 0, 0, 0}
if redis.call('HGET', ck, 'q') ~= name then return out end
local pol = policy(K)
local batch = unclaim_batch()
for _, id in ipairs(redis.call('LRANGE', cmk, 0, -1)) do
  local f = redis.call('HMGET', message_key(prefix, id), 'c', 'q', 'e')
  if f[1] == claim_id and f[2] == name and tonumber(f[3]) > now then
    local r = unclaim(prefix, K, name, id, now, pol, now, wait_ms, batch)
    if r == 'moved' then out[3] = out[3] + 1 elseif r == 'discarded' then out[4] = out[4] + 1
    else out[2] = out[2] + 1 end
  end
end
unclaimed(K, batch)
redis.call('DEL', ck, cmk)
out[1] = marks()
return out
