-- get_claim(KEYS=queue keys, claim, claim's messages; ARGV=[queue script args, claim_id])
--   -> {ttl, grace, created, expires, view1, ...} with the live messages the claim still holds,
--      or error CHARON_NO_CLAIM when the claim is unknown, of another queue (or of a queue deleted since), or
--      expired (lib.lua live_claim).
local prefix, name, now, K = queue_script()
local claim_id, ck = ARGV[7], KEYS[9]
if not live_claim(K, ck, name, now) then return no_claim(claim_id) end
local out = redis.call('HMGET', ck, 'ttl', 'grace', 'cr', 'e')
for _, id in ipairs(redis.call('LRANGE', KEYS[10], 0, -1)) do
  local mk = message_key(prefix, id)
  if redis.call('HGET', mk, 'c') == claim_id then
    local v = view(mk, name, id, now)
    if v then table.insert(out, v) end
  end
end
return out
