-- set_metadata(KEYS=queue keys, the project's metadata version; ARGV=[queue script args, meta_json, the
--                                 policy fields (lib.lua POLICY_FIELDS), expected_version])
--   -> 1. Creates the queue when absent; replaces its metadata and policy fields in one step. Error
--   CHARON_STALE (nothing written) when the project's metadata version is no longer expected_version;
--   CHARON_QUOTA (nothing written) when the queue, or a DLQ its policy names, is new and would take the
--   project past its `queues` quota.
local prefix, name, now, K = queue_script()
local refused = queue_refused(prefix, K, name, policy_arg(ARGV, 7, 'dlq'))
if refused then return refused end
if not write_metadata(KEYS[9], K, ARGV, 7) then return redis.error_reply(STALE) end
ensure_queue(K, name, now)
return 1
