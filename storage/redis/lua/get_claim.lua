-- get_claim(KEYS=queue keys, claim, claim's messages; ARGV=[queue script args, claim_id])
--   -> {ttl, grace, created, expires, view1, ...} with the live messages the claim still holds,
--      or error CHARON_NO_CLAIM when the claim is unknown, of another queue, or expired.
local prefix, name, now, K = queue_script()
local claim_id, ck = ARGV[7], KEYS[9]
local c = redis.call('HMGET', ck, 'q', 'ttl', 'grace', 'cr', 'e')
if c[1] ~= name or tonumber(c[5]) <= now then
  return redis.error_reply('CHARON_NO_CLAIM Claim ' .. claim_id .. ' does not exist or has expired.')
end
local out = {c[2], c[3], c[4], c[5]}
for _, id in ipairs(redis.call('LRANGE', KEYS[10], 0, -1)) do
  local mk = message_key(prefix, id)
  if redis.call('HGET', mk, 'c') == claim_id then
    local v = view(mk, name, id, now)
    if v then table.insert(out, v) end
  end
end
return out
