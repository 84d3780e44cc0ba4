-- acknowledge_claim(KEYS=queue keys, claim, claim's messages; ARGV=[queue script args, claim_id])
--   -> the number of messages deleted, or error CHARON_NO_CLAIM when the queue has no live claim of that id
--   (never made, expired, released or acknowledged already).
-- "I processed everything I claimed": deletes the messages the claim still holds (not those released from
-- it or deleted since), then the claim. One script: one atomic step.
local prefix, name, now, K = queue_script()
local claim_id = ARGV[7]
local ck, cmk = KEYS[9], KEYS[10]
if not live_claim(K, ck, name, now) then return no_claim(claim_id) end
local n = 0
for _, id in ipairs(redis.call('LRANGE', cmk, 0, -1)) do
  local f = redis.call('HMGET', message_key(prefix, id), 'c', 'q', 'e', 'ce')
  if f[1] == claim_id and f[2] == name and tonumber(f[3]) > now and tonumber(f[4]) > now then
    remove_message(prefix, K, id)
    n = n + 1
  end
end
redis.call('DEL', ck, cmk)
return n
