-- create_queue(KEYS=queue keys, the project's metadata version; ARGV=[queue script args, meta_json, the
--                                 policy fields (lib.lua POLICY_FIELDS), expected_version])
--   -> 1 created (metadata written) | 0 existed (metadata left as it is, as Zaqar does). Error CHARON_STALE
--   (nothing created) when the project's metadata version is no longer expected_version; CHARON_QUOTA
--   (nothing created) when it, or a DLQ its policy names that does not exist yet, would take the project
--   past its `queues` quota.
local prefix, name, now, K = queue_script()
if redis.call('EXISTS', K.queue) == 1 then return 0 end
local refused = queue_refused(prefix, K, name, policy_arg(ARGV, 7, 'dlq'))
if refused then return refused end
if not write_metadata(KEYS[9], K, ARGV, 7) then return redis.error_reply(STALE) end
ensure_queue(K, name, now)
return 1
