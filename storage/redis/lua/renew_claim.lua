-- renew_claim(KEYS=queue keys, ARGV=[prefix, name, now, claim_id, ttl, grace])
--   -> {lib.lua marks(), number of messages still held}. The claim now ends at now + ttl and its
--   age starts again (Zaqar); each message it holds lives at least until then plus grace. Error
--   CHARON_NO_CLAIM as get_claim.
local prefix, name, now, K = queue_script()
local claim_id, ttl, grace = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
local ck, cmk = KEYS[9], KEYS[10]
if not live_claim(K, ck, name, now) then return no_claim(claim_id) end
local ce = now + ttl * 1000
redis.call('HSET', ck, 'ttl', ttl, 'grace', grace, 'cr', now, 'e', ce)
local keep = (ttl + grace) * 1000 + 300000
redis.call('PEXPIRE', ck, keep)
redis.call('PEXPIRE', cmk, keep)
schedule(K, ce)
local held = 0
for _, id in ipairs(redis.call('LRANGE', cmk, 0, -1)) do
  local mk = message_key(prefix, id)
  local f = redis.call('HMGET', mk, 'c', 'e', 'q')
  if f[1] == claim_id and f[3] == name and tonumber(f[2]) > now then
    redis.call('HSET', mk, 'ce', ce)
    redis.call('ZADD', K.claimed, ce, id)
    if tonumber(f[2]) < ce + grace * 1000 then set_expiry(K, mk, id, ce + grace * 1000, now) end
    held = held + 1
  end
end
return {marks(), held}
