-- release_message(KEYS=queue keys, ARGV=[prefix, name, now, id, claim_id, delay_ms or ''])
--   -> {lib.lua marks(), 'ready' | 'delayed' | 'moved' | 'discarded'}
-- Takes one message out of the claim that holds it, as release_claim does for all of them: claimable again
-- after `delay_ms`, or after the queue's redelivery backoff when it is ''; moved to the DLQ now when it has
-- used up its claims. Errors CHARON_NO_MESSAGE, CHARON_CLAIM_MISMATCH (lib.lua check_held).
local prefix, name, now, K = queue_script()
local id, claim_id = ARGV[7], ARGV[8]
local err = check_held(KEYS[9], name, id, claim_id, now)
if err then return err end
local r = unclaim(prefix, K, name, id, now, policy(K), now, tonumber(ARGV[9]))
return {marks(), r}
