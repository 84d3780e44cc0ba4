-- delete_message(KEYS=queue keys, message; ARGV=[queue script args, id, claim_id or ''])
--   -> 1 deleted | 0 no such live message (deleting is idempotent, as in Zaqar).
-- A message under an active claim is deleted only with that claim's id (CHARON_CLAIMED without one,
-- CHARON_CLAIM_MISMATCH with another); a claim id on a message no claim holds is CHARON_CLAIM_MISMATCH,
-- since its claim expired and the message may already be someone else's; so is a claim id on a message a
-- dead-letter move took out of this queue (its claim expired, and it will be delivered from the DLQ).
local prefix, name, now, K = queue_script()
local id, claim_id = ARGV[7], ARGV[8]
local f = redis.call('HMGET', KEYS[9], 'q', 'e', 'c', 'ce', 'dsrc')
if claim_id ~= '' and f[1] and f[1] ~= name and f[5] == name and tonumber(f[2]) > now then
  return redis.error_reply('CHARON_CLAIM_MISMATCH Message ' .. id .. ' was not deleted (dead_lettered): ' ..
    'its claim expired and it was moved to the dead-letter queue ' .. f[1] ..
    ', from which it will be delivered again.')
end
if f[1] ~= name or tonumber(f[2]) <= now then return 0 end
local held_by = ''
if f[3] ~= '' and tonumber(f[4]) > now then held_by = f[3] end
if held_by ~= '' and claim_id == '' then
  return redis.error_reply('CHARON_CLAIMED Message ' .. id ..
    ' is claimed; delete it with the claim_id of the claim that holds it.')
end
if claim_id ~= held_by then
  return redis.error_reply('CHARON_CLAIM_MISMATCH Claim ' .. claim_id .. ' does not hold message ' .. id ..
    ' (the claim has expired or another claim holds the message).')
end
remove_message(prefix, K, id)
return 1
