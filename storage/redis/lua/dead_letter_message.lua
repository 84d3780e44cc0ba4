-- dead_letter_message(KEYS=queue keys, ARGV=[prefix, name, now, id, claim_id, reason, description])
--   -> 'moved' | 'discarded' (a message posted with dead_letter_eligible false)
-- A consumer rejects a message it holds: it moves to the queue's DLQ at once with reason 'rejected' and the
-- consumer's text ('' = none) in its provenance. Errors CHARON_NO_MESSAGE, CHARON_CLAIM_MISMATCH (lib.lua
-- check_held), CHARON_NO_DLQ when the queue has no DLQ.
local prefix, name, now, id, claim_id = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local K = keys_from(KEYS, ARGV[2])
local err = check_held(prefix, name, id, claim_id, now)
if err then return err end
local pol = policy(K)
if not pol.dlq then
  return redis.error_reply('CHARON_NO_DLQ Queue ' .. name .. ' has no dead-letter queue to move message ' ..
    id .. ' to; set _dead_letter_queue in its metadata first.')
end
redis.call('ZREM', K.claimed, id)
if dead_letter(prefix, K, name, id, 'rejected', now, pol, {ARGV[6], ARGV[7]}) == 1 then return 'moved' end
return 'discarded'
