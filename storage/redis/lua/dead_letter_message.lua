-- dead_letter_message(KEYS=queue keys, message; ARGV=[queue script args, id, claim_id, reason, description,
--                     client id])
--   -> {lib.lua marks(), 'moved' | 'discarded' (a message posted with dead_letter_eligible false)}
-- A consumer rejects a message it holds: it moves to the queue's DLQ at once with reason 'rejected', the
-- consumer's text ('' = none) and its client id ('' = the last claimer's) in its provenance. Errors
-- CHARON_NO_MESSAGE, CHARON_CLAIM_MISMATCH (lib.lua check_held), CHARON_NO_DLQ when the queue has no DLQ.
local prefix, name, now, K = queue_script()
local id, claim_id = ARGV[7], ARGV[8]
local err = check_held(KEYS[9], name, id, claim_id, now)
if err then return err end
local pol = policy(K)
if not pol.dlq then
  return redis.error_reply('CHARON_NO_DLQ Queue ' .. name .. ' has no dead-letter queue to move message ' ..
    id .. ' to; set _dead_letter_queue in its metadata first.')
end
redis.call('ZREM', K.claimed, id)
if dead_letter(prefix, K, name, id, 'rejected', now, pol, {ARGV[9], ARGV[10]}, ARGV[11]) == 1 then
  return {marks(), 'moved'}
end
return {marks(), 'discarded'}
