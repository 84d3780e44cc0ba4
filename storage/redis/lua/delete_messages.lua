-- delete_messages(KEYS=queue keys, message1, message2, ...; ARGV=[queue script args, claim ids, id1, id2, ...])
--   claim ids: comma-separated, '' = none.
--   -> {number deleted, id, reason, id, reason, ...}: the listed live messages it did not delete, and why.
-- Without claim ids, every listed message is deleted whatever holds it (Zaqar's bulk delete). With claim
-- ids (Zaqar's `claim_ids`, a set), a message is deleted only if one of them holds it now; the others stay
-- and are answered with 'not_claimed' (no live claim holds it) or 'claimed_by_another'; one that a
-- dead-letter move took out of this queue (its claim expired meanwhile) with 'dead_lettered'. Ids of
-- messages that do not exist (deleted, expired) are skipped, as deleting is idempotent. One script: one
-- atomic step.
local prefix, name, now, K = queue_script()
local given = nil
if ARGV[7] ~= '' then
  given = {}
  for cid in string.gmatch(ARGV[7], '[^,]+') do given[cid] = true end
end
local out, gone, going = {0}, {}, {}
for i = 8, #ARGV do
  local f = redis.call('HMGET', KEYS[i + 1], 'q', 'e', 'c', 'ce', 'dsrc')
  if given ~= nil and f[1] and f[1] ~= name and f[5] == name and tonumber(f[2]) > now then
    table.insert(out, ARGV[i])
    table.insert(out, 'dead_lettered')
  elseif f[1] == name and tonumber(f[2]) > now then
    local held = f[3] ~= '' and tonumber(f[4]) > now
    if given == nil or (held and given[f[3]]) then
      if not going[ARGV[i]] then table.insert(gone, ARGV[i]) end  -- an id listed twice is deleted once
      going[ARGV[i]] = true
    else
      table.insert(out, ARGV[i])
      table.insert(out, held and 'claimed_by_another' or 'not_claimed')
    end
  end
end
remove_messages(prefix, K, gone)  -- one call an index for them all
out[1] = #gone
return out
